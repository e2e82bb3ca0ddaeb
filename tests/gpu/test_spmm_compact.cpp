// The weight-reuse TwELL spmm (kernels/cuda/spmm_compact.cu: compaction pre-pass + product)
// against twell::reference::spmm on the same fresh random input: tiny and ragged shapes
// (M = 1, 37, 1000; K = 300, 5632; Nb = 128, 2048), tiles of 256 and 128, densities 0, 0.5 %, 5 %,
// 50 % and 100 % (Hybrid overflow), token-skewed rows that overflow into the Hybrid block,
// alpha/beta combinations with beta = 0 into NaN-poisoned C, TwELL and Hybrid, bf16 and fp16.
// Each case asserts through the kernel report that the weight-reuse path ran; operands it does
// not take must fall back. SpmmPlan must give the same bits as spmm() and be reusable.
#include <doctest/doctest.h>

#include <cmath>
#include <cstdint>
#include <string>
#include <utility>

#include <cuda_runtime.h>

#include <twell/converters/backends.hpp>
#include <twell/kernels/backends.hpp>
#include <twell/kernels/spmm_plan.hpp>
#include <twell/workload.hpp>

#include "fixtures.hpp"
#include "random.hpp"

using namespace twell;
namespace ref = twell::reference;
namespace dev = twell::cuda;

namespace {

constexpr MemorySpace kHost = MemorySpace::host;
constexpr MemorySpace kDevice = MemorySpace::device;

using testing::nan_dense;
using testing::relative_bound;

constexpr std::pair<float, float> kAlphaBeta[] = {{1.0f, 0.0f}, {-0.75f, 0.0f}, {0.5f, -1.5f}};

// Runs both backends on the same A, B, C0 (C poisoned with NaN when beta == 0) and returns the
// cuda path taken. With a plan, the plan runs too and must reproduce spmm()'s bits.
template <class T, class HostM>
std::string check_spmm(const HostM& a_host, const DenseMatrix<T>& b, const DenseMatrix<T>& c0, float alpha,
                       float beta, dev::SpmmPlan<T>* plan = nullptr) {
  CAPTURE(alpha);
  CAPTURE(beta);
  const std::int64_t m = a_host.rows();
  const std::int64_t nb = b.cols();
  DenseMatrix<T> want = beta == 0.0f ? nan_dense<T>(m, nb) : c0.to(kHost);
  ref::spmm<T>(Op::none, a_host.view(), b.view(), want.view(), alpha, beta);

  const auto a_dev = a_host.to(kDevice);
  const DenseMatrix<T> b_dev = b.to(kDevice);
  DenseMatrix<T> c_dev = beta == 0.0f ? nan_dense<T>(m, nb).to(kDevice) : c0.to(kDevice);
  KernelReport report;
  KernelOptions options;
  options.report = &report;
  dev::spmm<T>(Op::none, a_dev.view(), b_dev.view(), c_dev.view(), alpha, beta, options);
  REQUIRE(cudaDeviceSynchronize() == cudaSuccess);
  CAPTURE(report.path);
  const DenseMatrix<T> got = c_dev.to(kHost);
  const double err = testing::relative_error<T, T>(got.view(), want.view());
  CHECK(err <= relative_bound<T>());  // NaN (poison leaked or an element unwritten) fails too

  if (plan != nullptr) {
    DenseMatrix<T> c_plan = beta == 0.0f ? nan_dense<T>(m, nb).to(kDevice) : c0.to(kDevice);
    plan->run(a_dev.view(), b_dev.view(), c_plan.view(), alpha, beta);
    REQUIRE(cudaDeviceSynchronize() == cudaSuccess);
    CHECK(plan->path() == report.path);
    const DenseMatrix<T> got_plan = c_plan.to(kHost);
    CHECK(testing::bitwise_equal<T>(got_plan.view(), got.view()));
  }
  return report.path;
}

template <class T, class HostM>
void check_all(const HostM& a, const DenseMatrix<T>& b, const std::string& path, std::uint64_t seed,
               dev::SpmmPlan<T>* plan = nullptr) {
  const auto c0 = testing::random_dense<T>(a.rows(), b.cols(), 1.0f, seed + 2);
  for (const auto& [alpha, beta] : kAlphaBeta) CHECK(check_spmm<T>(a, b, c0, alpha, beta, plan) == path);
}

std::string hybrid_path(std::int64_t overflow_rows) {
  return overflow_rows > 0 ? "cuda/spmm/hybrid/compact_weight_reuse+cublas_overflow"
                           : "cuda/spmm/hybrid/compact_weight_reuse";
}
constexpr const char* kTwellPath = "cuda/spmm/twell/compact_weight_reuse";

}  // namespace

