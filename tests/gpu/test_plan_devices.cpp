// Every cuda plan (and GatedFfnTraining) is bound to the device current when it was made: with
// another device current, each call that queues work or allocates is refused (space_mismatch)
// before it touches the device, and the plan works again once its device is current. Without a
// second device only the check itself and the calls on the plan's own device run.
#include <doctest/doctest.h>

#include <functional>
#include <string>
#include <utility>
#include <vector>

#include <cuda_runtime.h>

#include <twell/converters/backends.hpp>
#include <twell/converters/hybrid_plan.hpp>
#include <twell/ffn.hpp>
#include <twell/kernels/ffn_cuda.hpp>
#include <twell/kernels/gemm_to_sparse_plan.hpp>
#include <twell/kernels/spmm_plan.hpp>

#include "checks.hpp"
#include "device.hpp"
#include "random.hpp"

namespace {

using namespace twell;
constexpr MemorySpace kDevice = MemorySpace::device;

// Restores device 0 when a case ends, also on a failed REQUIRE.
struct BackOnDeviceZero {
  BackOnDeviceZero() = default;
  BackOnDeviceZero(const BackOnDeviceZero&) = delete;
  BackOnDeviceZero& operator=(const BackOnDeviceZero&) = delete;
  ~BackOnDeviceZero() { cudaSetDevice(0); }
};

}  // namespace

