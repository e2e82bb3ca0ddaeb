// The direct transpose of 16-bit TwELL and Hybrid matrices (kernels/cuda/transpose_twell.cu) and
// spmm with op(A) = A^T through it (kernels/cuda/spmm.cu, path ".../via_transpose+<op-none path>"),
// against twell::reference on the same fresh random input.
// - transpose: the Hybrid must equal the reference's word for word (slot words, both row maps, the
//   dense block's bits) for tiny and ragged shapes, densities 0 to 100 % with NaN, Inf and -0.0
//   values, input tiles of 16 to 256 (3 to 32 slots) and output tiles of 16 to 256, TwELL and
//   Hybrid inputs (Hybrid dense rows read as whole rows), columns of A hot enough to overflow A^T's
//   groups; every output layout of 32 slots, with a group at exactly capacity and one past it;
//   a Hybrid's dense rows read 16 bytes at a time, a ragged last tile and a leading dimension past
//   the columns included;
//   -0.0 written into a Hybrid's dense block, which is no entry (through spmm too).
// - spmm: C = alpha A^T B + beta C (B: M x Nb, C: K x Nb) with beta = 0 into NaN-poisoned C, every
//   row of C checked on its own (and, in the shapes, token-skewed and SpmmPlan cases, every
//   element within one rounding into T of the reference's), the automatic choice and each op-none
//   kernel forced on A^T, a repeat run bit-equal, token-skewed rows at the paper's shape, Inf and
//   NaN in B reaching only the rows of C whose column of A has an entry in their row of B (a dense
//   row's -0.0 is none), and the operands this route does not take going through CSR; SpmmPlan's
//   op(A) = A^T runs bit-equal to spmm() on fresh matrices, its storage growing with the hot
//   columns; its run_transposed gives one, two and three products at once the bits each gets
//   alone, and writes nothing when it refuses a call; with SlotStructure::shared, value planes of
//   one structure (+-0 values included) give the reference's products and, where no plane holds
//   +-0 at another's entry, the separate call's bits, and planes of other structures are refused.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <span>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include <cuda_runtime.h>

#include <twell/converters/backends.hpp>
#include <twell/formats/validate.hpp>
#include <twell/kernels/backends.hpp>
#include <twell/kernels/spmm_plan.hpp>
#include <twell/workload.hpp>

#include "checks.hpp"
#include "device.hpp"
#include "fixtures.hpp"
#include "random.hpp"
#include "same.hpp"
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

template <class U>
bool same_words(const Buffer<U>& got, const Buffer<U>& want) {
  return testing::same_bytes(got.copy_to(kHost), want);
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

// A^T from the cuda backend word for word as the reference's, which it returns (for the callers'
// checks that the input reached what they test).
template <class T, class HostM>
HybridMatrix<T> check_transpose(const HostM& a, TwellLayout out_layout, const std::string& format) {
  CAPTURE(format);
  CAPTURE(out_layout.tile);
  CAPTURE(out_layout.compression);
  HybridMatrix<T> want = ref::transpose<T>(a.view(), out_layout);
  const auto a_dev = a.to(kDevice);
  KernelReport report;
  const HybridMatrix<T> got = dev::transpose<T>(a_dev.view(), out_layout, KernelOptions{{}, &report});
  REQUIRE(cudaDeviceSynchronize() == cudaSuccess);
  CHECK(report.path == "cuda/transpose/" + format + "/direct");
  REQUIRE(got.overflow_rows() == want.overflow_rows());
  CHECK(same_words(got.twell().packed(), want.twell().packed()));
  CHECK(same_words(got.row_to_overflow(), want.row_to_overflow()));
  CHECK(same_words(got.overflow_to_row(), want.overflow_to_row()));
  CHECK(same_words(got.overflow().values(), want.overflow().values()));
  return want;
}

// A's dense form for the word-for-word cases: entries at `density`, special values among them, a
// share `full_rows` of its rows full.
template <class T>
DenseMatrix<T> transpose_source(std::int64_t m, std::int64_t k, double density, double full_rows, std::uint64_t seed) {
  testing::SparseDenseOptions so;
  so.density = density;
  so.specials = true;
  so.full_row_share = full_rows;
  return testing::random_sparse_dense<T>(m, k, so, seed);
}

// check_transpose of A (dense) as a Hybrid in each input layout and, where it fits, as TwELL, into
// each output layout; on_reference(out layout, the Hybrid's reference A^T) runs the caller's
// checks of what the input reached. Returns how many inputs were TwELL.
template <class T, class F>
int check_transposes(const DenseMatrix<T>& a_dense, std::span<const TwellLayout> ins, std::span<const TwellLayout> outs,
                     F&& on_reference) {
  int plain_inputs = 0;
  for (const TwellLayout in : ins) {
    CAPTURE(in.tile);
    CAPTURE(in.compression);
    const HybridMatrix<T> hybrid = ref::dense_to_hybrid<T>(a_dense.view(), in);
    const bool plain = fits<T>(a_dense.view(), in);
    plain_inputs += plain ? 1 : 0;
    for (const TwellLayout out : outs) {
      on_reference(out, check_transpose<T>(hybrid, out, "hybrid"));
      if (plain) check_transpose<T>(ref::dense_to_twell<T>(a_dense.view(), in), out, "twell");
    }
  }
  return plain_inputs;
}

using testing::kSpmmAlphaBeta;
using testing::SpmmRun;

// The reference and the cuda C = alpha A^T B + beta C0.
template <class T, class HostM>
DenseMatrix<T> reference_spmm_t(const HostM& a, const DenseMatrix<T>& b, const DenseMatrix<T>& c0, float alpha,
                                float beta) {
  return testing::reference_spmm<T>(Op::transpose, a, b, c0, alpha, beta);
}
template <class T, class DevM>
SpmmRun<T> run_spmm_t(const DevM& a_dev, const DenseMatrix<T>& b_dev, const DenseMatrix<T>& c0, float alpha, float beta,
                      SpmmAlgorithm algorithm) {
  return testing::run_spmm<T>(Op::transpose, a_dev, b_dev, c0, alpha, beta, algorithm);
}

// At each element of |A|^T |B| (A: m x k, dense), the sum of the absolute products, k x Nb.
template <class T>
std::vector<double> product_magnitudes(const DenseMatrix<T>& a_dense, const DenseMatrix<T>& b) {
  const auto av = a_dense.view(), bv = b.view();
  std::vector<double> mag(static_cast<std::size_t>(av.cols * bv.cols), 0.0);
  for (std::int64_t i = 0; i < av.rows; ++i)
    for (std::int64_t j = 0; j < av.cols; ++j) {
      const double x = std::abs(to_float(av.at(i, j)));
      if (x == 0.0) continue;
      for (std::int64_t c = 0; c < bv.cols; ++c) mag[j * bv.cols + c] += x * std::abs(to_float(bv.at(i, c)));
    }
  return mag;
}

// At each element of C = alpha A^T B + beta C0, the sum of its terms' absolute values, from
// product_magnitudes.
template <class T>
std::vector<double> term_magnitudes(std::vector<double> products, const DenseMatrix<T>& c0, float alpha, float beta) {
  const auto cv = c0.view();
  for (std::int64_t j = 0; j < cv.rows; ++j)
    for (std::int64_t c = 0; c < cv.cols; ++c) {
      double& v = products[j * cv.cols + c];
      v = std::abs(alpha) * v + (beta != 0.0f ? std::abs(beta) * std::abs(to_float(cv.at(j, c))) : 0.0);
    }
  return products;
}

// Close to the reference in norm and, given the terms' magnitudes, rounded into T once, as the
// reference rounds: no part of the product (A^T's own dense rows, a Hybrid's dense rows of A) may
// be added to a C already rounded (an attempt that did so failed this check in 96 assertions,
// docs/testing-results.md, twenty-fourth session).
template <class T>
void check_close(const SpmmRun<T>& run, const DenseMatrix<T>& want, const std::vector<double>* magnitude = nullptr) {
  CAPTURE(run.path);
  CHECK(testing::relative_error<T, T>(run.got.view(), want.view()) <= relative_bound<T>());  // NaN fails too
  CHECK(worst_row_error<T>(run.got, want) <= relative_bound<T>());
  if constexpr (sizeof(T) == 2) {
    if (magnitude != nullptr) CHECK(testing::beyond_one_rounding<T>(run.got, want, *magnitude) == 0);
  } else {
    REQUIRE(magnitude == nullptr);  // the one-rounding bound is for 16-bit results
  }
}

// The automatic choice (twice: the same bits) and the op-none kernels forced on A^T: pair-balanced
// always, tile-streaming for aligned operands, slice-reuse where B's M rows fit its staging.
template <class T, class HostM>
void check_spmm_t(const HostM& a, const DenseMatrix<T>& a_dense, const DenseMatrix<T>& b, const std::string& format,
                  std::uint64_t seed) {
  const auto a_dev = a.to(kDevice);
  const DenseMatrix<T> b_dev = b.to(kDevice);
  const auto c0 = testing::random_dense<T>(a.cols(), b.cols(), 1.0f, seed + 7);
  const std::string prefix = "cuda/spmm/" + format + "/via_transpose+";
  const std::vector<double> products = product_magnitudes<T>(a_dense, b);
  std::vector<SpmmAlgorithm> forced = {SpmmAlgorithm::pair_balanced};
  if (b.cols() % 8 == 0) forced.push_back(SpmmAlgorithm::tile_stream);
  if (b.cols() % 8 == 0 && a.rows() <= 4000) forced.push_back(SpmmAlgorithm::slice_reuse);
  for (const auto& [alpha, beta] : testing::sweep_ends({kSpmmAlphaBeta[0], kSpmmAlphaBeta[1], kSpmmAlphaBeta[2]})) {
    CAPTURE(alpha);
    CAPTURE(beta);
    const DenseMatrix<T> want = reference_spmm_t<T>(a, b, c0, alpha, beta);
    const std::vector<double> magnitude = term_magnitudes<T>(products, c0, alpha, beta);
    const SpmmRun<T> automatic = run_spmm_t<T>(a_dev, b_dev, c0, alpha, beta, SpmmAlgorithm::automatic);
    CHECK(automatic.path.rfind(prefix, 0) == 0);
    check_close<T>(automatic, want, &magnitude);
    const SpmmRun<T> again = run_spmm_t<T>(a_dev, b_dev, c0, alpha, beta, SpmmAlgorithm::automatic);
    CHECK(testing::bitwise_equal<T>(again.got.view(), automatic.got.view()));
    for (const SpmmAlgorithm algorithm : forced) {
      CAPTURE(static_cast<int>(algorithm));
      const SpmmRun<T> run = run_spmm_t<T>(a_dev, b_dev, c0, alpha, beta, algorithm);
      CHECK(run.path.rfind(prefix, 0) == 0);
      check_close<T>(run, want, &magnitude);
    }
  }
}

}  // namespace

