// spmm with op(A) = A^T on 16-bit TwELL and Hybrid A: the transposed tile-streaming kernel
// (kernels/cuda/spmm_stream.cu, path ".../tile_stream_t") against twell::reference::spmm on the
// same fresh random input. C = alpha A^T B + beta C with A: M x K, B: M x Nb, C: K x Nb (training's
// dWd = h^T dy). Tiny and ragged shapes (M = 1 to 3000, not multiples of the kernel's 256-row blocks
// or 32-row batches; K = 64 to 5632, ragged last tiles; Nb = 8, 136: a partial second column
// block), tiles of 256, 128 and 64 (warp windows past the tile), 8 to 256 slots (rows with more
// entries than a staged head holds), densities 0 to 100 % (Hybrid dense rows, read by the kernel
// itself), token-skewed rows at the paper shape, Inf and NaN in B with -0.0 in a dense row, alpha/beta
// with beta = 0 into NaN-poisoned C. Every row of C is checked on its own; a second run must give
// the same bits; the automatic choice, the forced kernel and the CSR route are each checked, and the
// kernel must be refused where it does not apply.
#include <doctest/doctest.h>

#include <cstdint>
#include <limits>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include <cuda_runtime.h>

#include <twell/converters/backends.hpp>
#include <twell/kernels/backends.hpp>
#include <twell/workload.hpp>

#include "checks.hpp"
#include "fixtures.hpp"
#include "random.hpp"
#include "sweep.hpp"

using namespace twell;
namespace ref = twell::reference;
namespace dev = twell::cuda;

