// The workload generator: reproducible, at the requested density, with the skew it promises.
#include <doctest/doctest.h>

#include <Eigen/Core>

#include <algorithm>
#include <cmath>
#include <vector>

#include <twell/error.hpp>
#include <twell/workload.hpp>

#include "random.hpp"

using namespace twell;
using workload::ActivationOptions;
using workload::Distribution;

namespace {

constexpr Distribution kAll[] = {Distribution::uniform, Distribution::neuron_skewed, Distribution::token_skewed};

template <Value T>
Eigen::MatrixXf to_eigen(DenseView<const T> v) {
  Eigen::MatrixXf out(v.rows, v.cols);
  for (std::int64_t i = 0; i < v.rows; ++i)
    for (std::int64_t j = 0; j < v.cols; ++j) out(i, j) = to_float(v.at(i, j));
  return out;
}

template <Value T>
std::int64_t count_stored(DenseView<const T> v) {
  std::int64_t c = 0;
  for (std::int64_t i = 0; i < v.rows; ++i)
    for (std::int64_t j = 0; j < v.cols; ++j) c += is_stored(v.at(i, j)) ? 1 : 0;
  return c;
}

template <class F>
void expect_invalid(F&& f) {
  try {
    f();
    FAIL("no twell::Error thrown");
  } catch (const Error& e) {
    CHECK(e.code() == ErrorCode::invalid_argument);
  }
}

}  // namespace

TEST_CASE_TEMPLATE("same seed gives the same matrices, another seed other ones", T, bf16, fp16, float) {
  for (Distribution d : kAll) {
    CAPTURE(workload::to_string(d));
    ActivationOptions o{.tokens = 300, .units = 777, .density = 0.02, .distribution = d, .dead_fraction = 0.3,
                        .seed = testing::fresh_seed()};
    const auto a = workload::activations<T>(o);
    const auto b = workload::activations<T>(o);
    CHECK(testing::bitwise_equal<T>(a.view(), b.view()));
    o.seed += 1;
    const auto c = workload::activations<T>(o);
    CHECK_FALSE(testing::bitwise_equal<T>(a.view(), c.view()));

    const auto f1 = workload::ffn_inputs<T>(o, 64);
    const auto f2 = workload::ffn_inputs<T>(o, 64);
    CHECK(testing::bitwise_equal<T>(f1.x.view(), f2.x.view()));
    CHECK(testing::bitwise_equal<T>(f1.wg.view(), f2.wg.view()));
    CHECK(testing::bitwise_equal<T>(f1.wu.view(), f2.wu.view()));
    CHECK(testing::bitwise_equal<T>(f1.wd.view(), f2.wd.view()));
    o.seed += 1;
    const auto f3 = workload::ffn_inputs<T>(o, 64);
    CHECK_FALSE(testing::bitwise_equal<T>(f1.x.view(), f3.x.view()));
    CHECK_FALSE(testing::bitwise_equal<T>(f1.wg.view(), f3.wg.view()));
  }
}

TEST_CASE_TEMPLATE("realized density matches the target; nonzeros are positive", T, bf16, fp16, float) {
  for (Distribution d : kAll) {
    for (double density : {0.0, 0.003, 0.05, 0.2}) {
      CAPTURE(workload::to_string(d));
      CAPTURE(density);
      const ActivationOptions o{.tokens = 2048, .units = 1000, .density = density, .distribution = d,
                                .dead_fraction = 0.3, .seed = testing::fresh_seed()};
      CAPTURE(o.seed);
      const auto a = workload::activations<T>(o);
      REQUIRE(a.rows() == o.tokens);
      REQUIRE(a.cols() == o.units);
      const auto v = a.view();
      bool all_positive = true;
      for (std::int64_t i = 0; i < v.rows; ++i)
        for (std::int64_t j = 0; j < v.cols; ++j) {
          const float x = to_float(v.at(i, j));
          all_positive = all_positive && (x == 0.0f || (x > 0.0f && std::isfinite(x)));
        }
      CHECK(all_positive);
      const double target = density * static_cast<double>(o.tokens * o.units);
      const auto nnz = static_cast<double>(count_stored<T>(v));
      if (density == 0.0)
        CHECK(nnz == 0);
      else
        CHECK(std::abs(nnz - target) <= 0.05 * target);
    }
  }
  const ActivationOptions full{.tokens = 64, .units = 100, .density = 1.0, .distribution = Distribution::uniform};
  const auto a = workload::activations<T>(full);
  CHECK(count_stored<T>(a.view()) == 64 * 100);
}

