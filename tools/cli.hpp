// The twell program's subcommand registry: each subcommand lives in its own tools/*.cpp and
// registers itself at start-up, so adding one touches no other file.
#pragma once

#include <span>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

#include <twell/error.hpp>

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

}  // namespace twell::cli
