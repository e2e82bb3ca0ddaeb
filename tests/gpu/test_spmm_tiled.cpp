// The weight-reuse TwELL spmm (kernels/cuda/spmm_tiled.cu) against twell::reference::spmm on the
// same fresh random input, at the down projection's shape (B 5632 x 2048): ragged token counts,
// tiles of 256 and 128, densities from empty to half full, token-skewed workloads, Hybrid with
// overflow rows, beta = 0 into NaN-poisoned C and beta != 0. Each case asserts through the
// kernel report that the tiled path ran; operands it does not take must fall back. Layouts cover
// both tiled kernels: slot words staged in shared memory (S = 4 to 32) and read from global
// memory (S = 64, 256).
#include <doctest/doctest.h>

#include <cmath>
#include <cstdint>
#include <limits>
#include <string>

#include <cuda_runtime.h>

#include <twell/converters/backends.hpp>
#include <twell/kernels/backends.hpp>
#include <twell/workload.hpp>

#include "fixtures.hpp"
#include "random.hpp"

using namespace twell;
namespace ref = twell::reference;
namespace dev = twell::cuda;

namespace {

constexpr MemorySpace kHost = MemorySpace::host;
constexpr MemorySpace kDevice = MemorySpace::device;
constexpr std::int64_t kK = 5632;
constexpr std::int64_t kN = 2048;

using testing::nan_dense;
using testing::relative_bound;

// Runs both backends on the same A, B, C0 and returns the cuda path taken.
template <class T, class HostM>
std::string check_spmm(const HostM& a_host, const DenseMatrix<T>& b, const DenseMatrix<T>& c0, float alpha,
                       float beta) {
  CAPTURE(alpha);
  CAPTURE(beta);
  const std::int64_t m = a_host.rows();
  DenseMatrix<T> want = beta == 0.0f ? nan_dense<T>(m, b.cols()) : c0.to(kHost);
  ref::spmm<T>(Op::none, a_host.view(), b.view(), want.view(), alpha, beta);

  const auto a_dev = a_host.to(kDevice);
  const DenseMatrix<T> b_dev = b.to(kDevice);
  DenseMatrix<T> c_dev = beta == 0.0f ? nan_dense<T>(m, b.cols()).to(kDevice) : c0.to(kDevice);
  KernelReport report;
  KernelOptions options;
  options.report = &report;
  dev::spmm<T>(Op::none, a_dev.view(), b_dev.view(), c_dev.view(), alpha, beta, options);
  REQUIRE(cudaDeviceSynchronize() == cudaSuccess);
  CAPTURE(report.path);
  const DenseMatrix<T> got = c_dev.to(kHost);
  const double err = testing::relative_error<T, T>(got.view(), want.view());
  CHECK(err <= relative_bound<T>());  // NaN (poison leaked or an element unwritten) fails too
  return report.path;
}

// Both alpha/beta cases on one matrix, each required to take `path`.
template <class T, class HostM>
void check_both(const HostM& a, const DenseMatrix<T>& b, const std::string& path, std::uint64_t seed) {
  const auto c0 = testing::random_dense<T>(a.rows(), kN, 1.0f, seed + 2);
  CHECK(check_spmm<T>(a, b, c0, 1.0f, 0.0f) == path);
  CHECK(check_spmm<T>(a, b, c0, 0.5f, -1.5f) == path);
}

std::string hybrid_path(std::int64_t overflow_rows) {
  return overflow_rows > 0 ? "cuda/spmm/hybrid/tiled_weight_reuse+cublas_overflow"
                           : "cuda/spmm/hybrid/tiled_weight_reuse";
}

struct Case {
  std::int64_t m;
  double density;
};

// Larger M only at the densities whose reference product stays cheap on the CPU.
constexpr Case kCases[] = {{1, 0.0},  {1, 0.005}, {1, 0.05},    {1, 0.5},    {77, 0.0},   {77, 0.005},  {77, 0.05},
                           {77, 0.5}, {600, 0.0}, {600, 0.005}, {600, 0.05}, {4096, 0.0}, {4096, 0.005}};

}  // namespace

TEST_CASE_TEMPLATE("cuda tiled TwELL spmm matches the reference: shapes, tiles, densities", T, bf16, fp16) {
  for (const Case& cs : kCases) {
    const std::uint64_t seed = testing::fresh_seed();
    CAPTURE(seed);
    CAPTURE(cs.m);
    CAPTURE(cs.density);
    testing::SparseDenseOptions so;
    so.density = cs.density;
    so.empty_row_share = 0.1;
    const auto a_dense = testing::random_sparse_dense<T>(cs.m, kK, so, seed);
    const auto b = testing::random_dense<T>(kK, kN, 1.0f, seed + 1);
    // TwELL with room for every row (C = 1 and 2: capacities 255 and 63), so dense tiles walk
    // many entries per token; the paper-like layouts go through Hybrid, whose overflow rows the
    // tiled kernel must leave to the cuBLAS path.
    for (const TwellLayout layout : {TwellLayout{256, 1}, TwellLayout{128, 2}}) {
      if (cs.density > 0.1 && layout.tile == 128) continue;  // 128 / 2 - 1 = 63 < half a tile
      CAPTURE(layout.tile);
      CAPTURE(layout.compression);
      const TwellMatrix<T> a = ref::dense_to_twell<T>(a_dense.view(), layout);
      check_both<T>(a, b, "cuda/spmm/twell/tiled_weight_reuse", seed);
    }
    // S = 32, 32, 16, 8, 4: every slot-word size of the staged kernel (C = 1 and 2 above, S = 256
    // and 64, take the kernel that reads slot words from global memory).
    for (const TwellLayout layout : {TwellLayout{256, 8}, TwellLayout{128, 4}, TwellLayout{256, 16},
                                     TwellLayout{128, 16}, TwellLayout{256, 64}}) {
      CAPTURE(layout.tile);
      CAPTURE(layout.compression);
      const HybridMatrix<T> a = ref::dense_to_hybrid<T>(a_dense.view(), layout);
      check_both<T>(a, b, hybrid_path(a.overflow_rows()), seed);
    }
  }
}