TEST_CASE_TEMPLATE("cuda compact TwELL spmm matches the reference: shapes, tiles, densities", T, bf16, fp16) {
  for (const std::int64_t m : {std::int64_t{1}, std::int64_t{37}, std::int64_t{1000}}) {
    for (const std::int64_t k : {std::int64_t{300}, std::int64_t{5632}}) {
      for (const std::int64_t nb : {std::int64_t{128}, std::int64_t{2048}}) {
        for (const double density : {0.0, 0.005, 0.05, 0.5, 1.0}) {
          // Keep the CPU reference (nnz x Nb multiply-adds per alpha/beta pair) cheap.
          if (static_cast<double>(m) * static_cast<double>(k) * density * static_cast<double>(nb) > 3e8) continue;
          const std::uint64_t seed = testing::fresh_seed();
          CAPTURE(seed);
          CAPTURE(m);
          CAPTURE(k);
          CAPTURE(nb);
          CAPTURE(density);
          testing::SparseDenseOptions so;
          so.density = density;
          so.empty_row_share = density < 1.0 ? 0.1 : 0.0;
          so.full_row_share = density > 0.0 && density < 0.5 ? 0.02 : 0.0;  // rows that overflow
          const auto a_dense = testing::random_sparse_dense<T>(m, k, so, seed);
          const auto b = testing::random_dense<T>(k, nb, 1.0f, seed + 1);
          // Plain TwELL where a layout has room for every row: C = 1 (capacity 255 of 256).
          if (density < 1.0 && so.full_row_share == 0.0) {
            const TwellMatrix<T> a = ref::dense_to_twell<T>(a_dense.view(), TwellLayout{256, 1});
            check_all<T>(a, b, kTwellPath, seed);
          }
          // Hybrid at the paper's layouts and narrower ones; at 100 % every row overflows.
          for (const TwellLayout layout : {TwellLayout{256, 16}, TwellLayout{128, 4}, TwellLayout{256, 2}}) {
            CAPTURE(layout.tile);
            CAPTURE(layout.compression);
            const HybridMatrix<T> a = ref::dense_to_hybrid<T>(a_dense.view(), layout);
            dev::SpmmPlan<T> plan(m, k, layout);
            check_all<T>(a, b, hybrid_path(a.overflow_rows()), seed, &plan);
          }
        }
      }
    }
  }
}

// Token-skewed activations from the workload generator, plus rows forced heavy (within capacity
// at C = 1) and rows forced to overflow one tile, next to each other so the interleaved warps of
// one row block see them; dense tiles (more than 32 entries per warp and tile) included.
TEST_CASE_TEMPLATE("cuda compact TwELL spmm under token skew, with Hybrid overflow rows", T, bf16, fp16) {
  constexpr std::int64_t kK = 5632, kN = 2048;
  for (const std::int64_t m : {std::int64_t{600}, std::int64_t{2000}}) {
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
    for (const TwellLayout layout : {TwellLayout{256, 16}, TwellLayout{256, 8}, TwellLayout{128, 4}}) {
      CAPTURE(layout.tile);
      CAPTURE(layout.compression);
      const HybridMatrix<T> hybrid = ref::dense_to_hybrid<T>(a_dense.view(), layout);
      CHECK(hybrid.overflow_rows() > 0);
      dev::SpmmPlan<T> plan(m, kK, layout);
      check_all<T>(hybrid, b, hybrid_path(hybrid.overflow_rows()), seed, &plan);
    }
    const TwellMatrix<T> twell = ref::dense_to_twell<T>(a_dense.view(), TwellLayout{256, 1});
    check_all<T>(twell, b, kTwellPath, seed);
  }
}

// One plan serves fresh matrices of its shape; a matrix of another shape or layout is refused.
TEST_CASE("cuda SpmmPlan is reusable and checks its shape") {
  constexpr std::int64_t m = 300, k = 5632, nb = 256;
  const TwellLayout layout{256, 16};
  dev::SpmmPlan<bf16> plan(m, k, layout);
  for (int rep = 0; rep < 3; ++rep) {
    const std::uint64_t seed = testing::fresh_seed();
    CAPTURE(seed);
    testing::SparseDenseOptions so;
    so.density = 0.01 * (rep + 1);
    so.full_row_share = 0.02;
    const auto a = ref::dense_to_hybrid<bf16>(testing::random_sparse_dense<bf16>(m, k, so, seed).view(), layout);
    const auto b = testing::random_dense<bf16>(k, nb, 1.0f, seed + 1);
    const auto c0 = testing::random_dense<bf16>(m, nb, 1.0f, seed + 2);
    CHECK(check_spmm<bf16>(a, b, c0, 1.0f, 0.0f, &plan) == hybrid_path(a.overflow_rows()));
  }
  const auto other = ref::dense_to_hybrid<bf16>(testing::random_dense<bf16>(m, k, 1.0f, 5).view(), TwellLayout{256, 8});
  const auto a_dev = other.to(kDevice);
  DenseMatrix<bf16> b(k, nb, kDevice), c(m, nb, kDevice);
  try {
    plan.run(a_dev.view(), b.view(), c.view());
    FAIL("no error for a layout the plan was not made for");
  } catch (const Error& e) {
    CHECK(e.code() == ErrorCode::shape_mismatch);
  }
}

// Operands outside the weight-reuse path's preconditions take the pair-balanced kernel and stay
// right: B's columns not a multiple of 128, a tile of 64, fp32.
TEST_CASE("cuda compact TwELL spmm: other operands fall back") {
  constexpr std::int64_t kK = 5632;
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
    const HybridMatrix<float> a = ref::dense_to_hybrid<float>(a_f.view(), TwellLayout{256, 16});
    const auto b = testing::random_dense<float>(kK, 256, 1.0f, seed + 6);
    const auto c0 = testing::random_dense<float>(300, 256, 1.0f, seed + 7);
    dev::SpmmPlan<float> plan(300, kK, TwellLayout{256, 16});
    const std::string path = check_spmm<float>(a, b, c0, 0.5f, 2.0f, &plan);
    CHECK(path.rfind("cuda/spmm/hybrid/pair_balanced", 0) == 0);
  }
}
