// Reference converters and the public conversion API: property tests on random matrices of
// every dtype, shape and density (round trips, commutation, threshold, overflow policies,
// reports), an Eigen cross-check of CSR, the global16 import/export, and every error path.
#include <doctest/doctest.h>

#include <Eigen/SparseCore>

#include <cstring>
#include <functional>
#include <limits>
#include <random>
#include <string>
#include <variant>
#include <vector>

#include <twell/converters/backends.hpp>
#include <twell/twell.hpp>

#include "checks.hpp"
#include "random.hpp"
#include "same.hpp"

using namespace twell;
using testing::bitwise_equal;
using testing::fresh_seed;
using testing::random_sparse_dense;

namespace {

template <class F>
Error error_of(F&& f) {
  try {
    f();
  } catch (const Error& e) {
    return e;
  }
  FAIL("no twell::Error thrown");
  return Error(ErrorCode::unsupported, "");
}

bool contains(const std::string& text, const std::string& part) { return text.find(part) != std::string::npos; }

template <class T>
std::uint32_t bits(T v) {
  if constexpr (sizeof(T) == 2) {
    return v.bits;
  } else {
    std::uint32_t u;
    std::memcpy(&u, &v, 4);
    return u;
  }
}

// The dense matrix a conversion must reproduce: non-stored values become +0.
template <class T>
DenseMatrix<T> canonical(DenseView<const T> d, float threshold = 0.0f) {
  DenseMatrix<T> out(d.rows, d.cols);
  for (std::int64_t i = 0; i < d.rows; ++i)
    for (std::int64_t j = 0; j < d.cols; ++j)
      if (is_stored(d.at(i, j), threshold)) out.view().at(i, j) = d.at(i, j);
  return out;
}

template <class T>
std::int64_t count_stored(DenseView<const T> d, float threshold = 0.0f) {
  std::int64_t n = 0;
  for (std::int64_t i = 0; i < d.rows; ++i)
    for (std::int64_t j = 0; j < d.cols; ++j) n += is_stored(d.at(i, j), threshold) ? 1 : 0;
  return n;
}

struct TileCount {
  std::int64_t row = -1, tile = -1, count = 0;
};

// Nonzeros of (row, tile) computed column by column, independently of TwellLayout.
template <class T>
std::int64_t tile_count(DenseView<const T> d, std::int64_t i, std::int64_t t, std::int32_t tile) {
  std::int64_t n = 0;
  for (std::int64_t j = t * tile; j < std::min<std::int64_t>(d.cols, (t + 1) * tile); ++j) n += is_stored(d.at(i, j));
  return n;
}

template <class T>
TileCount first_overflow(DenseView<const T> d, TwellLayout l) {
  const std::int64_t tiles = (d.cols + l.tile - 1) / l.tile;
  for (std::int64_t i = 0; i < d.rows; ++i)
    for (std::int64_t t = 0; t < tiles; ++t)
      if (const auto n = tile_count(d, i, t, l.tile); n > l.tile / l.compression - 1) return {i, t, n};
  return {};
}

// Keeps the first S-1 nonzeros of each (row, tile); returns how many it removed.
template <class T>
std::int64_t drop_beyond_capacity(DenseMatrix<T>& d, TwellLayout l) {
  std::int64_t dropped = 0;
  const std::int64_t capacity = l.tile / l.compression - 1;
  for (std::int64_t i = 0; i < d.rows(); ++i)
    for (std::int64_t t0 = 0; t0 < d.cols(); t0 += l.tile) {
      std::int64_t seen = 0;
      for (std::int64_t j = t0; j < std::min(d.cols(), t0 + l.tile); ++j)
        if (is_stored(d.view().at(i, j)) && ++seen > capacity) {
          d.view().at(i, j) = T{};
          ++dropped;
        }
    }
  return dropped;
}

template <class T>
std::vector<std::int32_t> overflowing_rows(DenseView<const T> d, TwellLayout l) {
  std::vector<std::int32_t> rows;
  for (std::int64_t i = 0; i < d.rows; ++i)
    for (std::int64_t t = 0; t * l.tile < d.cols; ++t)
      if (tile_count(d, i, t, l.tile) > l.tile / l.compression - 1) {
        rows.push_back(static_cast<std::int32_t>(i));
        break;
      }
  return rows;
}

using testing::identical;

enum Fmt { kDense, kCsr, kEll, kTwell, kHybrid };
const char* const kFmtName[] = {"dense", "csr", "ell", "twell", "hybrid"};

template <class T>
using Any = std::variant<DenseMatrix<T>, CsrMatrix<T>, EllMatrix<T>, TwellMatrix<T>, HybridMatrix<T>>;

template <class T, class Src>
Any<T> convert(const Src& src, int fmt, TwellLayout l, const ConvertOptions& o = {}) {
  switch (fmt) {
    case kDense: return to_dense(src, o);
    case kCsr: return to_csr(src, o);
    case kEll: return to_ell(src, o);
    case kTwell: return to_twell(src, l, o);
    default: return to_hybrid(src, l, o);
  }
}

template <class T>
Any<T> convert_any(const Any<T>& src, int fmt, TwellLayout l, const ConvertOptions& o = {}) {
  return std::visit([&](const auto& m) { return convert<T>(m, fmt, l, o); }, src);
}

template <class T>
bool same_any(const Any<T>& a, const Any<T>& b) {
  if (a.index() != b.index()) return false;
  return std::visit(
      [&](const auto& x) {
        using M = std::remove_cvref_t<decltype(x)>;
        return identical(x, std::get<M>(b));
      },
      a);
}

template <class T>
DenseMatrix<T> densify(const Any<T>& m) {
  return std::visit([](const auto& x) { return to_dense(x); }, m);
}

template <class T>
void validate_any(const Any<T>& m) {
  std::visit([](const auto& x) { validate(x); }, m);
}

const TwellLayout kLayouts[] = {{8, 2}, {16, 4}, {32, 4}, {64, 8}, {128, 16}, {256, 8}, {256, 32}, {512, 2}};

struct Shape {
  std::int64_t rows, cols;
};

std::vector<Shape> shapes(std::mt19937_64& rng) {
  std::vector<Shape> s = {{1, 1}, {1, 7}, {2, 300}, {5, 257}, {33, 1}, {0, 5}, {4, 0}};
  for (int k = 0; k < 4; ++k) s.push_back({1 + static_cast<std::int64_t>(rng() % 64), 1 + static_cast<std::int64_t>(rng() % 700)});
  s.push_back({300, 1000});
  return s;
}

}  // namespace