TEST_CASE("token_skewed at the paper's shape and 0.5 % has the measured heavy tail") {
  const ActivationOptions o{.tokens = 16384, .units = 5632, .density = 0.005,
                            .distribution = Distribution::token_skewed, .dead_fraction = 0.3,
                            .seed = testing::fresh_seed()};
  CAPTURE(o.seed);
  const auto a = workload::activations<bf16>(o);
  const auto p = workload::profile<bf16>(a.view());
  CAPTURE(p.mean);
  CAPTURE(p.p50);
  CAPTURE(p.p99);
  CAPTURE(p.max);
  CHECK(std::abs(p.mean - 0.005 * 5632) <= 0.03 * 0.005 * 5632);
  CHECK(p.p50 >= 7);
  CHECK(p.p50 <= 17);
  CHECK(p.p99 >= 220 / 1.5);
  CHECK(p.p99 <= 220 * 1.5);
  CHECK(p.max >= 800 / 1.5);
  CHECK(p.max <= 800 * 1.5);
  CHECK(p.dead_unit_share >= 0.3);
  CHECK(p.dead_unit_share <= 0.36);

  // The same mean without token skew has no heavy tail: the skew comes from the token factors.
  ActivationOptions flat = o;
  flat.distribution = Distribution::neuron_skewed;
  flat.tokens = 4096;
  const auto q = workload::profile<bf16>(workload::activations<bf16>(flat).view());
  CHECK(q.p99 < 2 * q.mean);
  CHECK(q.p50 >= 20);
}

TEST_CASE("dead units never fire and live ones do") {
  for (double dead : {0.0, 0.15, 0.5, 0.83}) {
    CAPTURE(dead);
    const ActivationOptions o{.tokens = 4096, .units = 1200, .density = 0.05,
                              .distribution = Distribution::neuron_skewed, .dead_fraction = dead,
                              .seed = testing::fresh_seed()};
    const auto p = workload::profile<float>(workload::activations<float>(o).view());
    CHECK(p.dead_unit_share >= dead - 1e-9);
    CHECK(p.dead_unit_share <= dead + 0.05);
  }
  const ActivationOptions u{.tokens = 4096, .units = 1200, .density = 0.05, .distribution = Distribution::uniform,
                            .dead_fraction = 0.5, .seed = testing::fresh_seed()};
  CHECK(workload::profile<float>(workload::activations<float>(u).view()).dead_unit_share == 0.0);
}

TEST_CASE("profile agrees with a direct count") {
  const auto m = testing::random_sparse_dense<fp16>(501, 333, {.density = 0.1, .empty_row_share = 0.1},
                                                     testing::fresh_seed());
  const auto v = m.view();
  std::vector<std::int64_t> rows;
  std::vector<bool> fired(333, false);
  for (std::int64_t i = 0; i < v.rows; ++i) {
    std::int64_t c = 0;
    for (std::int64_t j = 0; j < v.cols; ++j)
      if (is_stored(v.at(i, j))) {
        ++c;
        fired[static_cast<std::size_t>(j)] = true;
      }
    rows.push_back(c);
  }
  const auto p = workload::profile<fp16>(v);
  std::sort(rows.begin(), rows.end());
  double sum = 0;
  for (auto c : rows) sum += static_cast<double>(c);
  CHECK(p.mean == doctest::Approx(sum / 501));
  CHECK(p.p50 == rows[250]);   // ceil(0.5 * 501) = 251st smallest
  CHECK(p.p99 == rows[495]);   // ceil(0.99 * 501) = 496th smallest
  CHECK(p.max == rows.back());
  CHECK(p.dead_unit_share ==
        doctest::Approx(static_cast<double>(std::count(fired.begin(), fired.end(), false)) / 333));
}

