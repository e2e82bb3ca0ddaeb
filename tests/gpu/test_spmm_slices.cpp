// The TwELL spmm paths of op none: the slice-reuse kernel (kernels/cuda/spmm_slices.cu: count and
// chunk pre-pass, slice-major copy of B, product with a row group's entries in registers) and, for
// the layouts of 8 or 16 slots at these sizes, the tile-streaming kernel (spmm_stream.cu), against
// twell::reference::spmm on the same fresh random input: tiny and ragged shapes (M = 1, 37, 257,
// 1000, 1025; K = 300, 777, 5632, 11008; Nb = 8 to 2048), tiles of 256 and 128, densities 0,
// 0.5 %, 5 %, 50 % and 100 % (Hybrid overflow), token-skewed rows at the paper shape with rows far
// over one lane's 32 entries (rows of 2, 22 and 32 lanes, rows that span warps, rows of more than
// 1024 entries that fill a CTA of their own), a block of 2100 empty rows, alpha/beta combinations
// with beta = 0 into NaN-poisoned C, TwELL and Hybrid, bf16 and fp16. Every row is checked on its
// own (a few wrong rows hide in a whole-matrix norm). Each case runs the automatic choice and
// every kernel forced that takes its layout, asserting the forced kernels' reported paths; the
// automatic choice has a case of its own; operands neither fast path takes must fall back. SpmmPlan must give the same
// bits as spmm() and be reusable.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <string>
#include <utility>
#include <vector>

#include <cuda_runtime.h>

#include <twell/converters/backends.hpp>
#include <twell/kernels/backends.hpp>
#include <twell/kernels/spmm_plan.hpp>
#include <twell/workload.hpp>

#include "checks.hpp"
#include "device.hpp"
#include "fixtures.hpp"
#include "random.hpp"
#include "spmm_runs.hpp"
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

// Token-skewed activations at the paper's 0.5 % mean density (the real workload's rows).
template <class T>
DenseMatrix<T> token_skewed_activations(std::int64_t tokens, std::int64_t units, std::uint64_t seed) {
  return workload::activations<T>({.tokens = tokens,
                                   .units = units,
                                   .density = 0.005,
                                   .distribution = workload::Distribution::token_skewed,
                                   .seed = seed});
}

using testing::kSpmmAlphaBeta;
using testing::SpmmRun;

// The reference and the cuda C = alpha A B + beta C0 (op none).
template <class T, class HostM>
DenseMatrix<T> reference_spmm(const HostM& a_host, const DenseMatrix<T>& b, const DenseMatrix<T>& c0, float alpha,
                              float beta) {
  return testing::reference_spmm<T>(Op::none, a_host, b, c0, alpha, beta);
}
template <class T, class DevM>
SpmmRun<T> run_spmm(const DevM& a_dev, const DenseMatrix<T>& b_dev, const DenseMatrix<T>& c0, float alpha, float beta,
                    SpmmAlgorithm algorithm) {
  return testing::run_spmm<T>(Op::none, a_dev, b_dev, c0, alpha, beta, algorithm);
}

// The kernels a case forces, each with the path it must report.
using Kernels = std::vector<std::pair<SpmmAlgorithm, std::string>>;

// Both backends on the same A, B, C0: the automatic choice and every kernel of `forced` must
// match the reference. With a plan (automatic), the plan runs too and must reproduce spmm()'s bits
// and path. Returns the automatic path.
template <class T, class HostM>
std::string check_spmm(const HostM& a_host, const DenseMatrix<T>& b, const DenseMatrix<T>& c0, float alpha, float beta,
                       const Kernels& forced, dev::SpmmPlan<T>* plan = nullptr) {
  CAPTURE(alpha);
  CAPTURE(beta);
  const auto a_dev = a_host.to(kDevice);
  const DenseMatrix<T> b_dev = b.to(kDevice);
  const DenseMatrix<T> want = reference_spmm<T>(a_host, b, c0, alpha, beta);
  const auto check = [&](const SpmmRun<T>& run) {
    CAPTURE(run.path);
    const double err = testing::relative_error<T, T>(run.got.view(), want.view());
    CHECK(err <= relative_bound<T>());  // NaN (poison leaked or an element unwritten) fails too
    const double row_err = worst_row_error<T>(run.got, want);
    CHECK(row_err <= relative_bound<T>());
  };
  const SpmmRun<T> automatic = run_spmm<T>(a_dev, b_dev, c0, alpha, beta, SpmmAlgorithm::automatic);
  check(automatic);
  for (const auto& [algorithm, path] : forced) {
    const SpmmRun<T> run = run_spmm<T>(a_dev, b_dev, c0, alpha, beta, algorithm);
    CHECK(run.path == path);
    check(run);
  }
  if (plan != nullptr) {
    DenseMatrix<T> c_plan = beta == 0.0f ? nan_dense<T>(a_host.rows(), b.cols()).to(kDevice) : c0.to(kDevice);
    plan->run(a_dev.view(), b_dev.view(), c_plan.view(), alpha, beta);
    REQUIRE(cudaDeviceSynchronize() == cudaSuccess);
    CHECK(plan->path() == automatic.path);
    const DenseMatrix<T> got_plan = c_plan.to(kHost);
    CHECK(testing::bitwise_equal<T>(got_plan.view(), automatic.got.view()));
  }
  return automatic.path;
}