TEST_CASE_TEMPLATE("cuda direct transpose of TwELL and Hybrid matches the reference word for word", T, bf16, fp16) {
  constexpr std::pair<std::int64_t, std::int64_t> kShapes[] = {{1, 1},     {3, 8},      {45, 37},   {300, 70},
                                                               {64, 1030}, {1000, 300}, {700, 5632}};
  // {24, 8} and {72, 8}: 3 and 9 slots, fewer than the kernel's 8 head words and one past them.
  // Outputs: 9 slots are no whole 16-byte quads (the groups' write-out a word per lane); 4 slots
  // are one quad (32 columns a warp) and 12 three (10 columns a warp, two lanes idle).
  constexpr TwellLayout kIn[] = {{256, 16}, {128, 4}, {16, 4}, {24, 8}, {72, 8}};
  constexpr TwellLayout kOut[] = {{256, 16}, {128, 8}, {16, 2}, {72, 8}, {16, 4}, {96, 8}};
  for (const auto& [m, k] : testing::sweep(kShapes)) {
    for (const double density : testing::sweep({0.0, 0.005, 0.05, 0.5, 1.0})) {
      const std::uint64_t seed = testing::fresh_seed();
      CAPTURE(seed);
      CAPTURE(m);
      CAPTURE(k);
      CAPTURE(density);
      auto a_dense = transpose_source<T>(m, k, density, density > 0.0 && density < 0.5 ? 0.03 : 0.0, seed);
      // A hot column: A^T's row 1 past every layout's capacity where M allows.
      if (k > 1 && density > 0.0)
        for (std::int64_t i = 0; i < m; i += 2) a_dense.view().at(i, 1) = from_float<T>(0.5f + 0.001f * i);
      check_transposes<T>(a_dense, kIn, kOut, [](TwellLayout, const HybridMatrix<T>&) {});
    }
  }
}

// A Hybrid's dense rows with a leading dimension in 8s past their columns (K = 997 of ld 1000),
// so that a lane of the warp walking a dense row reads 16 bytes at a time except in the last
// tile, where one lane's 8 columns end past the row (229 columns): that lane reads its columns one
// by one. Then K = 1000 (ld 1000), whose last tile of 232 columns ends on a lane's boundary.
// Word for word against the reference, dense rows of A^T included (a hot column).
TEST_CASE_TEMPLATE("cuda direct transpose reads a Hybrid's dense rows 16 bytes at a time, ragged tiles included", T,
                   bf16, fp16) {
  constexpr std::int64_t kM = 600, kLd = 1000;
  const std::uint64_t seed = testing::fresh_seed();
  CAPTURE(seed);
  for (const std::int64_t k : {std::int64_t{997}, kLd}) {
    CAPTURE(k);
    auto a_dense = transpose_source<T>(kM, kLd, 0.02, 0.05, seed + static_cast<std::uint64_t>(k));
    for (std::int64_t i = 0; i < kM; ++i)
      for (std::int64_t j = k; j < kLd; ++j) a_dense.view().at(i, j) = from_float<T>(0.0f);
    for (std::int64_t i = 0; i < kM; i += 2) a_dense.view().at(i, 1) = from_float<T>(0.5f + 0.001f * i);
    for (const TwellLayout in : {TwellLayout{256, 16}, TwellLayout{128, 8}}) {
      CAPTURE(in.tile);
      const HybridMatrix<T> host = ref::dense_to_hybrid<T>(a_dense.view(), in);
      REQUIRE(host.overflow_rows() > 0);
      const HybridMatrix<T> device = host.to(kDevice);
      // The same matrix seen k columns wide: the columns past k hold nothing, and the tiles of
      // 997 and 1000 columns are the same four.
      const auto narrowed = [k](HybridView<const T> v) {
        v.twell.cols = k;
        v.overflow.cols = k;
        return v;
      };
      for (const TwellLayout out : {TwellLayout{256, 16}, TwellLayout{128, 8}}) {
        CAPTURE(out.tile);
        const HybridMatrix<T> want = ref::transpose<T>(narrowed(host.view()), out);
        KernelReport report;
        const HybridMatrix<T> got = dev::transpose<T>(narrowed(device.view()), out, KernelOptions{{}, &report});
        REQUIRE(cudaDeviceSynchronize() == cudaSuccess);
        CHECK(report.path == "cuda/transpose/hybrid/direct");
        CHECK(want.overflow_rows() > 0);
        REQUIRE(got.overflow_rows() == want.overflow_rows());
        CHECK(same_words(got.twell().packed(), want.twell().packed()));
        CHECK(same_words(got.row_to_overflow(), want.row_to_overflow()));
        CHECK(same_words(got.overflow_to_row(), want.overflow_to_row()));
        CHECK(same_words(got.overflow().values(), want.overflow().values()));
      }
    }
  }
}

// A^T in the four layouts of 32 slots per group, the most that the direct transpose builds in
// shared memory (the case above reaches 16), word for word: A as a Hybrid with dense rows and,
// where it fits, as TwELL; ragged shapes (M and K no multiple of any tile); densities that leave
// A^T's groups sparse, near capacity (12 % puts 31 of 256 rows in a group on average) and past it;
// and in every layout, column 1 of A with exactly capacity entries in A^T's first group (its last
// slot used) and column 2 with one more (the first overflow), which makes A^T's row 2 dense while
// its later groups fit (where M spans more than A^T's first group: the dense pass copies those
// from A^T's groups, and walks A for the first).
TEST_CASE_TEMPLATE("cuda direct transpose into 32 slots per group matches the reference word for word", T, bf16, fp16) {
  constexpr std::pair<std::int64_t, std::int64_t> kShapes[] = {{45, 37}, {300, 70}, {1000, 777}};
  constexpr std::pair<double, double> kDensities[] = {{0.02, 0.0}, {0.12, 0.03}, {0.5, 0.0}};  // and full rows
  constexpr TwellLayout kIn[] = {{256, 16}, {64, 2}};
  constexpr TwellLayout kOut[] = {{256, 8}, {128, 4}, {64, 2}, {32, 1}};
  constexpr std::int64_t kCapacity = 31;
  constexpr std::int64_t kFirstGroup = 256;  // A's rows in A^T's first group: at most the largest tile
  int plain_inputs = 0;
  for (const auto& [m, k] : testing::sweep(kShapes)) {
    for (const auto& [density, full_rows] : testing::sweep(kDensities)) {
      const std::uint64_t seed = testing::fresh_seed();
      CAPTURE(seed);
      CAPTURE(m);
      CAPTURE(k);
      CAPTURE(density);
      auto a_dense = transpose_source<T>(m, k, density, full_rows, seed);
      for (std::int64_t i = 0; i < std::min(m, kFirstGroup); ++i) {
        const float v = 0.5f + 0.001f * static_cast<float>(i);
        a_dense.view().at(i, 1) = i < kCapacity ? from_float<T>(v) : T{};
        a_dense.view().at(i, 2) = i < kCapacity + 1 ? from_float<T>(-v) : T{};
      }
      plain_inputs += check_transposes<T>(a_dense, kIn, kOut, [&](TwellLayout out, const HybridMatrix<T>& want) {
        REQUIRE(out.capacity() == kCapacity);
        // Columns 1 and 2 did their part: A^T's row 1 fills its first group, row 2 overflows it.
        const std::uint32_t* words = want.twell().packed().data();
        CHECK(words[out.slot_offset(1, 0, m)] == kCapacity);
        CHECK(words[out.slot_offset(2, 0, m)] == kCapacity + 1);
        CHECK(want.row_to_overflow().data()[2] >= 0);
      });
    }
  }
  if (testing::whole_sweep()) CHECK(plain_inputs > 0);  // TwELL input ran too (at 2 % in (64, 2))
}

