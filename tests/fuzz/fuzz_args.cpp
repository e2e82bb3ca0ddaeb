// libFuzzer target: the twell program's command line. The input is the argv after "twell", its
// words split at NUL bytes; the first names the subcommand. Two layers run on the rest: Args with
// the subcommand's option table, and parse_<command> (tools/commands.hpp), everything the
// program does before any work. Each must succeed or throw cli::UsageError (main's exit status
// 2), nothing else; what succeeds must hold what the parsers promise: integers and numbers that
// parse whole, lie in [min, max] and equal the value their text spells (and every such text is
// accepted), positional counts in the spec's range, and each request's documented bounds.
#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdlib>
#include <functional>
#include <limits>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "args.hpp"
#include "cli.hpp"
#include "commands.hpp"
#include "fuzz_common.hpp"

namespace {

using namespace twell;
using namespace twell::cli;
using Words = std::vector<std::string>;
constexpr std::int64_t kInt64Min = std::numeric_limits<std::int64_t>::min();
constexpr std::int64_t kInt64Max = std::numeric_limits<std::int64_t>::max();

// Runs f: true when it returns, false when it throws a UsageError with a message; any other
// exception is what main would report as bad data (exit 1) or not at all, so the run stops.
template <class F>
bool parses(F&& f, const char* what) {
  try {
    f();
    return true;
  } catch (const UsageError& e) {
    if (*e.what() == '\0') fuzz::die("a UsageError without a message");
    return false;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "%s: %s\n", what, e.what());
    fuzz::die("a command-line parse threw something other than UsageError");
  } catch (...) {
    std::fprintf(stderr, "%s\n", what);
    fuzz::die("a command-line parse threw a non-exception");
  }
}

void expect(bool ok, const char* what) {
  if (!ok) fuzz::die(what);
}

bool contains(const Words& words, std::string_view w) {
  return std::find(words.begin(), words.end(), w) != words.end();
}

// The integer `text` spells in decimal ('-'? digits, nothing else) when it fits int64: the
// model get_int is held to, written without from_chars.
std::optional<std::int64_t> spelled_int(std::string_view text) {
  const bool negative = !text.empty() && text.front() == '-';
  if (negative) text.remove_prefix(1);
  if (text.empty()) return std::nullopt;
  std::int64_t v = 0;  // accumulated as a negative number, which reaches INT64_MIN
  for (const char c : text) {
    if (c < '0' || c > '9') return std::nullopt;
    const int d = c - '0';
    if (v < (kInt64Min + d) / 10) return std::nullopt;
    v = v * 10 - d;
  }
  if (negative) return v;
  if (v == kInt64Min) return std::nullopt;
  return -v;
}

// strtod's reading of `text` when it reads all of it; `normal` when it did so without ERANGE and
// the value is not subnormal (from_chars may refuse those, strtod sets ERANGE for them).
std::optional<double> spelled_double(const std::string& text, bool& normal) {
  normal = false;
  if (text.empty()) return std::nullopt;
  errno = 0;
  char* end = nullptr;
  const double v = std::strtod(text.c_str(), &end);
  if (end != text.c_str() + text.size()) return std::nullopt;
  normal = errno == 0 && std::fpclassify(v) != FP_SUBNORMAL;
  return v;
}

// A decimal in the syntax from_chars reads and strtod reads alike: '-'? digits with an
// optional '.', and an optional exponent; strtod's extras (spaces, '+', hex, inf) fall outside.
bool plain_decimal(std::string_view t) {
  std::size_t i = (!t.empty() && t[0] == '-') ? 1 : 0;
  const auto skip_digits = [&] {
    const std::size_t start = i;
    while (i < t.size() && t[i] >= '0' && t[i] <= '9') ++i;
    return i - start;
  };
  std::size_t digits = skip_digits();
  if (i < t.size() && t[i] == '.') ++i;
  digits += skip_digits();
  if (digits == 0) return false;
  if (i < t.size() && (t[i] == 'e' || t[i] == 'E')) {
    ++i;
    if (i < t.size() && (t[i] == '+' || t[i] == '-')) ++i;
    if (skip_digits() == 0) return false;
  }
  return i == t.size();
}

std::optional<std::string> given(const Args& args, const std::string& name) {
  return args.has(name) ? std::optional(args.get(name, "")) : std::nullopt;
}