TEST_CASE_TEMPLATE("Dense -> X -> Dense is the identity (up to -0.0 -> +0) for every format", T, bf16, fp16, float) {
  std::mt19937_64 rng(fresh_seed());
  for (const Shape shape : shapes(rng)) {
    for (const double density : {0.0, 0.005, 0.05, 0.5, 1.0}) {
      const std::uint64_t seed = fresh_seed();
      const TwellLayout layout = kLayouts[rng() % std::size(kLayouts)];
      CAPTURE(shape.rows);
      CAPTURE(shape.cols);
      CAPTURE(density);
      CAPTURE(seed);
      CAPTURE(layout.tile);
      CAPTURE(layout.compression);
      const auto d = random_sparse_dense<T>(
          shape.rows, shape.cols, {.density = density, .specials = true, .empty_row_share = 0.1, .full_row_share = 0.05},
          seed);
      const auto expected = canonical<T>(d.view());
      const std::int64_t nnz = count_stored<T>(d.view());
      const TileCount overflow = first_overflow<T>(d.view(), layout);
      for (int fmt = kDense; fmt <= kHybrid; ++fmt) {
        CAPTURE(std::string(kFmtName[fmt]));
        ConvertReport report;
        if (fmt == kTwell && overflow.row >= 0) {
          const Error e = error_of([&] { (void)to_twell(d, layout); });
          CHECK(e.code() == ErrorCode::overflow);
          CHECK(contains(e.what(), "row " + std::to_string(overflow.row) + ", tile " + std::to_string(overflow.tile)));
          CHECK(contains(e.what(), "holds " + std::to_string(overflow.count) + " nonzeros"));
          continue;
        }
        const Any<T> x = convert<T>(d, fmt, layout, {.report = &report});
        validate_any(x);
        CHECK(report.nnz == nnz);
        CHECK(report.dropped == 0);
        CHECK(identical(densify(x), expected));
        if (fmt == kHybrid) {
          const auto& h = std::get<HybridMatrix<T>>(x);
          const auto rows = overflowing_rows<T>(d.view(), layout);
          CHECK(report.overflow_rows == static_cast<std::int64_t>(rows.size()));
          REQUIRE(h.overflow_rows() == static_cast<std::int64_t>(rows.size()));
          CHECK(std::equal(rows.begin(), rows.end(), h.overflow_to_row().data()));
        }
      }
    }
  }
}

TEST_CASE_TEMPLATE("large ragged shapes round-trip through CSR and Hybrid", T, bf16, fp16, float) {
  std::mt19937_64 rng(fresh_seed());
  for (const Shape shape : {Shape{2000, 37}, Shape{37, 2000}, Shape{1999, 1531}}) {
    const double density = shape.rows * shape.cols > 1000000 ? (rng() % 2 ? 0.005 : 0.2) : 0.5;
    const std::uint64_t seed = fresh_seed();
    CAPTURE(shape.rows);
    CAPTURE(shape.cols);
    CAPTURE(seed);
    const auto d = random_sparse_dense<T>(shape.rows, shape.cols, {.density = density, .specials = true}, seed);
    const auto expected = canonical<T>(d.view());
    CHECK(identical(to_dense(to_csr(d)), expected));
    const auto h = to_hybrid(d, TwellLayout{256, 16});
    validate(h);
    CHECK(identical(to_dense(h), expected));
    CHECK(identical(to_csr(h), to_csr(d)));
  }
}

TEST_CASE_TEMPLATE("conversions commute: A -> B -> C equals A -> C", T, bf16, fp16, float) {
  std::mt19937_64 rng(fresh_seed());
  for (int trial = 0; trial < 3; ++trial) {
    const std::int64_t rows = 1 + static_cast<std::int64_t>(rng() % 90);
    const std::int64_t cols = 1 + static_cast<std::int64_t>(rng() % 600);
    const double density = trial == 0 ? 0.02 : (trial == 1 ? 0.1 : 0.6);
    const std::uint64_t seed = fresh_seed();
    CAPTURE(rows);
    CAPTURE(cols);
    CAPTURE(density);
    CAPTURE(seed);
    // Full rows only in the last trial: no TwELL layout holds one (capacity S-1 < tile), so the
    // first two trials pick a layout that holds d and run every route through TwELL.
    const auto d = random_sparse_dense<T>(
        rows, cols, {.density = density, .specials = true, .full_row_share = trial == 2 ? 0.05 : 0.0}, seed);
    std::vector<TwellLayout> fitting;
    for (const TwellLayout l : kLayouts)
      if (first_overflow<T>(d.view(), l).row < 0) fitting.push_back(l);
    const bool twell_fits = !fitting.empty();
    const TwellLayout layout = twell_fits ? fitting[rng() % fitting.size()] : kLayouts[rng() % std::size(kLayouts)];
    CAPTURE(layout.tile);
    CAPTURE(layout.compression);
    if (trial < 2) REQUIRE(twell_fits);
    std::vector<Any<T>> direct;
    for (int a = kDense; a <= kHybrid; ++a)
      direct.push_back(a == kTwell && !twell_fits ? Any<T>{} : convert<T>(d, a, layout));
    for (int a = kDense; a <= kHybrid; ++a)
      for (int b = kDense; b <= kHybrid; ++b)
        for (int c = kDense; c <= kHybrid; ++c) {
          if (!twell_fits && (a == kTwell || b == kTwell || c == kTwell)) continue;
          CAPTURE(std::string(kFmtName[a]));
          CAPTURE(std::string(kFmtName[b]));
          CAPTURE(std::string(kFmtName[c]));
          const Any<T> via_b = convert_any<T>(convert_any<T>(direct[static_cast<std::size_t>(a)], b, layout), c, layout);
          const Any<T> a_to_c = convert_any<T>(direct[static_cast<std::size_t>(a)], c, layout);
          CHECK(same_any(via_b, a_to_c));
          CHECK(same_any(a_to_c, direct[static_cast<std::size_t>(c)]));
        }
  }
}