template <class T, class HostM>
void check_all(const HostM& a, const DenseMatrix<T>& b, const Kernels& forced, std::uint64_t seed,
               dev::SpmmPlan<T>* plan = nullptr) {
  const auto c0 = testing::random_dense<T>(a.rows(), b.cols(), 1.0f, seed + 2);
  for (const auto& [alpha, beta] : testing::sweep_ends({kSpmmAlphaBeta[0], kSpmmAlphaBeta[1], kSpmmAlphaBeta[2]}))
    check_spmm<T>(a, b, c0, alpha, beta, forced, plan);
}

// The slice-reuse kernel takes layouts whose rows hold at most 2048 entries (capacity x tiles, see
// kMaxRowEntries in spmm_slices.cu) in tiles of at most 256 columns (and a K whose two slices of B
// fit in shared memory: `slices_fit`); the tile-streaming kernel tiles of at most 256 columns with
// 8 or more slots, a multiple of 4 (every B and C of these tests is aligned, with columns in 8s).
// The pair-balanced kernel takes everything (16-byte vectors here).
Kernels forced_kernels(const std::string& format, TwellLayout layout, std::int64_t k, std::int64_t overflow_rows,
                       bool slices_fit) {
  const std::string base = "cuda/spmm/" + format + "/";
  const std::string tail = overflow_rows > 0 ? "+cublas_overflow" : "";
  Kernels kernels{{SpmmAlgorithm::pair_balanced, base + (format == "twell" ? "pair_balanced_vec16" : "pair_balanced") + tail}};
  if (layout.tile <= 256 && layout.slots() >= 8 && layout.slots() % 4 == 0)
    kernels.emplace_back(SpmmAlgorithm::tile_stream, base + "tile_stream" + tail);
  if (layout.tile <= 256 && layout.capacity() * layout.tiles(k) <= 2048 && slices_fit)
    kernels.emplace_back(SpmmAlgorithm::slice_reuse, base + "slice_reuse" + tail);
  return kernels;
}
Kernels twell_kernels(TwellLayout layout, std::int64_t k) { return forced_kernels("twell", layout, k, 0, true); }
Kernels hybrid_kernels(TwellLayout layout, std::int64_t k, std::int64_t overflow_rows, bool slices_fit = true) {
  return forced_kernels("hybrid", layout, k, overflow_rows, slices_fit);
}

// Sets `count` nonzeros of row i, spread over the columns (at most 255 per tile of 256, so that
// TwELL(256, 1) holds the row), with values that vary along the row.
template <class T>
void fill_row(DenseMatrix<T>& a, std::int64_t i, std::int64_t count) {
  auto v = a.view();
  std::int64_t usable = 0;
  for (std::int64_t j = 0; j < v.cols; ++j) usable += j % 256 != 0 ? 1 : 0;
  REQUIRE(count <= usable);
  std::int64_t placed = 0;
  for (std::int64_t j = 0; j < v.cols; ++j) v.at(i, j) = from_float<T>(0.0f);
  // Every column j % 256 != 0 in order of (j * 37) mod cols: spread, deterministic.
  for (std::int64_t step = 0; step < v.cols && placed < count; ++step) {
    const std::int64_t j = (step * 37) % v.cols;
    if (j % 256 == 0) continue;
    v.at(i, j) = from_float<T>(0.5f + 0.001f * static_cast<float>((j * 7) % 101) - 0.05f * static_cast<float>(i % 3));
    ++placed;
  }
}

// Whether the device stages two slices of 4 columns of a K x Nb B in shared memory (what the
// slice-reuse path needs at K = 11008).
bool device_takes_k(std::int64_t k) {
  int device = 0, limit = 0;
  REQUIRE(cudaGetDevice(&device) == cudaSuccess);
  REQUIRE(cudaDeviceGetAttribute(&limit, cudaDevAttrMaxSharedMemoryPerBlockOptin, device) == cudaSuccess);
  return 2 * ((k + 2) / 2 * 2) * 8 + 20 * 1024 <= limit;  // and ~19 KB of static shared memory
}

}  // namespace

TEST_CASE_TEMPLATE("cuda slice-reuse TwELL spmm matches the reference: shapes, tiles, densities", T, bf16, fp16) {
  // Under a reduced sweep (the sanitizer): (M, K) 1 x 300, 37 x 5632 and 1000 x 5632, B 64 wide,
  // four densities.
  constexpr std::pair<std::int64_t, std::int64_t> kShapes[] = {{1, 300},   {1, 5632},   {37, 300},
                                                               {37, 5632}, {1000, 300}, {1000, 5632}};
  for (const auto& [m, k] : testing::sweep(kShapes)) {
    for (const std::int64_t nb :
         testing::reduced_sweep() ? std::vector<std::int64_t>{64} : std::vector<std::int64_t>{128, 2048}) {
      // Reduced: 0 %, 5 % (overflowing rows), 50 % (plain TwELL on nonzero rows) and 100 %.
      for (const double density : testing::reduced_sweep() ? std::vector<double>{0.0, 0.05, 0.5, 1.0}
                                                           : std::vector<double>{0.0, 0.005, 0.05, 0.5, 1.0}) {
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
          check_all<T>(a, b, twell_kernels(TwellLayout{256, 1}, k), seed);
        }
        // Hybrid at the paper's layouts and narrower ones; at 100 % every row overflows.
        for (const TwellLayout layout : {TwellLayout{256, 16}, TwellLayout{128, 4}, TwellLayout{256, 2}}) {
          CAPTURE(layout.tile);
          CAPTURE(layout.compression);
          const HybridMatrix<T> a = ref::dense_to_hybrid<T>(a_dense.view(), layout);
          dev::SpmmPlan<T> plan(m, k, layout);
          check_all<T>(a, b, hybrid_kernels(layout, k, a.overflow_rows()), seed, &plan);
        }
      }
    }
  }
}

