// `twell convert IN OUT --to FORMAT [...]`: reads a .mtx/.npy/.twell file, optionally changes
// the value type, converts to any format and writes .mtx (CSR), .npy (dense) or .twell (any).
#include <algorithm>
#include <iostream>
#include <vector>

#include <twell/any_matrix.hpp>
#include <twell/io.hpp>

#include "args.hpp"
#include "cli.hpp"
#include "commands.hpp"
#include "progress.hpp"

namespace twell::cli {
namespace {

// Rounds every value of m (read from `path`) to U through CSR (twell::narrow): a value beyond U's
// range is an error naming its row and column; values that round to zero are not stored (counted).
template <Value U>
AnyMatrix cast_to(const AnyMatrix& m, const std::string& path, std::int64_t& zeroed) {
  return std::visit(
      [&](const auto& x) -> AnyMatrix {
        const auto src = to_csr(x);
        const auto rp = src.row_ptr().host_span();
        const auto ci = src.col_idx().host_span();
        const auto v = src.values().host_span();
        std::vector<U> narrowed(v.size());
        std::int64_t dropped = 0, kept = 0;
        for (std::size_t r = 0; r + 1 < rp.size(); ++r) {
          for (auto k = rp[r]; k < rp[r + 1]; ++k) {
            const auto idx = static_cast<std::size_t>(k);
            const float value = to_float(v[idx]);
            bool to_zero = false;
            narrowed[idx] = narrow<U>(
                value, path,
                [&] { return detail::concat("row ", r, ", column ", ci[idx], ": value ", shortest_decimal(value)); },
                to_zero);
            dropped += to_zero ? 1 : 0;
            kept += is_stored(narrowed[idx]) ? 1 : 0;  // a zero stored in the source is not kept either
          }
        }
        zeroed += dropped;
        CsrMatrix<U> out(src.rows(), src.cols(), kept);
        auto orp = out.row_ptr().host_span();
        auto oci = out.col_idx().host_span();
        auto ov = out.values().host_span();
        std::size_t o = 0;
        for (std::size_t r = 0; r + 1 < rp.size(); ++r) {
          for (auto k = rp[r]; k < rp[r + 1]; ++k) {
            const auto idx = static_cast<std::size_t>(k);
            if (!is_stored(narrowed[idx])) continue;
            oci[o] = ci[idx];
            ov[o++] = narrowed[idx];
          }
          orp[r + 1] = static_cast<std::int64_t>(o);
        }
        return out;
      },
      m);
}

OverflowPolicy parse_overflow(const std::string& s) {
  if (s == "error") return OverflowPolicy::error;
  if (s == "hybrid") return OverflowPolicy::hybrid;
  if (s == "drop") return OverflowPolicy::drop;
  throw UsageError("--overflow '" + s + "' is not one of error, hybrid, drop");
}

// Why --overflow `policy` would have no effect on a `to` output; empty when it has one. ELL overflows
// only under --ell-width, and never into a block: the library refuses hybrid there only with a
// width, but without one it would be ignored, so the CLI refuses it either way.
std::string overflow_unused(Format to, OverflowPolicy policy, bool ell_width) {
  switch (to) {
    case Format::twell:
      return {};  // error and drop apply; hybrid writes a Hybrid
    case Format::hybrid:
      return policy == OverflowPolicy::hybrid ? "" : "a Hybrid keeps every value (its dense block takes the overflow)";
    case Format::ell:
      if (policy == OverflowPolicy::hybrid) return "ELL has no overflow block";
      return ell_width ? "" : "without --ell-width the ELL width is the longest row, so no row overflows";
    case Format::dense:
    case Format::csr:
      break;
  }
  return detail::concat("a ", to_string(to), " output has no overflow");
}

// The values a dense matrix stores: its nonzeros, as ConvertReport::nnz counts them.
std::int64_t stored_values(const AnyMatrix& dense) {
  return dispatch_dtype(dtype(dense), [&]<class T>() {
    const auto values = std::get<DenseMatrix<T>>(dense).values().host_span();
    return static_cast<std::int64_t>(std::ranges::count_if(values, [](T v) { return is_stored(v); }));
  });
}

std::string describe(const AnyMatrix& m) {
  std::string layout;
  if (const Format f = format(m); f == Format::twell || f == Format::hybrid) {
    const TwellLayout l = std::visit(
        [](const auto& x) -> TwellLayout {
          if constexpr (requires { x.layout(); }) {
            return x.layout();
          } else {
            return {};
          }
        },
        m);
    layout = detail::concat("(tile ", l.tile, ", C ", l.compression, ")");
  }
  return detail::concat(to_string(format(m)), layout, " ", to_string(dtype(m)), " ", rows(m), " x ", cols(m));
}

}  // namespace

const Spec kConvertSpec{
    "convert",
    "Converts a matrix file to another format and/or value type. File types follow the\n"
    "extensions: .mtx holds CSR (Matrix Market), .npy dense (NumPy), .twell any format.",
    "<input> <output>",
    2,
    2,
    {{"to", "FORMAT", "dense|csr|ell|twell|hybrid (default: csr for .mtx, dense for .npy; required for .twell)"},
     {"dtype", "bf16|fp16|fp32", "value type of the output (default: the input's; fp32 for .mtx input)"},
     {"tile", "T", "TwELL/Hybrid tile width in columns (default 256)"},
     {"compression", "C", "TwELL/Hybrid compression: S = tile / C slots per (row, tile) (default 8)"},
     {"overflow", "POLICY",
      "error|hybrid|drop for a (row, tile) beyond S-1 entries (default error; hybrid writes a Hybrid)"},
     {"threshold", "t", "store only values with |v| > t (default 0)"},
     {"ell-width", "W", "ELL width (default: the longest row; longer rows follow --overflow)"},
     {"quiet", "", "print nothing on success"}}};

std::optional<ConvertRequest> parse_convert(std::span<const std::string> argv) {
  const Args args(kConvertSpec, argv);
  if (args.help()) return std::nullopt;
  ConvertRequest r;
  r.in = args.positional()[0];
  r.out = args.positional()[1];
  try {
    file_type_of(r.in);
    const FileType out_type = file_type_of(r.out);
    if (args.has("dtype")) {
      r.dtype = parse_dtype(args.get("dtype", ""));
      r.read.dtype = *r.dtype;
    }
    r.to = output_format(out_type, args.has("to") ? std::optional(args.get("to", "")) : std::nullopt, std::nullopt);
    r.layout.tile =
        static_cast<std::int32_t>(args.get_int("tile", TwellLayout::kDefaultTile, 8, TwellLayout::kMaxTile));
    r.layout.compression =
        static_cast<std::int32_t>(args.get_int("compression", TwellLayout::kDefaultCompression, 1, 65536));
    // Checked whatever the output format: a bad value is refused, never ignored.
    check_layout(r.layout, "--tile/--compression");
    r.options.overflow = parse_overflow(args.get("overflow", "error"));
    r.options.threshold = static_cast<float>(args.get_double("threshold", 0.0, 0.0, 3.4e38));
    r.options.ell_width = args.get_int("ell-width", -1, -1, std::numeric_limits<std::int32_t>::max());
  } catch (const Error& e) {
    throw UsageError(e.what());
  }
  // Like the layout options, a width or a policy that would go unused is refused rather than ignored.
  if (args.has("ell-width") && r.to != Format::ell) {
    throw UsageError("--ell-width sets the width of an ELL output, but this command writes " +
                     std::string(to_string(r.to)));
  }
  if (args.has("overflow")) {
    if (const std::string why = overflow_unused(r.to, r.options.overflow, r.options.ell_width != -1); !why.empty())
      throw UsageError("--overflow " + args.get("overflow", "") + " has no effect: " + why);
  }
  if (r.to == Format::twell && r.options.overflow == OverflowPolicy::hybrid) r.to = Format::hybrid;
  r.quiet = args.flag("quiet");
  return r;
}

namespace {

int run_convert(std::span<const std::string> argv) {
  const std::optional<ConvertRequest> request = parse_or_print_usage(parse_convert, kConvertSpec, argv);
  if (!request) return 0;
  const std::string& in = request->in;
  const std::string& out = request->out;
  const Format to = request->to;
  const ReadOptions read = request->read;
  ConvertOptions options = request->options;
  ConvertReport report;
  // A dense output drops nothing and has no overflow block, so its values are counted rather than
  // reported: with a report the library re-builds a dense input through CSR instead of copying it,
  // which fails beyond CSR's 2^31-1 columns.
  if (to != Format::dense) options.report = &report;
  const bool cast = request->dtype.has_value();
  const DType want_dtype = request->dtype.value_or(DType::fp32);

  Progress progress(4);
  progress.step("reading " + in);
  // Text is parsed straight into the value type: the reader rounds, and counts what became zero.
  MtxReport mtx;
  AnyMatrix m = file_type_of(in) == FileType::mtx ? read_mtx(in, read, &mtx) : read_matrix(in, read);
  const std::string from = describe(m);
  std::int64_t zeroed = mtx.rounded_to_zero;
  if (cast && dtype(m) != want_dtype) {
    progress.step(std::string("rounding to ") + std::string(to_string(want_dtype)));
    m = dispatch_dtype(want_dtype, [&]<class U>() { return cast_to<U>(m, in, zeroed); });
  } else {
    progress.step("value type kept");
  }
  progress.step(std::string("converting to ") + std::string(to_string(to)));
  const AnyMatrix result = convert(m, to, request->layout, options);
  if (to == Format::dense) report.nnz = stored_values(result);
  progress.step("writing " + out);
  write_matrix(out, result);
  progress.clear();
  if (!request->quiet) {
    std::cout << in << " (" << from << ") -> " << out << " (" << describe(result) << "): " << report.nnz
              << " values stored";
    if (report.dropped != 0) std::cout << ", " << report.dropped << " dropped by --overflow drop";
    if (report.overflow_rows != 0) std::cout << ", " << report.overflow_rows << " rows in the dense overflow block";
    // Stored in the file but not in twell (no format keeps zeros): said, so the counts add up.
    if (mtx.explicit_zeros != 0) std::cout << ", " << mtx.explicit_zeros << " explicit zeros dropped";
    if (zeroed != 0)
      std::cout << ", " << zeroed << " values became zero in " << to_string(dtype(m)) << " and were dropped";
    std::cout << "\n";
  }
  return 0;
}

[[maybe_unused]] const bool kRegistered =
    register_command({"convert", "convert a .mtx/.npy/.twell file to another format or value type", run_convert});

}  // namespace
}  // namespace twell::cli
