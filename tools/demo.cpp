// `twell demo`: one sparse-activation workload through every format, the gated FFN and one
// training step of it, with sizes, timings and errors against exact products, on the GPU where
// one is present.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <functional>
#include <limits>
#include <string>
#include <type_traits>
#include <vector>

#include <twell/any_matrix.hpp>
#include <twell/config.hpp>
#include <twell/convert.hpp>
#include <twell/ffn.hpp>
#include <twell/kernels/ffn.hpp>
#include <twell/ops.hpp>
#include <twell/validate.hpp>
#include <twell/workload.hpp>

#if TWELL_HAS_CUDA
#include <cuda_runtime.h>
#endif

#include "args.hpp"
#include "cli.hpp"
#include "commands.hpp"

namespace twell::cli {

const Spec kDemoSpec{
    .command = "demo",
    .summary = "Generates sparse activations with the workload generator, converts them into CSR, ELL,\n"
               "TwELL and Hybrid, validates each, multiplies each by the down-projection weights, and\n"
               "runs the gated FFN forward through the sparse path (and, on the GPU, the fused layer)\n"
               "and the dense reference, then one training step (GatedFfnTraining) against the dense\n"
               "reference backward. Runs on the GPU when one is visible, else on the CPU reference\n"
               "backend.",
    .positional = "",
    .min_positional = 0,
    .max_positional = 0,
    .options = {
        {"shape", "NAME", "FFN shape: paper (2048 x 5632, default), llama7b (4096 x 11008), small (1024 x 2816)"},
        {"tokens", "M", "tokens (rows); default 2048 on the CPU, 16384 on a GPU"},
        {"density", "D", "target mean density of the activations, in [0, 1]; default 0.005"},
        {"distribution", "NAME", "uniform, neuron_skewed or token_skewed (default)"},
        {"dtype", "TYPE", "bf16 (default), fp16 or fp32"},
        {"seed", "S", "workload seed; default 1"},
        {"tile", "T", "TwELL tile width in columns; default 256"},
        {"compression", "C", "TwELL compression (slots per tile = T / C); default 8"},
        {"repeats", "R", "timed runs of each conversion and spmm (median shown); default 3 on the CPU, 20 on a GPU"},
        {"ffn-repeats", "R", "timed runs of the FFN forward (median shown); default 1 on the CPU, 20 on a GPU"},
    }};

namespace {

// Everything the demo's device choice touches: where operands live and how to wait for them.
struct Device {
  MemorySpace space = MemorySpace::host;
  std::string name;