// Token-skewed activations from the workload generator, plus rows forced heavy (within capacity
// at C = 1) and rows forced to overflow one tile, next to each other so that the rows of one group
// see them; dense tiles included.
TEST_CASE_TEMPLATE("cuda slice-reuse TwELL spmm under token skew, with Hybrid overflow rows", T, bf16, fp16) {
  constexpr std::int64_t kK = 5632;
  const std::int64_t nb = testing::sweep_size(2048, 64);  // 256 slices of B, or 8 under the sanitizer
  for (const std::int64_t m : {std::int64_t{600}, std::int64_t{2000}}) {
    const std::uint64_t seed = testing::fresh_seed();
    CAPTURE(seed);
    CAPTURE(m);
    DenseMatrix<T> a_dense = token_skewed_activations<T>(m, kK, seed);
    const auto b = testing::random_dense<T>(kK, nb, 1.0f, seed + 1);
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
      check_all<T>(hybrid, b, hybrid_kernels(layout, kK, hybrid.overflow_rows()), seed, &plan);
    }
    const TwellMatrix<T> twell = ref::dense_to_twell<T>(a_dense.view(), TwellLayout{256, 1});
    check_all<T>(twell, b, twell_kernels(TwellLayout{256, 1}, kK), seed);
  }
}

// The paper shape with rows far over one lane's 32 entries, among token-skewed ones: 40 entries
// (2 lanes), 700 (22 lanes), 1024 (32 lanes, the most a regular row has), 1025 (33 lanes: a group
// of its own, spanning two warps) and 5610 (176 lanes, 6 warps). Plain TwELL(256, 1) keeps them
// all in the TwELL part (rows of up to 5610 entries: the pair-balanced kernel); Hybrid(256, 2)
// (capacity 127, pair-balanced too) keeps rows up to 2794 entries and sends the rest to the
// overflow block; Hybrid(256, 16) sends every heavy row there. Then rows placed on the lanes where
// a group ends and where rows straddle warps.
TEST_CASE_TEMPLATE("cuda slice-reuse TwELL spmm: rows of many lanes and rows that fill a CTA", T, bf16, fp16) {
  constexpr std::int64_t kM = 2048, kK = 5632;
  const std::int64_t nb = testing::sweep_size(2048, 64);  // 256 slices of B, or 8 under the sanitizer
  const std::uint64_t seed = testing::fresh_seed();
  CAPTURE(seed);
  DenseMatrix<T> a_dense = token_skewed_activations<T>(kM, kK, seed);
  for (std::int64_t i = 5; i < kM; i += 61) fill_row(a_dense, i, 40);
  for (std::int64_t i = 7; i < kM; i += 127) fill_row(a_dense, i, 700);
  for (std::int64_t i = 11; i < kM; i += 251) fill_row(a_dense, i, 1024);
  for (std::int64_t i = 13; i < kM; i += 331) fill_row(a_dense, i, 1025);
  fill_row(a_dense, 1000, 5610);
  fill_row(a_dense, 1001, 3000);
  const auto b = testing::random_dense<T>(kK, nb, 1.0f, seed + 1);
  {
    const TwellMatrix<T> a = ref::dense_to_twell<T>(a_dense.view(), TwellLayout{256, 1});
    dev::SpmmPlan<T> plan(kM, kK, TwellLayout{256, 1});
    check_all<T>(a, b, twell_kernels(TwellLayout{256, 1}, kK), seed, &plan);
  }
  // Hybrid(256, 4) (63 per tile, 1386 per row) keeps the rows of up to 1025 entries on the slice
  // path, the 1025-entry rows in groups of their own, and sends the 3000 and 5610 to the block.
  for (const TwellLayout layout : {TwellLayout{256, 4}, TwellLayout{256, 2}, TwellLayout{256, 16}}) {
    CAPTURE(layout.compression);
    const HybridMatrix<T> a = ref::dense_to_hybrid<T>(a_dense.view(), layout);
    dev::SpmmPlan<T> plan(kM, kK, layout);
    check_all<T>(a, b, hybrid_kernels(layout, kK, a.overflow_rows()), seed, &plan);
  }
  // Rows of exactly 1024 entries (32 lanes each), so that the first group ends with a row on lanes
  // 992-1023, then rows of 70 entries (3 lanes), so that rows straddle warp boundaries.
  {
    constexpr std::int64_t kRows = 200;
    DenseMatrix<T> full(kRows, kK);
    for (std::int64_t i = 0; i < kRows; ++i) fill_row(full, i, i < 100 ? 1024 : 70);
    const TwellMatrix<T> a = ref::dense_to_twell<T>(full.view(), TwellLayout{256, 4});
    const auto b_small = testing::random_dense<T>(kK, 256, 1.0f, seed + 5);
    check_all<T>(a, b_small, twell_kernels(TwellLayout{256, 4}, kK), seed);
  }
}