// get_int: the fallback when not given, else accepted exactly when the text spells an integer in
// [min, max], and then that integer.
void check_int(const Args& args, const std::string& name, std::int64_t min, std::int64_t max) {
  constexpr std::int64_t kFallback = 42;
  std::int64_t v = 0;
  const bool ok = parses([&] { v = args.get_int(name, kFallback, min, max); }, "get_int");
  const std::optional<std::string> text = given(args, name);
  if (!text) return expect(ok && v == kFallback, "get_int of an option not given did not return the fallback");
  const std::optional<std::int64_t> want = spelled_int(*text);
  expect(ok == (want && *want >= min && *want <= max),
         ok ? "get_int accepted a text that is no integer in range" : "get_int refused an integer in range");
  if (ok) expect(v == *want, "get_int returned another value than its text spells");
}

// get_int_list: one integer per comma-separated piece, each held to check_int's model.
void check_int_list(const Args& args, const std::string& name, std::int64_t min, std::int64_t max) {
  std::vector<std::int64_t> v;
  const bool ok = parses([&] { v = args.get_int_list(name, {7}, min, max); }, "get_int_list");
  const std::optional<std::string> text = given(args, name);
  if (!text) return expect(ok && v == std::vector<std::int64_t>{7}, "get_int_list did not return the fallback");
  std::vector<std::int64_t> want;
  bool all = true;
  std::string_view rest = *text;
  while (true) {
    const std::size_t comma = rest.find(',');
    const auto x = spelled_int(rest.substr(0, comma));
    all = all && x && *x >= min && *x <= max;
    want.push_back(x.value_or(0));
    if (comma == std::string_view::npos) break;
    rest.remove_prefix(comma + 1);
  }
  expect(ok == all,
         ok ? "get_int_list accepted a piece that is no integer in range" : "get_int_list refused a valid list");
  if (ok) expect(v == want, "get_int_list returned other values than its text spells");
}

// get_double: finite, in [min, max] and strtod's value of the text; a plain decimal that strtod
// reads as a normal number in range is accepted.
void check_double(const Args& args, const std::string& name, double min, double max) {
  constexpr double kFallback = 0.25;
  double v = 0;
  const bool ok = parses([&] { v = args.get_double(name, kFallback, min, max); }, "get_double");
  const std::optional<std::string> text = given(args, name);
  if (!text) return expect(ok && v == kFallback, "get_double of an option not given did not return the fallback");
  bool normal = false;
  const std::optional<double> want = spelled_double(*text, normal);
  if (ok) {
    expect(std::isfinite(v) && v >= min && v <= max, "get_double returned a value outside [min, max]");
    expect(want && *want == v, "get_double returned another value than strtod reads");
  } else {
    expect(!(plain_decimal(*text) && want && normal && *want >= min && *want <= max),
           "get_double refused a plain decimal in range");
  }
}

// Args with a subcommand's table: what it accepts is what the table and the words say.
std::optional<Args> check_args(const Spec& spec, const Words& words) {
  std::optional<Args> args;
  if (!parses([&] { args.emplace(spec, words); }, spec.command.c_str())) return std::nullopt;
  if (args->help()) expect(contains(words, "--help") || contains(words, "-h"), "help() without --help or -h");
  const std::size_t n = args->positional().size();
  if (!args->help())
    expect(n >= spec.min_positional && n <= spec.max_positional, "a positional count outside the spec's range");
  for (const std::string& p : args->positional()) expect(contains(words, p), "a positional argument not in argv");
  for (const Option& o : spec.options) {
    const std::optional<std::string> text = given(*args, o.name);
    if (!text) continue;
    if (o.value_name.empty()) {
      expect(text->empty() && contains(words, "--" + o.name), "a flag with a value, or not on the command line");
      continue;
    }
    expect(contains(words, *text) || contains(words, "--" + o.name + "=" + *text), "an option value not in argv");
    check_int(*args, o.name, kInt64Min, kInt64Max);
    check_int(*args, o.name, -1, 65536);
    check_int_list(*args, o.name, 1, TwellLayout::kMaxTile);
    check_double(*args, o.name, 0.0, 1.0);
    check_double(*args, o.name, -1e300, 1e300);
    // Ranges that end at the text's own value test the bounds themselves: [x, x] accepts it,
    // a range one step past it refuses it.
    if (const std::optional<std::int64_t> x = spelled_int(*text)) {
      check_int(*args, o.name, *x, *x);
      if (*x > kInt64Min) check_int(*args, o.name, kInt64Min, *x - 1);
      if (*x < kInt64Max) check_int(*args, o.name, *x + 1, kInt64Max);
      check_int_list(*args, o.name, *x, *x);
    }
    bool normal = false;
    if (const std::optional<double> d = spelled_double(*text, normal); d && std::isfinite(*d)) {
      constexpr double kHuge = std::numeric_limits<double>::max();
      check_double(*args, o.name, *d, *d);
      check_double(*args, o.name, -kHuge, std::nextafter(*d, -kHuge));
      check_double(*args, o.name, std::nextafter(*d, kHuge), kHuge);
    }
  }
  return args;
}