TEST_CASE_TEMPLATE("same-format conversion: a re-build, or a re-layout / re-width", T, bf16, fp16, float) {
  const auto d = random_sparse_dense<T>(70, 333, {.density = 0.08, .specials = true}, fresh_seed());
  const auto csr = to_csr(d);
  const auto csr2 = to_csr(csr);
  CHECK(identical(csr, csr2));
  CHECK(csr2.values().data() != csr.values().data());
  const auto ell = to_ell(d);
  CHECK(identical(to_ell(ell), to_ell(d, {.ell_width = ell.width()})));
  CHECK(identical(to_ell(ell, {.ell_width = ell.width() + 5}), to_ell(d, {.ell_width = ell.width() + 5})));
  const auto h = to_hybrid(d, TwellLayout{32, 8});
  CHECK(identical(to_hybrid(h, TwellLayout{32, 8}), h));
  CHECK(identical(to_hybrid(h, TwellLayout{128, 2}), to_hybrid(d, TwellLayout{128, 2})));
  const auto tw = to_twell(d, TwellLayout{64, 2});
  CHECK(identical(to_twell(tw, TwellLayout{64, 2}), tw));
  CHECK(identical(to_twell(tw, TwellLayout{256, 2}), to_twell(d, TwellLayout{256, 2})));
  CHECK(identical(to_twell(h, TwellLayout{64, 2}), tw));
  CHECK(identical(to_hybrid(tw, TwellLayout{8, 4}), to_hybrid(d, TwellLayout{8, 4})));
  // Dense -> dense: -0.0 comes out as +0 (canonical), a canonical source is copied as it is.
  const auto dd = to_dense(d);
  CHECK(identical(dd, canonical<T>(d.view())));
  CHECK(identical(to_dense(dd), dd));
  CHECK(to_dense(dd).values().data() != dd.values().data());
  // A mutable view converts too.
  auto mutable_copy = to_dense(d);
  CHECK(identical(to_csr(mutable_copy.view()), csr));
  // A -0.0 where an overflow row stores nothing comes out as +0 from the copy too, as from every
  // re-build (the copy once kept it, so the bits depended on whether a report was asked for).
  auto signed_zero = to_hybrid(d, TwellLayout{32, 8});
  REQUIRE(signed_zero.overflow_rows() > 0);
  DenseView<T> block = signed_zero.overflow().view();
  bool placed = false;
  for (std::int64_t r = 0; r < block.rows && !placed; ++r)
    for (std::int64_t j = 0; j < block.cols && !placed; ++j)
      if (!is_stored(block.at(r, j))) {
        block.at(r, j) = from_float<T>(-0.0f);
        placed = true;
      }
  REQUIRE(placed);
  ConvertReport report;
  CHECK(identical(to_hybrid(signed_zero, TwellLayout{32, 8}), h));
  CHECK(identical(to_hybrid(signed_zero, TwellLayout{32, 8}, {.report = &report}), h));
}

TEST_CASE_TEMPLATE("threshold: |v| <= t is not stored, through every path", T, bf16, fp16, float) {
  const float t = 0.5f;
  const std::uint64_t seed = fresh_seed();
  CAPTURE(seed);
  const auto d = random_sparse_dense<T>(40, 300, {.density = 0.3, .specials = true}, seed);
  const auto expected = canonical<T>(d.view(), t);
  const std::int64_t nnz = count_stored<T>(d.view(), t);
  // Capacity 31 of 32 columns: the thresholded values (~23 % of them) fit whatever the seed
  // (capacity 15 at C = 2 overflowed for 8 of 14 seed bases).
  const TwellLayout layout{32, 1};
  REQUIRE(first_overflow<T>(expected.view(), layout).row < 0);
  const TwellLayout roomy{256, 1};  // holds d whole, as a TwELL source
  REQUIRE(first_overflow<T>(d.view(), roomy).row < 0);
  for (int a = kDense; a <= kHybrid; ++a) {
    const Any<T> src = convert<T>(d, a, a == kTwell ? roomy : TwellLayout{8, 2});
    for (int b = kDense; b <= kHybrid; ++b) {
      CAPTURE(std::string(kFmtName[a]));
      CAPTURE(std::string(kFmtName[b]));
      ConvertReport report;
      const Any<T> x = convert_any<T>(src, b, layout, {.threshold = t, .report = &report});
      validate_any(x);
      CHECK(identical(densify(x), expected));
      CHECK(report.nnz == nnz);
    }
  }
}

TEST_CASE_TEMPLATE("TwELL overflow policies: error names the first overflow, drop keeps S-1, hybrid is refused", T,
                   bf16, fp16, float) {
  std::mt19937_64 rng(fresh_seed());
  for (const TwellLayout layout : {TwellLayout{8, 2}, TwellLayout{64, 8}, TwellLayout{256, 32}}) {
    const std::uint64_t seed = fresh_seed();
    CAPTURE(layout.tile);
    CAPTURE(layout.compression);
    CAPTURE(seed);
    const std::int64_t cols = layout.tile * 3 + 5;
    const auto d = random_sparse_dense<T>(50, cols, {.density = 0.12, .full_row_share = 0.1}, seed);
    const TileCount first = first_overflow<T>(d.view(), layout);
    REQUIRE(first.row >= 0);
    auto kept = canonical<T>(d.view());
    const std::int64_t dropped = drop_beyond_capacity(kept, layout);
    for (int a = kDense; a <= kHybrid; ++a) {
      CAPTURE(std::string(kFmtName[a]));
      // d may hold full rows, which no TwELL holds (capacity S-1 < tile): its TwELL source is a Hybrid.
      const Any<T> src = convert<T>(d, a == kTwell ? kHybrid : a, layout);
      const Error e = error_of([&] { (void)convert_any<T>(src, kTwell, layout); });
      CHECK(e.code() == ErrorCode::overflow);
      CHECK(contains(e.what(), "row " + std::to_string(first.row) + ", tile " + std::to_string(first.tile)));
      CHECK(contains(e.what(), "holds " + std::to_string(first.count) + " nonzeros"));
      CHECK(contains(e.what(), "capacity S-1 = " + std::to_string(layout.capacity())));

      ConvertReport report;
      const Any<T> x = convert_any<T>(src, kTwell, layout, {.overflow = OverflowPolicy::drop, .report = &report});
      validate_any(x);
      CHECK(identical(densify(x), kept));
      CHECK(report.dropped == dropped);
      CHECK(report.nnz == count_stored<T>(d.view()) - dropped);

      const Error h = error_of([&] { (void)convert_any<T>(src, kTwell, layout, {.overflow = OverflowPolicy::hybrid}); });
      CHECK(h.code() == ErrorCode::invalid_argument);
      CHECK(contains(h.what(), "to_hybrid"));
    }
  }
  // The reference converters refuse the hybrid policy themselves too.
  const auto d = random_sparse_dense<T>(3, 10, {}, fresh_seed());
  CHECK(error_of([&] { (void)reference::dense_to_twell<T>(d.view(), {}, {.overflow = OverflowPolicy::hybrid}); }).code() ==
        ErrorCode::invalid_argument);
}