// 2100 consecutive empty rows (more than two groups of lanes that hold no entry), between rows of
// 1 % density and next to heavy rows; a matrix with no entry at all.
TEST_CASE_TEMPLATE("cuda slice-reuse TwELL spmm: empty row blocks", T, bf16, fp16) {
  constexpr std::int64_t kM = 3000, kK = 5632, kN = 256;
  const std::uint64_t seed = testing::fresh_seed();
  CAPTURE(seed);
  testing::SparseDenseOptions so;
  so.density = 0.01;
  DenseMatrix<T> a_dense = testing::random_sparse_dense<T>(kM, kK, so, seed);
  auto v = a_dense.view();
  for (std::int64_t i = 300; i < 2400; ++i)
    for (std::int64_t j = 0; j < kK; ++j) v.at(i, j) = from_float<T>(0.0f);
  fill_row(a_dense, 299, 900);
  fill_row(a_dense, 2400, 1500);
  const auto b = testing::random_dense<T>(kK, kN, 1.0f, seed + 1);
  for (const TwellLayout layout : {TwellLayout{256, 4}, TwellLayout{256, 8}}) {
    CAPTURE(layout.compression);
    const HybridMatrix<T> a = ref::dense_to_hybrid<T>(a_dense.view(), layout);
    dev::SpmmPlan<T> plan(kM, kK, layout);
    check_all<T>(a, b, hybrid_kernels(layout, kK, a.overflow_rows()), seed, &plan);
  }
  const DenseMatrix<T> zero =
      testing::random_sparse_dense<T>(kM, kK, testing::SparseDenseOptions{.density = 0.0}, seed);
  const TwellMatrix<T> a = ref::dense_to_twell<T>(zero.view(), TwellLayout{256, 8});
  check_all<T>(a, b, twell_kernels(TwellLayout{256, 8}, kK), seed);
}

// Ragged shapes: K not a multiple of the tile (777: last tiles of 9 columns) and the Llama shape
// K = 11008 (4-column slices), M just past a multiple of the pre-pass's 256 rows, Nb of 1, 3 and
// 5 slices (8-column) or 10 (4-column).
TEST_CASE_TEMPLATE("cuda slice-reuse TwELL spmm: ragged K, M and Nb", T, bf16, fp16) {
  for (const std::int64_t m : testing::sweep({std::int64_t{257}, testing::sweep_size(1025, 513)})) {
    for (const double density : {0.005, 0.03}) {
      const std::uint64_t seed = testing::fresh_seed();
      CAPTURE(seed);
      CAPTURE(m);
      CAPTURE(density);
      testing::SparseDenseOptions so;
      so.density = density;
      so.empty_row_share = 0.05;
      {
        constexpr std::int64_t kK = 777;
        const auto a_dense = testing::random_sparse_dense<T>(m, kK, so, seed);
        for (const std::int64_t nb : testing::sweep_ends({std::int64_t{8}, std::int64_t{24}, std::int64_t{40}})) {
          CAPTURE(nb);
          const auto b = testing::random_dense<T>(kK, nb, 1.0f, seed + 1);
          for (const TwellLayout layout : {TwellLayout{256, 1}, TwellLayout{128, 2}, TwellLayout{128, 4}}) {
            CAPTURE(layout.tile);
            const TwellMatrix<T> a = ref::dense_to_twell<T>(a_dense.view(), layout);
            dev::SpmmPlan<T> plan(m, kK, layout);
            check_all<T>(a, b, twell_kernels(layout, kK), seed, &plan);
          }
        }
      }
      {
        constexpr std::int64_t kK = 11008, kN = 40;  // ld 40: the path needs leading dimensions in 8s
        const auto a_dense = testing::random_sparse_dense<T>(m, kK, so, seed + 3);
        const auto b = testing::random_dense<T>(kK, kN, 1.0f, seed + 4);
        const HybridMatrix<T> a = ref::dense_to_hybrid<T>(a_dense.view(), TwellLayout{256, 8});
        dev::SpmmPlan<T> plan(m, kK, TwellLayout{256, 8});
        check_all<T>(a, b, hybrid_kernels(TwellLayout{256, 8}, kK, a.overflow_rows(), device_takes_k(kK)), seed,
                     &plan);
      }
    }
  }
}