// The value a request holds for an integer option: the text's, or the default when not given.
void expect_int(const Args& args, const std::string& name, std::int64_t value, std::int64_t fallback, std::int64_t min,
                std::int64_t max) {
  const std::optional<std::string> text = given(args, name);
  if (!text) return expect(value == fallback, "a request's integer option not given is not its default");
  expect(value >= min && value <= max && spelled_int(*text) == value,
         "a request's integer option is not its text or is outside its documented range");
}

void expect_double(const Args& args, const std::string& name, double value, double fallback, double min, double max) {
  const std::optional<std::string> text = given(args, name);
  if (!text) return expect(value == fallback, "a request's number not given is not its default");
  bool normal = false;
  expect(std::isfinite(value) && value >= min && value <= max && spelled_double(*text, normal) == value,
         "a request's number is not its text or is outside its documented range");
}

template <class F>
void expect_accepts(F&& f, const char* what) {
  try {
    f();
  } catch (const Error& e) {
    std::fprintf(stderr, "%s\n", e.what());
    fuzz::die(what);
  }
}

bool valid_dtype(DType t) { return t == DType::bf16 || t == DType::fp16 || t == DType::fp32; }

void check_shape(const workload::FfnShape& shape) {
  const auto all = workload::presets();
  expect(std::any_of(all.begin(), all.end(),
                     [&](const workload::FfnShape& s) {
                       return s.name == shape.name && s.hidden == shape.hidden && s.intermediate == shape.intermediate;
                     }),
         "a shape that is no preset");
}

// The format a file of `path`'s type holds (mtx: csr, npy: dense), or `twell` for a .twell file.
Format implied_format(const std::string& path, Format twell) {
  switch (file_type_of(path)) {
    case FileType::mtx:
      return Format::csr;
    case FileType::npy:
      return Format::dense;
    case FileType::twell:
      return twell;
  }
  return twell;
}

void check_request(const Args& a, const DemoRequest& r) {
  check_shape(r.shape);
  expect(r.workload.units == r.shape.intermediate, "demo: units are not the shape's intermediate size");
  expect(r.tokens.has_value() == a.has("tokens"), "demo: tokens set without --tokens");
  if (r.tokens) expect_int(a, "tokens", *r.tokens, 0, 1, std::int64_t{1} << 24);
  expect_double(a, "density", r.workload.density, 0.005, 0.0, 1.0);
  expect_int(a, "seed", static_cast<std::int64_t>(r.workload.seed), 1, 0, kInt64Max);
  expect_int(a, "tile", r.layout.tile, TwellLayout::kDefaultTile, 8, TwellLayout::kMaxTile);
  expect_int(a, "compression", r.layout.compression, TwellLayout::kDefaultCompression, 1, 1 << 16);
  for (const auto& [name, value] : {std::pair{"repeats", r.repeats}, std::pair{"ffn-repeats", r.ffn_repeats}}) {
    expect(value.has_value() == a.has(name), "demo: repeats set without the option");
    if (value) expect_int(a, name, *value, 0, 1, 1000);
  }
  expect(valid_dtype(r.dtype), "demo: an invalid dtype");
  expect_accepts([&] { check_layout(r.layout, "fuzz_args"); }, "demo: a layout that check_layout refuses");
  expect_accepts([&] { workload::check_options(r.workload, "fuzz_args"); }, "demo: workload options refused");
}

