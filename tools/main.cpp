// twell: the command-line program. Dispatches to the registered subcommands (tools/cli.hpp).
// Exit status: 0 success, 1 bad input data or a failed operation (twell::Error), 2 bad usage.
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <exception>
#include <iostream>
#include <string>
#include <vector>

#include <twell/config.hpp>
#include <twell/error.hpp>
#include <twell/memory.hpp>

#include "cli.hpp"

namespace {

void print_help(std::ostream& os) {
  os << "usage: twell <command> [options]\n\n"
        "Sparse activations for transformer models: TwELL, Hybrid, CSR and ELL formats,\n"
        "conversions, validation and sparse products on the CPU";
#if TWELL_HAS_CUDA
  os << " and the GPU";
#endif
  os << ".\n\ncommands:\n";
  std::size_t width = 0;
  for (const auto& c : twell::cli::commands()) width = std::max(width, c.name.size());
  for (const auto& c : twell::cli::commands())
    os << "  " << c.name << std::string(width + 2 - c.name.size(), ' ') << c.summary << "\n";
  os << "\n`twell <command> --help` describes a command's options.\n";
}

// Runs the command line; the exit status.
int run(const std::vector<std::string>& args) {
  if (args.empty()) {
    print_help(std::cerr);
    return 2;
  }
  const std::string& name = args.front();
  if (name == "--help" || name == "-h" || name == "help") {
    print_help(std::cout);
    return 0;
  }
  if (name == "--version") {
    std::cout << "twell " << TWELL_VERSION << (twell::cuda_available() ? " (cuda backend, device visible)" : "")
              << "\n";
    return 0;
  }
  const twell::cli::Command* command = twell::cli::find_command(name);
  if (command == nullptr) {
    std::cerr << "twell: unknown command '" << name << "' (see twell --help)\n";
    return 2;
  }
  try {
    return command->run(std::span<const std::string>(args).subspan(1));
  } catch (const twell::cli::UsageError& e) {
    std::cerr << "twell " << name << ": " << e.what() << "\n";
    return 2;
  } catch (const twell::Error& e) {
    std::cerr << "twell " << name << ": error (" << twell::to_string(e.code()) << "): " << e.what() << "\n";
    return 1;
  } catch (const std::exception& e) {
    std::cerr << "twell " << name << ": error: " << e.what() << "\n";
    return 1;
  }
}

}  // namespace

int main(int argc, char** argv) {
  const std::vector<std::string> args(argv + 1, argv + argc);
  const int status = run(args);
  // Output lost on a full disk or a closed file is a failure: a report cut short must not exit 0.
  // (std::cout shares stdout's buffer; `generate` also writes with printf.)
  errno = 0;
  std::cout.flush();
  const bool written = std::fflush(stdout) == 0 && std::cout && std::ferror(stdout) == 0;
  const int err = errno;  // of these flushes; 0 when only ferror kept an earlier failure
  if (written) return status;
  std::cerr << "twell" << (args.empty() ? "" : " " + args.front()) << ": error writing standard output"
            << (err != 0 ? std::string(": ") + std::strerror(err) : std::string()) << "\n";
  return status == 0 ? 1 : status;
}