// The slice kernel writes a row's pieces of C for slices s (even) and s + 1 together when one CTA
// runs both items (store_c): here enough items that every CTA runs several (~5 groups of lanes x
// 129 slices over ~132 CTAs, ~3 groups under the sanitizer's reduced sweep), so ranges start and
// end on odd and even slices and cross group ends, and the odd slice count leaves each group's
// last (even) slice alone. Heavy rows of 150 entries (~50 per tile of 64 slots) take 5 lanes; one
// that crosses a warp boundary is written by its owner lane, never held.
TEST_CASE_TEMPLATE("cuda slice-reuse TwELL spmm: pieces of C from adjacent slices", T, bf16, fp16) {
  constexpr std::int64_t kK = 777, kN = 1032;
  const std::int64_t m = testing::sweep_size(4000, 2500);
  const std::uint64_t seed = testing::fresh_seed();
  CAPTURE(seed);
  CAPTURE(m);
  testing::SparseDenseOptions so;
  so.density = 0.03;
  so.empty_row_share = 0.05;
  DenseMatrix<T> a_dense = testing::random_sparse_dense<T>(m, kK, so, seed);
  for (std::int64_t i = 40; i < m; i += 333) fill_row(a_dense, i, 150);
  const auto b = testing::random_dense<T>(kK, kN, 1.0f, seed + 1);
  const TwellLayout layout{256, 4};
  const TwellMatrix<T> a = ref::dense_to_twell<T>(a_dense.view(), layout);
  dev::SpmmPlan<T> plan(m, kK, layout);
  check_all<T>(a, b, twell_kernels(layout, kK), seed, &plan);
}

