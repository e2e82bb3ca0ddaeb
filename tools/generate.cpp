// `twell generate OUT [--shape ... --tokens M --density D --distribution ... --dtype ... --seed S]`:
// writes a workload-generator activation matrix to a file (.npy, .mtx or .twell by extension),
// so that `twell stats`, `convert` and outside tools can look at realistic sparse activations.
#include <cstdio>
#include <limits>

#include <twell/any_matrix.hpp>
#include <twell/io.hpp>
#include <twell/workload.hpp>

#include "args.hpp"
#include "cli.hpp"
#include "commands.hpp"

namespace twell::cli {

const Spec kGenerateSpec{
    .command = "generate",
    .summary = "Writes M x N sparse activations from the workload generator (N = the shape's intermediate\n"
               "size) as a dense .npy, a CSR .mtx, or a .twell container (dense for --to dense, else the\n"
               "format named by --to).",
    .positional = "<output>",
    .min_positional = 1,
    .max_positional = 1,
    .options = {
        {"shape", "NAME", "FFN shape: paper (2048 x 5632, default), llama7b (4096 x 11008), small (1024 x 2816)"},
        {"tokens", "M", "tokens (rows); default 16384"},
        {"density", "D", "target mean density, in [0, 1]; default 0.005"},
        {"distribution", "NAME", "uniform, neuron_skewed or token_skewed (default)"},
        {"dead-fraction", "F", "share of units that never fire (skewed distributions); default 0.3"},
        {"dtype", "TYPE", "bf16 (default), fp16 or fp32"},
        {"seed", "S", "workload seed; default 1"},
        {"to", "FORMAT", "format in a .twell file: dense (default), csr, ell, twell or hybrid (.mtx: csr,"
                         " .npy: dense)"},
    }};

std::optional<GenerateRequest> parse_generate(std::span<const std::string> argv) {
  const Args args(kGenerateSpec, argv);
  if (args.help()) return std::nullopt;
  GenerateRequest r;
  workload::ActivationOptions& w = r.workload;
  w.units = as_usage([&] { return workload::preset(args.get("shape", "paper")); }).intermediate;
  w.tokens = args.get_int("tokens", 16384, 1, std::int64_t{1} << 24);
  w.density = args.get_double("density", 0.005, 0.0, 1.0);
  w.distribution = as_usage([&] { return workload::parse_distribution(args.get("distribution", "token_skewed")); });
  w.dead_fraction = args.get_double("dead-fraction", w.dead_fraction, 0.0, 1.0);
  // Like convert's --ell-width, an option that would go unused is refused rather than ignored.
  if (w.distribution == workload::Distribution::uniform && args.has("dead-fraction"))
    throw UsageError("--dead-fraction has no effect with --distribution uniform: every unit may fire");
  w.seed = static_cast<std::uint64_t>(args.get_int("seed", 1, 0, std::numeric_limits<std::int64_t>::max()));
  r.dtype = as_usage([&] { return parse_dtype(args.get("dtype", "bf16")); });
  r.out = args.positional()[0];
  r.format = output_format(as_usage([&] { return file_type_of(r.out); }),
                           args.has("to") ? std::optional(args.get("to", "")) : std::nullopt, Format::dense);
  as_usage([&] { workload::check_options(w, "--density/--distribution/--dead-fraction"); });
  return r;
}

namespace {

int run_generate(std::span<const std::string> argv) {
  const std::optional<GenerateRequest> request = parse_or_print_usage(parse_generate, kGenerateSpec, argv);
  if (!request) return 0;
  const workload::ActivationOptions& w = request->workload;
  const DType dtype = request->dtype;
  const std::string& out = request->out;
  const Format format = request->format;

  AnyMatrix m = dispatch_dtype(dtype, [&]<class T>() { return AnyMatrix(workload::activations<T>(w)); });
  if (format != Format::dense) m = convert(m, format);
  write_matrix(out, m);
  std::printf("twell generate: wrote %lld x %lld %s %s to %s\n", static_cast<long long>(w.tokens),
              static_cast<long long>(w.units), std::string(to_string(dtype)).c_str(),
              std::string(to_string(format)).c_str(), out.c_str());
  return 0;
}

[[maybe_unused]] const bool kRegistered =
    register_command({"generate", "write workload-generator activations to a file (.npy, .mtx, .twell)", run_generate});

}  // namespace
}  // namespace twell::cli
