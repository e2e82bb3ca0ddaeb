// `twell validate FILE`: reads a .mtx, .npy or .twell file, which checks every invariant of its
// format (the readers run twell::validate), and says whether it holds.
#include <iostream>

#include <twell/io.hpp>

#include "args.hpp"
#include "cli.hpp"
#include "commands.hpp"
#include "progress.hpp"

namespace twell::cli {

const Spec kValidateSpec{"validate",
                         "Reads a matrix file and checks every invariant of its format: exit status 0 when it\n"
                         "is valid, 1 when it is not, with the first violation and its byte offset or coordinates,\n"
                         "or when it cannot be checked (a reader's memory limit).",
                         "<file.mtx|file.npy|file.twell>",
                         1,
                         1,
                         {{"dtype", "bf16|fp16|fp32", "value type for a .mtx file only (default fp32)"}}};

std::optional<ValidateRequest> parse_validate(std::span<const std::string> argv) {
  const Args args(kValidateSpec, argv);
  if (args.help()) return std::nullopt;
  ValidateRequest r;
  r.path = args.positional()[0];
  r.read = read_options(r.path, args.has("dtype") ? std::optional(args.get("dtype", "")) : std::nullopt);
  return r;
}

namespace {

int run_validate(std::span<const std::string> argv) {
  const std::optional<ValidateRequest> request = parse_or_print_usage(parse_validate, kValidateSpec, argv);
  if (!request) return 0;
  const std::string& path = request->path;
  const ReadOptions& options = request->read;
  Progress progress(1);
  progress.step("reading and validating");
  try {
    const AnyMatrix m = read_matrix(path, options);
    progress.clear();
    std::cout << path << ": valid " << to_string(format(m)) << " " << to_string(dtype(m)) << " matrix, " << rows(m)
              << " x " << cols(m) << "\n";
    return 0;
  } catch (const Error& e) {
    progress.clear();
    // A reader's limit (ReadOptions::max_implicit_bytes) or the machine's memory says nothing of
    // the file: a valid 50M-row matrix of one entry is not "invalid".
    const bool unchecked = e.code() == ErrorCode::out_of_memory;
    std::cout << path << (unchecked ? ": cannot check (" : ": invalid (") << to_string(e.code()) << "): " << e.what()
              << "\n";
    return 1;
  }
}

[[maybe_unused]] const bool kRegistered =
    register_command({"validate", "check a .mtx/.npy/.twell file against its format's invariants", run_validate});

}  // namespace
}  // namespace twell::cli