namespace {

constexpr MemorySpace kHost = MemorySpace::host;
constexpr MemorySpace kDevice = MemorySpace::device;

using testing::nan_dense;
using testing::relative_bound;
using testing::worst_row_error;

constexpr std::pair<float, float> kAlphaBeta[] = {{1.0f, 0.0f}, {-0.75f, 0.0f}, {0.5f, -1.5f}};

// The reference C = alpha A^T B + beta C0 (NaN-poisoned when beta == 0).
template <class T, class HostM>
DenseMatrix<T> reference_spmm_t(const HostM& a_host, const DenseMatrix<T>& b, const DenseMatrix<T>& c0, float alpha,
                                float beta) {
  DenseMatrix<T> want = beta == 0.0f ? nan_dense<T>(a_host.cols(), b.cols()) : c0.to(kHost);
  ref::spmm<T>(Op::transpose, a_host.view(), b.view(), want.view(), alpha, beta);
  return want;
}

template <class T>
struct SpmmRun {
  DenseMatrix<T> got;
  std::string path;
};

// The cuda C = alpha A^T B + beta C0 (C poisoned with NaN when beta == 0) by `algorithm`.
template <class T, class DevM>
SpmmRun<T> run_spmm_t(const DevM& a_dev, const DenseMatrix<T>& b_dev, const DenseMatrix<T>& c0, float alpha,
                      float beta, SpmmAlgorithm algorithm) {
  DenseMatrix<T> c_dev = beta == 0.0f ? nan_dense<T>(a_dev.cols(), b_dev.cols()).to(kDevice) : c0.to(kDevice);
  KernelReport report;
  KernelOptions options;
  options.report = &report;
  options.spmm_algorithm = algorithm;
  dev::spmm<T>(Op::transpose, a_dev.view(), b_dev.view(), c_dev.view(), alpha, beta, options);
  REQUIRE(cudaDeviceSynchronize() == cudaSuccess);
  return {c_dev.to(kHost), report.path};
}

template <class T>
void check_close(const SpmmRun<T>& run, const DenseMatrix<T>& want) {
  CAPTURE(run.path);
  CHECK(testing::relative_error<T, T>(run.got.view(), want.view()) <= relative_bound<T>());  // NaN fails too
  CHECK(worst_row_error<T>(run.got, want) <= relative_bound<T>());
}

// The forced kernel (twice: the same bits), the automatic choice (the kernel up to 32 slots) and
// the CSR route against the reference, at every alpha/beta pair of the sweep.
template <class T, class HostM>
void check_transposed(const HostM& a_host, const DenseMatrix<T>& b, const std::string& format, std::uint64_t seed) {
  const auto a_dev = a_host.to(kDevice);
  const DenseMatrix<T> b_dev = b.to(kDevice);
  const auto c0 = testing::random_dense<T>(a_host.cols(), b.cols(), 1.0f, seed + 7);
  const std::string kernel = "cuda/spmm/" + format + "/tile_stream_t";
  const std::string csr = "cuda/spmm/" + format + "/via_csr_transpose";
  const bool automatic_kernel = a_host.layout().slots() <= 32;
  for (const auto& [alpha, beta] : testing::sweep_ends({kAlphaBeta[0], kAlphaBeta[1], kAlphaBeta[2]})) {
    CAPTURE(alpha);
    CAPTURE(beta);
    const DenseMatrix<T> want = reference_spmm_t<T>(a_host, b, c0, alpha, beta);
    const SpmmRun<T> forced = run_spmm_t<T>(a_dev, b_dev, c0, alpha, beta, SpmmAlgorithm::tile_stream);
    CHECK(forced.path == kernel);
    check_close<T>(forced, want);
    const SpmmRun<T> again = run_spmm_t<T>(a_dev, b_dev, c0, alpha, beta, SpmmAlgorithm::tile_stream);
    CHECK(testing::bitwise_equal<T>(again.got.view(), forced.got.view()));
    const SpmmRun<T> automatic = run_spmm_t<T>(a_dev, b_dev, c0, alpha, beta, SpmmAlgorithm::automatic);
    CHECK(automatic.path == (automatic_kernel ? kernel : csr));
    check_close<T>(automatic, want);
    const SpmmRun<T> through_csr = run_spmm_t<T>(a_dev, b_dev, c0, alpha, beta, SpmmAlgorithm::pair_balanced);
    CHECK(through_csr.path == csr);
    check_close<T>(through_csr, want);
  }
}

// Whether a TwELL of `layout` holds every row of d.
template <class T>
bool fits(DenseView<const T> d, TwellLayout layout) {
  for (std::int64_t i = 0; i < d.rows; ++i)
    for (std::int64_t t = 0; t < layout.tiles(d.cols); ++t) {
      std::int64_t count = 0;
      for (std::int64_t j = layout.tile_begin(t); j < layout.tile_begin(t) + layout.tile_cols(t, d.cols); ++j)
        count += is_stored(d.at(i, j)) ? 1 : 0;
      if (layout.overflows(count)) return false;
    }
  return true;
}

}  // namespace

TEST_CASE_TEMPLATE("cuda spmm with op(A) = A^T, tile-streaming: shapes, tiles, slots, densities", T, bf16, fp16) {
  // Under a reduced sweep (the sanitizer): the first, a middle and the last shape.
  constexpr std::pair<std::int64_t, std::int64_t> kShapes[] = {{1, 300},   {37, 777},   {300, 5632},
                                                               {1000, 300}, {1025, 777}, {3000, 64}};
  constexpr TwellLayout kLayouts[] = {{256, 16}, {256, 8}, {128, 4}, {64, 8}, {256, 1}};
  for (const auto& [m, k] : testing::sweep(kShapes)) {
    for (const std::int64_t nb : testing::sweep({std::int64_t{8}, std::int64_t{136}})) {
      for (const double density : testing::sweep({0.0, 0.005, 0.05, 0.5, 1.0})) {
        // Keep the CPU reference (nnz x Nb multiply-adds per run) cheap.
        if (static_cast<double>(m) * static_cast<double>(k) * density * static_cast<double>(nb) > 1e8) continue;
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
        const auto b = testing::random_dense<T>(m, nb, 1.0f, seed + 1);
        for (const TwellLayout layout : kLayouts) {
          CAPTURE(layout.tile);
          CAPTURE(layout.compression);
          if (fits<T>(a_dense.view(), layout))
            check_transposed<T>(ref::dense_to_twell<T>(a_dense.view(), layout), b, "twell", seed);
          check_transposed<T>(ref::dense_to_hybrid<T>(a_dense.view(), layout), b, "hybrid", seed);
        }
      }
    }
  }
}