TEST_CASE_TEMPLATE("ELL width: -1 is the longest row, a smaller width follows the overflow policy", T, bf16, fp16,
                   float) {
  const auto d = random_sparse_dense<T>(60, 200, {.density = 0.1, .full_row_share = 0.05}, fresh_seed());
  const auto canon = canonical<T>(d.view());
  std::int64_t longest = 0;
  std::vector<std::int64_t> per_row;
  for (std::int64_t i = 0; i < d.rows(); ++i) {
    std::int64_t n = 0;
    for (std::int64_t j = 0; j < d.cols(); ++j) n += is_stored(d.view().at(i, j));
    per_row.push_back(n);
    longest = std::max(longest, n);
  }
  const auto ell = to_ell(d);
  CHECK(ell.width() == longest);
  // Any width up to the columns (one entry per column at most) pads the shorter rows.
  const auto wide = to_ell(d, {.ell_width = d.cols()});
  CHECK(wide.width() == d.cols());
  validate(wide);
  CHECK(identical(to_dense(wide), canon));
  // A policy outside the enum is an error, not a silent drop (nor a silent error policy).
  const auto unknown = static_cast<OverflowPolicy>(7);
  CHECK(error_of([&] { (void)to_ell(d, {.overflow = unknown, .ell_width = 2}); }).code() ==
        ErrorCode::invalid_argument);
  CHECK(error_of([&] { (void)to_twell(d, TwellLayout{}, {.overflow = unknown}); }).code() ==
        ErrorCode::invalid_argument);
  TwellMatrix<T> into(d.rows(), d.cols(), TwellLayout{});
  CHECK(error_of([&] { to_twell_into(d.view(), into.view(), {.overflow = unknown}); }).code() ==
        ErrorCode::invalid_argument);

  const std::int64_t width = longest / 2;
  std::int64_t first_row = -1, dropped = 0;
  auto kept = canonical<T>(d.view());
  for (std::int64_t i = 0; i < d.rows(); ++i) {
    if (per_row[static_cast<std::size_t>(i)] > width && first_row < 0) first_row = i;
    std::int64_t seen = 0;
    for (std::int64_t j = 0; j < d.cols(); ++j)
      if (is_stored(kept.view().at(i, j)) && ++seen > width) {
        kept.view().at(i, j) = T{};
        ++dropped;
      }
  }
  for (int a = kDense; a <= kHybrid; ++a) {
    CAPTURE(std::string(kFmtName[a]));
    // d may hold full rows, which no TwELL holds (capacity S-1 < tile): its TwELL source is a Hybrid.
    const Any<T> src = convert<T>(d, a == kTwell ? kHybrid : a, TwellLayout{8, 2});
    const Error e = error_of([&] { (void)convert_any<T>(src, kEll, {}, {.ell_width = width}); });
    CHECK(e.code() == ErrorCode::overflow);
    CHECK(contains(e.what(), "row " + std::to_string(first_row) + " holds " +
                                 std::to_string(per_row[static_cast<std::size_t>(first_row)]) + " nonzeros"));
    ConvertReport report;
    const Any<T> x = convert_any<T>(src, kEll, {}, {.overflow = OverflowPolicy::drop, .ell_width = width, .report = &report});
    validate_any(x);
    CHECK(std::get<EllMatrix<T>>(x).width() == width);
    CHECK(identical(densify(x), kept));
    CHECK(report.dropped == dropped);
    CHECK(error_of([&] { (void)convert_any<T>(src, kEll, {}, {.overflow = OverflowPolicy::hybrid, .ell_width = width}); })
              .code() == ErrorCode::invalid_argument);
    CHECK(error_of([&] { (void)convert_any<T>(src, kEll, {}, {.ell_width = -2}); }).code() ==
          ErrorCode::invalid_argument);
  }
  // An ELL source at its own width was once a plain copy, which skipped the policy check.
  CHECK(error_of([&] { (void)to_ell(ell, {.overflow = OverflowPolicy::hybrid, .ell_width = ell.width()}); }).code() ==
        ErrorCode::invalid_argument);
}

TEST_CASE_TEMPLATE("CSR equals Eigen::SparseMatrix<float, RowMajor> built from the same dense data", T, bf16, fp16,
                   float) {
  std::mt19937_64 rng(fresh_seed());
  for (const double density : {0.0, 0.005, 0.05, 0.5, 1.0}) {
    for (const float threshold : {0.0f, 0.7f}) {
      const std::int64_t rows = 1 + static_cast<std::int64_t>(rng() % 200);
      const std::int64_t cols = 1 + static_cast<std::int64_t>(rng() % 900);
      const std::uint64_t seed = fresh_seed();
      CAPTURE(rows);
      CAPTURE(cols);
      CAPTURE(density);
      CAPTURE(threshold);
      CAPTURE(seed);
      const auto d = random_sparse_dense<T>(rows, cols, {.density = density, .specials = true}, seed);
      Eigen::Matrix<float, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor> e(rows, cols);
      for (std::int64_t i = 0; i < rows; ++i)
        for (std::int64_t j = 0; j < cols; ++j) e(i, j) = to_float(d.view().at(i, j));
      // sparseView drops |v| <= reference * epsilon: with epsilon 1 that is the threshold rule.
      Eigen::SparseMatrix<float, Eigen::RowMajor> s = e.sparseView(threshold, 1.0f);
      s.makeCompressed();
      const auto csr = to_csr(d, {.threshold = threshold});
      REQUIRE(csr.nnz() == s.nonZeros());
      for (std::int64_t i = 0; i <= rows; ++i) REQUIRE(csr.row_ptr().data()[i] == s.outerIndexPtr()[i]);
      for (std::int64_t k = 0; k < csr.nnz(); ++k) {
        REQUIRE(csr.col_idx().data()[k] == s.innerIndexPtr()[k]);
        REQUIRE(bits(to_float(csr.values().data()[k])) == bits(s.valuePtr()[k]));
      }
    }
  }
}

