// A small command-line parser for the subcommands: `--key value`, `--key=value`, flags, and
// positional arguments. Anything it does not know is a UsageError, never silently ignored.
#pragma once

#include <cstdint>
#include <map>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace twell::cli {

struct Option {
  std::string name;         // without the dashes: "tokens" for --tokens
  std::string value_name;   // shown in the usage ("M"); empty for a flag, which takes no value
  std::string help;         // one line; mention the default
};

struct Spec {
  std::string command;          // "demo"
  std::string summary;          // one or two lines under the usage line
  std::string positional;       // usage of the positional arguments, e.g. "<input> <output>"
  std::size_t min_positional = 0;
  std::size_t max_positional = 0;
  std::vector<Option> options;  // --help is always accepted and need not be listed
};

// The usage text of `twell <command> --help`.
std::string usage(const Spec& spec);

class Args {
 public:
  // Throws UsageError for an unknown option, a missing value, a value given to a flag, or a
  // wrong number of positional arguments (unless --help was given).
  Args(const Spec& spec, std::span<const std::string> argv);

  bool help() const { return help_; }
  bool has(std::string_view name) const;  // given on the command line (flags: set)
  bool flag(std::string_view name) const { return has(name); }
  std::string get(std::string_view name, std::string_view fallback) const;
  // Numbers must parse whole ("12x" is an error) and lie in [min, max].
  std::int64_t get_int(std::string_view name, std::int64_t fallback, std::int64_t min, std::int64_t max) const;
  // A comma-separated list of such integers ("64,128"), each in [min, max]; none may be empty.
  std::vector<std::int64_t> get_int_list(std::string_view name, const std::vector<std::int64_t>& fallback,
                                         std::int64_t min, std::int64_t max) const;
  double get_double(std::string_view name, double fallback, double min, double max) const;
  const std::vector<std::string>& positional() const { return positional_; }

 private:
  const Option& known(std::string_view name) const;

  const Spec* spec_;
  bool help_ = false;
  std::map<std::string, std::string, std::less<>> values_;
  std::vector<std::string> positional_;
};

}  // namespace twell::cli