// The paper's shape under token skew (Hybrid dense rows among the TwELL ones, heavy rows within
// capacity), and the same matrix at 32 slots, where rows of a tile often pass the 7 entries a
// staged head holds.
TEST_CASE_TEMPLATE("cuda spmm with op(A) = A^T, tile-streaming: token-skewed rows at the paper's shape", T, bf16,
                   fp16) {
  constexpr std::int64_t kK = 5632;
  const std::int64_t nb = testing::sweep_size(256, 64);
  for (const std::int64_t m : {std::int64_t{700}, std::int64_t{2000}}) {
    const std::uint64_t seed = testing::fresh_seed();
    CAPTURE(seed);
    CAPTURE(m);
    DenseMatrix<T> a_dense = workload::activations<T>({.tokens = m,
                                                       .units = kK,
                                                       .density = 0.005,
                                                       .distribution = workload::Distribution::token_skewed,
                                                       .seed = seed});
    // Rows of 8 to 30 entries in every tile: past the staged head, within 32 slots.
    for (std::int64_t i = 3; i < m; i += 101)
      for (std::int64_t j = 0; j < kK; j += 256 / (8 + i % 23))
        a_dense.view().at(i, j) = from_float<T>(0.25f + 0.001f * static_cast<float>(j % 97));
    const auto b = testing::random_dense<T>(m, nb, 1.0f, seed + 1);
    const HybridMatrix<T> hybrid = ref::dense_to_hybrid<T>(a_dense.view(), TwellLayout{256, 16});
    CHECK(hybrid.overflow_rows() > 0);
    check_transposed<T>(hybrid, b, "hybrid", seed);
    check_transposed<T>(ref::dense_to_hybrid<T>(a_dense.view(), TwellLayout{256, 8}), b, "hybrid", seed);
  }
}

// An Inf and a NaN in B reach exactly the rows of C whose column of A holds an entry in their row
// of B; the Inf's row of A is a Hybrid dense row with -0.0 in some columns, which is no entry
// (0 x Inf would be NaN).
TEST_CASE_TEMPLATE("cuda spmm with op(A) = A^T, tile-streaming: Inf and NaN in B stay where A has entries", T, bf16,
                   fp16) {
  constexpr std::int64_t kM = 900, kK = 777, kN = 64, kInfRow = 300, kNanRow = 301;
  const std::uint64_t seed = testing::fresh_seed();
  CAPTURE(seed);
  testing::SparseDenseOptions so;
  so.density = 0.01;
  auto a_dense = testing::random_sparse_dense<T>(kM, kK, so, seed);
  for (std::int64_t j = 0; j < kK; ++j)  // a dense row: -0.0 in every third column, entries elsewhere
    a_dense.view().at(kInfRow, j) = from_float<T>(j % 3 == 0 ? -0.0f : 0.5f + 0.001f * static_cast<float>(j));
  auto b = testing::random_dense<T>(kM, kN, 1.0f, seed + 1);
  b.view().at(kInfRow, 3) = from_float<T>(std::numeric_limits<float>::infinity());
  b.view().at(kNanRow, 5) = from_float<T>(std::numeric_limits<float>::quiet_NaN());
  const auto c0 = testing::random_dense<T>(kK, kN, 1.0f, seed + 2);
  const HybridMatrix<T> a = ref::dense_to_hybrid<T>(a_dense.view(), TwellLayout{256, 16});
  REQUIRE(a.overflow_rows() > 0);
  const auto a_dev = a.to(kDevice);
  const DenseMatrix<T> b_dev = b.to(kDevice);
  for (const auto& [alpha, beta] : kAlphaBeta) {
    CAPTURE(alpha);
    CAPTURE(beta);
    DenseMatrix<T> want = reference_spmm_t<T>(a, b, c0, alpha, beta);
    auto [got, path] = run_spmm_t<T>(a_dev, b_dev, c0, alpha, beta, SpmmAlgorithm::tile_stream);
    CHECK(path == "cuda/spmm/hybrid/tile_stream_t");
    const auto [mismatched, non_finite] = testing::split_non_finite<T>(got, want);
    CHECK(non_finite > 0);
    CHECK(non_finite < kK * kN / 2);  // the -0.0 columns stay finite
    CHECK(mismatched == 0);
    CHECK(worst_row_error<T>(got, want) <= relative_bound<T>());
  }
}

