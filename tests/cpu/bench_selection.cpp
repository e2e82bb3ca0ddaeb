// `twell bench --cases` inside the harness (bench/suites/common.cpp): which cases run_case runs,
// which it only lists, and the prerequisites that run for a selected case. Runs without a GPU:
// the bodies below are host code; only the cuda build has the harness.
#include <doctest/doctest.h>

#include <stdexcept>
#include <string>
#include <vector>

#include "../../bench/suites/common.hpp"

namespace {

using twell::bench::Case;
using twell::bench::Report;
using twell::bench::detail::run_case;

Case point(const std::string& variant, double density) {
  Case c;
  c.suite = "convert";
  c.op = "dense_to_twell";
  c.variant = variant;
  c.shape = "paper";
  c.m = 16384;
  c.distribution = "uniform";
  c.density_target = density;
  return c;
}

// Runs the cases of two points as a suite would, the first a prerequisite of the other two,
// recording which bodies ran.
std::vector<std::string> run_points(Report& report) {
  std::vector<std::string> ran;
  for (const double density : {0.005, 0.05}) {
    const std::string d = std::to_string(density);
    run_case(report, point("probe", density), {"uses_probe", "other_user"},
             [&](Case&) { ran.push_back("probe@" + d); });
    run_case(report, point("uses_probe", density), [&](Case&) { ran.push_back("uses_probe@" + d); });
    run_case(report, point("alone", density), [&](Case&) { ran.push_back("alone@" + d); });
  }
  return ran;
}

std::vector<std::string> statuses(const Report& report) {
  std::vector<std::string> out;
  for (const Case& c : report.cases) out.push_back(c.variant + ":" + c.status);
  return out;
}

}  // namespace

TEST_CASE("run_case runs every case without a pattern and only the selected ones with one") {
  Report all;
  CHECK(run_points(all).size() == 6);
  CHECK(all.cases.size() == 6);

  Report some;
  some.selection = twell::bench::CaseFilter(" alone paper 16384 uniform 0.05$");
  CHECK(run_points(some) == std::vector<std::string>{"alone@0.050000"});
  // Every case keeps its place; those not run are marked, for run_suites to drop.
  REQUIRE(some.cases.size() == 6);
  CHECK(statuses(some) == std::vector<std::string>{"probe:not selected", "uses_probe:not selected",
                                                   "alone:not selected", "probe:not selected",
                                                   "uses_probe:not selected", "alone:ok"});
}

TEST_CASE("run_case runs a prerequisite where a case that needs it is selected, and reports it") {
  Report report;
  report.selection = twell::bench::CaseFilter("uses_probe paper 16384 uniform 0.005");
  CHECK(run_points(report) == std::vector<std::string>{"probe@0.005000", "uses_probe@0.005000"});
  CHECK(statuses(report) == std::vector<std::string>{"probe:ok", "uses_probe:ok", "alone:not selected",
                                                     "probe:not selected", "uses_probe:not selected",
                                                     "alone:not selected"});
}

TEST_CASE("run_case runs a prerequisite for any of the cases that need it") {
  Report report;
  report.selection = twell::bench::CaseFilter("other_user paper 16384 uniform 0.05$");
  CHECK(run_points(report) == std::vector<std::string>{"probe@0.050000"});
  CHECK(report.cases[3].status == "ok");
}

TEST_CASE("list_case and not_built keep their status only for selected cases") {
  Report report;
  report.selection = twell::bench::CaseFilter("^convert dense_to_twell kept ");
  twell::bench::detail::list_case(report, point("kept", 0.005), "skipped: overflow");
  twell::bench::detail::list_case(report, point("dropped", 0.005), "skipped: overflow");
  twell::bench::detail::not_built(report, point("kept", 0.05), "no kernel");
  twell::bench::detail::not_built(report, point("dropped", 0.05), "no kernel");
  CHECK(statuses(report) == std::vector<std::string>{"kept:skipped: overflow", "dropped:not selected",
                                                     "kept:not built: no kernel", "dropped:not selected"});
}