// Token-skewed activations from the workload generator, plus rows forced heavy (28 entries in
// every tile, within capacity) and rows forced to overflow one tile, next to each other so the
// interleaved warps of one block see them.
TEST_CASE_TEMPLATE("cuda tiled TwELL spmm under token skew, with Hybrid overflow rows", T, bf16, fp16) {
  for (const std::int64_t m : {std::int64_t{600}, std::int64_t{4096}}) {
    const std::uint64_t seed = testing::fresh_seed();
    CAPTURE(seed);
    CAPTURE(m);
    workload::ActivationOptions wo;
    wo.tokens = m;
    wo.units = kK;
    wo.density = 0.005;
    wo.distribution = workload::Distribution::token_skewed;
    wo.seed = seed;
    DenseMatrix<T> a_dense = workload::activations<T>(wo);
    const auto b = testing::random_dense<T>(kK, kN, 1.0f, seed + 1);
    auto v = a_dense.view();
    for (std::int64_t i = 1; i < m; i += 97)
      for (std::int64_t j = 0; j < kK; j += 9) v.at(i, j) = from_float<T>(0.25f + 0.0001f * static_cast<float>(j));
    for (std::int64_t i = 3; i < m; i += 131)
      for (std::int64_t j = 512; j < 512 + 64; ++j) v.at(i, j) = from_float<T>(-0.5f);
    const HybridMatrix<T> hybrid = ref::dense_to_hybrid<T>(a_dense.view(), TwellLayout{256, 8});
    CHECK(hybrid.overflow_rows() > 0);
    check_both<T>(hybrid, b, hybrid_path(hybrid.overflow_rows()), seed);
    const HybridMatrix<T> narrow = ref::dense_to_hybrid<T>(a_dense.view(), TwellLayout{128, 4});
    check_both<T>(narrow, b, hybrid_path(narrow.overflow_rows()), seed);
    const HybridMatrix<T> paper = ref::dense_to_hybrid<T>(a_dense.view(), TwellLayout{256, 16});
    check_both<T>(paper, b, hybrid_path(paper.overflow_rows()), seed);
    const TwellMatrix<T> twell = ref::dense_to_twell<T>(a_dense.view(), TwellLayout{256, 1});
    check_both<T>(twell, b, "cuda/spmm/twell/tiled_weight_reuse", seed);
  }
}

// Operands outside the tiled kernel's preconditions take the pair-balanced kernel and stay right:
// B's columns not a multiple of 128, a tile of 64, and fp32.
TEST_CASE("cuda tiled TwELL spmm: other operands fall back") {
  const std::uint64_t seed = testing::fresh_seed();
  CAPTURE(seed);
  testing::SparseDenseOptions so;
  so.density = 0.01;
  const auto a_dense = testing::random_sparse_dense<bf16>(300, kK, so, seed);
  {
    const TwellMatrix<bf16> a = ref::dense_to_twell<bf16>(a_dense.view(), TwellLayout{256, 4});
    const auto b = testing::random_dense<bf16>(kK, 200, 1.0f, seed + 1);
    const auto c0 = testing::random_dense<bf16>(300, 200, 1.0f, seed + 2);
    CHECK(check_spmm<bf16>(a, b, c0, 1.0f, 0.0f) == "cuda/spmm/twell/pair_balanced_vec16");
  }
  {
    const TwellMatrix<bf16> a = ref::dense_to_twell<bf16>(a_dense.view(), TwellLayout{64, 2});
    const auto b = testing::random_dense<bf16>(kK, 256, 1.0f, seed + 3);
    const auto c0 = testing::random_dense<bf16>(300, 256, 1.0f, seed + 4);
    CHECK(check_spmm<bf16>(a, b, c0, 1.0f, 0.0f) == "cuda/spmm/twell/pair_balanced_vec16");
  }
  {
    const auto a_f = testing::random_sparse_dense<float>(300, kK, so, seed + 5);
    const TwellMatrix<float> a = ref::dense_to_twell<float>(a_f.view(), TwellLayout{256, 4});
    const auto b = testing::random_dense<float>(kK, 256, 1.0f, seed + 6);
    const auto c0 = testing::random_dense<float>(300, 256, 1.0f, seed + 7);
    CHECK(check_spmm<float>(a, b, c0, 1.0f, 0.0f) == "cuda/spmm/twell/pair_balanced_vec16");
  }
}