// Operands the kernel does not take: forced, a clear Error(unsupported); automatic, the CSR route.
TEST_CASE("cuda spmm with op(A) = A^T refuses the tile-streaming kernel where it does not apply") {
  const std::uint64_t seed = testing::fresh_seed();
  CAPTURE(seed);
  testing::SparseDenseOptions so;
  so.density = 0.05;
  const auto a16 = testing::random_sparse_dense<bf16>(200, 300, so, seed);
  const auto a32 = testing::random_sparse_dense<float>(200, 300, so, seed);
  const auto expect = [&](const auto& a_host, std::int64_t nb, SpmmAlgorithm algorithm, const char* path) {
    using T = std::remove_cvref_t<decltype(*a_host.view().overflow.data)>;
    CAPTURE(nb);
    CAPTURE(static_cast<int>(algorithm));
    const auto a_dev = a_host.to(kDevice);
    const auto b = testing::random_dense<T>(a_host.rows(), nb, 1.0f, seed + 1);
    const DenseMatrix<T> b_dev = b.to(kDevice);
    DenseMatrix<T> c_dev = nan_dense<T>(a_host.cols(), nb).to(kDevice);
    KernelReport report;
    KernelOptions options;
    options.report = &report;
    options.spmm_algorithm = algorithm;
    const auto run = [&] { dev::spmm<T>(Op::transpose, a_dev.view(), b_dev.view(), c_dev.view(), 1.0f, 0.0f, options); };
    if (path == nullptr) {
      CHECK(testing::code_of(run) == ErrorCode::unsupported);
      return;
    }
    run();
    REQUIRE(cudaDeviceSynchronize() == cudaSuccess);
    CHECK(report.path == path);
    const auto want = reference_spmm_t<T>(a_host, b, nan_dense<T>(a_host.cols(), nb), 1.0f, 0.0f);
    check_close<T>(SpmmRun<T>{c_dev.to(kHost), report.path}, want);
  };
  const auto narrow = ref::dense_to_hybrid<bf16>(a16.view(), TwellLayout{16, 4});  // 4 slots
  const auto paper = ref::dense_to_hybrid<bf16>(a16.view(), TwellLayout{256, 16});
  const auto single = ref::dense_to_hybrid<float>(a32.view(), TwellLayout{256, 16});
  expect(narrow, 64, SpmmAlgorithm::tile_stream, nullptr);
  expect(narrow, 64, SpmmAlgorithm::automatic, "cuda/spmm/hybrid/via_csr_transpose");
  expect(paper, 100, SpmmAlgorithm::tile_stream, nullptr);  // B's columns not in 8s
  expect(paper, 100, SpmmAlgorithm::automatic, "cuda/spmm/hybrid/via_csr_transpose");
  expect(paper, 64, SpmmAlgorithm::slice_reuse, nullptr);  // op(A) = A only
  expect(single, 64, SpmmAlgorithm::tile_stream, nullptr);
  expect(single, 64, SpmmAlgorithm::automatic, "cuda/spmm/hybrid/via_csr_transpose");
}