TEST_CASE("none_selected lists a point's cases only when the selection leaves out all of them") {
  const auto point_cases = [](Report& report) {
    return twell::bench::detail::none_selected(report, point("probe", 0.005),
                                               {{"dense_to_twell", "kept"}, {"twell_to_dense", "other"}});
  };
  Report one;
  one.selection = twell::bench::CaseFilter("^convert twell_to_dense other ");
  CHECK_FALSE(point_cases(one));
  CHECK(one.cases.empty());  // the suite runs the point and lists its cases itself
  Report none;
  none.selection = twell::bench::CaseFilter("^convert dense_to_twell probe ");  // the base's own variant
  CHECK(point_cases(none));
  REQUIRE(none.cases.size() == 2);
  CHECK(none.cases[1].op == "twell_to_dense");
  CHECK(statuses(none) == std::vector<std::string>{"kept:not selected", "other:not selected"});
  Report all;
  CHECK_FALSE(point_cases(all));
}

TEST_CASE("a selected case that throws is listed as failed, a prerequisite's failure too") {
  Report report;
  report.selection = twell::bench::CaseFilter("needs_it");
  run_case(report, point("prerequisite", 0.005), {"needs_it"}, [](Case&) { throw std::runtime_error("boom"); });
  run_case(report, point("needs_it", 0.005), [](Case&) {});
  REQUIRE(report.cases.size() == 2);
  CHECK(report.cases[0].status == "failed: boom");
  CHECK(report.cases[1].status == "ok");
}

TEST_CASE("CaseFilter refuses what std::regex cannot compile safely, naming the limit") {
  const auto message_of = [](const std::string& pattern) -> std::string {
    try {
      (void)twell::bench::CaseFilter(pattern);
    } catch (const twell::Error& e) {
      CHECK(e.code() == twell::ErrorCode::invalid_argument);
      return e.what();
    }
    return "";
  };
  CHECK(message_of(std::string(1001, 'a')).find("at most 1000") != std::string::npos);
  CHECK(message_of("spmm \\1234567890").find("more than 9 digits") != std::string::npos);
  CHECK(message_of("spmm (twell").find("not an ECMAScript regular expression") != std::string::npos);
  // At the limits a pattern still compiles and selects.
  CHECK(message_of(std::string(1000, 'a')).empty());
  CHECK(message_of("paper 123456789").empty());
}

TEST_CASE("--tokens replaces the suites' two M, and --contract takes those") {
  using twell::bench::Config;
  using twell::bench::detail::in_scope;
  using twell::bench::detail::tokens_large;
  using twell::bench::detail::tokens_small;
  using twell::workload::Distribution;
  Config config;
  CHECK(tokens_small(config) == 4096);
  CHECK(tokens_large(config) == 16384);
  config.quick = true;
  CHECK(tokens_small(config) == 512);
  CHECK(tokens_large(config) == 2048);
  config.tokens_small = 6144;
  config.tokens_large = 12288;
  CHECK(tokens_small(config) == 6144);  // --tokens over --quick's sizes too
  CHECK(tokens_large(config) == 12288);
  config.quick = false;
  config.contract = true;
  const std::string paper = twell::workload::paper_shape().name;
  CHECK(in_scope(config, paper, 6144, 0.005, Distribution::token_skewed));
  CHECK(in_scope(config, paper, 12288, 0.005, Distribution::uniform));
  CHECK_FALSE(in_scope(config, paper, 16384, 0.005, Distribution::uniform));
  CHECK_FALSE(in_scope(config, paper, 4096, 0.005, Distribution::uniform));
  CHECK_FALSE(in_scope(config, paper, 6144, 0.005, Distribution::neuron_skewed));
  CHECK_FALSE(in_scope(config, paper, 6144, 0.01, Distribution::uniform));
}