// CSR -> CSR is re-built row by row: its cost follows the entries, not the width (it once went through a Hybrid, whose
// dense overflow row here would have taken 8.6 GB).
TEST_CASE("to_csr of a CSR with a threshold: one row 2^31 - 1 columns wide, 40 entries in one tile") {
  constexpr std::int64_t kWidest = std::numeric_limits<std::int32_t>::max();
  CsrMatrix<float> csr(1, kWidest, 40);
  csr.row_ptr().data()[0] = 0;
  csr.row_ptr().data()[1] = 40;
  for (std::int32_t k = 0; k < 40; ++k) {
    csr.col_idx().data()[k] = 3 * k;
    csr.values().data()[k] = k == 7 ? 0.0f : static_cast<float>(k + 1);  // one stored zero
  }
  ConvertReport report;
  const auto out = to_csr(csr, {.threshold = 20.5f, .report = &report});
  validate(out);
  REQUIRE(out.nnz() == 20);
  CHECK(report.nnz == 20);
  CHECK(out.cols() == kWidest);
  for (std::int32_t k = 0; k < 20; ++k) {
    CHECK(out.col_idx().data()[k] == 3 * (k + 20));
    CHECK(out.values().data()[k] == static_cast<float>(k + 21));
  }
  const auto no_zeros = to_csr(csr);  // the stored zero alone makes it a re-build too
  CHECK(no_zeros.nnz() == 39);
}

TEST_CASE_TEMPLATE("explicit zeros in a source (sddmm output) are accepted and not copied", T, bf16, fp16, float) {
  CsrMatrix<T> csr(2, 5, 3);
  const std::int64_t row_ptr[] = {0, 2, 3};
  const std::int32_t col_idx[] = {1, 3, 0};
  std::copy(std::begin(row_ptr), std::end(row_ptr), csr.row_ptr().data());
  std::copy(std::begin(col_idx), std::end(col_idx), csr.col_idx().data());
  csr.values().data()[0] = from_float<T>(1.5f);
  csr.values().data()[1] = from_float<T>(-0.0f);
  csr.values().data()[2] = from_float<T>(0.0f);
  CHECK(error_of([&] { validate(csr); }).code() == ErrorCode::malformed);
  CHECK_NOTHROW(validate(csr, {.allow_explicit_zeros = true}));
  ConvertReport report;
  const auto clean = to_csr(csr, {.report = &report});
  validate(clean);
  CHECK(clean.nnz() == 1);
  CHECK(report.nnz == 1);
  const auto tw = to_twell(csr, TwellLayout{8, 2});
  validate(tw);
  CHECK(tw.packed().data()[0] == 1u);
}

TEST_CASE("global16 import/export: the paper's layout, bit-exact both ways") {
  std::mt19937_64 rng(fresh_seed());
  for (const TwellLayout layout : {TwellLayout{256, 8}, TwellLayout{128, 4}, TwellLayout{64, 2}}) {
    const std::int64_t cols = 1 + static_cast<std::int64_t>(rng() % 5000);
    const auto d = random_sparse_dense<bf16>(40, cols, {.density = 0.02, .specials = true}, fresh_seed());
    CAPTURE(cols);
    const auto tw = to_twell(d, layout, {.overflow = OverflowPolicy::drop});
    const Buffer<std::uint32_t> g = export_global16(tw.view());
    REQUIRE(g.size() == tw.packed().size());
    for (std::int64_t i = 0; i < tw.rows(); ++i)
      for (std::int64_t t = 0; t < layout.tiles(cols); ++t) {
        const std::int64_t o = i * layout.packed_width(cols) + t * layout.slots();
        const std::uint32_t count = tw.packed().data()[o];
        REQUIRE(g.data()[o] == count);
        for (std::int32_t s = 1; s < layout.slots(); ++s) {
          const std::uint32_t w = tw.packed().data()[o + s];
          const std::uint32_t expected = s <= static_cast<std::int32_t>(count)
                                             ? (w & 0xffff0000u) | static_cast<std::uint32_t>(t * layout.tile + (w & 0xffffu))
                                             : 0u;
          REQUIRE(g.data()[o + s] == expected);
        }
      }
    const auto back = import_global16<bf16>(tw.rows(), cols, layout, g.host_span());
    CHECK(identical(back, tw));
  }
  const auto f16 = to_twell(random_sparse_dense<fp16>(7, 900, {.density = 0.01}, fresh_seed()), TwellLayout{});
  const auto g16 = export_global16(f16.view());
  CHECK(identical(import_global16<fp16>(7, 900, TwellLayout{}, g16.host_span()), f16));

  // Error paths.
  const auto wide = to_twell(DenseMatrix<bf16>(1, 65537), TwellLayout{});
  CHECK(error_of([&] { (void)export_global16(wide.view()); }).code() == ErrorCode::invalid_argument);
  CHECK(error_of([&] { (void)import_global16<bf16>(1, 65537, TwellLayout{}, wide.packed().host_span()); }).code() ==
        ErrorCode::invalid_argument);
  CHECK(error_of([&] { (void)import_global16<fp16>(7, 900, TwellLayout{}, std::span(g16.data(), g16.size() - 1)); })
            .code() == ErrorCode::shape_mismatch);
  CHECK(error_of([&] { (void)import_global16<fp16>(7, 900, TwellLayout{12, 2}, g16.host_span()); }).code() ==
        ErrorCode::invalid_argument);
  // rows x packed width past 2^63 once wrapped to a count that an empty span could match.
  CHECK(error_of([&] { (void)import_global16<bf16>(std::int64_t{1} << 62, 16, TwellLayout{8, 2}, {}); }).code() ==
        ErrorCode::invalid_argument);
  std::vector<std::uint32_t> bad(g16.data(), g16.data() + g16.size());
  const TwellLayout l{};
  // Tile 1 of row 0 with one entry whose global column lies in tile 0.
  const std::int64_t o = l.slots();
  std::fill(bad.begin() + o, bad.begin() + o + l.slots(), 0u);
  bad[static_cast<std::size_t>(o)] = 1;
  bad[static_cast<std::size_t>(o) + 1] = TwellLayout::pack(0x3f80, 5);
  const Error e = error_of([&] { (void)import_global16<fp16>(7, 900, l, bad); });
  CHECK(e.code() == ErrorCode::malformed);
  CHECK(contains(e.what(), "row 0, tile 1, slot 1: global column 5"));
  bad[static_cast<std::size_t>(o) + 1] = TwellLayout::pack(0x3f80, 256 + 5);
  CHECK_NOTHROW((void)import_global16<fp16>(7, 900, l, bad));
  bad[static_cast<std::size_t>(o)] = static_cast<std::uint32_t>(l.capacity() + 1);
  CHECK(contains(error_of([&] { (void)import_global16<fp16>(7, 900, l, bad); }).what(), "count 32 exceeds"));
  bad[static_cast<std::size_t>(o)] = 1;
  bad[static_cast<std::size_t>(o) + 2] = 0xdead;
  const Error unused = error_of([&] { (void)import_global16<fp16>(7, 900, l, bad); });
  CHECK(unused.code() == ErrorCode::malformed);
  CHECK(contains(unused.what(), "unused slot"));
}

