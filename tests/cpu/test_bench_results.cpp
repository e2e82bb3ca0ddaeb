// The host half of the benchmark harness: JSON writing, timing summaries, suite selection,
// the result records and the table.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include <twell/bench/json.hpp>
#include <twell/bench/results.hpp>
#include <twell/error.hpp>

#include "random.hpp"

using twell::bench::Json;

TEST_CASE("Json writes scalars, escapes strings and never writes NaN or Inf") {
  CHECK(Json().dump(0) == "null");
  CHECK(Json(true).dump(0) == "true");
  CHECK(Json(std::int64_t{-42}).dump(0) == "-42");
  CHECK(Json(0.5).dump(0) == "0.5");
  CHECK(Json(std::numeric_limits<double>::quiet_NaN()).dump(0) == "null");
  CHECK(Json(-std::numeric_limits<double>::infinity()).dump(0) == "null");
  CHECK(Json("a\"b\\c\nd\te").dump(0) == R"("a\"b\\c\nd\te")");
  CHECK(Json(std::string("\x01")).dump(0) == R"("\u0001")");
  // Valid UTF-8 passes through; each byte outside a valid sequence (a Latin-1 e-acute, a
  // truncated sequence, an overlong form, a surrogate) becomes U+FFFD, so the output stays JSON.
  CHECK(Json("caf\xc3\xa9 \xf0\x9f\x99\x82").dump(0) == "\"caf\xc3\xa9 \xf0\x9f\x99\x82\"");
  CHECK(Json("caf\xe9").dump(0) == R"("caf\ufffd")");
  CHECK(Json("\xe2\x82").dump(0) == R"("\ufffd\ufffd")");
  CHECK(Json("\xc0\xaf").dump(0) == R"("\ufffd\ufffd")");
  CHECK(Json("\xed\xa0\x80").dump(0) == R"("\ufffd\ufffd\ufffd")");
  CHECK(twell::bench::json_quoted(std::string_view("a\0b", 3)) == R"("a\u0000b")");
}

TEST_CASE("Json objects keep insertion order, replace on a repeated key, and nest") {
  Json j = Json::object();
  j["b"] = 1;
  j["a"] = "x";
  j["b"] = 2;
  Json list = Json::array();
  list.push_back(1);
  list.push_back(Json::object());
  j["list"] = list;
  j["empty"] = Json::array();
  CHECK(j.size() == 4);
  CHECK(j.dump(0) == R"({"b":2,"a":"x","list":[1,{}],"empty":[]})");
  const std::string pretty = j.dump(2);
  CHECK(pretty.find("\n  \"a\": \"x\"") != std::string::npos);
  CHECK(pretty.back() == '\n');
  // Arrays of scalars stay on one line.
  Json flat = Json::array();
  for (int i = 0; i < 3; ++i) flat.push_back(i);
  CHECK(flat.dump(2) == "[0, 1, 2]\n");
}

TEST_CASE("Json refuses to index a non-object or append to a non-array") {
  Json n(1);
  CHECK_THROWS_AS(n["k"], twell::Error);
  Json o = Json::object();
  CHECK_THROWS_AS(o.push_back(1), twell::Error);
}

TEST_CASE("summarize gives nearest-rank median and percentiles of fresh samples") {
  std::mt19937_64 rng(twell::testing::fresh_seed());
  for (const std::size_t n : {std::size_t{1}, std::size_t{2}, std::size_t{50}, std::size_t{101}}) {
    CAPTURE(n);
    std::vector<float> samples(n);
    std::uniform_real_distribution<float> u(0.1f, 5.0f);
    for (float& s : samples) s = u(rng);
    std::vector<float> sorted = samples;
    std::sort(sorted.begin(), sorted.end());
    const twell::bench::Timing t = twell::bench::summarize(samples);
    CHECK(t.reps == static_cast<int>(n));
    CHECK(t.min_ms == doctest::Approx(sorted.front()));
    auto rank = [&](double q) {
      return sorted[std::max<std::size_t>(static_cast<std::size_t>(std::ceil(q * n)), 1) - 1];
    };
    CHECK(t.median_ms == doctest::Approx(rank(0.5)));
    CHECK(t.p10_ms == doctest::Approx(rank(0.1)));
    CHECK(t.p90_ms == doctest::Approx(rank(0.9)));
    CHECK(t.p10_ms <= t.median_ms);
    CHECK(t.median_ms <= t.p90_ms);
  }
  CHECK(twell::bench::summarize({}).reps == 0);
}

TEST_CASE("parse_suites selects, deduplicates and rejects unknown names") {
  CHECK(twell::bench::parse_suites("") == twell::bench::suite_names());
  CHECK(twell::bench::parse_suites("all") == twell::bench::suite_names());
  CHECK(twell::bench::parse_suites("ffn,spmm,ffn") == std::vector<std::string>{"ffn", "spmm"});
  CHECK_THROWS_AS(twell::bench::parse_suites("spmm,nope"), twell::Error);
  CHECK_THROWS_AS(twell::bench::parse_suites("spmm,"), twell::Error);
}