TEST_CASE_TEMPLATE("ffn_inputs: relu(x Wg) has the requested density", T, bf16, float) {
  for (Distribution d : kAll) {
    for (double density : {0.005, 0.05}) {
      CAPTURE(workload::to_string(d));
      CAPTURE(density);
      const ActivationOptions o{.tokens = 2048, .units = 1024, .density = density, .distribution = d,
                                .dead_fraction = 0.3, .seed = testing::fresh_seed()};
      CAPTURE(o.seed);
      const std::int64_t hidden = 256;
      const auto in = workload::ffn_inputs<T>(o, hidden);
      REQUIRE(in.x.rows() == o.tokens);
      REQUIRE(in.x.cols() == hidden);
      REQUIRE(in.wg.rows() == hidden);
      REQUIRE(in.wg.cols() == o.units);
      REQUIRE(in.wu.rows() == hidden);
      REQUIRE(in.wu.cols() == o.units);
      REQUIRE(in.wd.rows() == o.units);
      REQUIRE(in.wd.cols() == hidden);
      const Eigen::MatrixXf gate = to_eigen<T>(in.x.view()) * to_eigen<T>(in.wg.view());
      std::vector<std::int64_t> per_row(static_cast<std::size_t>(o.tokens), 0);
      std::int64_t nnz = 0;
      for (Eigen::Index i = 0; i < gate.rows(); ++i)
        for (Eigen::Index j = 0; j < gate.cols(); ++j)
          if (gate(i, j) > 0.0f) {
            ++nnz;
            ++per_row[static_cast<std::size_t>(i)];
          }
      const double target = density * static_cast<double>(o.tokens * o.units);
      CHECK(std::abs(static_cast<double>(nnz) - target) <= 0.25 * target);
      std::sort(per_row.begin(), per_row.end());
      const double mean = static_cast<double>(nnz) / static_cast<double>(o.tokens);
      const auto p99 = static_cast<double>(per_row[static_cast<std::size_t>(0.99 * static_cast<double>(o.tokens))]);
      // Without token skew a row's count is about Poisson(mean): p99 well inside mean + 4 sd.
      const double poisson_bound = mean + 4 * std::sqrt(mean) + 2;
      if (d == Distribution::token_skewed)
        CHECK(p99 > std::max(3 * mean, poisson_bound));
      else
        CHECK(p99 < poisson_bound);
    }
  }
}

TEST_CASE("bad options, names and presets") {
  ActivationOptions ok{.tokens = 8, .units = 16, .density = 0.1};
  auto with = [&](auto change) {
    ActivationOptions o = ok;
    change(o);
    return o;
  };
  expect_invalid([&] { workload::activations<float>(with([](auto& o) { o.density = -0.1; })); });
  expect_invalid([&] { workload::activations<float>(with([](auto& o) { o.density = 1.5; })); });
  expect_invalid([&] { workload::activations<float>(with([](auto& o) { o.density = std::nan(""); })); });
  expect_invalid([&] { workload::activations<float>(with([](auto& o) { o.tokens = -1; })); });
  expect_invalid([&] { workload::activations<float>(with([](auto& o) { o.units = 0; })); });
  expect_invalid([&] { workload::activations<float>(with([](auto& o) { o.dead_fraction = 1.0; })); });
  expect_invalid([&] {
    workload::activations<float>(with([](auto& o) {
      o.dead_fraction = 0.5;
      o.density = 0.6;
    }));
  });
  expect_invalid([&] { workload::ffn_inputs<float>(ok, 2); });
  CHECK(workload::activations<float>(with([](auto& o) { o.tokens = 0; })).rows() == 0);

  for (Distribution d : kAll) CHECK(workload::parse_distribution(workload::to_string(d)) == d);
  CHECK(workload::parse_distribution("token-skewed") == Distribution::token_skewed);
  expect_invalid([] { workload::parse_distribution("zipf"); });

  CHECK(workload::preset("paper").hidden == 2048);
  CHECK(workload::preset("paper").intermediate == 5632);
  CHECK(workload::preset("llama7b").intermediate == 11008);
  CHECK(workload::preset("small").hidden == 1024);
  CHECK(workload::presets().size() == 3);
  expect_invalid([] { workload::preset("gpt5"); });
}