namespace {

// The -0.0 case below. A is 700 x 600: entries at 0.2 %; every 90th row from row 10 dense (about
// 170 entries per 256 columns, past every layout's capacity) with a zero in every third column
// (signs by row and column: rows 100 and 190 differ in sign wherever both hold an entry, so that
// an Inf and a -Inf of B on them add up in C rather than cancel); the `hot` columns with an entry
// in every even row (where a dense row holds what that row holds), which overflow A^T's groups:
// A^T's dense rows. Any other column has at most three dense rows and a few sparse entries among
// 256 rows of A, and stays in A^T's TwELL part.
constexpr std::int64_t kZeroRows = 700, kZeroCols = 600, kZeroFirstDenseRow = 10, kZeroDenseRowStep = 90;

template <class T>
DenseMatrix<T> dense_rows_with_zeros(std::span<const std::int64_t> hot, std::uint64_t seed) {
  testing::SparseDenseOptions so;
  so.density = 0.002;
  DenseMatrix<T> a = testing::random_sparse_dense<T>(kZeroRows, kZeroCols, so, seed);
  for (const std::int64_t j : hot)
    for (std::int64_t i = 0; i < kZeroRows; i += 2)
      a.view().at(i, j) = from_float<T>(0.5f + 0.001f * static_cast<float>(i));
  for (std::int64_t i = kZeroFirstDenseRow; i < kZeroRows; i += kZeroDenseRowStep)
    for (std::int64_t j = 0; j < kZeroCols; ++j) {
      const float sign = (i / kZeroDenseRowStep + j) % 3 == 0 ? -1.0f : 1.0f;
      a.view().at(i, j) = j % 3 == 0 ? T{} : from_float<T>(sign * (0.25f + 0.001f * static_cast<float>(j)));
    }
  return a;
}

// a as a Hybrid in `layout` with every zero of its dense block set to -0.0: still zero, no entry
// (the Hybrid stays valid), but not +0 bit for bit. The converters store no zero of either sign,
// so -0.0 written into a dense source reaches the block as +0 (the Inf and NaN case below).
template <class T>
HybridMatrix<T> with_negative_zeros(DenseView<const T> a, TwellLayout layout) {
  HybridMatrix<T> h = ref::dense_to_hybrid<T>(a, layout);
  auto block = h.overflow().view();
  std::int64_t negative = 0;
  for (std::int64_t r = 0; r < block.rows; ++r)
    for (std::int64_t j = 0; j < block.cols; ++j)
      if (ValueTraits<T>::to_bits(block.at(r, j)) == 0) {
        block.at(r, j) = from_float<T>(-0.0f);
        ++negative;
      }
  REQUIRE(negative > 0);
  REQUIRE(find_violation(std::as_const(h).view()) == "");
  return h;
}

}  // namespace

// -0.0 in a Hybrid's dense rows is zero, no entry: the reference's A^T has no slot for it and +0
// in its dense rows, and the direct transpose must give that A^T word for word. A walk of A's
// dense rows that tested values against +0 alone would add slots; a copy of their bits into A^T's
// dense block would carry the sign, where hot column 3 (a dense row of A^T) meets A's dense rows
// at their -0.0. spmm with op(A) = A^T takes the same route: an Inf, a -Inf and a NaN in B on
// dense rows of A reach C through those rows' entries only, so the rows of C of every third
// column stay finite (a -0.0 taken as an entry makes them NaN). There the hot columns meet the
// dense rows at entries only: A^T's dense rows go through a dense cuBLAS product, where a zero
// times Inf is NaN (test_spmm_slices.cpp).
TEST_CASE_TEMPLATE("cuda direct transpose and spmm with op(A) = A^T: -0.0 in a Hybrid's dense rows is no entry", T,
                   bf16, fp16) {
  constexpr std::int64_t kHot[] = {3, 4, 301, 598};  // 3 meets the dense rows at their zeros, the rest at entries
  constexpr std::int64_t kInfRow = 100, kMinusInfRow = 190, kNanRow = 280;  // dense rows of A
  constexpr std::int64_t kN = 64;
  constexpr TwellLayout kIn[] = {{256, 16}, {256, 8}};  // spmm's A^T: 16 and 32 slots per 256 columns
  const std::uint64_t seed = testing::fresh_seed();
  CAPTURE(seed);
  const DenseMatrix<T> a_dense = dense_rows_with_zeros<T>(kHot, seed);
  const DenseMatrix<T> a_dense_spmm = dense_rows_with_zeros<T>(std::span(kHot).subspan(1), seed);
  auto b = testing::random_dense<T>(kZeroRows, kN, 1.0f, seed + 1);
  b.view().at(kInfRow, 3) = from_float<T>(std::numeric_limits<float>::infinity());
  b.view().at(kMinusInfRow, 3) = from_float<T>(-std::numeric_limits<float>::infinity());
  b.view().at(kNanRow, 5) = from_float<T>(std::numeric_limits<float>::quiet_NaN());
  const DenseMatrix<T> b_dev = b.to(kDevice);
  const auto c0 = testing::random_dense<T>(kZeroCols, kN, 1.0f, seed + 2);
  for (const TwellLayout in : kIn) {
    CAPTURE(in.compression);
    const HybridMatrix<T> a = with_negative_zeros<T>(a_dense.view(), in);
    for (const TwellLayout out : {TwellLayout{256, 16}, TwellLayout{256, 8}, TwellLayout{16, 2}}) {
      const HybridMatrix<T> want = check_transpose<T>(a, out, "hybrid");
      REQUIRE(want.row_to_overflow().data()[3] >= 0);  // where a copied sign would show
    }
    const HybridMatrix<T> a_spmm = with_negative_zeros<T>(a_dense_spmm.view(), in);
    for (const std::int64_t row : {kInfRow, kMinusInfRow, kNanRow}) REQUIRE(a_spmm.row_to_overflow().data()[row] >= 0);
    const auto a_dev = a_spmm.to(kDevice);
    for (const auto& [alpha, beta] : kSpmmAlphaBeta) {
      CAPTURE(alpha);
      CAPTURE(beta);
      DenseMatrix<T> want = reference_spmm_t<T>(a_spmm, b, c0, alpha, beta);
      auto [got, path] = run_spmm_t<T>(a_dev, b_dev, c0, alpha, beta, SpmmAlgorithm::automatic);
      CHECK(path.rfind("cuda/spmm/hybrid/via_transpose+", 0) == 0);
      CHECK(path.find("+cublas_overflow") != std::string::npos);  // A^T's dense rows were built
      const auto [mismatched, non_finite] = testing::split_non_finite<T>(got, want);
      CHECK(non_finite > 0);
      CHECK(non_finite <= 2 * kZeroCols);  // B's columns 3 and 5 only (mismatched: no other element)
      CHECK(mismatched == 0);
      CHECK(worst_row_error<T>(got, want) <= relative_bound<T>());
    }
  }
}

// spmm with op(A) = A^T over shapes, widths of B and densities, A in each of `layouts`, as TwELL
// (where it fits) and as Hybrid with rows that overflow.
template <class T>
void check_spmm_t_sweep(std::span<const TwellLayout> layouts) {
  constexpr std::pair<std::int64_t, std::int64_t> kShapes[] = {{1, 300},    {37, 777},   {300, 5632},
                                                               {1000, 300}, {1025, 777}, {3000, 64}};
  for (const auto& [m, k] : testing::sweep(kShapes)) {
    for (const std::int64_t nb : testing::sweep({std::int64_t{8}, std::int64_t{136}, std::int64_t{100}})) {
      for (const double density : testing::sweep({0.0, 0.005, 0.05, 0.5})) {
        if (static_cast<double>(m) * static_cast<double>(k) * density * static_cast<double>(nb) > 1e8) continue;
        const std::uint64_t seed = testing::fresh_seed();
        CAPTURE(seed);
        CAPTURE(m);
        CAPTURE(k);
        CAPTURE(nb);
        CAPTURE(density);
        testing::SparseDenseOptions so;
        so.density = density;
        so.empty_row_share = 0.1;
        so.full_row_share = density > 0.0 && density < 0.5 ? 0.02 : 0.0;  // rows that overflow A's layout
        const auto a_dense = testing::random_sparse_dense<T>(m, k, so, seed);
        const auto b = testing::random_dense<T>(m, nb, 1.0f, seed + 1);
        for (const TwellLayout layout : layouts) {
          CAPTURE(layout.tile);
          CAPTURE(layout.compression);
          if (fits<T>(a_dense.view(), layout))
            check_spmm_t<T>(ref::dense_to_twell<T>(a_dense.view(), layout), a_dense, b, "twell", seed);
          check_spmm_t<T>(ref::dense_to_hybrid<T>(a_dense.view(), layout), a_dense, b, "hybrid", seed);
        }
      }
    }
  }
}

