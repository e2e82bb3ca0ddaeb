// What each subcommand takes from its command line: parse_<command> reads and checks the whole
// command line and does no work (no file is opened, nothing is generated or timed); run_<command>
// calls it, and so does the fuzz target tests/fuzz/fuzz_args.cpp. Each parse throws UsageError
// for a bad command line and returns std::nullopt for --help (the caller prints usage(spec)).
#pragma once

#include <cstdint>
#include <iostream>
#include <optional>
#include <span>
#include <string>

#include <twell/any_matrix.hpp>
#include <twell/bench/results.hpp>
#include <twell/convert.hpp>
#include <twell/io.hpp>
#include <twell/stats.hpp>
#include <twell/workload.hpp>

#include "args.hpp"

namespace twell::cli {

extern const Spec kBenchSpec;
struct BenchRequest {
  bench::Config config;  // suites, reps in [1, 100000], warmup in [0, 100000], a compiled --cases
  std::string out;       // empty: no JSON
};
std::optional<BenchRequest> parse_bench(std::span<const std::string> argv);

extern const Spec kConvertSpec;
struct ConvertRequest {
  std::string in, out;         // both with a known extension
  Format to = Format::csr;     // hybrid when --to twell --overflow hybrid
  std::optional<DType> dtype;  // --dtype: round the values to it (and read a .mtx as it)
  ReadOptions read;
  TwellLayout layout;      // passes check_layout
  ConvertOptions options;  // threshold in [0, 3.4e38], ell_width in [-1, INT32_MAX]; report unset
  bool quiet = false;
};
std::optional<ConvertRequest> parse_convert(std::span<const std::string> argv);

extern const Spec kDemoSpec;
struct DemoRequest {
  workload::FfnShape shape;
  workload::ActivationOptions workload;  // passes check_options; its tokens are not read
  TwellLayout layout;                    // passes check_layout
  DType dtype = DType::bf16;
  // Given on the command line, else the device's default (run_demo picks the device once the
  // command line is checked): tokens in [1, 2^24], repeats in [1, 1000].
  std::optional<std::int64_t> tokens;
  std::optional<int> repeats, ffn_repeats;
};
std::optional<DemoRequest> parse_demo(std::span<const std::string> argv);

extern const Spec kGenerateSpec;
struct GenerateRequest {
  workload::ActivationOptions workload;  // passes check_options, tokens in [1, 2^24]
  DType dtype = DType::bf16;
  std::string out;
  Format format = Format::dense;  // what the output's file type holds
};
std::optional<GenerateRequest> parse_generate(std::span<const std::string> argv);

extern const Spec kStatsSpec;
struct StatsRequest {
  std::string path;
  ReadOptions read;
  StatsOptions options;  // passes check_stats_options; candidates distinct, in the order given
  std::optional<std::string> json, png;
};
std::optional<StatsRequest> parse_stats(std::span<const std::string> argv);

extern const Spec kValidateSpec;
struct ValidateRequest {
  std::string path;
  ReadOptions read;
};
std::optional<ValidateRequest> parse_validate(std::span<const std::string> argv);

// parse(argv), or, for --help, std::nullopt after printing spec's usage (the command then exits
// 0): the start of every run_<command>.
template <class Parse>
auto parse_or_print_usage(Parse&& parse, const Spec& spec, std::span<const std::string> argv) {
  auto request = parse(argv);
  if (!request) std::cout << usage(spec);
  return request;
}

}  // namespace twell::cli
