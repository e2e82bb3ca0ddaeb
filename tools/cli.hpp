// The twell program's subcommand registry: each subcommand lives in its own tools/*.cpp and
// registers itself at start-up, so adding one touches no other file.
#pragma once

#include <filesystem>
#include <optional>
#include <span>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

#include <twell/any_matrix.hpp>
#include <twell/error.hpp>
#include <twell/io.hpp>

namespace twell::cli {

struct Command {
  std::string_view name;     // what the user types: `twell <name> ...`
  std::string_view summary;  // one line for `twell --help`
  // Runs with the arguments after the name and returns the exit status. Throws UsageError for a
  // bad command line (exit 2) and twell::Error for bad input data (exit 1).
  int (*run)(std::span<const std::string> args) = nullptr;
};

// Adds a command; returns true so that a file can register from a namespace-scope initialiser:
//   [[maybe_unused]] const bool kRegistered = register_command({"demo", "...", run_demo});
bool register_command(const Command& command);

// Every registered command, sorted by name.
std::vector<Command> commands();
const Command* find_command(std::string_view name);

// A malformed command line: main prints "twell <command>: <message>" and exits with status 2.
class UsageError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// Runs a parse or a check of values from the command line (a preset name, a dtype, a layout,
// workload options): what the library refuses in them (ErrorCode::invalid_argument) is a mistake
// on the command line, so it is reported as usage, before any work is done.
template <class F>
auto as_usage(F&& parse) {
  try {
    return parse();
  } catch (const Error& e) {
    if (e.code() != ErrorCode::invalid_argument) throw;
    throw UsageError(e.what());
  }
}

// The format an output file of `type` will hold, from --to (`to`, when given): a .mtx file holds
// CSR and a .npy file dense, and --to naming another format is a usage error; a .twell file holds
// any format, --to's or else `twell_default` (none: --to is required). Throws UsageError.
Format output_format(FileType type, const std::optional<std::string>& to, std::optional<Format> twell_default);

// The reading options of validate's and stats' --dtype (`dtype`, when given): the value type a
// .mtx file is parsed into. A .npy or .twell file holds its own, so --dtype for one is refused
// rather than ignored. Throws UsageError, also for a path of no known file type.
ReadOptions read_options(const std::filesystem::path& path, const std::optional<std::string>& dtype);

// Whether a and b name the same file: the same file on disk where both exist, else the same
// absolute path once "." and ".." are resolved (an output not yet written).
bool same_file(const std::filesystem::path& a, const std::filesystem::path& b);

// Writes `text` to `path` as every output of the program is written: twell::write_file, which
// replaces the file whole or not at all (a failure throws ErrorCode::io).
void write_text_file(const std::filesystem::path& path, std::string_view text);

}  // namespace twell::cli
