#include "args.hpp"

#include <charconv>
#include <cmath>
#include <sstream>

#include "cli.hpp"

namespace twell::cli {

namespace {
std::string dashed(std::string_view name) { return "--" + std::string(name); }

// One integer option value, parsed whole and range-checked; errors name the option.
std::int64_t parse_int(std::string_view name, std::string_view text, std::int64_t min, std::int64_t max) {
  std::int64_t v = 0;
  const auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), v);
  if (ec != std::errc() || end != text.data() + text.size() || text.empty())
    throw UsageError(dashed(name) + " expects an integer, got '" + std::string(text) + "'");
  if (v < min || v > max)
    throw UsageError(dashed(name) + " = " + std::string(text) + " is outside [" + std::to_string(min) + ", " +
                     std::to_string(max) + "]");
  return v;
}
}  // namespace

std::string usage(const Spec& spec) {
  std::ostringstream os;
  os << "usage: twell " << spec.command;
  if (!spec.options.empty()) os << " [options]";
  if (!spec.positional.empty()) os << ' ' << spec.positional;
  os << "\n\n" << spec.summary << "\n";
  std::size_t width = std::string("--help").size();
  for (const Option& o : spec.options)
    width = std::max(width, o.name.size() + 2 + (o.value_name.empty() ? 0 : o.value_name.size() + 1));
  auto line = [&](const std::string& left, const std::string& help) {
    os << "  " << left << std::string(width + 2 - left.size(), ' ') << help << "\n";
  };
  os << "\noptions:\n";
  for (const Option& o : spec.options) line("--" + o.name + (o.value_name.empty() ? "" : " " + o.value_name), o.help);
  line("--help", "show this help and exit");
  return os.str();
}

Args::Args(const Spec& spec, std::span<const std::string> argv) : spec_(&spec) {
  for (std::size_t i = 0; i < argv.size(); ++i) {
    const std::string& arg = argv[i];
    if (arg == "--help" || arg == "-h") {
      help_ = true;
      continue;
    }
    if (arg.size() < 3 || arg.rfind("--", 0) != 0) {
      if (arg.size() > 1 && arg[0] == '-') throw UsageError("unknown option '" + arg + "' (see --help)");
      positional_.push_back(arg);
      continue;
    }
    const std::size_t eq = arg.find('=');
    const std::string name = arg.substr(2, eq == std::string::npos ? std::string::npos : eq - 2);
    const Option& option = known(name);
    if (values_.contains(name)) throw UsageError("option --" + name + " given twice");
    if (option.value_name.empty()) {
      if (eq != std::string::npos) throw UsageError("option --" + name + " is a flag and takes no value");
      values_[name] = "";
    } else if (eq != std::string::npos) {
      values_[name] = arg.substr(eq + 1);
    } else {
      if (i + 1 == argv.size()) throw UsageError("option --" + name + " needs a value " + option.value_name);
      values_[name] = argv[++i];
    }
  }
  if (help_) return;
  if (positional_.size() < spec.min_positional || positional_.size() > spec.max_positional) {
    std::ostringstream os;
    os << "expected " << spec.min_positional;
    if (spec.max_positional != spec.min_positional) os << " to " << spec.max_positional;
    os << " positional argument" << (spec.max_positional == 1 ? "" : "s");
    if (!spec.positional.empty()) os << " (" << spec.positional << ")";
    os << ", got " << positional_.size() << " (see --help)";
    throw UsageError(os.str());
  }
}

const Option& Args::known(std::string_view name) const {
  for (const Option& o : spec_->options)
    if (o.name == name) return o;
  throw UsageError("unknown option '--" + std::string(name) + "' (see --help)");
}

bool Args::has(std::string_view name) const {
  known(name);
  return values_.contains(name);
}

std::string Args::get(std::string_view name, std::string_view fallback) const {
  known(name);
  const auto it = values_.find(name);
  return it == values_.end() ? std::string(fallback) : it->second;
}

std::int64_t Args::get_int(std::string_view name, std::int64_t fallback, std::int64_t min, std::int64_t max) const {
  const auto it = values_.find(name);
  known(name);
  if (it == values_.end()) return fallback;
  return parse_int(name, it->second, min, max);
}

std::vector<std::int64_t> Args::get_int_list(std::string_view name, const std::vector<std::int64_t>& fallback,
                                             std::int64_t min, std::int64_t max) const {
  const auto it = values_.find(name);
  known(name);
  if (it == values_.end()) return fallback;
  std::vector<std::int64_t> out;
  std::string_view rest = it->second;
  while (true) {
    const std::size_t comma = rest.find(',');
    out.push_back(parse_int(name, rest.substr(0, comma), min, max));
    if (comma == std::string_view::npos) return out;
    rest.remove_prefix(comma + 1);
  }
}

double Args::get_double(std::string_view name, double fallback, double min, double max) const {
  const auto it = values_.find(name);
  known(name);
  if (it == values_.end()) return fallback;
  const std::string& text = it->second;
  double v = 0;
  const auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), v);
  if (ec != std::errc() || end != text.data() + text.size() || text.empty() || !std::isfinite(v))
    throw UsageError(dashed(name) + " expects a number, got '" + text + "'");
  if (v < min || v > max) {
    std::ostringstream os;
    os << dashed(name) << " = " << text << " is outside [" << min << ", " << max << "]";
    throw UsageError(os.str());
  }
  return v;
}

}  // namespace twell::cli
