#include "cli.hpp"

#include <algorithm>

namespace twell::cli {

namespace {
// A function-local static: registrations run during static initialisation of other files,
// in an order the language leaves open, so the registry must exist before the first of them.
std::vector<Command>& registry() {
  static std::vector<Command> all;
  return all;
}
}  // namespace

bool register_command(const Command& command) {
  registry().push_back(command);
  return true;
}

std::vector<Command> commands() {
  std::vector<Command> sorted = registry();
  std::sort(sorted.begin(), sorted.end(), [](const Command& a, const Command& b) { return a.name < b.name; });
  return sorted;
}

const Command* find_command(std::string_view name) {
  for (const Command& c : registry())
    if (c.name == name) return &c;
  return nullptr;
}

Format output_format(FileType type, const std::optional<std::string>& to, std::optional<Format> twell_default) {
  if (type == FileType::twell) {
    if (to) return as_usage([&] { return parse_format(*to); });
    if (!twell_default) throw UsageError("--to FORMAT is required for a .twell output");
    return *twell_default;
  }
  const Format implied = type == FileType::mtx ? Format::csr : Format::dense;
  if (!to) return implied;
  const Format asked = as_usage([&] { return parse_format(*to); });
  if (asked != implied)
    throw UsageError(detail::concat("a .", to_string(type), " file holds ", to_string(implied),
                                    " matrices; use a .twell output for --to ", to_string(asked)));
  return asked;
}

ReadOptions read_options(const std::filesystem::path& path, const std::optional<std::string>& dtype) {
  ReadOptions read;
  const FileType type = as_usage([&] { return file_type_of(path); });
  if (!dtype) return read;
  if (type != FileType::mtx)
    throw UsageError(detail::concat("--dtype has no effect: a .", to_string(type), " file holds its own value type"));
  read.dtype = as_usage([&] { return parse_dtype(*dtype); });
  return read;
}

bool same_file(const std::filesystem::path& a, const std::filesystem::path& b) {
  std::error_code ec;
  if (std::filesystem::exists(a, ec) && std::filesystem::exists(b, ec)) {
    const bool same = std::filesystem::equivalent(a, b, ec);
    if (!ec) return same;
  }
  const auto normal = [](const std::filesystem::path& p) {
    std::error_code absolute_ec;
    return std::filesystem::absolute(p, absolute_ec).lexically_normal();
  };
  return normal(a) == normal(b);
}

void write_text_file(const std::filesystem::path& path, std::string_view text) {
  write_file(path, std::as_bytes(std::span(text.data(), text.size())));
}

}  // namespace twell::cli