TEST_CASE_TEMPLATE("bad input: every error path throws twell::Error with the right code", T, bf16, fp16, float) {
  const auto d = random_sparse_dense<T>(6, 40, {.density = 0.3}, fresh_seed());
  const auto csr = to_csr(d);
  CHECK(error_of([&] { (void)to_csr(d, {.threshold = -1.0f}); }).code() == ErrorCode::invalid_argument);
  CHECK(error_of([&] { (void)to_hybrid(csr, {}, {.threshold = std::nanf("")}); }).code() ==
        ErrorCode::invalid_argument);
  // +Inf would drop Inf values, which are always stored.
  CHECK(error_of([&] { (void)to_csr(d, {.threshold = std::numeric_limits<float>::infinity()}); }).code() ==
        ErrorCode::invalid_argument);
  CHECK(error_of([&] { (void)to_twell(csr, TwellLayout{256, 3}); }).code() == ErrorCode::invalid_argument);
  CHECK(error_of([&] { (void)to_hybrid(d, TwellLayout{8, 8}); }).code() == ErrorCode::invalid_argument);
  CHECK(error_of([&] { (void)to_ell(d, {.ell_width = -7}); }).code() == ErrorCode::invalid_argument);

  // A corrupted source is malformed, named by the converter that refused it.
  CsrMatrix<T> broken = to_csr(d);
  broken.col_idx().data()[0] = 1000;
  const Error e = error_of([&] { (void)to_dense(broken); });
  CHECK(e.code() == ErrorCode::malformed);
  CHECK(contains(e.what(), "twell::reference::csr_to_dense"));
  CHECK(contains(e.what(), "col_idx[0] = 1000"));
  const DenseView<const T> negative{d.view().data, 3, 4, 2, MemorySpace::host};
  CHECK(error_of([&] { (void)to_csr(negative); }).code() == ErrorCode::malformed);
  // A source between value boundaries (docs/api.md: every dense-source converter checks it).
  const DenseView<const T> shifted = testing::off_boundary<T>(d.view());
  CHECK(error_of([&] { (void)to_csr(shifted); }).code() == ErrorCode::misaligned);
  CHECK(error_of([&] { (void)to_ell(shifted); }).code() == ErrorCode::misaligned);
  CHECK(error_of([&] { (void)to_twell(shifted); }).code() == ErrorCode::misaligned);
  CHECK(error_of([&] { (void)to_hybrid(shifted); }).code() == ErrorCode::misaligned);
  CHECK(error_of([&] { (void)to_dense(shifted); }).code() == ErrorCode::misaligned);
  TwellMatrix<T> into(d.rows(), d.cols(), TwellLayout{});
  CHECK(error_of([&] { to_twell_into(shifted, into.view()); }).code() == ErrorCode::misaligned);

  // The reference backend reads host memory only.
  DenseView<const T> on_device = d.view();
  on_device.space = MemorySpace::device;
  CHECK(error_of([&] { (void)reference::dense_to_csr<T>(on_device); }).code() == ErrorCode::space_mismatch);
  if (!cuda_available()) {
    CHECK(error_of([&] { (void)to_twell(on_device); }).code() == ErrorCode::no_device);
    CHECK(error_of([&] { (void)to_ell(on_device); }).code() == ErrorCode::no_device);
  }
}

namespace {

// Every slot of a TwELL (both planes), so two results can be compared word for word.
template <class T>
bool same_slots(const TwellMatrix<T>& a, const TwellMatrix<T>& b) {
  if (a.rows() != b.rows() || a.cols() != b.cols() || !(a.layout() == b.layout())) return false;
  return std::memcmp(a.packed().data(), b.packed().data(), a.packed().bytes()) == 0 &&
         std::memcmp(a.value_plane().data(), b.value_plane().data(), a.value_plane().bytes()) == 0;
}

// Every byte of dst set, so a slot the conversion leaves unwritten cannot pass for a zero.
template <class T>
void poison(TwellMatrix<T>& dst) {
  std::memset(dst.packed().data(), 0xff, dst.packed().bytes());
  std::memset(static_cast<void*>(dst.value_plane().data()), 0xff, dst.value_plane().bytes());
}

}  // namespace

TEST_CASE_TEMPLATE("dense_to_twell_into a poisoned destination equals dense_to_twell", T, bf16, fp16, float) {
  const std::vector<std::pair<std::int64_t, std::int64_t>> shapes = {{1, 1}, {3, 257}, {17, 1000}, {40, 5632}};
  for (const TwellLayout layout : {TwellLayout{256, 8}, TwellLayout{128, 16}, TwellLayout{64, 4}}) {
    for (const auto& [rows, cols] : shapes) {
      for (const double density : {0.0, 0.005, 0.05, 0.5, 1.0}) {
        const std::uint64_t seed = fresh_seed();
        CAPTURE(layout.tile);
        CAPTURE(layout.compression);
        CAPTURE(rows);
        CAPTURE(cols);
        CAPTURE(density);
        CAPTURE(seed);
        const auto d = random_sparse_dense<T>(rows, cols, {.density = density, .specials = density == 0.05}, seed);
        TwellMatrix<T> dst(rows, cols, layout);
        for (const OverflowPolicy policy : {OverflowPolicy::error, OverflowPolicy::drop}) {
          poison(dst);
          ConvertReport want_report;
          ConvertReport got_report;
          std::string want_error;
          std::string got_error;
          TwellMatrix<T> want;
          try {
            want = reference::dense_to_twell<T>(d.view(), layout, {.overflow = policy, .report = &want_report});
          } catch (const Error& e) {
            REQUIRE(e.code() == ErrorCode::overflow);
            want_error = e.what();
          }
          try {
            reference::dense_to_twell_into<T>(d.view(), dst.view(), {.overflow = policy, .report = &got_report});
          } catch (const Error& e) {
            REQUIRE(e.code() == ErrorCode::overflow);
            got_error = e.what();
          }
          // Same outcome; the messages differ only in the function named.
          REQUIRE(want_error.empty() == got_error.empty());
          if (!want_error.empty()) {
            CHECK(policy == OverflowPolicy::error);
            CHECK(want_error.substr(want_error.find(": ")) == got_error.substr(got_error.find(": ")));
            continue;
          }
          CHECK(same_slots(dst, want));
          CHECK(find_violation(dst.view()).empty());
          CHECK(got_report.nnz == want_report.nnz);
          CHECK(got_report.dropped == want_report.dropped);
          // The public API dispatches a host pair to the reference.
          poison(dst);
          to_twell_into(d, dst, {.overflow = policy});
          CHECK(same_slots(dst, want));
        }
      }
    }
  }
}