  void synchronize() const {
#if TWELL_HAS_CUDA
    if (space == MemorySpace::device) {
      const cudaError_t status = cudaDeviceSynchronize();
      require(status == cudaSuccess, ErrorCode::cuda, "twell demo", "cudaDeviceSynchronize: ",
              cudaGetErrorString(status));
    }
#endif
  }
};

Device pick_device() {
  Device d;
  d.name = "CPU (reference backend)";
#if TWELL_HAS_CUDA
  if (cuda_available()) {
    int id = 0;
    cudaDeviceProp prop{};
    if (cudaGetDevice(&id) == cudaSuccess && cudaGetDeviceProperties(&prop, id) == cudaSuccess) {
      d.space = MemorySpace::device;
      d.name = std::string(prop.name) + " (cuda backend)";
    }
  }
#endif
  return d;
}

// Median wall time of `repeats` calls of f, waiting for the device after each.
template <class F>
double median_ms(int repeats, const Device& device, F&& f) {
  std::vector<double> ms;
  for (int r = 0; r < repeats; ++r) {
    const auto start = std::chrono::steady_clock::now();
    f();
    device.synchronize();
    ms.push_back(std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count());
  }
  std::nth_element(ms.begin(), ms.begin() + static_cast<std::ptrdiff_t>(ms.size() / 2), ms.end());
  return ms[ms.size() / 2];
}

// The exact product A B in fp64 (A sparse-in-dense, so zeros are skipped: 0 * b adds nothing),
// and the largest sum of |a_ij b_jk| over the terms of one output, which bounds the rounding
// error of any fp32 accumulation order.
struct ExactProduct {
  std::vector<double> c;
  double largest_abs_sum = 0;
};

template <Value T>
ExactProduct exact_product(DenseView<const T> a, DenseView<const T> b) {
  ExactProduct out;
  out.c.assign(static_cast<std::size_t>(a.rows * b.cols), 0.0);
  std::vector<double> abs_sum(static_cast<std::size_t>(b.cols));
  for (std::int64_t i = 0; i < a.rows; ++i) {
    double* row = out.c.data() + i * b.cols;
    std::fill(abs_sum.begin(), abs_sum.end(), 0.0);
    for (std::int64_t j = 0; j < a.cols; ++j) {
      const double v = to_float(a.at(i, j));
      if (v == 0.0) continue;
      for (std::int64_t k = 0; k < b.cols; ++k) {
        const double term = v * to_float(b.at(j, k));
        row[k] += term;
        abs_sum[static_cast<std::size_t>(k)] += std::abs(term);
      }
    }
    for (double t : abs_sum) out.largest_abs_sum = std::max(out.largest_abs_sum, t);
  }
  return out;
}

template <Value T>
double max_abs_error(const DenseMatrix<T>& got, const std::vector<double>& want) {
  const DenseMatrix<T> host = got.to(MemorySpace::host);
  const auto values = host.values().host_span();
  double worst = 0;
  for (std::size_t i = 0; i < values.size(); ++i) {
    const double e = std::abs(static_cast<double>(to_float(values[i])) - want[i]);
    worst = std::isnan(e) ? std::numeric_limits<double>::infinity() : std::max(worst, e);
  }
  return worst;
}

// ||a - b|| / ||b|| over two host views of the same shape, in fp64.
template <Value T>
double relative_difference(DenseView<const T> a, DenseView<const T> b) {
  double diff = 0, norm = 0;
  for (std::int64_t i = 0; i < b.rows; ++i)
    for (std::int64_t j = 0; j < b.cols; ++j) {
      const double x = to_float(a.at(i, j)), y = to_float(b.at(i, j));
      diff += (x - y) * (x - y);
      norm += y * y;
    }
  return std::sqrt(diff) / std::max(std::sqrt(norm), std::numeric_limits<double>::min());
}

// The first `rows` rows of a matrix (a view in its memory space).
template <Value T>
DenseView<const T> first_rows(const DenseMatrix<T>& m, std::int64_t rows) {
  DenseView<const T> v = m.view();
  v.rows = std::min(v.rows, rows);
  return v;
}

template <Value T>
std::int64_t bytes_of(const DenseMatrix<T>& m) {
  return static_cast<std::int64_t>(m.values().bytes());
}
template <Value T>
std::int64_t bytes_of(const CsrMatrix<T>& m) {
  return static_cast<std::int64_t>(m.row_ptr().bytes() + m.col_idx().bytes() + m.values().bytes());
}
template <Value T>
std::int64_t bytes_of(const EllMatrix<T>& m) {
  return static_cast<std::int64_t>(m.row_count().bytes() + m.col_idx().bytes() + m.values().bytes());
}
template <Value T>
std::int64_t bytes_of(const TwellMatrix<T>& m) {
  return static_cast<std::int64_t>(m.packed().bytes() + m.value_plane().bytes());
}
template <Value T>
std::int64_t bytes_of(const HybridMatrix<T>& m) {
  return bytes_of(m.twell()) + bytes_of(m.overflow()) +
         static_cast<std::int64_t>(m.row_to_overflow().bytes() + m.overflow_to_row().bytes());
}

struct Row {
  std::string format;
  std::int64_t bytes = 0;
  double convert_ms = 0, spmm_ms = 0, error = 0;
  std::string note;
  bool measured = true;
  bool lossy = false;  // dropped values on purpose: its error is the point, not a defect
};

// Machine epsilon of T: results rounded to T are checked against multiples of it.
template <Value T>
double epsilon() {
  if constexpr (std::is_same_v<T, bf16>) return 0x1p-7;
  else if constexpr (std::is_same_v<T, fp16>) return 0x1p-10;
  else return 0x1p-23;
}

void print_rows(const std::vector<Row>& rows, std::int64_t dense_bytes) {
  std::printf("\n%-16s %12s %8s %11s %9s %12s  %s\n", "format", "bytes", "vs dense", "convert ms", "spmm ms",
              "max abs err", "notes");
  for (const Row& r : rows) {
    std::printf("%-16s %12lld %7.1fx ", r.format.c_str(), static_cast<long long>(r.bytes),
                static_cast<double>(dense_bytes) / static_cast<double>(std::max<std::int64_t>(r.bytes, 1)));
    if (r.measured)
      std::printf("%11.2f %9.2f %12.3g", r.convert_ms, r.spmm_ms, r.error);
    else
      std::printf("%11s %9s %12s", "-", "-", "-");
    std::printf("  %s\n", r.note.c_str());
  }
}

struct Settings {
  workload::FfnShape shape;
  workload::ActivationOptions workload;
  TwellLayout layout;
  int repeats = 3;
  int ffn_repeats = 1;
};

template <Value T>
int run_typed(const Settings& s, const Device& device) {
  const MemorySpace space = device.space;
  const std::int64_t m = s.workload.tokens, n = s.workload.units, k = s.shape.hidden;
  std::printf("workload: %s, %lld tokens x %lld units (hidden %lld), %s, target density %.3g %%, seed %llu\n",
              s.shape.name.c_str(), static_cast<long long>(m), static_cast<long long>(n),
              static_cast<long long>(k), workload::to_string(s.workload.distribution).c_str(),
              100 * s.workload.density, static_cast<unsigned long long>(s.workload.seed));

  const DenseMatrix<T> act_host = workload::activations<T>(s.workload);
  const workload::RowProfile p = workload::profile<T>(act_host.view());
  std::printf("activations: mean %.1f nonzeros per token (%.3f %%), p50 %lld, p99 %lld, max %lld; %.0f %% of units "
              "never fire\n",
              p.mean, 100 * p.mean / static_cast<double>(n), static_cast<long long>(p.p50),
              static_cast<long long>(p.p99), static_cast<long long>(p.max), 100 * p.dead_unit_share);

  // The down projection's weights are the dense right-hand side, as in the FFN.
  const workload::FfnInputs<T> host_in = workload::ffn_inputs<T>(s.workload, k);
  const ExactProduct exact = exact_product<T>(act_host.view(), host_in.wd.view());
  const DenseMatrix<T> act = act_host.to(space);
  const DenseMatrix<T> wd = host_in.wd.to(space);
  DenseMatrix<T> c(m, k, space);
  const std::int64_t dense_bytes = bytes_of(act);

  std::vector<Row> rows;
  auto add = [&](std::string format, auto&& convert, std::string note) {
    Row r{.format = std::move(format), .note = std::move(note)};
    decltype(convert()) sparse;
    r.convert_ms = median_ms(s.repeats, device, [&] { sparse = convert(); });
    validate(sparse);
    r.bytes = bytes_of(sparse);
    r.spmm_ms = median_ms(s.repeats, device, [&] { spmm<T>(Op::none, sparse.view(), wd.view(), c.view()); });
    r.error = max_abs_error(c, exact.c);
    rows.push_back(std::move(r));
  };

  rows.push_back({.format = "dense", .bytes = dense_bytes, .note = "M x N values", .measured = false});
  add("CSR", [&] { return to_csr(act); }, "64-bit row pointers, 32-bit columns");
  add("ELL", [&] { return to_ell(act); }, "width = longest row, " + std::to_string(p.max));

  const std::string layout_name =
      "(" + std::to_string(s.layout.tile) + ", " + std::to_string(s.layout.compression) + ")";
  ConvertReport twell_report;
  ConvertOptions strict;
  try {
    add("TwELL" + layout_name, [&] { return to_twell(act, s.layout, strict); }, "exact: no tile overflowed");
  } catch (const Error& e) {
    if (e.code() != ErrorCode::overflow) throw;
    // The default policy refuses to lose values; show what dropping would cost, then the hybrid.
    ConvertOptions drop;
    drop.overflow = OverflowPolicy::drop;
    drop.report = &twell_report;
    add("TwELL" + layout_name, [&] { return to_twell(act, s.layout, drop); }, "");
    rows.back().lossy = true;
    rows.back().note = "overflow: the default policy throws; with drop, " + std::to_string(twell_report.dropped) +
                       " values lost";
  }
  ConvertReport hybrid_report;
  ConvertOptions routed;
  routed.report = &hybrid_report;
  add("Hybrid" + layout_name, [&] { return to_hybrid(act, s.layout, routed); }, "");
  rows.back().note = "exact: " + std::to_string(hybrid_report.overflow_rows) + " rows in the dense block";
  print_rows(rows, dense_bytes);
  std::printf("(errors are against the exact fp64 product; outputs are rounded to %s)\n",
              std::string(twell::to_string(dtype_of<T>)).c_str());

  // The gated FFN: sparse composed path (gate GEMM -> Hybrid, sampled up projection, sparse
  // down projection) against the dense reference, the oracle, which runs on the CPU; next to a
  // GPU it checks only the first kOracleTokens tokens, to keep the demo short.
  constexpr std::int64_t kOracleTokens = 1024;
  const std::int64_t checked = space == MemorySpace::device ? std::min(m, kOracleTokens) : m;
  const DenseMatrix<T> x = host_in.x.to(space), wg = host_in.wg.to(space), wu = host_in.wu.to(space);
  DenseMatrix<T> y_sparse(m, k, space), y_dense(checked, k);
  const ActivationSpec relu{};
  const double sparse_ms = median_ms(s.ffn_repeats, device, [&] {
    sparse_gated_ffn_forward<T>(x.view(), wg.view(), wu.view(), wd.view(), relu, s.layout, y_sparse.view());
  });
  const Device host{};
  const double dense_ms = median_ms(space == MemorySpace::device ? 1 : s.ffn_repeats, host, [&] {
    reference::gated_ffn_forward<T>(first_rows(host_in.x, checked), host_in.wg.view(), host_in.wu.view(),
                                    host_in.wd.view(), relu, y_dense.view());
  });
  const DenseMatrix<T> y_sparse_host = y_sparse.to(MemorySpace::host);
  std::printf("\ngated FFN forward, y = (relu(x Wg) * (x Wu)) Wd, M = %lld:\n", static_cast<long long>(m));
  std::printf("  sparse composed path (%s)           %10.2f ms\n", space == MemorySpace::device ? "GPU" : "CPU",
              sparse_ms);
  std::printf("  dense reference (CPU, %5lld tokens) %10.2f ms\n", static_cast<long long>(checked), dense_ms);
  const double ffn_difference = relative_difference(first_rows(y_sparse_host, checked), first_rows(y_dense, checked));
  std::printf("  relative difference ||y_sparse - y_dense|| / ||y_dense|| = %.3g (%s precision: %.3g)\n",
              ffn_difference,
              std::string(twell::to_string(dtype_of<T>)).c_str(), epsilon<T>());
  // On the GPU the layer object runs the fused path (the gate GEMM's epilogue writes TwELL, one
  // up/down kernel); on the CPU it is the composition above.
  double layer_difference = 0;
  if (space == MemorySpace::device) {
    GatedFfn<T> layer(m, wg.view(), wu.view(), wd.view(), relu, s.layout);
    DenseMatrix<T> y_layer(m, k, space);
    const double layer_ms =
        median_ms(s.ffn_repeats, device, [&] { layer.forward(x.view(), y_layer.view()); });
    layer_difference =
        relative_difference(first_rows(y_layer.to(MemorySpace::host), checked), first_rows(y_dense, checked));
    std::printf("  GatedFfn layer (GPU, fused)          %10.2f ms, relative difference %.3g (%s)\n", layer_ms,
                layer_difference, layer.path().c_str());
  }

  // One training step of the same layer on its first kTrainTokens tokens, GatedFfnTraining against
  // the dense reference backward on the CPU, with dy = the dense reference's y (the gradient of
  // 0.5 ||y||^2 at that y) and the L1 term.
  constexpr std::int64_t kTrainTokens = 256;
  constexpr float kLambda = 2e-5f;  // the paper's, per token
  const std::int64_t mt = std::min(checked, kTrainTokens);
  const DenseMatrix<T> dy = y_dense.to(space);
  DenseMatrix<T> y_step(mt, k, space), dx(mt, k, space), dwg(k, n, space), dwu(k, n, space), dwd(n, k, space);
  GatedFfnTraining<T> step(mt, k, n, space, relu, s.layout);
  double l1_sparse = 0;
  const double step_ms = median_ms(s.ffn_repeats, device, [&] {
    step.forward(first_rows(x, mt), wg.view(), wu.view(), wd.view(), y_step.view());
    l1_sparse = step.backward(first_rows(x, mt), wg.view(), wu.view(), wd.view(), first_rows(dy, mt), kLambda,
                              L1Normalization::per_token, {dx.view(), dwg.view(), dwu.view(), dwd.view()});
  });
  GatedFfnGradients<T> want;
  const double dense_step_ms = median_ms(space == MemorySpace::device ? 1 : s.ffn_repeats, host, [&] {
    want = reference::gated_ffn_backward<T>(first_rows(host_in.x, mt), host_in.wg.view(), host_in.wu.view(),
                                            host_in.wd.view(), first_rows(y_dense, mt), relu, kLambda,
                                            L1Normalization::per_token);
  });
  std::printf("\ngated FFN training step (forward + backward, loss 0.5 ||y||^2 + %g sum |h| / M), M = %lld:\n",
              static_cast<double>(kLambda), static_cast<long long>(mt));
  std::printf("  GatedFfnTraining (%s)               %10.2f ms\n", space == MemorySpace::device ? "GPU" : "CPU",
              step_ms);
  std::printf("  dense reference step (CPU)           %10.2f ms\n", dense_step_ms);
  double step_difference = 0;
  const std::pair<const char*, std::pair<const DenseMatrix<T>*, const DenseMatrix<T>*>> grads[] = {
      {"dx", {&dx, &want.dx}}, {"dwg", {&dwg, &want.dwg}}, {"dwu", {&dwu, &want.dwu}}, {"dwd", {&dwd, &want.dwd}}};
  std::printf("  relative difference to the dense gradients:");
  for (const auto& [name, pair] : grads) {
    const DenseMatrix<T> got = pair.first->to(MemorySpace::host);
    const double d = relative_difference<T>(got.view(), pair.second->view());
    step_difference = std::max(step_difference, std::isnan(d) ? INFINITY : d);
    std::printf(" %s %.3g", name, d);
  }
  std::printf("; L1 term %.6g vs %.6g\n", l1_sparse, want.l1_term);

  // The demo doubles as a smoke test: exact paths must agree with the oracles to T's precision.
  // spmm: the output's rounding to T plus fp32 accumulation over at most p.max terms; the FFN:
  // intermediates rounded to T, plus fp32 sums over K terms in different orders.
  double largest = 0;
  for (double v : exact.c) largest = std::max(largest, std::abs(v));
  const double spmm_tolerance =
      epsilon<T>() * largest + static_cast<double>(p.max) * 0x1p-24 * exact.largest_abs_sum;
  const double ffn_tolerance = 4 * epsilon<T>() + 1e-5;
  bool ok = true;
  for (const Row& r : rows)
    if (r.measured && !r.lossy && !(r.error <= spmm_tolerance)) {
      std::printf("FAILED: %s spmm error %.3g exceeds %.3g\n", r.format.c_str(), r.error, spmm_tolerance);
      ok = false;
    }
  if (!(ffn_difference <= ffn_tolerance) || !(layer_difference <= ffn_tolerance)) {
    std::printf("FAILED: the sparse FFN (composition %.3g, layer %.3g) differs from the dense reference by more "
                "than %.3g\n",
                ffn_difference, layer_difference, ffn_tolerance);
    ok = false;
  }
  // The step rounds u, h, dh, dg, du and half of dx to T on the way; in fp32 a gate entry within
  // rounding of zero may be in one side's pattern only, which moves a weight gradient by ~3e-4.
  const double step_tolerance = 4 * epsilon<T>() + 2e-3;
  const double y_step_difference =
      relative_difference(first_rows(y_step.to(MemorySpace::host), mt), first_rows(y_dense, mt));
  if (!(y_step_difference <= ffn_tolerance)) {
    std::printf("FAILED: the training forward's y differs from the dense reference by %.3g (more than %.3g)\n",
                y_step_difference, ffn_tolerance);
    ok = false;
  }
  if (!(step_difference <= step_tolerance)) {
    std::printf("FAILED: a gradient of the training step differs from the dense reference by %.3g (more than %.3g)\n",
                step_difference, step_tolerance);
    ok = false;
  }
  if (!(std::abs(l1_sparse - want.l1_term) <= step_tolerance * std::abs(want.l1_term))) {
    std::printf("FAILED: the training step's L1 term %.6g differs from the dense reference's %.6g\n", l1_sparse,
                want.l1_term);
    ok = false;
  }
  return ok ? 0 : 1;
}

}  // namespace

std::optional<DemoRequest> parse_demo(std::span<const std::string> argv) {
  const Args args(kDemoSpec, argv);
  if (args.help()) return std::nullopt;
  DemoRequest r;
  r.shape = as_usage([&] { return workload::preset(args.get("shape", "paper")); });
  r.workload.units = r.shape.intermediate;
  if (args.has("tokens")) r.tokens = args.get_int("tokens", 0, 1, std::int64_t{1} << 24);
  r.workload.density = args.get_double("density", 0.005, 0.0, 1.0);
  r.workload.distribution =
      as_usage([&] { return workload::parse_distribution(args.get("distribution", "token_skewed")); });
  r.workload.seed = static_cast<std::uint64_t>(args.get_int("seed", 1, 0, std::numeric_limits<std::int64_t>::max()));
  r.layout.tile = static_cast<std::int32_t>(args.get_int("tile", TwellLayout::kDefaultTile, 8, TwellLayout::kMaxTile));
  r.layout.compression =
      static_cast<std::int32_t>(args.get_int("compression", TwellLayout::kDefaultCompression, 1, 1 << 16));
  as_usage([&] { check_layout(r.layout, "--tile/--compression"); });
  if (args.has("repeats")) r.repeats = static_cast<int>(args.get_int("repeats", 0, 1, 1000));
  if (args.has("ffn-repeats")) r.ffn_repeats = static_cast<int>(args.get_int("ffn-repeats", 0, 1, 1000));
  r.dtype = as_usage([&] { return parse_dtype(args.get("dtype", "bf16")); });
  // tokens does not enter the check beyond its sign: the device's default can come later.
  as_usage([&] { workload::check_options(r.workload, "--density/--distribution"); });
  return r;
}

namespace {

int run_demo(std::span<const std::string> argv) {
  const std::optional<DemoRequest> request = parse_or_print_usage(parse_demo, kDemoSpec, argv);
  if (!request) return 0;
  const Device device = pick_device();
  const bool gpu = device.space == MemorySpace::device;
  Settings s;
  s.shape = request->shape;
  s.workload = request->workload;
  s.workload.tokens = request->tokens.value_or(gpu ? 16384 : 2048);
  s.layout = request->layout;
  s.repeats = request->repeats.value_or(gpu ? 20 : 3);
  s.ffn_repeats = request->ffn_repeats.value_or(gpu ? 20 : 1);

  std::printf("twell %s demo on %s\n", TWELL_VERSION, device.name.c_str());
  return dispatch_dtype(request->dtype, [&]<class T>() { return run_typed<T>(s, device); });
}

[[maybe_unused]] const bool kRegistered =
    register_command({"demo", "run a workload through every format, the sparse FFN and a training step, with timings",
                      run_demo});

}  // namespace
}  // namespace twell::cli
