#include <twell/bench/results.hpp>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <ctime>
#include <ostream>
#include <sstream>

#include <twell/error.hpp>

namespace twell::bench {

const std::vector<std::string>& suite_names() {
  static const std::vector<std::string> names{"convert", "spmm", "sddmm", "gemm_to_sparse", "ffn", "training"};
  return names;
}

std::vector<std::string> parse_suites(const std::string& list) {
  if (list.empty() || list == "all") return suite_names();
  std::vector<std::string> out;
  std::size_t begin = 0;
  while (begin <= list.size()) {
    const std::size_t end = std::min(list.find(',', begin), list.size());
    const std::string name = list.substr(begin, end - begin);
    require(std::find(suite_names().begin(), suite_names().end(), name) != suite_names().end(),
            ErrorCode::invalid_argument, "twell::bench::parse_suites", "suite '", name,
            "' is not one of convert, spmm, sddmm, gemm_to_sparse, ffn, training, all");
    if (std::find(out.begin(), out.end(), name) == out.end()) out.push_back(name);
    begin = end + 1;
  }
  return out;
}

Timing summarize(std::vector<float> samples_ms) {
  Timing t;
  if (samples_ms.empty()) return t;
  std::sort(samples_ms.begin(), samples_ms.end());
  const auto at = [&](double q) {
    const auto rank = static_cast<std::size_t>(std::ceil(q * static_cast<double>(samples_ms.size())));
    return static_cast<double>(samples_ms[std::max<std::size_t>(rank, 1) - 1]);
  };
  t.median_ms = at(0.5);
  t.p10_ms = at(0.1);
  t.p90_ms = at(0.9);
  t.min_ms = samples_ms.front();
  t.reps = static_cast<int>(samples_ms.size());
  return t;
}

Json Case::to_json() const {
  Json j = Json::object();
  j["suite"] = suite;
  j["op"] = op;
  j["variant"] = variant;
  j["status"] = status;
  j["dtype"] = dtype;
  j["shape"] = shape;
  j["M"] = m;
  j["K"] = k;
  j["N"] = n;
  j["distribution"] = distribution;
  j["density_target"] = density_target;
  j["density_realized"] = density_realized;
  if (status == "ok") {
    Json ms = Json::object();
    ms["median"] = timing.median_ms;
    ms["p10"] = timing.p10_ms;
    ms["p90"] = timing.p90_ms;
    ms["min"] = timing.min_ms;
    ms["reps"] = timing.reps;
    j["ms"] = ms;
    if (bytes > 0) j["gb_per_s"] = gbps();
    if (flops > 0) j["tflop_per_s"] = tflops();
    j["bytes"] = bytes;
    j["flops"] = flops;
  }
  j["baseline"] = baseline;
  j["speedup"] = speedup > 0 ? Json(speedup) : Json();
  j["extra"] = extra;
  return j;
}

void set_floor(Case& c, const Ceilings& ceilings, const std::vector<FloorPhase>& phases) {
  struct Resource {
    const char* name;  // the phase's "bound"; its time is NAME_ms
    double FloorPhase::*amount;
    double rate_per_ms;  // amount per millisecond
    const char* ceiling;
  };
  const Resource resources[] = {
      {"dram", &FloorPhase::dram_bytes, ceilings.copy_gbps * 1e6, "device copy"},
      {"on_chip", &FloorPhase::on_chip_bytes, ceilings.shared_load_gbps * 1e6, "shared-memory load"},
      {"cuda_core", &FloorPhase::cuda_core_flops, ceilings.fma_tflops * 1e9, "fp32 FMA"},
      {"tensor", &FloorPhase::tensor_flops, ceilings.gemm_tflops * 1e9, "bf16 GEMM"}};
  Json parts = Json::array();
  double total_ms = 0;
  for (const FloorPhase& phase : phases) {
    Json part = Json::object();
    part["name"] = phase.name;
    double phase_ms = 0;
    std::string bound;
    for (const Resource& r : resources) {
      const double amount = phase.*r.amount;
      if (amount <= 0) continue;
      if (r.rate_per_ms <= 0) {
        c.extra["floor"] = std::string("unavailable: the ") + r.ceiling + " ceiling was not measured";
        return;
      }
      const double ms = amount / r.rate_per_ms;
      part[std::string(r.name) + "_ms"] = ms;
      if (ms > phase_ms) {
        phase_ms = ms;
        bound = r.name;
      }
    }
    part["ms"] = phase_ms;
    part["bound"] = bound;
    parts.push_back(part);
    total_ms += phase_ms;
  }
  Json floor = Json::object();
  floor["phases"] = parts;
  floor["ms"] = total_ms;
  if (c.status == "ok" && total_ms > 0) floor["measured_over_floor"] = c.timing.median_ms / total_ms;
  c.extra["floor"] = floor;
}

std::string case_name(const Case& c) {
  std::ostringstream name;
  name << c.suite << ' ' << c.op << ' ' << c.variant << ' ' << c.shape << ' ' << c.m << ' ' << c.distribution << ' '
       << c.density_target;
  return name.str();
}

CaseFilter::CaseFilter(const std::string& pattern) : pattern_(pattern) {
  // libstdc++'s std::regex compiles recursively, frames per character and group (tens of
  // thousands overflow the stack), and reads a repeat count or a backreference into a long
  // without an overflow check (19 digits are undefined behaviour). A case name has under 100
  // characters and no number beyond 5 digits, so neither limit refuses a useful pattern.
  constexpr std::size_t kMaxLength = 1000, kMaxDigits = 9;
  require(pattern.size() <= kMaxLength, ErrorCode::invalid_argument, "twell::bench::CaseFilter", "the pattern has ",
          pattern.size(), " characters; at most ", kMaxLength, " are accepted");
  std::size_t digits = 0;
  for (const char c : pattern) {
    digits = c >= '0' && c <= '9' ? digits + 1 : 0;
    require(digits <= kMaxDigits, ErrorCode::invalid_argument, "twell::bench::CaseFilter", "'", pattern,
            "' holds a number of more than ", kMaxDigits, " digits");
  }
  try {
    regex_ = std::regex(pattern, std::regex::ECMAScript);
  } catch (const std::regex_error& e) {
    fail(ErrorCode::invalid_argument, "twell::bench::CaseFilter", "'", pattern,
         "' is not an ECMAScript regular expression (", e.what(), ")");
  }
}

bool CaseFilter::selects(const Case& c) const { return pattern_.empty() || std::regex_search(case_name(c), regex_); }

Json Report::to_json() const {
  Json j = Json::object();
  j["meta"] = meta;
  j["device"] = device;
  j["ceilings"] = ceilings;
  j["suites"] = suites;
  Json list = Json::array();
  for (const Case& c : cases) list.push_back(c.to_json());
  j["cases"] = list;
  return j;
}

void print_table(std::ostream& os, const Report& report) {
  char line[256];
  std::snprintf(line, sizeof line, "%-15s %-26s %6s %7s %-13s %9s %12s %8s\n", "op", "variant", "M", "density", "dist",
                "ms", "rate", "speedup");
  os << line;
  for (const Case& c : report.cases) {
    if (c.status != "ok") {
      std::snprintf(line, sizeof line, "%-15s %-26s %6lld %6.2f%% %-13s  %s\n", c.op.c_str(), c.variant.c_str(),
                    static_cast<long long>(c.m), 100 * c.density_target, c.distribution.c_str(), c.status.c_str());
      os << line;
      continue;
    }
    char rate[32] = "";
    if (c.flops > 0 && c.tflops() >= 1.0)
      std::snprintf(rate, sizeof rate, "%.1f TF/s", c.tflops());
    else if (c.bytes > 0)
      std::snprintf(rate, sizeof rate, "%.0f GB/s", c.gbps());
    else if (c.flops > 0)
      std::snprintf(rate, sizeof rate, "%.2f TF/s", c.tflops());
    char speed[16] = "";
    if (c.speedup > 0) std::snprintf(speed, sizeof speed, "%.2fx", c.speedup);
    std::snprintf(line, sizeof line, "%-15s %-26s %6lld %6.2f%% %-13s %9.4f %12s %8s\n", c.op.c_str(),
                  c.variant.c_str(), static_cast<long long>(c.m), 100 * c.density_target, c.distribution.c_str(),
                  c.timing.median_ms, rate, speed);
    os << line;
  }
}

std::string utc_now() {
  const std::time_t now = std::time(nullptr);
  std::tm tm{};
  gmtime_r(&now, &tm);
  char buf[32];
  std::strftime(buf, sizeof buf, "%Y-%m-%dT%H:%M:%SZ", &tm);
  return buf;
}

}  // namespace twell::bench