TEST_CASE("case_name names a case as its NVTX range does, and CaseFilter selects by it") {
  twell::bench::Case c;
  c.suite = "spmm";
  c.op = "spmm";
  c.variant = "twell_slice_reuse";
  c.shape = "paper";
  c.m = 16384;
  c.distribution = "token_skewed";
  c.density_target = 0.005;
  CHECK(twell::bench::case_name(c) == "spmm spmm twell_slice_reuse paper 16384 token_skewed 0.005");

  CHECK(twell::bench::CaseFilter().selects(c));
  CHECK(twell::bench::CaseFilter("").selects(c));
  CHECK(twell::bench::CaseFilter("slice_reuse").selects(c));  // searched, not matched whole
  CHECK(twell::bench::CaseFilter("^spmm spmm (twell_slice_reuse|cusparse_csr) paper 16384 ").selects(c));
  CHECK_FALSE(twell::bench::CaseFilter("^spmm spmm (twell_slice_reuse|cusparse_csr) paper 4096 ").selects(c));
  CHECK_FALSE(twell::bench::CaseFilter(" uniform ").selects(c));
  CHECK_FALSE(twell::bench::CaseFilter("^spmm spmm twell ").selects(c));  // the variant ends at a space
  c.variant = "twell";
  CHECK(twell::bench::CaseFilter("^spmm spmm twell ").selects(c));

  // Of a list of variants, a pattern naming some selects exactly those.
  const std::vector<std::string> variants{"twell", "twell_plan", "cusparse_csr", "cusparse_coo", "cublas_dense"};
  const twell::bench::CaseFilter some("^spmm spmm_at (twell_plan|cusparse_coo) ");
  c.op = "spmm_at";
  for (const std::string& v : variants) {
    c.variant = v;
    CHECK_MESSAGE(some.selects(c) == (v == "twell_plan" || v == "cusparse_coo"), v);
  }

  try {
    (void)twell::bench::CaseFilter("spmm (twell");
    FAIL("an unbalanced parenthesis was accepted");
  } catch (const twell::Error& e) {
    CHECK(e.code() == twell::ErrorCode::invalid_argument);
    CHECK(std::string(e.what()).find("'spmm (twell' is not an ECMAScript regular expression") != std::string::npos);
  }
}

TEST_CASE("a case writes its numbers only when it ran, and the table shows status or rates") {
  twell::bench::Case ok;
  ok.suite = "spmm";
  ok.op = "spmm";
  ok.variant = "twell";
  ok.m = 16384;
  ok.density_target = 0.005;
  ok.distribution = "uniform";
  ok.timing = twell::bench::summarize({2.0f, 1.0f, 3.0f});
  ok.bytes = 4e9;  // 4 GB in 2 ms: 2000 GB/s
  ok.flops = 1e9;
  ok.baseline = "cusparse_csr";
  ok.speedup = 2.5;
  CHECK(ok.gbps() == doctest::Approx(2000.0));
  CHECK(ok.tflops() == doctest::Approx(0.5));
  const std::string j = ok.to_json().dump(0);
  CHECK(j.find(R"("ms":{"median":2,)") != std::string::npos);
  CHECK(j.find(R"("speedup":2.5)") != std::string::npos);

  twell::bench::Case missing = ok;
  missing.variant = "fused";
  missing.status = "not built: kernels/cuda/ffn.cu is not in this build";
  missing.speedup = 0;
  const std::string jm = missing.to_json().dump(0);
  CHECK(jm.find("\"ms\"") == std::string::npos);
  CHECK(jm.find("gb_per_s") == std::string::npos);
  CHECK(jm.find(R"("speedup":null)") != std::string::npos);

  twell::bench::Report report;
  report.cases = {ok, missing};
  std::ostringstream os;
  twell::bench::print_table(os, report);
  const std::string table = os.str();
  CHECK(table.find("2000 GB/s") != std::string::npos);
  CHECK(table.find("2.50x") != std::string::npos);
  CHECK(table.find("not built: kernels/cuda/ffn.cu") != std::string::npos);
  CHECK(report.to_json().dump(0).find(R"("cases":[{)") != std::string::npos);
}

TEST_CASE("set_floor adds each phase's most demanding resource and says when a ceiling is missing") {
  twell::bench::Ceilings ceilings;
  ceilings.copy_gbps = 3000;          // 3 GB per ms
  ceilings.shared_load_gbps = 30000;  // 30 GB per ms
  ceilings.fma_tflops = 60;           // 60 GFLOP per ms
  ceilings.gemm_tflops = 750;         // 750 GFLOP per ms
  twell::bench::Case c;
  c.timing = twell::bench::summarize({0.5f});
  // Phase 1 bound by tensor FLOPs (0.5 ms against 0.01 of DRAM); phase 2 by on-chip bytes (0.1 ms
  // against 0.03 of DRAM and 0.05 of FMAs): 0.6 ms, the case at 0.5 / 0.6 of it.
  twell::bench::set_floor(c, ceilings,
                          {{.name = "gate", .dram_bytes = 3e7, .tensor_flops = 3.75e11},
                           {.name = "sparse", .dram_bytes = 9e7, .on_chip_bytes = 3e9, .cuda_core_flops = 3e9}});
  const std::string j = c.to_json().dump(0);
  CHECK(j.find(R"({"name":"gate","dram_ms":0.01,"tensor_ms":0.5,"ms":0.5,"bound":"tensor"})") != std::string::npos);
  CHECK(j.find(R"("name":"sparse","dram_ms":0.03,"on_chip_ms":0.1,"cuda_core_ms":0.05,"ms":0.1,"bound":"on_chip"})") !=
        std::string::npos);
  CHECK(j.find(R"("ms":0.6)") != std::string::npos);
  CHECK(j.find(R"("measured_over_floor":0.83333)") != std::string::npos);

  ceilings.shared_load_gbps = 0;
  twell::bench::set_floor(c, ceilings, {{.name = "sparse", .dram_bytes = 9e7, .on_chip_bytes = 3e9}});
  CHECK(c.to_json().dump(0).find(R"("floor":"unavailable: the shared-memory load ceiling was not measured")") !=
        std::string::npos);
  // A phase that needs no unmeasured ceiling is still a floor.
  twell::bench::set_floor(c, ceilings, {{.name = "copy", .dram_bytes = 3e9}});
  CHECK(c.to_json().dump(0).find(R"("ms":1,"bound":"dram"})") != std::string::npos);
}