void check_request(const Args& a, const GenerateRequest& r) {
  expect(a.positional().size() == 1 && r.out == a.positional()[0], "generate: the output is not the positional");
  expect_int(a, "tokens", r.workload.tokens, 16384, 1, std::int64_t{1} << 24);
  expect_double(a, "density", r.workload.density, 0.005, 0.0, 1.0);
  expect_double(a, "dead-fraction", r.workload.dead_fraction, workload::ActivationOptions{}.dead_fraction, 0.0, 1.0);
  expect_int(a, "seed", static_cast<std::int64_t>(r.workload.seed), 1, 0, kInt64Max);
  expect(valid_dtype(r.dtype), "generate: an invalid dtype");
  expect_accepts(
      [&] {
        const Format twell = a.has("to") ? parse_format(a.get("to", "")) : Format::dense;
        expect(r.format == implied_format(r.out, twell), "generate: a format the output's file type does not hold");
      },
      "generate: an output with an unknown extension or format");
  expect_accepts([&] { workload::check_options(r.workload, "fuzz_args"); }, "generate: workload options refused");
}

void check_request(const Args& a, const ConvertRequest& r) {
  expect(a.positional().size() == 2 && r.in == a.positional()[0] && r.out == a.positional()[1],
         "convert: input and output are not the positionals");
  expect(r.dtype.has_value() == a.has("dtype") && (!r.dtype || (valid_dtype(*r.dtype) && r.read.dtype == *r.dtype)),
         "convert: --dtype not kept");
  expect_accepts(
      [&] {
        (void)file_type_of(r.in);
        Format twell = a.has("to") ? parse_format(a.get("to", "")) : Format::csr;
        if (twell == Format::twell && r.options.overflow == OverflowPolicy::hybrid) twell = Format::hybrid;
        expect(a.has("to") || file_type_of(r.out) != FileType::twell, "convert: a .twell output without --to");
        expect(r.to == implied_format(r.out, twell), "convert: a format the output's file type does not hold");
        check_layout(r.layout, "fuzz_args");
        check_convert_options(r.options, "fuzz_args");
      },
      "convert: a request the library refuses");
  expect_int(a, "tile", r.layout.tile, TwellLayout::kDefaultTile, 8, TwellLayout::kMaxTile);
  expect_int(a, "compression", r.layout.compression, TwellLayout::kDefaultCompression, 1, 65536);
  expect_int(a, "ell-width", r.options.ell_width, -1, -1, std::numeric_limits<std::int32_t>::max());
  expect(!a.has("ell-width") || r.to == Format::ell, "convert: --ell-width accepted for an output that is not ELL");
  const std::optional<std::string> threshold = given(a, "threshold");
  bool normal = false;
  const std::optional<double> t = threshold ? spelled_double(*threshold, normal) : std::optional(0.0);
  expect(t && *t >= 0.0 && *t <= 3.4e38 && r.options.threshold == static_cast<float>(*t) &&
             std::isfinite(r.options.threshold),
         "convert: a threshold that is not its text or not a finite float in [0, 3.4e38]");
  expect(r.options.report == nullptr && r.quiet == a.has("quiet"), "convert: report or quiet not as given");
}

void check_request(const Args& a, const StatsRequest& r) {
  expect(a.positional().size() == 1 && r.path == a.positional()[0], "stats: the file is not the positional");
  expect(valid_dtype(r.read.dtype), "stats: an invalid dtype");
  expect_int(a, "tile", r.options.default_layout.tile, 256, 8, TwellLayout::kMaxTile);
  for (const auto* list : {&r.options.tiles, &r.options.compressions}) {
    expect(!list->empty(), "stats: an empty candidate list");
    for (std::size_t i = 0; i < list->size(); ++i) {
      expect((*list)[i] >= 1 && (*list)[i] <= TwellLayout::kMaxTile, "stats: a candidate outside [1, kMaxTile]");
      expect(std::find(list->begin(), list->begin() + static_cast<std::ptrdiff_t>(i), (*list)[i]) ==
                 list->begin() + static_cast<std::ptrdiff_t>(i),
             "stats: a candidate listed twice");
    }
  }
  expect_accepts([&] { check_stats_options(r.options, "fuzz_args"); }, "stats: options check_stats_options refuses");
  expect(r.json == given(a, "json") && r.png == given(a, "png"), "stats: --json or --png not as given");
}

