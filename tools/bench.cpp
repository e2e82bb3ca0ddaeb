// `twell bench`: the benchmark suites of bench/ (DESIGN.md "Benchmark method"); JSON for
// bench/plot.py and a short table on stdout.
#include <cstdint>
#include <iostream>
#include <string>
#include <vector>

#include <twell/bench/results.hpp>
#include <twell/config.hpp>
#include <twell/memory.hpp>

#if TWELL_HAS_CUDA
#include <twell/bench/harness.hpp>
#include <twell/bench/timeline.hpp>
#endif

#include "args.hpp"
#include "cli.hpp"
#include "commands.hpp"

namespace twell::cli {

const Spec kBenchSpec{"bench",
                      "Times each twell op and its baseline in the same process on the GPU (CUDA events,\n"
                      "warm-up, median/p10/p90 of the timed runs, L2 flushed between runs) on data from the\n"
                      "workload generator, and writes every case, the device and the ceilings measured in the same\n"
                      "run (copy, GEMM, shared-memory and L2 loads, FMAs) as JSON, each sparse case with its floor\n"
                      "against those ceilings (docs/benchmarks/README.md, Method).\n"
                      "Suites: convert, spmm, sddmm, gemm_to_sparse, ffn, training (default: all).",
                      "",
                      0,
                      0,
                      {{"suite", "NAME[,NAME]", "suites to run (default all)"},
                       {"out", "FILE", "write the results as JSON (default: none)"},
                       {"quick", "", "small shapes and few repetitions: a smoke test, not a result"},
                       {"contract", "",
                        "only the contract's points (paper shape, M = 4096 and 16384 or --tokens, 0.5 %, uniform "
                        "and token-skewed): a short run while iterating, not the full sweep"},
                       {"tokens", "SMALL,LARGE",
                        "the suites' two token counts M in place of 4096 and 16384 (512 and 2048 with --quick), "
                        "SMALL < LARGE <= 131072, e.g. 6144,12288 to time the spmm kernels between the contract's "
                        "sizes; --contract then takes these M. The small M's rows are the first of the large M's "
                        "workload, as by default; the report is graded a diagnostic"},
                       {"cases", "RE",
                        "only the cases whose name \"SUITE OP VARIANT SHAPE M DISTRIBUTION DENSITY\" contains a "
                        "match of the regular expression RE (ECMAScript), e.g. 'spmm spmm (twell|cusparse_csr) "
                        "paper 16384 uniform 0.005 ': a short A/B run; the report lists those and the cases they "
                        "need"},
                       {"timeline", "FILE",
                        "a CUPTI trace of the selected cases' timed runs (kernels, copies, memsets, API calls) into "
                        "the CSV FILE, for scripts/timeline_summary.py: a diagnostic of the time between kernels "
                        "(tracing slows the host a little)"},
                       {"no-energy", "",
                        "no energy per token for the FFN cases (their loop of runs after the timed ones): for a "
                        "profiler that should see the timed runs alone"},
                       {"reps", "N", "timed runs per case (default 50, the fewest for a result; 10 with --quick)"},
                       {"warmup", "N", "untimed runs before each case (default 5; 2 with --quick)"},
                       {"seed", "S", "workload seed (default 1)"}}};

std::optional<BenchRequest> parse_bench(std::span<const std::string> argv) {
  const Args args(kBenchSpec, argv);
  if (args.help()) return std::nullopt;
  BenchRequest r;
  bench::Config& config = r.config;
  try {
    config.suites = bench::parse_suites(args.get("suite", "all"));
  } catch (const Error&) {
    throw UsageError("--suite '" + args.get("suite", "") +
                     "' names an unknown suite; choose from convert, spmm, sddmm, gemm_to_sparse, ffn, training, all");
  }
  config.quick = args.flag("quick");
  config.contract = args.flag("contract");
  config.reps = static_cast<int>(args.get_int("reps", config.quick ? 10 : 50, 1, 100000));
  config.warmup = static_cast<int>(args.get_int("warmup", config.quick ? 2 : 5, 0, 100000));
  config.seed = static_cast<std::uint64_t>(args.get_int("seed", 1, 0, INT64_MAX));
  if (args.has("tokens")) {
    const std::vector<std::int64_t> tokens = args.get_int_list("tokens", {}, 1, bench::kMaxTokens);
    if (tokens.size() != 2 || tokens[0] >= tokens[1])
      throw UsageError("--tokens '" + args.get("tokens", "") +
                       "' must be two token counts SMALL,LARGE with SMALL < LARGE");
    config.tokens_small = tokens[0];
    config.tokens_large = tokens[1];
  }
  config.cases = args.get("cases", "");
  try {
    (void)bench::CaseFilter(config.cases);
  } catch (const Error& e) {
    throw UsageError("--cases: " + std::string(e.what()));
  }
  config.timeline = args.get("timeline", "");
  config.energy = !args.flag("no-energy");
#if TWELL_HAS_CUDA
  if (!config.timeline.empty() && !bench::timeline::available())
    throw UsageError("--timeline: this build of twell bench has no CUPTI");
#endif
  r.out = args.get("out", "");
  return r;
}

namespace {

int run_bench(std::span<const std::string> argv) {
  const std::optional<BenchRequest> request = parse_or_print_usage(parse_bench, kBenchSpec, argv);
  if (!request) return 0;
  const bench::Config& config = request->config;
  const std::string& out = request->out;

  bench::Report report;
  int status = 0;
  // Without a device or a cuda backend: the report says why for each suite.
  const auto nothing_measured = [&](const std::string& why, const std::string& suite_status) {
    report.meta["error"] = why;
    report.meta["program"] = "twell bench";
    report.meta["date"] = bench::utc_now();
    for (const std::string& s : config.suites) {
      bench::Json j = bench::Json::object();
      j["status"] = "not built: " + suite_status;
      report.suites[s] = j;
    }
    std::cerr << "twell bench: nothing measured: " << why << "\n";
    status = 1;
  };
#if TWELL_HAS_CUDA
  if (cuda_available()) {
    report = bench::run_suites(config);
    bench::print_table(std::cout, report);
    if (config.quick || config.reps < bench::kResultReps)
      std::cerr << "twell bench: " << config.reps << " timed runs" << (config.quick ? ", --quick shapes" : "")
                << ": a diagnostic, not a result (DESIGN.md: the median of at least " << bench::kResultReps
                << " runs); meta.grade says so\n";
    if (!config.cases.empty() && report.cases.empty()) status = 1;  // run_suites said why
  } else {
    nothing_measured("no CUDA device is visible", "no CUDA device");
  }
#else
  nothing_measured("this build of twell has no cuda backend (configure with -DTWELL_WITH_CUDA=ON)", "no cuda backend");
#endif
  if (!out.empty()) {
    write_text_file(out, report.to_json().dump(1));
    std::cerr << "twell bench: wrote " << out << "\n";
  }
  return status;
}

[[maybe_unused]] const bool kRegistered =
    register_command({"bench", "benchmark suites on the GPU (ops against cuSPARSE/cuBLAS), JSON out", run_bench});

}  // namespace
}  // namespace twell::cli