// A^T gets A's slots per 256 columns: 16 for {256, 16} and {64, 16}, 32 for {128, 8} and
// {256, 8}. Two cases, so that each finishes under compute-sanitizer's racecheck in one call.
TEST_CASE_TEMPLATE("cuda spmm with op(A) = A^T through the direct transpose: shapes, densities, 16 slots per 256 columns",
                   T, bf16, fp16) {
  constexpr TwellLayout kLayouts[] = {{256, 16}, {64, 16}};
  check_spmm_t_sweep<T>(kLayouts);
}

TEST_CASE_TEMPLATE("cuda spmm with op(A) = A^T through the direct transpose: shapes, densities, 32 slots per 256 columns",
                   T, bf16, fp16) {
  constexpr TwellLayout kLayouts[] = {{128, 8}, {256, 8}};
  check_spmm_t_sweep<T>(kLayouts);
}

// The paper's shape under token skew: Hybrid dense rows of A among its TwELL rows, hot units that
// overflow A^T's groups (dense rows of A^T, through cuBLAS), rows past a staged head.
TEST_CASE_TEMPLATE("cuda spmm with op(A) = A^T through the direct transpose: token-skewed rows, paper shape", T, bf16,
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
    for (std::int64_t i = 0; i < m; i += 3)  // a hot unit: A^T's row 77 overflows
      a_dense.view().at(i, 77) = from_float<T>(0.25f + 0.001f * static_cast<float>(i % 97));
    for (std::int64_t j = 512; j < 512 + 40; ++j)  // a row past 32 slots in one tile: a dense row of A
      a_dense.view().at(5, j) = from_float<T>(-0.5f - 0.001f * static_cast<float>(j));
    const auto b = testing::random_dense<T>(m, nb, 1.0f, seed + 1);
    for (const TwellLayout layout : {TwellLayout{256, 16}, TwellLayout{256, 8}}) {
      const HybridMatrix<T> hybrid = ref::dense_to_hybrid<T>(a_dense.view(), layout);
      CHECK(hybrid.overflow_rows() > 0);
      check_spmm_t<T>(hybrid, a_dense, b, "hybrid", seed);
    }
  }
}

// An Inf and a NaN in B reach exactly the rows of C whose column of A holds an entry in their row
// of B. The rows of the Inf and of a -Inf in the same column of B are Hybrid dense rows (walked a
// warp each into A^T's groups) with -0.0 in every third and every fifth column, which is no entry
// (0 x Inf would be NaN): C gets Inf, -Inf, or NaN where both meet.
TEST_CASE_TEMPLATE("cuda spmm with op(A) = A^T through the direct transpose: Inf and NaN in B", T, bf16, fp16) {
  constexpr std::int64_t kM = 900, kK = 777, kN = 64, kInfRow = 300, kNanRow = 301, kMinusInfRow = 302;
  const std::uint64_t seed = testing::fresh_seed();
  CAPTURE(seed);
  testing::SparseDenseOptions so;
  so.density = 0.01;
  auto a_dense = testing::random_sparse_dense<T>(kM, kK, so, seed);
  for (std::int64_t j = 0; j < kK; ++j) {
    a_dense.view().at(kInfRow, j) = from_float<T>(j % 3 == 0 ? -0.0f : 0.5f + 0.001f * static_cast<float>(j));
    a_dense.view().at(kMinusInfRow, j) = from_float<T>(j % 5 == 0 ? -0.0f : 0.25f + 0.001f * static_cast<float>(j));
  }
  auto b = testing::random_dense<T>(kM, kN, 1.0f, seed + 1);
  b.view().at(kInfRow, 3) = from_float<T>(std::numeric_limits<float>::infinity());
  b.view().at(kMinusInfRow, 3) = from_float<T>(-std::numeric_limits<float>::infinity());
  b.view().at(kNanRow, 5) = from_float<T>(std::numeric_limits<float>::quiet_NaN());
  const auto c0 = testing::random_dense<T>(kK, kN, 1.0f, seed + 2);
  const HybridMatrix<T> a = ref::dense_to_hybrid<T>(a_dense.view(), TwellLayout{256, 16});
  REQUIRE(a.overflow_rows() > 0);
  const auto a_dev = a.to(kDevice);
  const DenseMatrix<T> b_dev = b.to(kDevice);
  for (const auto& [alpha, beta] : kSpmmAlphaBeta) {
    CAPTURE(alpha);
    CAPTURE(beta);
    DenseMatrix<T> want = reference_spmm_t<T>(a, b, c0, alpha, beta);
    auto [got, path] = run_spmm_t<T>(a_dev, b_dev, c0, alpha, beta, SpmmAlgorithm::automatic);
    CHECK(path.rfind("cuda/spmm/hybrid/via_transpose+", 0) == 0);
    const auto [mismatched, non_finite] = testing::split_non_finite<T>(got, want);
    CHECK(non_finite > 0);
    CHECK(non_finite <= 2 * kK);  // B's columns 3 and 5 only (mismatched: no other element)
    CHECK(mismatched == 0);
    CHECK(worst_row_error<T>(got, want) <= relative_bound<T>());
  }
}

