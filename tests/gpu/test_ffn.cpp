// twell::cuda::gated_ffn_forward / ffn_forward / GatedFfnPlan against the dense reference FFN
// (twell::reference) on fresh workload inputs: realistic and token-skewed gate patterns (Hybrid
// overflow rows included), ragged shapes, every activation, outputs poisoned with NaN.
#include <doctest/doctest.h>

#include <cmath>
#include <cstdint>
#include <limits>
#include <string>

#include <twell/kernels/ffn.hpp>
#include <twell/kernels/ffn_cuda.hpp>
#include <twell/workload.hpp>

#include "checks.hpp"
#include "fixtures.hpp"
#include "random.hpp"

namespace {

using namespace twell;

template <class T>
DenseMatrix<T> poisoned(std::int64_t rows, std::int64_t cols) {
  DenseMatrix<T> y(rows, cols);
  auto v = y.view();
  for (std::int64_t i = 0; i < rows; ++i)
    for (std::int64_t j = 0; j < cols; ++j) v.at(i, j) = from_float<T>(std::numeric_limits<float>::quiet_NaN());
  return y.to(MemorySpace::device);
}

template <class T>
double tolerance() {
  return std::is_same_v<T, float> ? 1e-3 : 1e-2;
}

// Runs the gated (and non-gated) forward on both backends; returns nothing, CHECKs the errors.
template <class T>
void check_ffn(const workload::FfnInputs<T>& in, ActivationSpec act, bool expect_vector_path) {
  const std::int64_t m = in.x.rows(), k = in.x.cols();
  DenseMatrix<T> ref(m, k), ref_plain(m, k);
  reference::gated_ffn_forward<T>(in.x.view(), in.wg.view(), in.wu.view(), in.wd.view(), act, ref.view());
  reference::ffn_forward<T>(in.x.view(), in.wg.view(), in.wd.view(), act, ref_plain.view());

  const auto x = in.x.to(MemorySpace::device), wg = in.wg.to(MemorySpace::device);
  const auto wu = in.wu.to(MemorySpace::device), wd = in.wd.to(MemorySpace::device);
  KernelReport report;
  KernelOptions options;
  options.report = &report;

  auto y = poisoned<T>(m, k);
  cuda::gated_ffn_forward<T>(x.view(), wg.view(), wu.view(), wd.view(), act, y.view(), options);
  CAPTURE(report.path);
  CHECK(report.path.find(expect_vector_path ? "ffn_rows_v8" : "ffn_rows_v1") != std::string::npos);
  const double err = testing::relative_error<T, T>(y.to(MemorySpace::host).view(), ref.view());
  CAPTURE(err);
  CHECK(err < tolerance<T>());

  // A plan reused twice gives the same bits (deterministic, no state carried between calls).
  const cuda::GatedFfnPlan<T> plan(wg.view(), wu.view(), wd.view(), TwellLayout{128, 4});
  auto y1 = poisoned<T>(m, k), y2 = poisoned<T>(m, k);
  plan.forward(x.view(), act, y1.view());
  plan.forward(x.view(), act, y2.view());
  const auto h1 = y1.to(MemorySpace::host), h2 = y2.to(MemorySpace::host);
  CHECK(testing::bitwise_equal<T>(h1.view(), h2.view()));
  CHECK(testing::relative_error<T, T>(h1.view(), ref.view()) < tolerance<T>());

  auto yp = poisoned<T>(m, k);
  cuda::ffn_forward<T>(x.view(), wg.view(), wd.view(), act, yp.view());
  const double err_plain = testing::relative_error<T, T>(yp.to(MemorySpace::host).view(), ref_plain.view());
  CAPTURE(err_plain);
  CHECK(err_plain < tolerance<T>());
}

using testing::workload_inputs;

}  // namespace

TEST_CASE_TEMPLATE("fused gated FFN forward matches the dense reference on workload patterns", T, bf16, fp16) {
  using testing::WorkloadSetting;
  for (const WorkloadSetting s : {WorkloadSetting{512, 2048, 5632, 0.005, workload::Distribution::token_skewed},
                                  WorkloadSetting{512, 2048, 5632, 0.005, workload::Distribution::uniform},
                                  WorkloadSetting{300, 512, 1408, 0.05, workload::Distribution::token_skewed},
                                  WorkloadSetting{200, 256, 1024, 0.3, workload::Distribution::neuron_skewed}}) {
    const std::uint64_t seed = testing::fresh_seed();
    CAPTURE(seed);
    CAPTURE(s.density);
    const auto in = workload_inputs<T>(s, seed);
    check_ffn<T>(in, {Activation::relu, 0.0f}, true);
  }
}

TEST_CASE_TEMPLATE("fused FFN forward: ragged shapes, thresholded activations, fp32", T, bf16, fp16, float) {
  const std::uint64_t seed = testing::fresh_seed();
  CAPTURE(seed);
  // K = 96, N = 300: aligned K (vector path), ragged N (generic gate path).
  const auto a = workload_inputs<T>({77, 96, 300, 0.05, workload::Distribution::token_skewed}, seed);
  for (const ActivationSpec act : {ActivationSpec{Activation::relu, 0.0f}, ActivationSpec{Activation::silu, 0.05f},
                                   ActivationSpec{Activation::gelu, 0.05f}}) {
    CAPTURE(static_cast<int>(act.kind));
    check_ffn<T>(a, act, true);
  }
  // K = 99: no 16-byte rows, the scalar path.
  const auto b = workload_inputs<T>({33, 99, 256, 0.1, workload::Distribution::uniform}, seed + 1);
  check_ffn<T>(b, {Activation::relu, 0.0f}, false);
}

TEST_CASE("fused FFN forward rejects bad input") {
  const auto in = workload_inputs<bf16>({8, 32, 64, 0.1, workload::Distribution::uniform}, 5);
  const auto x = in.x.to(MemorySpace::device), wg = in.wg.to(MemorySpace::device);
  const auto wu = in.wu.to(MemorySpace::device), wd = in.wd.to(MemorySpace::device);
  auto y = poisoned<bf16>(8, 32);
  auto bad_y = poisoned<bf16>(8, 31);
  using testing::code_of;
  CHECK(code_of([&] {
          cuda::gated_ffn_forward<bf16>(x.view(), wg.view(), wu.view(), wd.view(), {}, bad_y.view());
        }) == ErrorCode::shape_mismatch);
  CHECK(code_of([&] {
          cuda::gated_ffn_forward<bf16>(x.view(), wg.view(), wu.view(), in.wd.view(), {}, y.view());
        }) == ErrorCode::space_mismatch);
  CHECK(code_of([&] { cuda::ffn_forward<bf16>(x.view(), wu.view(), wu.view(), {}, y.view()); }) ==
        ErrorCode::shape_mismatch);
}