// An Inf and a NaN in B reach exactly the outputs of the rows whose entries use those B rows, as in
// the reference (sparse semantics: a zero of A never meets B). A kernel that multiplies B rows by
// explicit zeros (padding, or the zero rows of a tensor-core tile) would turn neighbouring rows
// NaN. Elementwise: NaN where the reference has NaN, the same infinity where it has one, and the
// finite elements within the usual row bound. (A Hybrid's overflow rows go through a dense cuBLAS
// product, where a row's zero times Inf is NaN: the layout here keeps every row in TwELL.)
TEST_CASE_TEMPLATE("cuda slice-reuse TwELL spmm: Inf and NaN in B stay in the rows that use them", T, bf16, fp16) {
  constexpr std::int64_t kM = 1000, kK = 777, kN = 64, kInfRow = 300, kNanRow = 301;
  // Every kernel, at 5 % with 64 slots and at 1 % with 16 (which hold every row there).
  for (const auto& [layout, density] : {std::pair{TwellLayout{256, 4}, 0.05}, std::pair{TwellLayout{256, 16}, 0.01}}) {
    CAPTURE(layout.compression);
    const std::uint64_t seed = testing::fresh_seed();
    CAPTURE(seed);
    testing::SparseDenseOptions so;
    so.density = density;
    const auto a_dense = testing::random_sparse_dense<T>(kM, kK, so, seed);
    auto b = testing::random_dense<T>(kK, kN, 1.0f, seed + 1);
    b.view().at(kInfRow, 3) = from_float<T>(std::numeric_limits<float>::infinity());
    b.view().at(kNanRow, 5) = from_float<T>(std::numeric_limits<float>::quiet_NaN());
    const auto c0 = testing::random_dense<T>(kM, kN, 1.0f, seed + 2);
    const TwellMatrix<T> a = ref::dense_to_twell<T>(a_dense.view(), layout);
    const auto a_dev = a.to(kDevice);
    const DenseMatrix<T> b_dev = b.to(kDevice);
    std::int64_t rows_hit = 0;
    for (std::int64_t i = 0; i < kM; ++i)
      rows_hit += to_float(a_dense.view().at(i, kInfRow)) != 0.0f || to_float(a_dense.view().at(i, kNanRow)) != 0.0f;
    REQUIRE(rows_hit > 0);
    REQUIRE(rows_hit < kM / 4);  // most rows must stay finite, or the test shows nothing
    for (const auto& [alpha, beta] : kSpmmAlphaBeta) {
      for (const auto& [algorithm, expected] : twell_kernels(layout, kK)) {
        CAPTURE(alpha);
        CAPTURE(beta);
        CAPTURE(expected);
        DenseMatrix<T> want = reference_spmm<T>(a, b, c0, alpha, beta);
        auto [got, path] = run_spmm<T>(a_dev, b_dev, c0, alpha, beta, algorithm);
        CHECK(path == expected);
        const auto [mismatched, non_finite] = testing::split_non_finite<T>(got, want);
        CHECK(non_finite > 0);
        CHECK(mismatched == 0);
        CHECK(worst_row_error<T>(got, want) <= relative_bound<T>());
      }
    }
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
    check_spmm<bf16>(a, b, c0, 1.0f, 0.0f, hybrid_kernels(layout, k, a.overflow_rows()), &plan);
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
  // A moved-from plan refuses to run; an algorithm outside the enum is refused by the plan and by
  // spmm() alike.
  const auto a = ref::dense_to_hybrid<bf16>(testing::random_dense<bf16>(m, k, 1.0f, 6).view(), layout).to(kDevice);
  dev::SpmmPlan<bf16> moved_to = std::move(plan);
  CHECK(testing::code_of([&] { plan.run(a.view(), b.view(), c.view()); }) ==  // NOLINT(bugprone-use-after-move)
        ErrorCode::invalid_argument);
  moved_to.run(a.view(), b.view(), c.view());
  const auto unknown = static_cast<SpmmAlgorithm>(9);
  CHECK(testing::code_of([&] { dev::SpmmPlan<bf16>(m, k, layout, {}, unknown); }) == ErrorCode::invalid_argument);
  KernelOptions options;
  options.spmm_algorithm = unknown;
  CHECK(testing::code_of([&] { dev::spmm<bf16>(Op::none, a.view(), b.view(), c.view(), 1.0f, 0.0f, options); }) ==
        ErrorCode::invalid_argument);
}

// Operands outside the slice-reuse path's preconditions take the pair-balanced kernel and stay
// right: B's columns not a multiple of 4, a tile of 512, fp32.
TEST_CASE("cuda slice-reuse TwELL spmm: other operands fall back") {
  constexpr std::int64_t kK = 5632;
  const std::uint64_t seed = testing::fresh_seed();
  CAPTURE(seed);
  testing::SparseDenseOptions so;
  so.density = 0.01;
  const auto a_dense = testing::random_sparse_dense<bf16>(300, kK, so, seed);
  {
    const TwellMatrix<bf16> a = ref::dense_to_twell<bf16>(a_dense.view(), TwellLayout{256, 4});
    const auto b = testing::random_dense<bf16>(kK, 202, 1.0f, seed + 1);
    const auto c0 = testing::random_dense<bf16>(300, 202, 1.0f, seed + 2);
    CHECK(check_spmm<bf16>(a, b, c0, 1.0f, 0.0f, {}) == "cuda/spmm/twell/pair_balanced_scalar");
  }
  {
    const TwellMatrix<bf16> a = ref::dense_to_twell<bf16>(a_dense.view(), TwellLayout{512, 2});
    const auto b = testing::random_dense<bf16>(kK, 256, 1.0f, seed + 3);
    const auto c0 = testing::random_dense<bf16>(300, 256, 1.0f, seed + 4);
    CHECK(check_spmm<bf16>(a, b, c0, 1.0f, 0.0f, {}) == "cuda/spmm/twell/pair_balanced_vec16");
  }
  {
    const auto a_f = testing::random_sparse_dense<float>(300, kK, so, seed + 5);
    const HybridMatrix<float> a = ref::dense_to_hybrid<float>(a_f.view(), TwellLayout{256, 16});
    const auto b = testing::random_dense<float>(kK, 256, 1.0f, seed + 6);
    const auto c0 = testing::random_dense<float>(300, 256, 1.0f, seed + 7);
    dev::SpmmPlan<float> plan(300, kK, TwellLayout{256, 16});
    const std::string path = check_spmm<float>(a, b, c0, 0.5f, 2.0f, {}, &plan);
    CHECK(path.rfind("cuda/spmm/hybrid/pair_balanced", 0) == 0);
  }
}

// SpmmAlgorithm::automatic by rows and layout (kernels/cuda/spmm.cu, choose_twell_path): the
// pair-balanced kernel up to 768 rows (2048 for more than 16 slots), the tile-streaming one up to
// 4096 rows at 8-16 slots, the slice-reuse one above, or the tile-streaming one again where K is
// too large for the slice-reuse kernel; each on both sides of its bound, with B 64 wide to keep
// the reference cheap (so tile-streaming's grid stays within one wave and choose_hybrid_path's
// rule for overflow rows, tested below, does not apply). A plan made for a forced kernel runs
// that kernel.
TEST_CASE("cuda spmm picks its TwELL kernel by rows and layout") {
  constexpr std::int64_t kK = 5632, kN = 64;
  // Two slices of 4 columns of B need (K + 2) x 16 bytes beside ~20 KB of static shared memory,
  // past an H100's 227 KB from K ~ 13230.
  constexpr std::int64_t kKPastSlices = 14000;
  const char* const past_slices = device_takes_k(kKPastSlices) ? "slice_reuse" : "tile_stream";
  struct Case {
    std::int64_t m;
    TwellLayout layout;
    const char* path;
    std::int64_t k = kK;
  };
  const Case cases[] = {{16, {256, 16}, "pair_balanced"},   {768, {256, 16}, "pair_balanced"},
                        {769, {256, 16}, "tile_stream"},    {4096, {256, 16}, "tile_stream"},
                        {4097, {256, 16}, "slice_reuse"},   {769, {256, 32}, "tile_stream"},
                        {2048, {256, 4}, "pair_balanced"}, {2049, {256, 4}, "slice_reuse"},
                        {4097, {256, 16}, past_slices, kKPastSlices}};
  for (const Case& c : testing::sweep(cases)) {
    const std::uint64_t seed = testing::fresh_seed();
    CAPTURE(seed);
    CAPTURE(c.m);
    CAPTURE(c.k);
    CAPTURE(c.layout.compression);
    testing::SparseDenseOptions so;
    so.density = 0.004;
    // Hybrid: 8 slots (capacity 7) may overflow a tile now and then at this density.
    const HybridMatrix<bf16> a =
        ref::dense_to_hybrid<bf16>(testing::random_sparse_dense<bf16>(c.m, c.k, so, seed).view(), c.layout);
    const auto b = testing::random_dense<bf16>(c.k, kN, 1.0f, seed + 1);
    const auto c0 = testing::random_dense<bf16>(c.m, kN, 1.0f, seed + 2);
    dev::SpmmPlan<bf16> plan(c.m, c.k, c.layout);
    const std::string path = check_spmm<bf16>(a, b, c0, 1.0f, 0.0f, {}, &plan);
    CHECK(path.rfind(std::string("cuda/spmm/hybrid/") + c.path, 0) == 0);
  }
  // A plan bound to a kernel runs it whatever the rows, and right.
  const TwellLayout layout{256, 16};
  const std::uint64_t seed = testing::fresh_seed();
  CAPTURE(seed);
  const auto a_dense = testing::random_sparse_dense<bf16>(100, kK, testing::SparseDenseOptions{.density = 0.005}, seed);
  const TwellMatrix<bf16> a = ref::dense_to_twell<bf16>(a_dense.view(), layout);
  const auto b = testing::random_dense<bf16>(kK, kN, 1.0f, seed + 1);
  const DenseMatrix<bf16> want = reference_spmm<bf16>(a, b, b, 1.0f, 0.0f);  // beta 0: C0 unused
  DenseMatrix<bf16> c = nan_dense<bf16>(100, kN).to(kDevice);
  dev::SpmmPlan<bf16> plan(100, kK, layout, {}, SpmmAlgorithm::slice_reuse);
  plan.run(a.to(kDevice).view(), b.to(kDevice).view(), c.view());
  REQUIRE(cudaDeviceSynchronize() == cudaSuccess);
  CHECK(plan.path() == "cuda/spmm/twell/slice_reuse");
  CHECK(worst_row_error<bf16>(c.to(kHost), want) <= relative_bound<bf16>());
}

// A Hybrid with overflow rows takes slice-reuse where tile-streaming (256 x 128 blocks of C per
// CTA) would need more than one wave, and stays on tile-streaming within one; spmm() and a plan
// agree (check_spmm compares their paths and bits). 1024 rows in 4 row blocks, B as wide as makes
// tile-streaming's grid at most the device's SMs, or past them. Like the test above, it assumes a
// device with the shared memory for the tile-streaming kernel (218 KiB per block: Hopper).
TEST_CASE("cuda spmm takes slice-reuse for a Hybrid with overflow rows past one wave of tile-streaming") {
  constexpr std::int64_t kM = 1024, kK = 5632;
  const TwellLayout layout{256, 16};
  const std::int64_t one_wave_blocks = testing::device_multiprocessors() / (kM / 256);
  for (const auto& [blocks, path] :
       {std::pair{one_wave_blocks, "tile_stream"}, std::pair{one_wave_blocks + 1, "slice_reuse"}}) {
    const std::uint64_t seed = testing::fresh_seed();
    CAPTURE(seed);
    CAPTURE(blocks);
    testing::SparseDenseOptions so;
    so.density = 0.004;
    so.full_row_share = 0.01;  // dense rows: the overflow
    const HybridMatrix<bf16> a =
        ref::dense_to_hybrid<bf16>(testing::random_sparse_dense<bf16>(kM, kK, so, seed).view(), layout);
    REQUIRE(a.overflow_rows() > 0);
    const auto b = testing::random_dense<bf16>(kK, 128 * blocks, 1.0f, seed + 1);
    const auto c0 = testing::random_dense<bf16>(kM, 128 * blocks, 1.0f, seed + 2);
    dev::SpmmPlan<bf16> plan(kM, kK, layout);
    const std::string got = check_spmm<bf16>(a, b, c0, 1.0f, 0.5f, {}, &plan);
    CHECK(got == std::string("cuda/spmm/hybrid/") + path + "+cublas_overflow");
  }
}

template <class T>
void expect_unsupported(const TwellMatrix<T>& a_host, std::int64_t nb, SpmmAlgorithm algorithm) {
  const auto a = a_host.to(kDevice);
  const auto b = testing::random_dense<T>(a_host.cols(), nb, 1.0f, 3).to(kDevice);
  DenseMatrix<T> c(a_host.rows(), nb, kDevice);
  KernelOptions options;
  options.spmm_algorithm = algorithm;
  try {
    dev::spmm<T>(Op::none, a.view(), b.view(), c.view(), 1.0f, 0.0f, options);
    FAIL("no error for a forced kernel that does not take the operands");
  } catch (const Error& e) {
    CHECK(e.code() == ErrorCode::unsupported);
  }
}

// A forced kernel that does not take the operands is refused with unsupported, never run on them
// nor silently replaced: the tile-streaming kernel with 4 slots or fp32 values, the slice-reuse
// kernel with tiles of 512 columns.
TEST_CASE("cuda spmm refuses a forced TwELL kernel that does not take the operands") {
  constexpr std::int64_t kM = 64, kK = 1024, kN = 64;
  const testing::SparseDenseOptions so{.density = 0.0};  // the layouts alone decide: 4 slots hold no row of 1 %
  const auto a16 = testing::random_sparse_dense<bf16>(kM, kK, so, 1);
  expect_unsupported<bf16>(ref::dense_to_twell<bf16>(a16.view(), TwellLayout{256, 64}), kN,
                           SpmmAlgorithm::tile_stream);
  expect_unsupported<bf16>(ref::dense_to_twell<bf16>(a16.view(), TwellLayout{512, 4}), kN, SpmmAlgorithm::slice_reuse);
  const auto a32 = testing::random_sparse_dense<float>(kM, kK, so, 2);
  expect_unsupported<float>(ref::dense_to_twell<float>(a32.view(), TwellLayout{256, 16}), kN,
                            SpmmAlgorithm::tile_stream);
}

// The tile-streaming grid ends at 65535 slices of 128 columns of B: forced, the kernel runs at
// that width and is refused one slice past it, naming the limit; automatic (the pair-balanced
// kernel at these 4 rows) stays right past it.
TEST_CASE("cuda spmm with B as wide as the tile-streaming kernel's 65535 column slices, and wider") {
  constexpr std::int64_t kM = 4, kK = 16;
  constexpr std::int64_t kAtLimit = 65535LL * 128;
  const std::uint64_t seed = testing::fresh_seed();
  CAPTURE(seed);
  const TwellMatrix<bf16> a_host = ref::dense_to_twell<bf16>(
      testing::random_sparse_dense<bf16>(kM, kK, {.density = 0.3}, seed).view(), TwellLayout{16, 1});
  const auto b_at = testing::random_dense<bf16>(kK, kAtLimit, 1.0f, seed + 1);
  const auto c_at = testing::random_dense<bf16>(kM, kAtLimit, 1.0f, seed + 2);
  check_spmm<bf16>(a_host, b_at, c_at, 1.0f, 0.5f, {{SpmmAlgorithm::tile_stream, "cuda/spmm/twell/tile_stream"}});

  constexpr std::int64_t kPast = kAtLimit + 8;  // one slice more, columns still in 8s
  const auto b = testing::random_dense<bf16>(kK, kPast, 1.0f, seed + 3);
  const auto c0 = testing::random_dense<bf16>(kM, kPast, 1.0f, seed + 4);
  CHECK(check_spmm<bf16>(a_host, b, c0, 1.0f, 0.5f, {}) == "cuda/spmm/twell/pair_balanced_vec16");
  const auto a = a_host.to(kDevice);
  const DenseMatrix<bf16> b_dev = b.to(kDevice);
  DenseMatrix<bf16> c(kM, kPast, kDevice);
  KernelOptions options;
  options.spmm_algorithm = SpmmAlgorithm::tile_stream;
  try {
    dev::spmm<bf16>(Op::none, a.view(), b_dev.view(), c.view(), 1.0f, 0.0f, options);
    FAIL("no error for the tile-streaming kernel past its grid");
  } catch (const Error& e) {
    CHECK(e.code() == ErrorCode::unsupported);
    CHECK(std::string(e.what()).find("B of at most 8388480 columns") != std::string::npos);
  }
}

// A B whose rows lie 2^40 bytes apart (one row, so nothing past its first row is read) cannot be
// described to TMA, by which an sm_90a build stages the tile-streaming kernel's B: forced, that
// kernel is refused with unsupported (not a failed encode at launch); automatic, which takes that
// kernel for these 1024 rows of a compact B, takes another, exactly (one entry a sum).
TEST_CASE("cuda spmm with B's rows too far apart for a tensor map") {
  constexpr std::int64_t kM = 1024, kN = 64;
  constexpr std::int64_t kFar = std::int64_t{1} << 39;
  const std::uint64_t seed = testing::fresh_seed();
  CAPTURE(seed);
  const TwellMatrix<bf16> a_host = ref::dense_to_twell<bf16>(
      testing::random_sparse_dense<bf16>(kM, 1, {.density = 0.5}, seed).view(), TwellLayout{16, 1});
  const auto b_host = testing::random_dense<bf16>(1, kN, 1.0f, seed + 1);
  DenseMatrix<bf16> want = nan_dense<bf16>(kM, kN);
  ref::spmm<bf16>(Op::none, a_host.view(), b_host.view(), want.view(), 1.0f, 0.0f);
  const auto a = a_host.to(kDevice);
  const DenseMatrix<bf16> b = b_host.to(kDevice);
  DenseView<const bf16> far = b.view();
  far.ld = kFar;
  DenseMatrix<bf16> c = nan_dense<bf16>(kM, kN).to(kDevice);
  KernelOptions forced;
  forced.spmm_algorithm = SpmmAlgorithm::tile_stream;
  dev::spmm<bf16>(Op::none, a.view(), b.view(), c.view(), 1.0f, 0.0f, forced);  // the kernel takes rows 128 bytes apart
  CHECK(testing::code_of([&] { dev::spmm<bf16>(Op::none, a.view(), far, c.view(), 1.0f, 0.0f, forced); }) ==
        ErrorCode::unsupported);
  KernelReport report;
  KernelOptions automatic;
  automatic.report = &report;
  dev::spmm<bf16>(Op::none, a.view(), b.view(), c.view(), 1.0f, 0.0f, automatic);
  CHECK(report.path == "cuda/spmm/twell/tile_stream");
  c = nan_dense<bf16>(kM, kN).to(kDevice);
  dev::spmm<bf16>(Op::none, a.view(), far, c.view(), 1.0f, 0.0f, automatic);
  REQUIRE(cudaDeviceSynchronize() == cudaSuccess);
  CAPTURE(report.path);
  CHECK(report.path.find("tile_stream") == std::string::npos);
  CHECK(testing::bitwise_equal<bf16>(c.to(kHost).view(), want.view()));
}
