#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <string>

#include <twell/bench/harness.hpp>
#include <twell/bench/timeline.hpp>
#include <twell/config.hpp>

#include "common.hpp"

namespace twell::bench {

Report run_suites(const Config& config) {
  Report report;
  report.meta["program"] = "twell bench";
  report.meta["version"] = TWELL_VERSION;
  report.meta["date"] = utc_now();
  report.meta["quick"] = config.quick;
  report.meta["contract_points_only"] = config.contract;
  report.meta["reps"] = config.reps;
  Json tokens = Json::array();  // the suites' small and large M
  tokens.push_back(detail::tokens_small(config));
  tokens.push_back(detail::tokens_large(config));
  report.meta["tokens"] = tokens;
  // DESIGN.md: a result is the median of at least 50 timed runs at the full shapes; fewer runs (an
  // A/B or diagnostic call on a lent GPU) are labelled so that no one quotes them as one.
  // Other M (--tokens) are measurements, not the contract's points: the summary's contract table
  // would otherwise show them under the contract's names.
  if (config.tokens_small > 0)
    report.meta["grade"] = "diagnostic: --tokens " + std::to_string(config.tokens_small) + "," +
                           std::to_string(config.tokens_large) + ", not the contract's M";
  else
    report.meta["grade"] = !config.quick && config.reps >= kResultReps
                               ? "result"
                               : "diagnostic: fewer than 50 timed runs or --quick shapes, not a result (DESIGN.md)";
  // The commit the binary was built from, when the caller says (scripts/gpu-check.sh sets it from
  // git): the bench cannot know which tree a copied working tree came from.
  const char* commit = std::getenv("TWELL_SOURCE_COMMIT");
  report.meta["source_commit"] = commit != nullptr && *commit != '\0' ? commit : "unknown";
  report.meta["warmup"] = config.warmup;
  report.meta["seed"] = static_cast<std::int64_t>(config.seed);
  report.selection = CaseFilter(config.cases);
  if (!config.cases.empty()) report.meta["cases"] = config.cases;
  report.meta["dtype"] = "bf16";
  report.meta["method"] =
      "CUDA events around each run; warm-up first; median, p10, p90 of the timed runs; a buffer of twice the L2 "
      "size written between runs so no run reads its inputs from the cache; speedup = baseline median / median, "
      "both timed in this process";

  Harness h(config);
  // Closed on every way out, before the harness (and its stream) goes.
  struct TimelineFile {
    TimelineFile(const std::string& path, std::size_t flush_bytes) {
      if (!path.empty()) timeline::open(path, flush_bytes);
    }
    ~TimelineFile() { timeline::close(); }
    TimelineFile(const TimelineFile&) = delete;
    TimelineFile& operator=(const TimelineFile&) = delete;
  } const trace(config.timeline, h.flush_bytes());
  if (!config.timeline.empty()) report.meta["timeline"] = config.timeline;
  report.device = h.device_info();
  std::fprintf(stderr, "twell bench: %s\n", report.device["name"].dump(0).c_str());
  try {
    report.ceilings = h.measure_ceilings();
    const Ceilings& c = h.ceilings();
    std::fprintf(stderr,
                 "twell bench: ceilings: copy %.0f GB/s, bf16 GEMM %.0f TFLOP/s, shared-memory loads %.0f GB/s, L2 "
                 "loads %.0f GB/s, fp32 FMA %.1f TFLOP/s\n",
                 c.copy_gbps, c.gemm_tflops, c.shared_load_gbps, c.l2_load_gbps, c.fma_tflops);
  } catch (const std::exception& e) {
    report.ceilings["status"] = std::string("failed: ") + e.what();
  }

  using SuiteFn = void (*)(Harness&, Report&);
  const std::pair<const char*, SuiteFn> suites[] = {{"convert", run_convert},
                                                    {"spmm", run_spmm},
                                                    {"sddmm", run_sddmm},
                                                    {"gemm_to_sparse", run_gemm_to_sparse},
                                                    {"ffn", run_ffn},
                                                    {"training", run_training}};
  bool all_ran = true;
  for (const auto& [name, fn] : suites) {
    bool selected = false;
    for (const auto& s : config.suites) selected = selected || s == name;
    if (!selected) continue;
    const auto t0 = std::chrono::steady_clock::now();
    const std::size_t before = report.cases.size();
    Json status = Json::object();
    try {
      fn(h, report);
      status["status"] = "ran";
    } catch (const std::exception& e) {
      status["status"] = std::string("failed: ") + e.what();
      all_ran = false;
    }
    const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    std::size_t ok = 0, listed = 0;
    for (std::size_t i = before; i < report.cases.size(); ++i) {
      ok += report.cases[i].status == "ok" ? 1 : 0;
      listed += report.cases[i].status != kNotSelected ? 1 : 0;
    }
    status["seconds"] = seconds;
    status["cases"] = static_cast<std::int64_t>(listed);
    status["cases_ok"] = static_cast<std::int64_t>(ok);
    if (listed < report.cases.size() - before)
      status["cases_not_selected"] = static_cast<std::int64_t>(report.cases.size() - before - listed);
    report.suites[name] = status;
    std::fprintf(stderr, "twell bench: suite %s: %zu cases, %zu ok, %.1f s\n", name, listed, ok, seconds);
  }
  // The cases that --cases left out held their places while the suites ran; the report lists the
  // selected ones (meta.cases and each suite's cases_not_selected say what was left out).
  std::erase_if(report.cases, [](const Case& c) { return c.status == kNotSelected; });
  if (!config.cases.empty() && report.cases.empty() && all_ran) {
    // Most likely a misspelt name: say how names look.
    const std::string why = "--cases '" + config.cases +
                            "' selected no case of these suites (names look like \"spmm spmm twell paper 16384 "
                            "uniform 0.005\"; densities as C++ prints them: 0.005, 0.1)";
    report.meta["error"] = why;
    std::fprintf(stderr, "twell bench: %s\n", why.c_str());
  }
  detail::clear_caches();
  return report;
}

}  // namespace twell::bench