TEST_CASE_TEMPLATE("dense_to_twell_into refuses a destination of the wrong shape, layout, space or policy", T, bf16,
                   fp16, float) {
  const auto d = random_sparse_dense<T>(5, 300, {.density = 0.05}, fresh_seed());
  const TwellLayout layout{128, 8};
  TwellMatrix<T> wrong_rows(4, 300, layout);
  TwellMatrix<T> wrong_cols(5, 299, layout);
  TwellMatrix<T> dst(5, 300, layout);
  CHECK(error_of([&] { reference::dense_to_twell_into<T>(d.view(), wrong_rows.view()); }).code() ==
        ErrorCode::shape_mismatch);
  CHECK(error_of([&] { reference::dense_to_twell_into<T>(d.view(), wrong_cols.view()); }).code() ==
        ErrorCode::shape_mismatch);
  TwellView<T> bad_layout = dst.view();
  bad_layout.layout = TwellLayout{128, 128};  // S = 1
  CHECK(error_of([&] { reference::dense_to_twell_into<T>(d.view(), bad_layout); }).code() ==
        ErrorCode::invalid_argument);
  bad_layout.layout = TwellLayout{100, 4};  // tile not a multiple of 8
  CHECK(error_of([&] { reference::dense_to_twell_into<T>(d.view(), bad_layout); }).code() ==
        ErrorCode::invalid_argument);
  TwellView<T> null_packed = dst.view();
  null_packed.packed = nullptr;
  CHECK(error_of([&] { reference::dense_to_twell_into<T>(d.view(), null_packed); }).code() ==
        ErrorCode::invalid_argument);
  if constexpr (std::is_same_v<T, float>) {
    TwellView<T> null_plane = dst.view();
    null_plane.value_plane = nullptr;
    CHECK(error_of([&] { reference::dense_to_twell_into<T>(d.view(), null_plane); }).code() ==
          ErrorCode::invalid_argument);
  } else {  // 16-bit values live in the slots: a value plane would leave a view validate refuses
    std::vector<T> plane(static_cast<std::size_t>(dst.packed().size()));
    TwellView<T> with_plane = dst.view();
    with_plane.value_plane = plane.data();
    CHECK(contains(error_of([&] { to_twell_into(d.view(), with_plane); }).what(), "dst.value_plane is set"));
    // An empty one too, which validate refuses as well.
    const DenseMatrix<T> none(0, 300);
    TwellMatrix<T> empty(0, 300, layout);
    TwellView<T> empty_with_plane = empty.view();
    empty_with_plane.value_plane = plane.data();
    CHECK(contains(error_of([&] { to_twell_into(none.view(), empty_with_plane); }).what(), "dst.value_plane is set"));
  }
  TwellView<T> device_dst = dst.view();
  device_dst.space = MemorySpace::device;
  CHECK(error_of([&] { reference::dense_to_twell_into<T>(d.view(), device_dst); }).code() ==
        ErrorCode::space_mismatch);
  CHECK(error_of([&] { to_twell_into(d.view(), device_dst); }).code() == ErrorCode::space_mismatch);
  CHECK(error_of([&] {
          reference::dense_to_twell_into<T>(d.view(), dst.view(), {.overflow = OverflowPolicy::hybrid});
        }).code() == ErrorCode::invalid_argument);
  CHECK(error_of([&] { to_twell_into(d.view(), dst.view(), {.overflow = OverflowPolicy::hybrid}); }).code() ==
        ErrorCode::invalid_argument);
}

TEST_CASE_TEMPLATE("dense_to_twell_into refuses a destination whose storage overlaps the source", T, bf16, fp16,
                   float) {
  // One buffer holds the source (4 x 16 values) and the destination planes (4 x 8 words each at
  // (8, 2)), so that an unrefused conversion writes nowhere outside it.
  const TwellLayout layout{8, 2};
  Buffer<std::uint32_t> storage(256);
  auto* base = reinterpret_cast<T*>(storage.data());
  const DenseView<T> src{base, 4, 16, 16, MemorySpace::host};
  for (std::int64_t i = 0; i < 4; ++i)
    for (std::int64_t j = 0; j < 16; j += 5) src.at(i, j) = from_float<T>(static_cast<float>(1 + i + j));
  const TwellMatrix<T> want = reference::dense_to_twell<T>(src, layout);
  const std::size_t src_words = 4 * 16 * sizeof(T) / 4;
  TwellMatrix<T> holder(4, 16, layout);

  auto expect_overlap = [&](TwellView<T> dst, const std::string& plane) {
    for (const Error& e : {error_of([&] { reference::dense_to_twell_into<T>(src, dst); }),
                           error_of([&] { to_twell_into(DenseView<const T>(src), dst); })}) {
      CHECK(e.code() == ErrorCode::invalid_argument);
      CHECK(contains(e.what(), "dst." + plane + " overlaps the source"));
    }
  };
  TwellView<T> packed_on_src = holder.view();
  packed_on_src.packed = storage.data();  // the whole source
  expect_overlap(packed_on_src, "packed");
  packed_on_src.packed = storage.data() + src_words - 1;  // the source's last word only
  expect_overlap(packed_on_src, "packed");
  if constexpr (std::is_same_v<T, float>) {
    TwellView<T> plane_on_src = holder.view();
    plane_on_src.value_plane = base + 8;
    expect_overlap(plane_on_src, "value_plane");
    // The value plane on the destination's own packed words: refused too.
    TwellView<T> plane_on_packed = holder.view();
    plane_on_packed.value_plane = reinterpret_cast<T*>(plane_on_packed.packed);
    for (const Error& e : {error_of([&] { reference::dense_to_twell_into<T>(src, plane_on_packed); }),
                           error_of([&] { to_twell_into(DenseView<const T>(src), plane_on_packed); })}) {
      CHECK(e.code() == ErrorCode::invalid_argument);
      CHECK(contains(e.what(), "dst.value_plane overlaps dst.packed"));
    }
  }
  // Right after the source is not an overlap: the conversion runs and is exact.
  TwellView<T> beside = holder.view();
  beside.packed = storage.data() + src_words;
  if constexpr (std::is_same_v<T, float>) beside.value_plane = reinterpret_cast<T*>(storage.data() + src_words + 32);
  to_twell_into(DenseView<const T>(src), beside);
  CHECK(std::memcmp(beside.packed, want.packed().data(), want.packed().bytes()) == 0);
  if constexpr (std::is_same_v<T, float>)
    CHECK(std::memcmp(beside.value_plane, want.value_plane().data(), want.value_plane().bytes()) == 0);
}