TEST_CASE("cuda plans refuse every call while another device is current, and run again on theirs") {
  const BackOnDeviceZero restore;
  testing::cuda_ok(cudaSetDevice(0));
  const std::string other_device = testing::message_of([] { twell::detail::require_plan_device(1, "test"); });
  CHECK(other_device.find("made on device 1, but device 0 is current") != std::string::npos);
  CHECK(testing::code_of([] { twell::detail::require_plan_device(1, "test"); }) == ErrorCode::space_mismatch);

  const std::uint64_t seed = testing::fresh_seed();
  CAPTURE(seed);
  constexpr std::int64_t m = 128, k = 64, n = 256;
  const TwellLayout layout{128, 8};
  const auto x = testing::random_dense<bf16>(m, k, 1.0f, seed).to(kDevice);
  const auto wg = testing::random_dense<bf16>(k, n, 1.0f, seed + 1).to(kDevice);
  const auto wu = testing::random_dense<bf16>(k, n, 1.0f, seed + 2).to(kDevice);
  const auto wd = testing::random_dense<bf16>(n, k, 1.0f, seed + 3).to(kDevice);
  const auto activations = testing::random_sparse_dense<bf16>(m, n, {.density = 0.05}, seed + 4).to(kDevice);
  const auto a = cuda::dense_to_hybrid<bf16>(activations.view(), layout);
  DenseMatrix<bf16> y(m, k, kDevice), dy = testing::random_dense<bf16>(m, k, 1.0f, seed + 5).to(kDevice);
  DenseMatrix<bf16> dx(m, k, kDevice), dwg(k, n, kDevice), dwu(k, n, kDevice), dwd(n, k, kDevice);

  cuda::SpmmPlan<bf16> spmm(m, n, layout);
  cuda::GemmToSparsePlan<bf16> gate(m, k, n, {}, layout);
  cuda::DenseToHybridPlan<bf16> convert(m, n, layout);
  cuda::GatedFfnPlan<bf16> ffn(m, wg.view(), wu.view(), wd.view(), {}, layout);
  cuda::FfnPlan<bf16> plain(m, wu.view(), wd.view(), {}, layout);
  GatedFfn<bf16> layer(m, OutIn<bf16>{wd.view()}, OutIn<bf16>{wd.view()}, OutIn<bf16>{wu.view()}, {}, layout);
  GatedFfnTraining<bf16> training(m, k, n, kDevice, {}, layout);
  // GatedUpDownPlan's own operands: a gate result that no other call here changes, and u and h
  // of its overflow rows.
  cuda::GemmToSparsePlan<bf16> held_gate(m, k, n, {}, layout);
  held_gate.run(x.view(), wg.view());
  const std::int64_t gate_rows = held_gate.sync_overflow_count().rows;
  HybridMatrix<bf16> u(m, n, layout, gate_rows, kDevice), h(m, n, layout, gate_rows, kDevice);
  cuda::GatedUpDownPlan<bf16> up_down(m, k, n, layout);
  REQUIRE(cuda::GatedUpDownPlan<bf16>::applies(k));
  const HybridView<const bf16> a_span[] = {a.view()};
  const DenseView<const bf16> dy_span[] = {dy.view()};
  const DenseView<bf16> dwd_span[] = {dwd.view()};
  // Each call once on the plan's device first: it must be a call that works there. Each is named
  // by the function that must refuse it elsewhere, as its message starts.
  gate.run(x.view(), wg.view());
  (void)gate.sync_overflow_count();
  training.forward(x.view(), wg.view(), wu.view(), wd.view(), y.view());
  const std::vector<std::pair<const char*, std::function<void()>>> calls = {
      {"twell::cuda::SpmmPlan::run", [&] { spmm.run(a.view(), wd.view(), y.view()); }},
      {"twell::cuda::SpmmPlan::run", [&] { spmm.run(Op::transpose, a.view(), dy.view(), dwd.view()); }},
      {"twell::cuda::SpmmPlan::run_transposed", [&] { spmm.run_transposed(a_span, dy_span, dwd_span); }},
      {"twell::cuda::SpmmPlan::reserve_overflow", [&] { spmm.reserve_overflow(m, k); }},
      {"twell::cuda::SpmmPlan::reserve_b_cols", [&] { spmm.reserve_b_cols(k); }},
      {"twell::cuda::GemmToSparsePlan::sync_overflow_count", [&] { (void)gate.sync_overflow_count(); }},
      {"twell::cuda::GemmToSparsePlan::run", [&] { gate.run(x.view(), wg.view()); }},
      {"twell::cuda::DenseToHybridPlan", [&] { (void)convert.run(activations.view()); }},
      {"twell::cuda::GatedFfnPlan", [&] { ffn.forward(x.view(), y.view()); }},
      {"twell::cuda::FfnPlan", [&] { plain.forward(x.view(), y.view()); }},
      {"twell::GatedFfn::forward", [&] { layer.forward(x.view(), y.view()); }},
      {"twell::cuda::GatedUpDownPlan::queue_ahead",
       [&] { up_down.queue_ahead(held_gate.result(), wu.view(), u.view(), h.view()); }},
      {"twell::cuda::GatedUpDownPlan::run",
       [&] { up_down.run(x.view(), held_gate.result(), wu.view(), wd.view(), u.view(), h.view(), y.view()); }},
      {"twell::GatedFfnTraining::backward",
       [&] {
         (void)training.backward(x.view(), wg.view(), wu.view(), wd.view(), dy.view(), 1e-3f,
                                 L1Normalization::per_token, {dx.view(), dwg.view(), dwu.view(), dwd.view()});
       }},
      {"twell::GatedFfnTraining::forward",
       [&] { training.forward(x.view(), wg.view(), wu.view(), wd.view(), y.view()); }},
  };
  for (const auto& [name, call] : calls) {
    CAPTURE(name);
    call();
  }
  testing::cuda_ok(cudaDeviceSynchronize());

  int devices = 0;
  testing::cuda_ok(cudaGetDeviceCount(&devices));
  if (devices < 2) {
    MESSAGE("one device: the plans' refusal on another device is not run");
    return;
  }
  testing::cuda_ok(cudaSetDevice(1));
  for (const auto& [name, call] : calls) {
    CAPTURE(name);
    const std::string message = testing::message_of(call);
    CHECK(message.rfind(name, 0) == 0);  // refused by the call itself (the layer before its plan)
    CHECK(message.find("made on device 0, but device 1 is current") != std::string::npos);
    CHECK(testing::code_of(call) == ErrorCode::space_mismatch);
  }
  CHECK(testing::code_of([&] { (void)std::move(held_gate).take_result(); }) == ErrorCode::space_mismatch);
  testing::cuda_ok(cudaDeviceSynchronize());  // nothing was queued on device 1
  testing::cuda_ok(cudaGetLastError());
  testing::cuda_ok(cudaSetDevice(0));
  for (const auto& [name, call] : calls) {
    CAPTURE(name);
    call();
  }
  const HybridMatrix<bf16> taken = std::move(held_gate).take_result();  // NOLINT(bugprone-use-after-move): refused
  CHECK(taken.overflow_rows() == gate_rows);
  testing::cuda_ok(cudaDeviceSynchronize());
}