// Empty shapes (the groups launch skipped, the map kernel at K = 0, C only scaled) and work on a
// non-blocking stream, which does not wait for the legacy stream: the count of A^T's dense rows
// is read back behind the stream's own work. Hybrid A in (256, 16) with full rows, so that A^T
// has dense rows where M allows; B with 0 and 8 columns.
TEST_CASE("cuda direct transpose and spmm with op(A) = A^T: empty shapes, on a non-blocking stream") {
  cudaStream_t stream = nullptr;
  testing::cuda_ok(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  constexpr TwellLayout kLayout{256, 16};
  constexpr std::pair<std::int64_t, std::int64_t> kShapes[] = {{0, 300}, {37, 0}, {0, 0}, {300, 70}};
  for (const auto& [m, k] : kShapes) {
    const std::uint64_t seed = testing::fresh_seed();
    CAPTURE(seed);
    CAPTURE(m);
    CAPTURE(k);
    testing::SparseDenseOptions so;
    so.density = 0.05;
    so.full_row_share = 0.1;
    auto a_dense = testing::random_sparse_dense<bf16>(m, k, so, seed);
    for (std::int64_t i = 0; k > 1 && i < m; i += 2) a_dense.view().at(i, 1) = from_float<bf16>(0.5f);  // a hot unit
    const HybridMatrix<bf16> a = ref::dense_to_hybrid<bf16>(a_dense.view(), kLayout);
    const auto a_dev = a.to(kDevice);
    KernelReport report;
    const KernelOptions options{Stream{stream}, &report};
    const HybridMatrix<bf16> want_t = ref::transpose<bf16>(a.view(), kLayout);
    const HybridMatrix<bf16> got_t = dev::transpose<bf16>(a_dev.view(), kLayout, options);
    testing::cuda_ok(cudaStreamSynchronize(stream));
    CHECK(report.path == "cuda/transpose/hybrid/direct");
    testing::expect_same(got_t.to(kHost), want_t);
    for (const std::int64_t nb : {std::int64_t{0}, std::int64_t{8}}) {
      CAPTURE(nb);
      const auto b = testing::random_dense<bf16>(m, nb, 1.0f, seed + 1);
      const auto c0 = testing::random_dense<bf16>(k, nb, 1.0f, seed + 2);
      const DenseMatrix<bf16> want = reference_spmm_t<bf16>(a, b, c0, 1.5f, -2.0f);
      const auto b_dev = b.to(kDevice);
      auto c_dev = c0.to(kDevice);
      dev::spmm<bf16>(Op::transpose, a_dev.view(), b_dev.view(), c_dev.view(), 1.5f, -2.0f, options);
      testing::cuda_ok(cudaStreamSynchronize(stream));
      CHECK(report.path.rfind("cuda/spmm/hybrid/via_transpose+", 0) == 0);
      CHECK(testing::relative_error<bf16, bf16>(c_dev.to(kHost).view(), want.view()) <= relative_bound<bf16>());
    }
  }
  testing::cuda_ok(cudaStreamDestroy(stream));
}

// fp32, tiles over 256 columns and layouts of more than 32 slots per 256 columns go through CSR
// (the paths are checked as prefixes: A^T may have overflow rows).
TEST_CASE("cuda spmm with op(A) = A^T takes the CSR route where the direct transpose does not apply") {
  const std::uint64_t seed = testing::fresh_seed();
  CAPTURE(seed);
  testing::SparseDenseOptions so;
  so.density = 0.05;
  const auto a16 = testing::random_sparse_dense<bf16>(200, 600, so, seed);
  const auto a32 = testing::random_sparse_dense<float>(200, 600, so, seed);
  const auto check = [&](const auto& a, const char* path) {
    using T = std::remove_cvref_t<decltype(*a.view().overflow.data)>;
    CAPTURE(path);
    const auto b = testing::random_dense<T>(a.rows(), 64, 1.0f, seed + 1);
    const auto c0 = testing::random_dense<T>(a.cols(), 64, 1.0f, seed + 2);
    const SpmmRun<T> run = run_spmm_t<T>(a.to(kDevice), b.to(kDevice), c0, 1.0f, 0.0f, SpmmAlgorithm::automatic);
    CHECK(run.path.rfind(path, 0) == 0);
    check_close<T>(run, reference_spmm_t<T>(a, b, c0, 1.0f, 0.0f));
  };
  check(ref::dense_to_hybrid<float>(a32.view(), TwellLayout{256, 16}), "cuda/spmm/hybrid/via_csr_transpose");
  check(ref::dense_to_hybrid<bf16>(a16.view(), TwellLayout{512, 16}), "cuda/spmm/hybrid/via_csr_transpose");
  check(ref::dense_to_hybrid<bf16>(a16.view(), TwellLayout{256, 4}), "cuda/spmm/hybrid/via_csr_transpose");
  check(ref::dense_to_hybrid<bf16>(a16.view(), TwellLayout{256, 16}), "cuda/spmm/hybrid/via_transpose+pair_balanced");
}

// One plan serves fresh matrices of its shape with op(A) = A^T, bit for bit as spmm(): its A^T
// storage is reused, and its dense-row storage grows when a later matrix has more hot columns.
// Two shapes: A^T of 777 rows in 16 slots takes the tile-streaming kernel; A^T of 2100 rows in 32
// slots the slice-reuse kernel, whose workspace and copy of B the plan holds (spmm() takes them
// from scratch).
TEST_CASE_TEMPLATE("cuda SpmmPlan with op(A) = A^T equals spmm() bit for bit and is reusable", T, bf16, fp16) {
  struct Setting {
    std::int64_t m, k;
    TwellLayout layout;
    const char* kernel;
  };
  constexpr std::int64_t kN = 64;
  for (const Setting st : {Setting{1500, 777, {256, 16}, "tile_stream"}, Setting{300, 2100, {256, 8}, "slice"}}) {
    CAPTURE(st.k);
    const std::int64_t kM = st.m, kK = st.k;
    const TwellLayout kLayout = st.layout;
    dev::SpmmPlan<T> plan(kM, kK, kLayout);
    for (int round = 0; round < 3; ++round) {
      const std::uint64_t seed = testing::fresh_seed();
      CAPTURE(seed);
      CAPTURE(round);
      testing::SparseDenseOptions so;
      so.density = round == 0 ? 0.005 : 0.02;
      so.full_row_share = 0.01;
      auto a_dense = testing::random_sparse_dense<T>(kM, kK, so, seed);
      for (std::int64_t j = 0; j < 5 * round; ++j)  // hot columns: more dense rows of A^T each round
        for (std::int64_t i = j % 2; i < kM; i += 2) a_dense.view().at(i, 3 + 11 * j) = from_float<T>(0.75f);
      const HybridMatrix<T> a = ref::dense_to_hybrid<T>(a_dense.view(), kLayout);
      const auto a_dev = a.to(kDevice);
      const auto b = testing::random_dense<T>(kM, kN, 1.0f, seed + 1);
      const DenseMatrix<T> b_dev = b.to(kDevice);
      const auto c0 = testing::random_dense<T>(kK, kN, 1.0f, seed + 2);
      for (const auto& [alpha, beta] : {kSpmmAlphaBeta[0], kSpmmAlphaBeta[2]}) {
        CAPTURE(alpha);
        CAPTURE(beta);
        const SpmmRun<T> want = run_spmm_t<T>(a_dev, b_dev, c0, alpha, beta, SpmmAlgorithm::automatic);
        DenseMatrix<T> c_plan = beta == 0.0f ? nan_dense<T>(kK, kN).to(kDevice) : c0.to(kDevice);
        plan.run(Op::transpose, a_dev.view(), b_dev.view(), c_plan.view(), alpha, beta);
        REQUIRE(cudaDeviceSynchronize() == cudaSuccess);
        CHECK(plan.path() == want.path);
        CHECK(plan.path().rfind("cuda/spmm/hybrid/via_transpose+", 0) == 0);
        CHECK(plan.path().find(st.kernel) != std::string::npos);
        CHECK(testing::bitwise_equal<T>(c_plan.to(kHost).view(), want.got.view()));
        const std::vector<double> magnitude = term_magnitudes<T>(product_magnitudes<T>(a_dense, b), c0, alpha, beta);
        check_close<T>(want, reference_spmm_t<T>(a, b, c0, alpha, beta), &magnitude);
      }
      // op none through the same plan is run(), and matches the reference (both C poisoned).
      const auto b_none = testing::random_dense<T>(kK, kN, 1.0f, seed + 3);
      const DenseMatrix<T> b_none_dev = b_none.to(kDevice);
      DenseMatrix<T> c_none = nan_dense<T>(kM, kN).to(kDevice), c_run = nan_dense<T>(kM, kN).to(kDevice);
      plan.run(Op::none, a_dev.view(), b_none_dev.view(), c_none.view());
      plan.run(a_dev.view(), b_none_dev.view(), c_run.view());
      REQUIRE(cudaDeviceSynchronize() == cudaSuccess);
      const SpmmRun<T> none{c_none.to(kHost), plan.path()};
      CHECK(testing::bitwise_equal<T>(none.got.view(), c_run.to(kHost).view()));
      check_close<T>(none,
                     testing::reference_spmm<T>(Op::none, a, b_none, DenseMatrix<T>{}, 1.0f, 0.0f));  // beta 0: no C0
    }
    // Another shape is refused, naming the plan's.
    const auto other =
        ref::dense_to_hybrid<T>(testing::random_dense<T>(kM, kK + 8, 1.0f, 5).view(), kLayout).to(kDevice);
    const DenseMatrix<T> b_other(kM, kN, kDevice);
    DenseMatrix<T> c_other(kK + 8, kN, kDevice);
    CHECK(testing::code_of([&] { plan.run(Op::transpose, other.view(), b_other.view(), c_other.view()); }) ==
          ErrorCode::shape_mismatch);
  }
}

namespace {

// The routes of SpmmPlan::run_transposed, each A m x k in `layout` with `algorithm`, and the path it
// reports: the tile-streaming kernel (all products in one launch; automatic and forced), the
// slice-reuse and pair-balanced kernels (one product after another) and the CSR route. The forced
// tile-streaming routes in tiles of 128 and 64 columns give its staging (TMA where the sm_90a code
// runs) other box heights, A^T of 3 tiles (fewer than the stages, the last one ragged) and
// of 9 (each stage refilled twice).
struct TransposedRoute {
  std::int64_t m, k;
  TwellLayout layout;
  SpmmAlgorithm algorithm;
  const char* path;
};
std::vector<TransposedRoute> transposed_routes() {
  return {{1500, 777, {256, 16}, SpmmAlgorithm::automatic, "/via_transpose+tile_stream_batched"},
          {testing::sweep_size(2000, 700),
           5632,
           {256, 16},
           SpmmAlgorithm::tile_stream,
           "/via_transpose+tile_stream_batched"},
          {300, 777, {128, 8}, SpmmAlgorithm::tile_stream, "/via_transpose+tile_stream_batched"},
          {520, 600, {64, 8}, SpmmAlgorithm::tile_stream, "/via_transpose+tile_stream_batched"},
          {300, 2100, {256, 8}, SpmmAlgorithm::automatic, "/via_transpose+slice_reuse"},
          {600, 500, {256, 16}, SpmmAlgorithm::automatic, "/via_transpose+pair_balanced"},
          {300, 777, {256, 4}, SpmmAlgorithm::automatic, "/via_csr_transpose"}};
}

}  // namespace

// SpmmPlan::run_transposed runs up to three products on A^T in one call (the training step's
// weight gradients): each C_i must have the bits that spmm() gives it alone, into NaN-poisoned C
// (beta = 0) and over C0, for one, two and three products whose A^T hold different numbers of
// dense rows (the plan sizes their storage for the largest), in both orders, with the middle
// product's B and C wider than their columns (a kernel reading one product's leading dimension
// for another fails), on every route: the tile-streaming kernel (one launch for all: path
// "tile_stream_batched"), the slice-reuse and pair-balanced kernels and the CSR route (one product
// after another), and a call whose products take different kernels. A refused call writes
// nothing: every product is checked before any is queued.
TEST_CASE_TEMPLATE("cuda SpmmPlan runs products on A^T together with the bits of each alone", T, bf16, fp16) {
  constexpr std::int64_t kN = 64, kWider = 8;
  constexpr int kProducts = dev::SpmmPlan<T>::kMaxTransposedBatch;
  const std::vector<TransposedRoute> settings = transposed_routes();
  // `m` with `extra` columns more in its buffer, filled with 7s, and its view of its own columns.
  const auto widened = [](const DenseMatrix<T>& m, std::int64_t extra) {
    DenseMatrix<T> wide(m.rows(), m.cols() + extra);
    for (std::int64_t r = 0; r < m.rows(); ++r)
      for (std::int64_t j = 0; j < wide.cols(); ++j)
        wide.view().at(r, j) = j < m.cols() ? m.view().at(r, j) : from_float<T>(7.0f);
    return wide;
  };
  const auto narrowed = [](DenseMatrix<T>& wide, std::int64_t cols) {
    DenseView<T> v = wide.view();
    v.cols = cols;
    return v;
  };
  for (const TransposedRoute& st : settings) {
    CAPTURE(st.m);
    CAPTURE(st.k);
    CAPTURE(st.path);
    const std::uint64_t seed = testing::fresh_seed();
    CAPTURE(seed);
    dev::SpmmPlan<T> plan(st.m, st.k, st.layout, {}, st.algorithm);
    std::vector<HybridMatrix<T>> a_host, a_dev;
    std::vector<DenseMatrix<T>> a_dense_all, b_host, b_dev, b_wide, c0;
    for (int i = 0; i < kProducts; ++i) {
      DenseMatrix<T> a_dense = workload::activations<T>({.tokens = st.m,
                                                         .units = st.k,
                                                         .density = 0.005,
                                                         .distribution = workload::Distribution::token_skewed,
                                                         .seed = seed + 10 * i});
      for (std::int64_t j = 0; j < 4 * i; ++j)  // hot columns: 0, 4 and 8 dense rows of A^T
        for (std::int64_t r = j % 2; r < st.m; r += 2) a_dense.view().at(r, 5 + 13 * j) = from_float<T>(0.5f);
      a_host.push_back(ref::dense_to_hybrid<T>(a_dense.view(), st.layout));
      a_dev.push_back(a_host.back().to(kDevice));
      a_dense_all.push_back(std::move(a_dense));
      b_host.push_back(testing::random_dense<T>(st.m, kN, 1.0f, seed + 10 * i + 1));
      b_dev.push_back(b_host.back().to(kDevice));
      b_wide.push_back(widened(b_host.back(), i == 1 ? kWider : 0).to(kDevice));
      c0.push_back(testing::random_dense<T>(st.k, kN, 1.0f, seed + 10 * i + 2));
    }
    for (const auto& [alpha, beta] : {kSpmmAlphaBeta[1], kSpmmAlphaBeta[2]}) {
      CAPTURE(alpha);
      CAPTURE(beta);
      std::vector<SpmmRun<T>> alone;
      for (int i = 0; i < kProducts; ++i) {
        alone.push_back(run_spmm_t<T>(a_dev[i], b_dev[i], c0[i], alpha, beta, st.algorithm));
        check_close<T>(alone.back(), reference_spmm_t<T>(a_host[i], b_host[i], c0[i], alpha, beta));
      }
      // The products `order` (the first n of it), product 1's B and C wider than their columns.
      const auto run_together = [&](const std::vector<int>& order) {
        CAPTURE(order.size());
        CAPTURE(order.front());
        std::vector<DenseMatrix<T>> c;
        std::vector<HybridView<const T>> a_views;
        std::vector<DenseView<const T>> b_views;
        std::vector<DenseView<T>> c_views;
        for (const int i : order) {
          const DenseMatrix<T> start = beta == 0.0f ? nan_dense<T>(st.k, kN) : c0[i].to(kHost);
          c.push_back(widened(start, i == 1 ? kWider : 0).to(kDevice));
          a_views.push_back(a_dev[i].view());
          b_views.push_back(narrowed(b_wide[i], kN));
        }
        for (DenseMatrix<T>& part : c) c_views.push_back(narrowed(part, kN));
        plan.run_transposed(a_views, b_views, c_views, alpha, beta);
        REQUIRE(cudaDeviceSynchronize() == cudaSuccess);
        if (order.size() == 1) {
          CHECK(plan.path() == alone[order[0]].path);
        } else {
          CHECK(plan.path().rfind("cuda/spmm/hybrid/via_", 0) == 0);
          CHECK(plan.path().find(st.path) != std::string::npos);
        }
        for (std::size_t p = 0; p < order.size(); ++p) {
          CAPTURE(order[p]);
          DenseMatrix<T> got = c[p].to(kHost);
          CHECK(testing::bitwise_equal<T>(narrowed(got, kN), alone[order[p]].got.view()));
          if (got.cols() > kN) {  // the columns past C's own are untouched
            bool kept = true;
            for (std::int64_t r = 0; r < st.k; ++r)
              for (std::int64_t j = kN; j < got.cols(); ++j) kept = kept && to_float(got.view().at(r, j)) == 7.0f;
            CHECK(kept);
          }
        }
      };
      run_together({0});
      run_together({1});
      run_together({0, 1});
      run_together({0, 1, 2});
      run_together({2, 1, 0});
    }
    if (st.algorithm == SpmmAlgorithm::automatic && std::string(st.path).find("tile_stream") != std::string::npos) {
      // Product 1's B with an odd leading dimension takes the pair-balanced kernel, the others the
      // tile-streaming one: the call runs them one after another, each with its own kernel's bits.
      DenseMatrix<T> b_odd = widened(b_host[1], 1).to(kDevice);
      DenseMatrix<T> c_mixed[] = {nan_dense<T>(st.k, kN).to(kDevice), nan_dense<T>(st.k, kN).to(kDevice),
                                  nan_dense<T>(st.k, kN).to(kDevice)};
      const HybridView<const T> a_views[] = {a_dev[0].view(), a_dev[1].view(), a_dev[2].view()};
      const DenseView<const T> b_views[] = {b_dev[0].view(), narrowed(b_odd, kN), b_dev[2].view()};
      const DenseView<T> c_views[] = {c_mixed[0].view(), c_mixed[1].view(), c_mixed[2].view()};
      plan.run_transposed(a_views, b_views, c_views, 1.0f, 0.0f);
      REQUIRE(cudaDeviceSynchronize() == cudaSuccess);
      CHECK(plan.path().find("tile_stream_batched") == std::string::npos);
      for (int i = 0; i < kProducts; ++i) {
        CAPTURE(i);
        const DenseMatrix<T> want = reference_spmm_t<T>(a_host[i], b_host[i], c0[i], 1.0f, 0.0f);
        check_close<T>({c_mixed[i].to(kHost), plan.path()}, want);
        if (i != 1) {
          const SpmmRun<T> lone = run_spmm_t<T>(a_dev[i], b_dev[i], c0[i], 1.0f, 0.0f, st.algorithm);
          CHECK(testing::bitwise_equal<T>(c_mixed[i].to(kHost).view(), lone.got.view()));
        }
      }
    }
    // Refused calls, each before anything is queued: C 0 keeps its poison. (A C's byte range runs
    // from its first element to its last: views of interleaved columns of one buffer overlap.)
    DenseMatrix<T> c_first = nan_dense<T>(st.k, kN).to(kDevice);
    DenseMatrix<T> c_second(st.k, kN, kDevice), c_third(st.k, kN, kDevice);
    const HybridView<const T> a3[] = {a_dev[0].view(), a_dev[1].view(), a_dev[2].view()};
    const DenseView<const T> b3[] = {b_dev[0].view(), b_dev[1].view(), b_dev[2].view()};
    const DenseView<T> c3[] = {c_first.view(), c_second.view(), c_third.view()};
    const auto refused = [&](std::span<const HybridView<const T>> a, std::span<const DenseView<const T>> b,
                             std::span<const DenseView<T>> c) {
      return testing::code_of([&] { plan.run_transposed(a, b, c); });
    };
    CHECK(refused({}, {}, {}) == ErrorCode::invalid_argument);
    CHECK(refused(a3, std::span(b3).first(2), c3) == ErrorCode::invalid_argument);
    const DenseView<T> c_twice[] = {c_first.view(), c_second.view(), c_second.view()};
    CHECK(refused(a3, b3, c_twice) == ErrorCode::invalid_argument);
    // B 2 is C 1's memory: a product may not read what another writes.
    DenseMatrix<T> shared(std::max(st.m, st.k), kN, kDevice);
    const DenseView<T> c_shared[] = {c_first.view(), DenseView<T>{shared.view().data, st.k, kN, kN, kDevice},
                                     c_third.view()};
    const DenseView<const T> b_shared[] = {b3[0], b3[1], DenseView<const T>{shared.view().data, st.m, kN, kN, kDevice}};
    CHECK(refused(a3, b_shared, c_shared) == ErrorCode::invalid_argument);
    // B 2 narrower than the others (its C too); A 2 of another layout.
    DenseMatrix<T> c_narrow_store(st.k, kN - 8, kDevice);
    const DenseView<const T> b_narrow[] = {b3[0], b3[1], DenseView<const T>{b3[2].data, st.m, kN - 8, kN, kDevice}};
    const DenseView<T> c_narrow[] = {c_first.view(), c_second.view(), c_narrow_store.view()};
    CHECK(refused(a3, b_narrow, c_narrow) == ErrorCode::shape_mismatch);
    const HybridMatrix<T> other =
        ref::dense_to_hybrid<T>(a_dense_all[2].view(), TwellLayout{st.layout.tile, st.layout.compression * 2})
            .to(kDevice);
    const HybridView<const T> a_other[] = {a3[0], a3[1], other.view()};
    CHECK(refused(a_other, b3, c3) == ErrorCode::shape_mismatch);
    REQUIRE(cudaDeviceSynchronize() == cudaSuccess);
    const DenseMatrix<T> first = c_first.to(kHost);
    bool poisoned = true;
    for (std::int64_t r = 0; r < st.k; ++r)
      for (std::int64_t j = 0; j < kN; ++j) poisoned = poisoned && std::isnan(to_float(first.view().at(r, j)));
    CHECK(poisoned);
  }
}

// SpmmPlan::run_transposed with SlotStructure::shared (the training step's h, dg and du): value
// planes of one structure transpose together. Plane p is A_0's Hybrid with other values at the
// same entries (A_0's dense rows as dense rows); each C_p must be within one rounding of the
// reference and, where no plane holds +-0 at another's entry, carry the bits of the separate call.
// Then every entry (slot or dense-row column) is kept by one plane alone, the others holding +-0
// there (and one slot +-0 in every plane): each C must match the reference. Two planes as well
// as three. Every route: the
// tile-streaming kernel in one launch, slice-reuse, pair-balanced, and the CSR route (where shared
// changes nothing). Planes of other structures (a column moved in one group; other activations; a
// dense row in one plane only) are refused, and the plan runs correctly after the refusal.
TEST_CASE_TEMPLATE("cuda SpmmPlan transposes value planes of one slot structure together", T, bf16, fp16) {
  constexpr std::int64_t kN = 64;
  constexpr int kPlanes = dev::SpmmPlan<T>::kMaxTransposedBatch;
  const std::vector<TransposedRoute> settings = transposed_routes();
  for (const TransposedRoute& st : settings) {
    CAPTURE(st.path);  // with k, one route
    CAPTURE(st.k);
    const std::uint64_t seed = testing::fresh_seed();
    CAPTURE(seed);
    const bool direct = std::string(st.path).find("csr") == std::string::npos;
    dev::SpmmPlan<T> plan(st.m, st.k, st.layout, {}, st.algorithm);
    DenseMatrix<T> a0_dense = workload::activations<T>({.tokens = st.m,
                                                        .units = st.k,
                                                        .density = 0.005,
                                                        .distribution = workload::Distribution::token_skewed,
                                                        .seed = seed});
    // `hot` hot columns from column 5 on: dense rows of A^T.
    const auto add_hot_columns = [&](int hot) {
      for (std::int64_t j = 0; j < hot; ++j)
        for (std::int64_t r = j % 2; r < st.m; r += 2) a0_dense.view().at(r, 5 + 13 * j) = from_float<T>(0.5f);
    };
    add_hot_columns(6);
    for (std::int64_t j = 0; j < 100; ++j) a0_dense.view().at(7, j) = from_float<T>(-0.5f);  // a dense row of A
    // Column 9: 10 entries in rows 0-255 besides row 7's and no others there, a group of A^T past
    // the 7 entries its staged head holds (the kernel reads the rest from global memory) and
    // within 15 slots.
    for (std::int64_t r = 0; r < 256; ++r)
      if (r != 7) a0_dense.view().at(r, 9) = from_float<T>(r % 25 == 0 && r < 250 ? 0.375f : 0.0f);
    // Plane p: A_0's entries with fresh values (nonzero: the structure stays), as a Hybrid.
    const auto make_planes = [&] {
      std::vector<HybridMatrix<T>> made;
      for (int p = 0; p < kPlanes; ++p) {
        DenseMatrix<T> values = a0_dense.to(kHost);
        const DenseMatrix<T> fresh = testing::random_dense<T>(st.m, st.k, 1.0f, seed + 10 * p + 3);
        for (std::int64_t r = 0; r < st.m; ++r)
          for (std::int64_t j = 0; j < st.k; ++j)
            if (p > 0 && is_stored(values.view().at(r, j)))
              values.view().at(r, j) = is_stored(fresh.view().at(r, j)) ? fresh.view().at(r, j) : from_float<T>(0.25f);
        made.push_back(ref::dense_to_hybrid<T>(values.view(), st.layout));
      }
      return made;
    };
    const std::vector<HybridMatrix<T>> planes = make_planes();
    std::vector<DenseMatrix<T>> b_host, b_dev, c0;
    for (int p = 0; p < kPlanes; ++p) {
      b_host.push_back(testing::random_dense<T>(st.m, kN, 1.0f, seed + 10 * p + 1));
      b_dev.push_back(b_host.back().to(kDevice));
      c0.push_back(testing::random_dense<T>(st.k, kN, 1.0f, seed + 10 * p + 2));
    }
    REQUIRE(planes[0].overflow_rows() > 0);
    std::int64_t column9 = 0;
    for (std::int64_t r = 0; r < 256; ++r) column9 += is_stored(a0_dense.view().at(r, 9)) ? 1 : 0;
    REQUIRE(column9 == 11);
    const auto dense_row = [](const HybridMatrix<T>& h, std::int64_t r) { return h.row_to_overflow().data()[r] >= 0; };
    // Runs the planes together into C poisoned with NaN (beta = 0) or C0; returns each C.
    const auto run_shared = [&](const std::vector<HybridMatrix<T>>& a_dev, int count, float alpha, float beta) {
      std::vector<DenseMatrix<T>> c;
      std::vector<HybridView<const T>> a_views;
      std::vector<DenseView<const T>> b_views;
      std::vector<DenseView<T>> c_views;
      for (int p = 0; p < count; ++p) {
        c.push_back(beta == 0.0f ? nan_dense<T>(st.k, kN).to(kDevice) : c0[p].to(kDevice));
        a_views.push_back(a_dev[p].view());
        b_views.push_back(b_dev[p].view());
      }
      for (DenseMatrix<T>& part : c) c_views.push_back(part.view());
      plan.run_transposed(a_views, b_views, c_views, alpha, beta, dev::SlotStructure::shared);
      REQUIRE(cudaDeviceSynchronize() == cudaSuccess);
      CHECK(plan.path().find(st.path) != std::string::npos);
      std::vector<DenseMatrix<T>> got;
      for (const DenseMatrix<T>& part : c) got.push_back(part.to(kHost));
      return got;
    };
    const auto to_device = [](const std::vector<HybridMatrix<T>>& host) {
      std::vector<HybridMatrix<T>> out;
      for (const HybridMatrix<T>& h : host) out.push_back(h.to(kDevice));
      return out;
    };
    const auto check_planes = [&](const std::vector<HybridMatrix<T>>& a_host, const std::vector<bool>& same_bits) {
      const std::vector<HybridMatrix<T>> a_dev = to_device(a_host);
      for (const auto& [alpha, beta] : {kSpmmAlphaBeta[1], kSpmmAlphaBeta[2]}) {
        CAPTURE(alpha);
        CAPTURE(beta);
        // Three planes, then the first two (the kernel of two planes).
        for (const int count : {kPlanes, 2}) {
          CAPTURE(count);
          const std::vector<DenseMatrix<T>> got = run_shared(a_dev, count, alpha, beta);
          for (int p = 0; p < count; ++p) {
            CAPTURE(p);
            check_close<T>({got[p].to(kHost), plan.path()},
                           reference_spmm_t<T>(a_host[p], b_host[p], c0[p], alpha, beta));
            if (same_bits[p]) {
              const SpmmRun<T> alone = run_spmm_t<T>(a_dev[p], b_dev[p], c0[p], alpha, beta, st.algorithm);
              CHECK(testing::bitwise_equal<T>(got[p].view(), alone.got.view()));
            }
          }
        }
      }
    };
    // Planes 1 and 2 over one B (the training step's dg^T x and du^T x): on the tile-streaming
    // kernel one product of two planes, with the bits of two Bs of the same values.
    // Paired products get their own operands: B of two column slices, each C and B_0 with its
    // own leading dimension (a kernel reading another product's ld fails), alpha and beta as
    // run_transposed's other cases.
    constexpr std::int64_t kPairN = 136;
    constexpr std::int64_t kPairLd[kPlanes] = {kPairN, 152, 144};  // of C_p; B_0's is 144
    const DenseMatrix<T> b0_wide = testing::random_dense<T>(st.m, 144, 1.0f, seed + 7),
                         b1_pair = testing::random_dense<T>(st.m, kPairN, 1.0f, seed + 8);
    DenseMatrix<T> b0_pair(st.m, kPairN);  // the reference's copy of B_0's columns
    for (std::int64_t r = 0; r < st.m; ++r)
      for (std::int64_t j = 0; j < kPairN; ++j) b0_pair.view().at(r, j) = b0_wide.view().at(r, j);
    const DenseMatrix<T> b0_pair_dev = b0_wide.to(kDevice), b1_pair_dev = b1_pair.to(kDevice),
                         b1_copy = b1_pair.to(kDevice);
    DenseView<const T> b0_view = b0_pair_dev.view();
    b0_view.cols = kPairN;
    std::vector<DenseMatrix<T>> c0_pair;
    for (int p = 0; p < kPlanes; ++p) c0_pair.push_back(testing::random_dense<T>(st.k, kPairN, 1.0f, seed + 20 + p));
    const auto check_paired = [&](const std::vector<HybridMatrix<T>>& a_host) {
      const std::vector<HybridMatrix<T>> a_dev = to_device(a_host);
      const HybridView<const T> a_views[] = {a_dev[0].view(), a_dev[1].view(), a_dev[2].view()};
      for (const auto& [alpha, beta] : {kSpmmAlphaBeta[1], kSpmmAlphaBeta[2]}) {
        CAPTURE(alpha);
        CAPTURE(beta);
        // Planes 1 and 2 over `b2` for plane 2 (b1_pair_dev: one B, paired on the tile-streaming
        // kernel; b1_copy: the same values elsewhere, not paired).
        const auto run = [&](const DenseMatrix<T>& b2) {
          std::vector<DenseMatrix<T>> c;
          for (int p = 0; p < kPlanes; ++p) {
            DenseMatrix<T> start(st.k, kPairLd[p]);
            for (std::int64_t r = 0; r < st.k; ++r)
              for (std::int64_t j = 0; j < start.cols(); ++j)
                start.view().at(r, j) = j >= kPairN    ? from_float<T>(7.0f)
                                        : beta == 0.0f ? from_float<T>(std::numeric_limits<float>::quiet_NaN())
                                                       : c0_pair[p].view().at(r, j);
            c.push_back(start.to(kDevice));
          }
          const DenseView<const T> b_views[] = {b0_view, b1_pair_dev.view(), b2.view()};
          DenseView<T> c_views[kPlanes];
          for (int p = 0; p < kPlanes; ++p) {
            c_views[p] = c[p].view();
            c_views[p].cols = kPairN;
          }
          plan.run_transposed(a_views, b_views, c_views, alpha, beta, dev::SlotStructure::shared);
          REQUIRE(cudaDeviceSynchronize() == cudaSuccess);
          std::vector<DenseMatrix<T>> got;
          for (const DenseMatrix<T>& part : c) got.push_back(part.to(kHost));
          return std::pair(std::move(got), plan.path());
        };
        const auto [paired, paired_path] = run(b1_pair_dev);
        const bool stream = std::string(st.path).find("tile_stream") != std::string::npos;
        CHECK((paired_path.find("_paired") != std::string::npos) == stream);
        const auto [apart, apart_path] = run(b1_copy);
        CHECK(apart_path.find("_paired") == std::string::npos);
        for (int p = 0; p < kPlanes; ++p) {
          CAPTURE(p);
          CHECK(testing::identical(paired[p], apart[p]));  // the 7s past C's columns included
          DenseMatrix<T> own(st.k, kPairN);
          for (std::int64_t r = 0; r < st.k; ++r)
            for (std::int64_t j = 0; j < kPairN; ++j) own.view().at(r, j) = paired[p].view().at(r, j);
          check_close<T>({std::move(own), paired_path},
                         reference_spmm_t<T>(a_host[p], p == 0 ? b0_pair : b1_pair, c0_pair[p], alpha, beta));
        }
      }
    };
    check_planes(planes, {true, true, true});
    check_paired(planes);
    // Each entry kept by one plane alone: at a TwELL slot or dense-row column in the q-th third,
    // every plane but q holds +-0 there (and every plane at one slot). Then each plane holds a
    // third of the union, and a union taken from fewer planes than all would lose entries.
    std::vector<HybridMatrix<T>> zeros;
    for (const HybridMatrix<T>& h : planes) zeros.push_back(h.to(kHost));
    const TwellLayout lay = st.layout;
    const std::int64_t pw = lay.packed_width(st.k);
    std::int64_t planted = 0, everywhere = -1;
    const auto zero_bits = [&] { return (planted++ % 2 == 0) ? std::uint16_t{0x0000u} : std::uint16_t{0x8000u}; };
    for (std::int64_t r = 0; r < st.m; ++r) {
      if (dense_row(zeros[0], r)) continue;  // a dense row: its slots are not read
      for (std::int64_t t = 0; t < lay.tiles(st.k); ++t) {
        const std::int64_t at = r * pw + t * lay.slots();
        const std::uint32_t n =
            std::min<std::uint32_t>(zeros[0].twell().view().packed[at], static_cast<std::uint32_t>(lay.capacity()));
        for (std::uint32_t s = 1; s <= n; ++s) {
          const bool all = everywhere < 0;
          for (int p = 0; p < kPlanes; ++p) {
            if (!all && p == static_cast<int>((r + t + s) % 3)) continue;
            std::uint32_t& word = zeros[p].twell().view().packed[at + s];
            word = TwellLayout::pack(zero_bits(), TwellLayout::slot_column(word));
          }
          if (all) everywhere = at + s;
        }
      }
    }
    REQUIRE(everywhere >= 0);
    for (int p = 0; p < kPlanes; ++p) {
      const std::int32_t row7 = zeros[p].row_to_overflow().data()[7];
      REQUIRE(row7 >= 0);
      for (std::int64_t j = 0; j < 100; ++j)
        if (j % 3 != p) zeros[p].overflow().view().at(row7, j) = from_float<T>(zero_bits() == 0 ? 0.0f : -0.0f);
    }
    check_planes(zeros, {!direct, !direct, !direct});
    check_paired(zeros);
    if (!direct) continue;
    // Refused, once the transpose has run: plane 1 with one entry moved to the next column, plane
    // 2 from other activations, plane 1 without plane 0's dense row 7. A correct call after them runs as before.
    std::vector<HybridMatrix<T>> moved;
    for (const HybridMatrix<T>& h : planes) moved.push_back(h.to(kHost));
    bool shifted = false;
    for (std::int64_t r = 0; r < st.m && !shifted; ++r) {
      if (dense_row(moved[1], r)) continue;
      for (std::int64_t t = 0; t < lay.tiles(st.k) && !shifted; ++t) {
        std::uint32_t* group = moved[1].twell().view().packed + r * pw + t * lay.slots();
        const std::uint32_t column = TwellLayout::slot_column(group[1]);
        if (group[0] == 1 && column + 1 < static_cast<std::uint32_t>(lay.tile_cols(t, st.k))) {
          group[1] = TwellLayout::pack(TwellLayout::slot_value_bits(group[1]), column + 1);
          shifted = true;
        }
      }
    }
    REQUIRE(shifted);
    std::vector<HybridMatrix<T>> other;
    for (const HybridMatrix<T>& h : planes) other.push_back(h.to(kHost));
    other[2] = ref::dense_to_hybrid<T>(
        workload::activations<T>({.tokens = st.m, .units = st.k, .density = 0.005, .seed = seed + 99}).view(),
        st.layout);
    // Plane 1 reading row 7 from its slots, where plane 0 has it dense: the same slots, another
    // dense row.
    std::vector<HybridMatrix<T>> undensed;
    for (const HybridMatrix<T>& h : planes) undensed.push_back(h.to(kHost));
    undensed[1].row_to_overflow().data()[7] = -1;
    for (const auto* wrong : {&moved, &other, &undensed}) {
      const std::vector<HybridMatrix<T>> wrong_dev = to_device(*wrong);
      std::vector<HybridView<const T>> a_views;
      std::vector<DenseView<const T>> b_views;
      std::vector<DenseMatrix<T>> c;
      std::vector<DenseView<T>> c_views;
      for (int p = 0; p < kPlanes; ++p) {
        a_views.push_back(wrong_dev[p].view());
        b_views.push_back(b_dev[p].view());
        c.push_back(DenseMatrix<T>(st.k, kN, kDevice));
      }
      for (DenseMatrix<T>& part : c) c_views.push_back(part.view());
      CHECK(testing::code_of([&] {
              plan.run_transposed(a_views, b_views, c_views, 1.0f, 0.0f, dev::SlotStructure::shared);
            }) == ErrorCode::invalid_argument);
      REQUIRE(cudaDeviceSynchronize() == cudaSuccess);
    }
    check_planes(planes, {true, true, true});
    // More dense rows of A^T than the plan's runs so far had: their buffer grows after runs that
    // put them beside the products (on the plan's side lane, from its second run with dense rows).
    add_hot_columns(12);
    const std::vector<HybridMatrix<T>> hotter = make_planes();
    const TwellLayout at_layout{256, 16};  // A^T's on the direct route here; R only has to grow
    REQUIRE(ref::transpose<T>(hotter[0].view(), at_layout).overflow_rows() >
            ref::transpose<T>(planes[0].view(), at_layout).overflow_rows());
    check_planes(hotter, {true, true, true});
  }
}