TEST_CASE_TEMPLATE("dense_to_twell_into that throws overflow leaves its destination empty, not half written", T, bf16,
                   fp16, float) {
  // Row 0 fits, row 1 overflows tile 0 (5 nonzeros, capacity 3), row 2 would fit again.
  const TwellLayout layout{8, 2};
  DenseMatrix<T> d(3, 16);
  d.view().at(0, 2) = from_float<T>(1.0f);
  for (std::int64_t j = 0; j < 5; ++j) d.view().at(1, j) = from_float<T>(2.0f);
  d.view().at(2, 9) = from_float<T>(3.0f);
  TwellMatrix<T> dst(3, 16, layout);
  for (int via_public = 0; via_public < 2; ++via_public) {
    CAPTURE(via_public);
    poison(dst);
    const Error e = error_of([&] {
      if (via_public != 0) {
        to_twell_into(d, dst);
      } else {
        reference::dense_to_twell_into<T>(d.view(), dst.view());
      }
    });
    CHECK(e.code() == ErrorCode::overflow);
    CHECK(contains(e.what(), "row 1, tile 0"));
    CHECK(find_violation(dst.view()).empty());
    CHECK(same_slots(dst, TwellMatrix<T>(3, 16, layout)));  // every slot zero: no entry at all
  }
}

TEST_CASE_TEMPLATE("every reference converter refuses an overflow policy outside the enum", T, bf16, fp16, float) {
  // Rows of 12 nonzeros: more than ELL width 2 and than the 3 slots of (8, 2), so that a policy
  // read as drop would lose values.
  const TwellLayout layout{8, 2};
  DenseMatrix<T> d(3, 16);
  for (std::int64_t i = 0; i < 3; ++i)
    for (std::int64_t j = 0; j < 12; ++j) d.view().at(i, j) = from_float<T>(static_cast<float>(1 + j));
  const auto csr = reference::dense_to_csr<T>(d.view());
  const auto ell = reference::dense_to_ell<T>(d.view());
  const auto tw = reference::dense_to_twell<T>(d.view(), TwellLayout{16, 1});
  const auto hy = reference::dense_to_hybrid<T>(d.view(), layout);
  TwellMatrix<T> into(3, 16, layout);
  const ConvertOptions o{.overflow = static_cast<OverflowPolicy>(7), .ell_width = 2};
  const std::vector<std::pair<const char*, std::function<void()>>> calls = {
      {"dense_to_csr", [&] { (void)reference::dense_to_csr<T>(d.view(), o); }},
      {"csr_to_dense", [&] { (void)reference::csr_to_dense<T>(csr.view(), o); }},
      {"dense_to_ell", [&] { (void)reference::dense_to_ell<T>(d.view(), o); }},
      {"ell_to_dense", [&] { (void)reference::ell_to_dense<T>(ell.view(), o); }},
      {"csr_to_ell", [&] { (void)reference::csr_to_ell<T>(csr.view(), o); }},
      {"csr_to_csr", [&] { (void)reference::csr_to_csr<T>(csr.view(), o); }},
      {"ell_to_csr", [&] { (void)reference::ell_to_csr<T>(ell.view(), o); }},
      {"dense_to_twell", [&] { (void)reference::dense_to_twell<T>(d.view(), layout, o); }},
      {"dense_to_twell_into", [&] { reference::dense_to_twell_into<T>(d.view(), into.view(), o); }},
      {"twell_to_dense", [&] { (void)reference::twell_to_dense<T>(tw.view(), o); }},
      {"csr_to_twell", [&] { (void)reference::csr_to_twell<T>(csr.view(), layout, o); }},
      {"twell_to_csr", [&] { (void)reference::twell_to_csr<T>(tw.view(), o); }},
      {"dense_to_hybrid", [&] { (void)reference::dense_to_hybrid<T>(d.view(), layout, o); }},
      {"hybrid_to_dense", [&] { (void)reference::hybrid_to_dense<T>(hy.view(), o); }},
      {"csr_to_hybrid", [&] { (void)reference::csr_to_hybrid<T>(csr.view(), layout, o); }},
      {"hybrid_to_csr", [&] { (void)reference::hybrid_to_csr<T>(hy.view(), o); }},
      {"twell_to_hybrid", [&] { (void)reference::twell_to_hybrid<T>(tw.view(), layout, o); }},
      {"hybrid_to_twell", [&] { (void)reference::hybrid_to_twell<T>(hy.view(), layout, o); }},
  };
  for (const auto& [name, call] : calls) {
    CAPTURE(name);
    const Error e = error_of(call);
    CHECK(e.code() == ErrorCode::invalid_argument);
    CHECK(contains(e.what(), std::string("twell::reference::") + name + ": overflow policy 7 is none of"));
  }
  // The public API too, also for same-format requests and a canonical host dense -> dense copy.
  const ConvertOptions bad_policy{.overflow = static_cast<OverflowPolicy>(7)};
  DenseMatrix<T> canon(2, 8);
  canon.view().at(1, 3) = from_float<T>(1.0f);
  const auto canon_csr = to_csr(canon);
  const auto canon_hy = to_hybrid(canon, layout);
  CHECK(error_of([&] { (void)to_dense(canon, bad_policy); }).code() == ErrorCode::invalid_argument);
  CHECK(error_of([&] { (void)to_csr(canon_csr, bad_policy); }).code() == ErrorCode::invalid_argument);
  CHECK(error_of([&] { (void)to_hybrid(canon_hy, layout, bad_policy); }).code() == ErrorCode::invalid_argument);
}