void check_request(const Args& a, const ValidateRequest& r) {
  expect(a.positional().size() == 1 && r.path == a.positional()[0], "validate: the file is not the positional");
  expect(valid_dtype(r.read.dtype), "validate: an invalid dtype");
  expect_accepts([&] { (void)file_type_of(r.path); }, "validate: a file type the readers do not know");
}

void check_request(const Args& a, const BenchRequest& r) {
  const bench::Config& c = r.config;
  const auto& known = bench::suite_names();
  expect(!c.suites.empty(), "bench: no suite");
  for (std::size_t i = 0; i < c.suites.size(); ++i) {
    expect(std::find(known.begin(), known.end(), c.suites[i]) != known.end(), "bench: an unknown suite");
    expect(std::count(c.suites.begin(), c.suites.end(), c.suites[i]) == 1, "bench: a suite listed twice");
  }
  expect(c.quick == a.has("quick") && c.contract == a.has("contract"), "bench: a flag not as given");
  expect_int(a, "reps", c.reps, c.quick ? 10 : 50, 1, 100000);
  expect_int(a, "warmup", c.warmup, c.quick ? 2 : 5, 0, 100000);
  expect_int(a, "seed", static_cast<std::int64_t>(c.seed), 1, 0, kInt64Max);
  expect(c.cases == a.get("cases", "") && r.out == a.get("out", ""), "bench: --cases or --out not as given");
  expect_accepts([&] { (void)bench::CaseFilter(c.cases); }, "bench: --cases that CaseFilter refuses");
  if (a.has("tokens")) {
    const std::vector<std::int64_t> tokens = a.get_int_list("tokens", {}, 1, bench::kMaxTokens);
    expect(tokens.size() == 2 && tokens[0] < tokens[1] && c.tokens_small == tokens[0] && c.tokens_large == tokens[1],
           "bench: --tokens not as given");
  } else {
    expect(c.tokens_small == 0 && c.tokens_large == 0, "bench: token counts without --tokens");
  }
}

// One subcommand: Args with its table, then its whole parse, which must agree with Args on
// whether the words are well-formed and on --help.
template <class Parse>
void check_command(const Spec& spec, Parse&& parse, const Words& words) {
  const std::optional<Args> args = check_args(spec, words);
  decltype(parse(words)) request;
  const bool ok = parses([&] { request = parse(words); }, spec.command.c_str());
  if (!args) return expect(!ok, "a parse accepted words that Args refuses");
  if (!ok) return;
  expect(request.has_value() != args->help(), "a parse and Args disagree on --help");
  if (request) check_request(*args, *request);
}

struct Entry {
  std::string_view name;
  std::function<void(const Words&)> check;
};

const std::vector<Entry>& entries() {
  static const std::vector<Entry> all = {
      {"bench", [](const Words& w) { check_command(kBenchSpec, parse_bench, w); }},
      {"convert", [](const Words& w) { check_command(kConvertSpec, parse_convert, w); }},
      {"demo", [](const Words& w) { check_command(kDemoSpec, parse_demo, w); }},
      {"generate", [](const Words& w) { check_command(kGenerateSpec, parse_generate, w); }},
      {"stats", [](const Words& w) { check_command(kStatsSpec, parse_stats, w); }},
      {"validate", [](const Words& w) { check_command(kValidateSpec, parse_validate, w); }},
  };
  return all;
}

}  // namespace

// The table above and the program's registry must name the same subcommands: a renamed or new
// one would otherwise go unfuzzed.
extern "C" int LLVMFuzzerInitialize(int*, char***) {
  const std::vector<Command> registered = commands();
  expect(registered.size() == entries().size(), "fuzz_args does not cover every registered subcommand");
  for (const Entry& e : entries())
    expect(find_command(e.name) != nullptr, "fuzz_args names a subcommand that is not registered");
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  Words words;
  std::string word;
  for (std::size_t i = 0; i < size; ++i) {
    if (data[i] == 0) {
      words.push_back(std::move(word));
      word.clear();
    } else {
      word.push_back(static_cast<char>(data[i]));
    }
  }
  words.push_back(std::move(word));
  const std::string name = words.front();
  words.erase(words.begin());
  for (const Entry& e : entries())
    if (e.name == name) e.check(words);
  return 0;
}
