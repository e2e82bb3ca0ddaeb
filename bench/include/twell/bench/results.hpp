// Benchmark configuration, results and their JSON and table forms (host code, every build).
#pragma once

#include <cstdint>
#include <iosfwd>
#include <regex>
#include <string>
#include <vector>

#include <twell/bench/json.hpp>

namespace twell::bench {

// The suites `twell bench --suite` accepts, in the order they run.
const std::vector<std::string>& suite_names();
// Splits "a,b" and checks each name; "all" or empty selects every suite. Throws invalid_argument.
std::vector<std::string> parse_suites(const std::string& list);

// Timed runs per case below which a report is not a result (DESIGN.md: median of at least 50).
inline constexpr int kResultReps = 50;

// The most tokens --tokens takes, 8x the contract's large M. Buffers that do not fit on the
// device fail their case, or the suite where the suite allocates them; the report says which.
inline constexpr std::int64_t kMaxTokens = 131072;

struct Config {
  std::vector<std::string> suites = suite_names();
  bool quick = false;  // smaller shapes and fewer repetitions: a smoke test, not a result
  // Only the points the performance contract names (paper shape, the large M, 0.5 %, uniform and
  // token-skewed): a short run for iterating on a kernel or for the contract's figures (a result
  // at 50 runs or more); the full sweep adds the densities, shapes and M of the plots.
  bool contract = false;
  // The small and large token counts of the suites' M sweeps (--tokens, at most kMaxTokens); 0:
  // 4096 and 16384, or 512 and 2048 with quick.
  std::int64_t tokens_small = 0, tokens_large = 0;
  int reps = kResultReps;  // timed runs per case
  int warmup = 5;
  std::uint64_t seed = 1;
  // Only the cases whose case_name matches this regular expression (CaseFilter); empty: all. For
  // A/B and diagnostic runs that need a few cases, not the baselines of every point.
  std::string cases;
  // A CUPTI trace of each selected case's timed runs into this CSV (bench/include/twell/bench/
  // timeline.hpp); empty: none.
  std::string timeline;
  // Whether the FFN cases measure their energy per token (a loop of runs for 0.5 s after the
  // timed ones); off (--no-energy) where a profiler or tracer should see the timed runs alone.
  bool energy = true;
};

// Median and spread of the timed runs of one case, in milliseconds.
struct Timing {
  double median_ms = 0, p10_ms = 0, p90_ms = 0, min_ms = 0;
  int reps = 0;
};
// Nearest-rank percentiles of the samples (which it sorts).
Timing summarize(std::vector<float> samples_ms);

// One measured (or unmeasured) case. A case that did not run has status other than "ok" and
// no numbers: "not built: ..." when the twell op or baseline is missing from this build or
// reports ErrorCode::unsupported, "failed: ..." when it threw.
struct Case {
  std::string suite, op, variant;  // variant: the twell path ("twell", "hybrid", ...) or a baseline's name
  std::string status = "ok";
  std::string dtype = "bf16";
  std::string shape;  // preset name, e.g. "paper"
  std::int64_t m = 0, k = 0, n = 0;
  std::string distribution;  // empty where the data has no pattern (dense baselines keep the case's)
  double density_target = 0, density_realized = 0;
  Timing timing;
  double bytes = 0;             // bytes the op must move at least (inputs read once, outputs written once)
  double flops = 0;             // useful floating-point operations
  std::string baseline;         // the case whose median this one is compared with
  double speedup = 0;           // baseline median / this median; 0: none
  Json extra = Json::object();  // suite-specific facts (layout, path, energy, storage bytes, ...)

  double gbps() const { return timing.median_ms > 0 ? bytes / (timing.median_ms * 1e6) : 0; }
  double tflops() const { return timing.median_ms > 0 ? flops / (timing.median_ms * 1e9) : 0; }
  Json to_json() const;
};

// Rates measured once per run (Harness::measure_ceilings); 0 where one was not measured.
struct Ceilings {
  double copy_gbps = 0;         // device-to-device copy, bytes read plus bytes written
  double gemm_tflops = 0;       // cuBLAS bf16 GEMM (tensor cores)
  double shared_load_gbps = 0;  // 16-byte shared-memory loads without bank conflicts, all SMs
  double l2_load_gbps = 0;      // 16-byte loads served by L2 (L1 bypassed), all SMs
  double fma_tflops = 0;        // fp32 FMAs on CUDA cores, 2 FLOPs each
};

// One phase of the least work an op must do; phases run one after another, and a phase takes
// as long as its most demanding resource at its measured ceiling.
struct FloorPhase {
  std::string name;
  double dram_bytes = 0;       // inputs read and outputs written once, at the copy bandwidth
  double on_chip_bytes = 0;    // operand bytes loaded from shared memory, at its load rate
  double cuda_core_flops = 0;  // at the fp32 FMA rate
  double tensor_flops = 0;     // at the cuBLAS GEMM rate
};
// Sets c.extra["floor"]: each phase's time per resource in ms and the resource that bounds it,
// their sum ("ms") and the case's median over it ("measured_over_floor"); a string saying why
// where a ceiling the phases need was not measured. Call it after the case is timed.
void set_floor(Case& c, const Ceilings& ceilings, const std::vector<FloorPhase>& phases);

// A case's name: "SUITE OP VARIANT SHAPE M DISTRIBUTION DENSITY", space-separated, e.g. "spmm spmm
// twell_slice_reuse paper 16384 uniform 0.005"; also the name of the NVTX range around its runs.
std::string case_name(const Case& c);

// The cases a run times: those whose case_name contains a match of an ECMAScript regular
// expression (`twell bench --cases`); the empty pattern selects every case. A suite still lists
// the cases it does not run, with status kNotSelected, so that the cases after them keep their
// places while it runs; run_suites drops them from its report. A case whose product later cases
// of its point use runs whenever one of them is selected (detail::run_case's needed_by).
class CaseFilter {
 public:
  CaseFilter() = default;
  // invalid_argument if it is not a regular expression, or past what std::regex compiles safely
  // (1000 characters, numbers of 9 digits).
  explicit CaseFilter(const std::string& pattern);
  bool selects(const Case& c) const;
  const std::string& pattern() const { return pattern_; }

 private:
  std::string pattern_;
  std::regex regex_;
};
inline constexpr const char* kNotSelected = "not selected";

struct Report {
  CaseFilter selection;            // the cases this run times (not written out; meta records it)
  Json meta = Json::object();      // program, version, date, options
  Json device = Json::object();    // name, driver, SMs, L2, clocks as read
  Json ceilings = Json::object();  // the measured rates (Ceilings) and how each was measured
  Json suites = Json::object();    // suite name -> {"status": ..., "seconds": ...}
  std::vector<Case> cases;

  Json to_json() const;
};

// The short table printed by `twell bench`: op, variant, M, density, distribution, ms,
// GB/s or TFLOP/s, speedup over the baseline.
void print_table(std::ostream& os, const Report& report);

// Current UTC time, ISO 8601.
std::string utc_now();

}  // namespace twell::bench
