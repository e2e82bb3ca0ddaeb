// Reference kernels against plain fp64 dense loops written here (no Eigen, no kernel code reused):
// spmm, sddmm, transpose, elementwise, reductions and gemm_to_sparse, for every format and dtype.
#include <doctest/doctest.h>

#include <cmath>
#include <cstring>
#include <functional>
#include <limits>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include <twell/convert.hpp>
#include <twell/converters/backends.hpp>
#include <twell/formats/validate.hpp>
#include <twell/kernels/backends.hpp>
#include <twell/ops.hpp>

#include "checks.hpp"
#include "fixtures.hpp"
#include "fp64.hpp"
#include "random.hpp"
#include "shapes.hpp"

using namespace twell;
namespace ref = twell::reference;

namespace {

constexpr double kDensities[] = {0.0, 0.005, 0.05, 0.5, 1.0};
// (alpha, beta) pairs; beta = 0 runs on NaN-poisoned outputs.
constexpr std::pair<float, float> kSpmmScales[] = {{1.0f, 0.0f}, {-0.5f, 0.0f}, {1.5f, -2.0f}};
constexpr std::pair<float, float> kSddmmScales[] = {{1.0f, 0.0f}, {0.75f, -1.5f}};

// Relative precision of one rounding into T, with room for fp32 accumulation.
template <class T>
double eps() {
  if constexpr (std::is_same_v<T, bf16>) return 1.0 / 128;
  if constexpr (std::is_same_v<T, fp16>) return 1.0 / 1024;
  return 1e-5;
}

// Absolute rounding error near zero: fp16 subnormals are spaced 2^-24 apart.
template <class T>
double tiny() {
  return std::is_same_v<T, fp16> ? 6e-8 : 1e-30;
}

using testing::act64;
using testing::Matrix64;
using testing::Shape;
using testing::to64;

// Stored iff nonzero: -0.0 is not, NaN is.
bool stored64(double v) { return !(std::fabs(v) <= 0.0); }

// got vs want with an absolute bound; NaN must meet NaN and Inf the same Inf.
bool close(double got, double want, double bound) {
  if (std::isnan(want)) return std::isnan(got);
  if (std::isinf(want)) return got == want;
  return std::fabs(got - want) <= bound;
}

// Every format built from one dense matrix by the reference converters. TwELL takes a narrow
// layout (tile 16, C 4: 3 entries per tile) when nothing overflows and otherwise one tile wider
// than the matrix with C = 1, which holds every row; Hybrid always takes the narrow layout, so
// its overflow block is exercised at moderate densities.
template <class T>
struct AllFormats {
  CsrMatrix<T> csr;
  EllMatrix<T> ell;
  TwellMatrix<T> twell;
  HybridMatrix<T> hybrid;
};

constexpr TwellLayout kNarrow{16, 4};

TwellLayout wide_layout(std::int64_t cols) { return TwellLayout{static_cast<std::int32_t>((cols / 8 + 1) * 8), 1}; }

template <class T>
TwellMatrix<T> to_twell(DenseView<const T> d) {
  try {
    return ref::dense_to_twell<T>(d, kNarrow);
  } catch (const Error& e) {
    REQUIRE(e.code() == ErrorCode::overflow);
    return ref::dense_to_twell<T>(d, wide_layout(d.cols));
  }
}

template <class T>
AllFormats<T> all_formats(DenseView<const T> d) {
  return {ref::dense_to_csr<T>(d), ref::dense_to_ell<T>(d), to_twell<T>(d), ref::dense_to_hybrid<T>(d, kNarrow)};
}

// Calls f(name, const view) for each format.
template <class T, class F>
void each(const AllFormats<T>& m, F&& f) {
  f("csr", m.csr.view());
  f("ell", m.ell.view());
  f("twell", m.twell.view());
  f("hybrid", m.hybrid.view());
}

template <class T>
void fill_nan(DenseView<T> c) {
  for (std::int64_t i = 0; i < c.rows; ++i)
    for (std::int64_t j = 0; j < c.cols; ++j) c.at(i, j) = from_float<T>(std::numeric_limits<float>::quiet_NaN());
}

std::vector<Shape> shapes() {
  const std::vector<Shape> fixed = {{1, 1, 1}, {3, 5, 2}, {17, 33, 7}, {64, 100, 19}, {40, 16, 3}, {130, 520, 9}};
  return testing::with_random_shapes(fixed, 70, 1);
}

// Calls body(s, d, seed) for every shape and density with a fresh s.m x s.n sparse matrix d
// (NaN, Inf and -0.0 included); seed, shape and density are captured for failure messages.
template <class T, class Body>
void for_each_sparse_input(Body&& body) {
  for (const Shape& s : shapes()) {
    for (const double density : kDensities) {
      const std::uint64_t seed = testing::fresh_seed();
      CAPTURE(seed);
      CAPTURE(s);
      CAPTURE(density);
      const testing::SparseDenseOptions so{.density = density, .specials = true};
      body(s, testing::random_sparse_dense<T>(s.m, s.n, so, seed), seed);
    }
  }
}

}  // namespace

TEST_CASE_TEMPLATE("spmm matches fp64 for every format, op, alpha and beta", T, bf16, fp16, float) {
  for (const Shape& s : shapes()) {
    for (const double density : kDensities) {
      for (const bool specials : {false, true}) {
        for (const Op op : {Op::none, Op::transpose}) {
          const std::uint64_t seed = testing::fresh_seed();
          CAPTURE(seed);
          CAPTURE(s);
          CAPTURE(density);
          CAPTURE(specials);
          const bool tr = op == Op::transpose;
          const testing::SparseDenseOptions so{.density = density, .specials = specials};
          const auto a_dense = testing::random_sparse_dense<T>(tr ? s.k : s.m, tr ? s.m : s.k, so, seed);
          const auto b = testing::random_dense<T>(s.k, s.n, 1.0f, seed + 1);
          const auto c0 = testing::random_dense<T>(s.m, s.n, 1.0f, seed + 2);
          const Matrix64 a64 = to64<T>(a_dense.view()), b64 = to64<T>(b.view()), c64 = to64<T>(c0.view());
          const AllFormats<T> formats = all_formats<T>(a_dense.view());
          for (const auto& [alpha_, beta_] : kSpmmScales) {
            const float alpha = alpha_, beta = beta_;
            each(formats, [&](const char* name, auto a) {
              const std::string format = name;
              CAPTURE(format);
              CAPTURE(alpha);
              CAPTURE(beta);
              DenseMatrix<T> c(s.m, s.n);
              if (beta == 0.0f) {
                fill_nan(c.view());
              } else {
                std::memcpy(c.values().data(), c0.values().data(), c0.values().bytes());
              }
              ref::spmm<T>(op, a, b.view(), c.view(), alpha, beta);
              int bad = 0;
              for (std::int64_t i = 0; i < s.m; ++i)
                for (std::int64_t j = 0; j < s.n; ++j) {
                  double sum = 0.0, mag = 0.0;
                  for (std::int64_t p = 0; p < s.k; ++p) {
                    const double av = tr ? a64(p, i) : a64(i, p);
                    if (!stored64(av)) continue;
                    sum += av * b64(p, j);
                    mag += std::fabs(av * b64(p, j));
                  }
                  double want = alpha * sum;
                  mag = std::fabs(alpha) * mag;
                  if (beta != 0.0f) {
                    want += beta * c64(i, j);
                    mag += std::fabs(beta * c64(i, j));
                  }
                  const double got = to_float(c.view().at(i, j));
                  if (!close(got, want, eps<T>() * mag + tiny<T>())) ++bad;
                }
              CHECK(bad == 0);
            });
          }
        }
      }
    }
  }
}

TEST_CASE_TEMPLATE("sddmm samples A op(B) at the pattern, with and without beta", T, bf16, fp16, float) {
  testing::for_each_product_case(shapes(), kDensities, [&](const Shape& s, double density, Op op, std::uint64_t seed) {
    const bool tr = op == Op::transpose;
    const testing::SparseDenseOptions so{.density = density};
    const auto p_dense = testing::random_sparse_dense<T>(s.m, s.n, so, seed);
    const auto a = testing::random_dense<T>(s.m, s.k, 1.0f, seed + 1);
    const auto b = testing::random_dense<T>(tr ? s.n : s.k, tr ? s.k : s.n, 1.0f, seed + 2);
    const Matrix64 p64 = to64<T>(p_dense.view()), a64 = to64<T>(a.view()), b64 = to64<T>(b.view());
    const AllFormats<T> patterns = all_formats<T>(p_dense.view());
    for (const auto& [alpha_, beta_] : kSddmmScales) {
      const float alpha = alpha_, beta = beta_;
      // out starts as a second copy of the pattern: same structure in separate arrays.
      AllFormats<T> outs = all_formats<T>(p_dense.view());
      if (beta == 0.0f) {  // poison what the kernel must overwrite whole
        for (auto& w : outs.twell.packed().host_span()) w = 0xdeadbeefu;
        for (auto& v : outs.twell.value_plane().host_span()) v = from_float<T>(NAN);
        for (auto& w : outs.hybrid.twell().packed().host_span()) w = 0xdeadbeefu;
        for (auto& v : outs.hybrid.overflow().values().host_span()) v = from_float<T>(NAN);
        for (auto& v : outs.csr.values().host_span()) v = from_float<T>(NAN);
        for (std::int64_t i = 0; i < s.m; ++i)  // ELL padding must stay zero: poison stored slots only
          for (std::int64_t k = 0; k < outs.ell.row_count().data()[i]; ++k)
            outs.ell.values().data()[i * outs.ell.width() + k] = from_float<T>(NAN);
      }
      auto check = [&](const char* name, auto out_view) {
        const std::string format = name;
        CAPTURE(format);
        CAPTURE(alpha);
        CAPTURE(beta);
        const auto got = to_dense(out_view);
        int bad = 0;
        for (std::int64_t i = 0; i < s.m; ++i)
          for (std::int64_t j = 0; j < s.n; ++j) {
            const double g = to_float(got.view().at(i, j));
            if (!stored64(p64(i, j))) {
              if (g != 0.0) ++bad;
              continue;
            }
            double dot = 0.0, mag = 0.0;
            for (std::int64_t p = 0; p < s.k; ++p) {
              const double x = a64(i, p) * (tr ? b64(j, p) : b64(p, j));
              dot += x;
              mag += std::fabs(x);
            }
            const double want = alpha * dot + beta * p64(i, j);
            mag = std::fabs(alpha) * mag + std::fabs(beta * p64(i, j));
            if (!close(g, want, eps<T>() * mag + tiny<T>())) ++bad;
          }
        CHECK(bad == 0);
      };
      ref::sddmm<T>(a.view(), op, b.view(), patterns.csr.view(), outs.csr.view(), alpha, beta);
      check("csr", std::as_const(outs.csr).view());
      ref::sddmm<T>(a.view(), op, b.view(), patterns.ell.view(), outs.ell.view(), alpha, beta);
      check("ell", std::as_const(outs.ell).view());
      ref::sddmm<T>(a.view(), op, b.view(), patterns.twell.view(), outs.twell.view(), alpha, beta);
      check("twell", std::as_const(outs.twell).view());
      ref::sddmm<T>(a.view(), op, b.view(), patterns.hybrid.view(), outs.hybrid.view(), alpha, beta);
      check("hybrid", std::as_const(outs.hybrid).view());
      // The structure of the pattern survives, including shadow slots and maps.
      CHECK(std::equal(outs.hybrid.row_to_overflow().data(), outs.hybrid.row_to_overflow().data() + s.m,
                       patterns.hybrid.row_to_overflow().data()));
      if constexpr (ValueTraits<T>::packs_in_slot) {
        const auto& pw = patterns.hybrid.twell().packed();
        const auto& ow = outs.hybrid.twell().packed();
        int diff = 0;
        for (std::size_t w = 0; w < pw.size(); ++w)
          diff += (pw.data()[w] & 0xffffu) != (ow.data()[w] & 0xffffu) ? 1 : 0;
        CHECK(diff == 0);
      } else {
        CHECK(std::memcmp(outs.hybrid.twell().packed().data(), patterns.hybrid.twell().packed().data(),
                          patterns.hybrid.twell().packed().bytes()) == 0);
      }
    }
    // out aliasing the pattern (in place).
    AllFormats<T> inplace = all_formats<T>(p_dense.view());
    const auto h = inplace.hybrid.view();
    ref::sddmm<T>(a.view(), op, b.view(), h, h, 1.0f, 0.0f);
    const auto via_alias = ref::hybrid_to_dense<T>(std::as_const(inplace.hybrid).view());
    HybridMatrix<T> fresh(s.m, s.n, kNarrow, patterns.hybrid.overflow_rows());
    ref::sddmm<T>(a.view(), op, b.view(), patterns.hybrid.view(), fresh.view(), 1.0f, 0.0f);
    CHECK(testing::bitwise_equal<T>(via_alias.view(), ref::hybrid_to_dense<T>(std::as_const(fresh).view()).view()));
  });
}

namespace {

// A dense matrix with -0.0 written as +0.0, the form every sparse round trip gives back.
template <class T>
DenseMatrix<T> canonical(DenseView<const T> d, bool transposed) {
  DenseMatrix<T> out(transposed ? d.cols : d.rows, transposed ? d.rows : d.cols);
  for (std::int64_t i = 0; i < d.rows; ++i)
    for (std::int64_t j = 0; j < d.cols; ++j) {
      const T v = d.at(i, j);
      (transposed ? out.view().at(j, i) : out.view().at(i, j)) = is_stored(v) ? v : T{};
    }
  return out;
}

}  // namespace

TEST_CASE("an fp32 TwELL slot word whose high bits are set is a bad column, not its low 16 bits") {
  // validate rejects the word 0x10001 in a tile of 8 columns; the kernels once read it as column 1.
  TwellMatrix<float> a(1, 8, TwellLayout{8, 2});
  a.packed().host_span()[0] = 1;
  a.packed().host_span()[1] = 0x10001u;
  a.value_plane().host_span()[1] = 5.0f;
  const DenseMatrix<float> b = testing::random_dense<float>(8, 4, 1.0f, testing::fresh_seed());
  DenseMatrix<float> c(1, 4);
  using testing::code_of;
  CHECK(code_of([&] { ref::spmm<float>(Op::none, std::as_const(a).view(), b.view(), c.view(), 1.0f, 0.0f); }) ==
        ErrorCode::malformed);
  CHECK(code_of([&] { (void)ref::transpose<float>(std::as_const(a).view(), TwellLayout{8, 2}); }) ==
        ErrorCode::malformed);
  CHECK(code_of([&] { (void)ref::l1_norm<float>(std::as_const(a).view()); }) == ErrorCode::malformed);
  a.packed().host_span()[1] = 1;  // the same entry, well formed
  CHECK_NOTHROW(ref::spmm<float>(Op::none, std::as_const(a).view(), b.view(), c.view(), 1.0f, 0.0f));
}

// A pattern found malformed part-way (a column out of range in its second row) must leave out,
// which shares its index arrays and may alias it, as it was: the CSR and ELL writers once
// stored the first row's values before the throw.
TEST_CASE("sddmm and multiply_on_pattern on a malformed CSR or ELL pattern leave out untouched") {
  std::int64_t row_ptr[] = {0, 1, 2};
  std::int32_t col_idx[] = {0, 7};  // 7 is outside [0, 4)
  const float ones[] = {1.0f, 1.0f};
  const CsrView<const float> pattern{2, 4, 2, row_ptr, col_idx, ones};
  std::int32_t counts[] = {1, 1};
  const EllView<const float> ell_pattern{2, 4, 1, counts, col_idx, ones};
  const DenseMatrix<float> a = testing::random_dense<float>(2, 3, 1.0f, testing::fresh_seed());
  const DenseMatrix<float> b = testing::random_dense<float>(3, 4, 1.0f, testing::fresh_seed());
  std::vector<float> out(2, -1.0f);
  const CsrView<float> csr_out{2, 4, 2, row_ptr, col_idx, out.data()};
  const EllView<float> ell_out{2, 4, 1, counts, col_idx, out.data()};
  using testing::code_of;
  CHECK(code_of([&] { sddmm<float>(a.view(), Op::none, b.view(), pattern, csr_out); }) == ErrorCode::malformed);
  CHECK(out == std::vector<float>{-1.0f, -1.0f});
  CHECK(code_of([&] { multiply_on_pattern<float>(pattern, pattern, csr_out); }) == ErrorCode::malformed);
  CHECK(out == std::vector<float>{-1.0f, -1.0f});
  CHECK(code_of([&] { sddmm<float>(a.view(), Op::none, b.view(), ell_pattern, ell_out); }) == ErrorCode::malformed);
  CHECK(out == std::vector<float>{-1.0f, -1.0f});
  CHECK(code_of([&] { multiply_on_pattern<float>(ell_pattern, ell_pattern, ell_out); }) == ErrorCode::malformed);
  CHECK(out == std::vector<float>{-1.0f, -1.0f});
}

// The GPU kernels read A and B while they write out; both backends refuse out's values on either,
// in every format (a Hybrid's overflow block too).
TEST_CASE_TEMPLATE("sddmm refuses an out whose values overlap A or B", T, bf16, float) {
  const auto dense =
      testing::random_sparse_dense<T>(6, 40, {.density = 0.2, .full_row_share = 0.5}, testing::fresh_seed());
  const auto a = testing::random_dense<T>(6, 5, 1.0f, testing::fresh_seed());
  const auto b = testing::random_dense<T>(5, 40, 1.0f, testing::fresh_seed());
  // A or B as a view that starts on the first bytes an out writes.
  const auto on = [](const T* p, std::int64_t rows, std::int64_t cols) {
    return DenseView<const T>{p, rows, cols, cols, MemorySpace::host};
  };
  const auto refused = [&](auto out, DenseView<const T> a_view, DenseView<const T> b_view) {
    return testing::message_of([&] { sddmm<T>(a_view, Op::none, b_view, out, out); }).find("out overlaps A or B") !=
           std::string::npos;
  };
  auto csr = to_csr(dense);
  CHECK(refused(csr.view(), on(csr.values().data(), 6, 5), b.view()));
  CHECK(refused(csr.view(), a.view(), on(csr.values().data(), 5, 40)));
  auto ell = to_ell(dense);
  CHECK(refused(ell.view(), on(ell.values().data(), 6, 5), b.view()));
  auto tw = to_twell(dense, TwellLayout{64, 1});
  CHECK(refused(tw.view(), on(reinterpret_cast<const T*>(tw.packed().data()), 6, 5), b.view()));
  if constexpr (!ValueTraits<T>::packs_in_slot) CHECK(refused(tw.view(), on(tw.value_plane().data(), 6, 5), b.view()));
  auto hy = to_hybrid(dense, TwellLayout{8, 2});
  REQUIRE(hy.overflow_rows() > 0);
  CHECK(refused(hy.view(), on(hy.overflow().values().data(), 6, 5), b.view()));
  CHECK_NOTHROW(sddmm<T>(a.view(), Op::none, b.view(), csr.view(), csr.view()));  // apart: it runs
}

// A view whose span passes the address space covers everything above its start: its byte range
// once wrapped to a few bytes, and a transpose went ahead over its own input.
TEST_CASE("an output whose span passes the address space overlaps what lies above it") {
  std::vector<float> memory(72, 1.0f);
  const DenseView<const float> a{memory.data() + 64, 2, 2, 2, MemorySpace::host};
  const DenseView<float> out{memory.data(), 2, 2, std::int64_t{1} << 62, MemorySpace::host};  // row 1 at +2^64 bytes
  CHECK(testing::message_of([&] { transpose<float>(a, out); }).find("out overlaps a") != std::string::npos);
}

TEST_CASE("transpose refuses A with more rows than its transpose's 32-bit column indices hold") {
  // Refused from the shape alone, before A's arrays are read: they once wrapped to negative columns.
  const CsrView<const float> tall{std::int64_t{1} << 31, 4, 0, nullptr, nullptr, nullptr};
  try {
    (void)ref::transpose<float>(tall);
    FAIL("accepted");
  } catch (const Error& e) {
    CHECK(e.code() == ErrorCode::unsupported);
    CHECK(std::string(e.what()).find("32-bit") != std::string::npos);
  }
}

TEST_CASE_TEMPLATE("transpose matches the dense transpose and twice is the identity", T, bf16, fp16, float) {
  for_each_sparse_input<T>([&](const Shape&, const DenseMatrix<T>& d, std::uint64_t) {
    const auto want_t = canonical<T>(d.view(), true);
    const auto want = canonical<T>(d.view(), false);
    const AllFormats<T> f = all_formats<T>(d.view());

    const auto csr_t = ref::transpose<T>(f.csr.view());
    CHECK(testing::bitwise_equal<T>(to_dense(csr_t.view()).view(), want_t.view()));
    CHECK(testing::bitwise_equal<T>(to_dense(ref::transpose<T>(csr_t.view()).view()).view(), want.view()));

    const auto ell_t = ref::transpose<T>(f.ell.view());
    CHECK(testing::bitwise_equal<T>(to_dense(ell_t.view()).view(), want_t.view()));
    CHECK(testing::bitwise_equal<T>(to_dense(ref::transpose<T>(ell_t.view()).view()).view(), want.view()));

    for (const TwellLayout layout : {kNarrow, TwellLayout{}, TwellLayout{8, 2}}) {
      const auto tw_t = ref::transpose<T>(f.twell.view(), layout);
      CHECK(tw_t.layout() == layout);
      CHECK(testing::bitwise_equal<T>(to_dense(tw_t.view()).view(), want_t.view()));
      const auto hy_t = ref::transpose<T>(f.hybrid.view(), layout);
      CHECK(testing::bitwise_equal<T>(to_dense(hy_t.view()).view(), want_t.view()));
      const auto hy_tt = ref::transpose<T>(hy_t.view(), kNarrow);
      CHECK(testing::bitwise_equal<T>(to_dense(hy_tt.view()).view(), want.view()));
    }
  });
}

TEST_CASE_TEMPLATE("multiply_on_pattern, add_scaled_sign, l1_norm and l0_norm", T, bf16, fp16, float) {
  for_each_sparse_input<T>([&](const Shape& s, const DenseMatrix<T>& xd, std::uint64_t seed) {
    // y: fresh nonzero values on x's stored entries, so both share one structure.
    auto yd = testing::random_dense<T>(s.m, s.n, 2.0f, seed + 1);
    for (std::int64_t i = 0; i < s.m; ++i)
      for (std::int64_t j = 0; j < s.n; ++j) {
        T& v = yd.view().at(i, j);
        if (!is_stored(xd.view().at(i, j))) {
          v = T{};
        } else if (!is_stored(v)) {
          v = from_float<T>(0.5f);
        }
      }
    const Matrix64 x64 = to64<T>(xd.view()), y64 = to64<T>(yd.view());
    const AllFormats<T> xs = all_formats<T>(xd.view()), ys = all_formats<T>(yd.view());

    double want_l1 = 0.0;
    std::int64_t want_l0 = 0;
    for (const double v : x64.v)
      if (stored64(v)) {
        want_l1 += std::fabs(v);
        want_l0 += v != 0.0 ? 1 : 0;
      }
    each(xs, [&](const char* name, auto x) {
      const std::string format = name;
      CAPTURE(format);
      const double l1 = ref::l1_norm<T>(x);
      if (std::isnan(want_l1)) {
        CHECK(std::isnan(l1));
      } else if (std::isinf(want_l1)) {
        CHECK(l1 == want_l1);
      } else {
        CHECK(l1 == doctest::Approx(want_l1).epsilon(1e-12));
      }
      CHECK(ref::l0_norm<T>(x) == want_l0);
    });

    // Compare a result in the structure of x against f(x, y) in fp64 on x's stored entries; `slack`
    // adds slack * |x| to the bound where the kernel evaluates a factor of x in fp32 with
    // cancellation (act' near its zeros).
    auto check = [&](const char* name, const DenseMatrix<T>& got, auto&& f, double slack = 0.0) {
      const std::string format = name;
      CAPTURE(format);
      int bad = 0;
      for (std::int64_t i = 0; i < s.m; ++i)
        for (std::int64_t j = 0; j < s.n; ++j) {
          const double g = to_float(got.view().at(i, j));
          const double want = stored64(x64(i, j)) ? f(x64(i, j), y64(i, j)) : 0.0;
          if (!close(g, want, eps<T>() * std::fabs(want) + slack * std::fabs(x64(i, j)) + tiny<T>())) ++bad;
        }
      CHECK(bad == 0);
    };
    const auto product = [](double x, double y) { return x * y; };
    for (const float sc : {0.25f, -0.125f}) {
      CAPTURE(sc);
      const auto with_sign = [sc](double x, double) {
        return std::isnan(x) ? x : x + sc * (x > 0 ? 1.0 : (x < 0 ? -1.0 : 0.0));
      };
      AllFormats<T> outs = all_formats<T>(xd.view());
      ref::add_scaled_sign<T>(xs.csr.view(), sc, outs.csr.view());
      check("csr", to_dense(std::as_const(outs.csr).view()), with_sign);
      ref::add_scaled_sign<T>(xs.ell.view(), sc, outs.ell.view());
      check("ell", to_dense(std::as_const(outs.ell).view()), with_sign);
      ref::add_scaled_sign<T>(xs.twell.view(), sc, outs.twell.view());
      check("twell", to_dense(std::as_const(outs.twell).view()), with_sign);
      ref::add_scaled_sign<T>(xs.hybrid.view(), sc, outs.hybrid.view());
      check("hybrid", to_dense(std::as_const(outs.hybrid).view()), with_sign);

      // The two-operand form: x + sc * sign(y), y on x's structure.
      const auto with_sign_of_y = [sc](double x, double y) {
        return x + sc * (std::isnan(y) ? y : (y > 0 ? 1.0 : (y < 0 ? -1.0 : 0.0)));
      };
      ref::add_scaled_sign<T>(xs.csr.view(), sc, ys.csr.view(), outs.csr.view());
      check("csr, sign of y", to_dense(std::as_const(outs.csr).view()), with_sign_of_y);
      ref::add_scaled_sign<T>(xs.ell.view(), sc, ys.ell.view(), outs.ell.view());
      check("ell, sign of y", to_dense(std::as_const(outs.ell).view()), with_sign_of_y);
      ref::add_scaled_sign<T>(xs.twell.view(), sc, ys.twell.view(), outs.twell.view());
      check("twell, sign of y", to_dense(std::as_const(outs.twell).view()), with_sign_of_y);
      ref::add_scaled_sign<T>(xs.hybrid.view(), sc, ys.hybrid.view(), outs.hybrid.view());
      check("hybrid, sign of y", to_dense(std::as_const(outs.hybrid).view()), with_sign_of_y);
    }
    for (const Activation act : {Activation::relu, Activation::silu, Activation::gelu}) {
      CAPTURE(static_cast<int>(act));
      // x * act'(y), the derivative in fp64.
      const auto times_derivative = [act](double x, double g) {
        double d = g > 0 ? 1.0 : 0.0;
        if (act == Activation::silu) {
          const double sg = 1.0 / (1.0 + std::exp(-g));
          d = sg * (1.0 + g * (1.0 - sg));
        } else if (act == Activation::gelu) {
          d = 0.5 * (1.0 + std::erf(g / std::sqrt(2.0))) + g * std::exp(-0.5 * g * g) / std::sqrt(2.0 * M_PI);
        }
        return x * d;
      };
      AllFormats<T> outs = all_formats<T>(xd.view());
      ref::multiply_by_activation_derivative<T>(xs.csr.view(), ys.csr.view(), act, outs.csr.view());
      check("csr, act'", to_dense(std::as_const(outs.csr).view()), times_derivative, 1e-6);
      ref::multiply_by_activation_derivative<T>(xs.ell.view(), ys.ell.view(), act, outs.ell.view());
      check("ell, act'", to_dense(std::as_const(outs.ell).view()), times_derivative, 1e-6);
      ref::multiply_by_activation_derivative<T>(xs.twell.view(), ys.twell.view(), act, outs.twell.view());
      check("twell, act'", to_dense(std::as_const(outs.twell).view()), times_derivative, 1e-6);
      ref::multiply_by_activation_derivative<T>(xs.hybrid.view(), ys.hybrid.view(), act, outs.hybrid.view());
      check("hybrid, act'", to_dense(std::as_const(outs.hybrid).view()), times_derivative, 1e-6);
    }
    {
      AllFormats<T> outs = all_formats<T>(xd.view());
      for (auto& w : outs.twell.packed().host_span()) w = 0xdeadbeefu;
      for (auto& v : outs.hybrid.overflow().values().host_span()) v = from_float<T>(NAN);
      ref::multiply_on_pattern<T>(xs.csr.view(), ys.csr.view(), outs.csr.view());
      check("csr", to_dense(std::as_const(outs.csr).view()), product);
      ref::multiply_on_pattern<T>(xs.ell.view(), ys.ell.view(), outs.ell.view());
      check("ell", to_dense(std::as_const(outs.ell).view()), product);
      ref::multiply_on_pattern<T>(xs.twell.view(), ys.twell.view(), outs.twell.view());
      check("twell", to_dense(std::as_const(outs.twell).view()), product);
      ref::multiply_on_pattern<T>(xs.hybrid.view(), ys.hybrid.view(), outs.hybrid.view());
      check("hybrid", to_dense(std::as_const(outs.hybrid).view()), product);
    }
    {  // in place: out aliases x
      AllFormats<T> inplace = all_formats<T>(xd.view());
      const auto h = inplace.hybrid.view();
      ref::multiply_on_pattern<T>(h, ys.hybrid.view(), h);
      check("hybrid in place", to_dense(std::as_const(inplace.hybrid).view()), product);
      const auto c = inplace.csr.view();
      ref::multiply_on_pattern<T>(c, ys.csr.view(), c);
      check("csr in place", to_dense(std::as_const(inplace.csr).view()), product);
    }
  });
}

TEST_CASE_TEMPLATE("add_scaled_sign(x, s, y): where x is exactly zero in a Hybrid's dense rows, y's sign still counts",
                   T, bf16, float) {
  // A gradient x sampled on y's pattern that came out exactly zero (rows of A all zero, as dh for a
  // token outside the loss): in TwELL slots the zero stays in the structure; a dense overflow row
  // cannot store it, so the kernel must visit y's entries too.
  const std::uint64_t seed = testing::fresh_seed();
  CAPTURE(seed);
  const std::int64_t m = 40, n = 96;
  const auto s = testing::zero_row_sample<T>(m, n, 8, seed);
  bool zero_overflow_row = false;
  for (std::int64_t i = 0; i < m; i += 2)
    zero_overflow_row = zero_overflow_row || s.y.row_to_overflow().host_span()[static_cast<std::size_t>(i)] >= 0;
  REQUIRE(zero_overflow_row);
  const float sc = 0.5f;
  HybridMatrix<T> out(m, n, s.y.layout(), s.y.overflow_rows());
  ref::add_scaled_sign<T>(s.x.view(), sc, s.y.view(), out.view());
  const auto got = ref::hybrid_to_dense<T>(std::as_const(out).view());
  const auto xd = ref::hybrid_to_dense<T>(s.x.view());
  int bad = 0;
  for (std::int64_t i = 0; i < m; ++i)
    for (std::int64_t j = 0; j < n; ++j) {
      const float yv = to_float(s.yd.view().at(i, j));
      const float want = is_stored(s.yd.view().at(i, j))
                             ? to_float(from_float<T>(to_float(xd.view().at(i, j)) + sc * (yv > 0 ? 1.0f : -1.0f)))
                             : 0.0f;
      if (to_float(got.view().at(i, j)) != want) ++bad;
    }
  CHECK(bad == 0);
}

TEST_CASE_TEMPLATE("Hybrid results stay valid when their pattern holds exact zeros in overflow rows", T, bf16,
                   float) {
  // Operations on the pattern of x (zero_row_sample: exact zeros in its structure) visit those
  // places in the shadow slots but not in the dense rows; the shadow must still equal the dense
  // row (validate), for a second sddmm (nonzero values there) and for a product with Inf there
  // (0 * Inf = NaN).
  const std::uint64_t seed = testing::fresh_seed();
  CAPTURE(seed);
  const std::int64_t m = 40, n = 96, k = 8;
  const auto s = testing::zero_row_sample<T>(m, n, k, seed);
  const ValidateOptions zeros_allowed{.allow_explicit_zeros = true};
  REQUIRE(find_violation(s.x.view(), zeros_allowed) == "");

  HybridMatrix<T> resampled(m, n, s.y.layout(), s.y.overflow_rows());
  ref::sddmm<T>(s.resample_a.view(), Op::none, s.b.view(), s.x.view(), resampled.view(), 1.0f, 0.0f);
  CHECK(find_violation(std::as_const(resampled).view(), zeros_allowed) == "");

  HybridMatrix<T> product(m, n, s.y.layout(), s.y.overflow_rows());
  ref::multiply_on_pattern<T>(s.x.view(), s.infinite.view(), product.view());
  CHECK(find_violation(std::as_const(product).view(), zeros_allowed) == "");
}

namespace {

// Inputs whose products are exact in fp32: multiples of 1/2 in [-1.5, 1.5], so act(X W) never
// sits within rounding of the threshold.
template <class T>
DenseMatrix<T> halves(std::int64_t rows, std::int64_t cols, std::uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::uniform_int_distribution<int> q(-3, 3);
  DenseMatrix<T> m(rows, cols);
  for (std::int64_t i = 0; i < rows; ++i)
    for (std::int64_t j = 0; j < cols; ++j) m.view().at(i, j) = from_float<T>(0.5f * static_cast<float>(q(rng)));
  return m;
}

}  // namespace

TEST_CASE_TEMPLATE("gemm_to_sparse stores exactly the dense reference's nonzeros", T, bf16, fp16, float) {
  const ActivationSpec acts[] = {
      {Activation::relu, 0.0f}, {Activation::relu, 1.0f}, {Activation::silu, 0.3f}, {Activation::gelu, 0.3f}};
  for (const Shape& s : shapes()) {
    for (const ActivationSpec& act : acts) {
      const std::uint64_t seed = testing::fresh_seed();
      CAPTURE(seed);
      CAPTURE(s);
      CAPTURE(static_cast<int>(act.kind));
      CAPTURE(act.threshold);
      const auto x = halves<T>(s.m, s.k, seed);
      const auto w = halves<T>(s.k, s.n, seed + 1);
      const Matrix64 x64 = to64<T>(x.view()), w64 = to64<T>(w.view());
      Matrix64 want(s.m, s.n);
      for (std::int64_t i = 0; i < s.m; ++i)
        for (std::int64_t j = 0; j < s.n; ++j) {
          double dot = 0.0;
          for (std::int64_t p = 0; p < s.k; ++p) dot += x64(i, p) * w64(p, j);
          const double a = act64(act.kind, dot);
          want(i, j) = std::fabs(a) <= act.threshold ? 0.0 : a;
        }
      // Counts per (row, tile) of the narrow layout decide which rows overflow.
      std::int64_t overflow_rows = 0, surplus = 0, nnz = 0;
      for (std::int64_t i = 0; i < s.m; ++i) {
        bool overflows = false;
        for (std::int64_t t = 0; t < kNarrow.tiles(s.n); ++t) {
          std::int64_t count = 0;
          for (std::int64_t j = t * kNarrow.tile; j < std::min<std::int64_t>(s.n, (t + 1) * kNarrow.tile); ++j)
            count += want(i, j) != 0.0 ? 1 : 0;
          nnz += count;
          overflows = overflows || count > kNarrow.capacity();
          surplus += std::max<std::int64_t>(0, count - kNarrow.capacity());
        }
        overflow_rows += overflows ? 1 : 0;
      }
      auto check_values = [&](const HybridMatrix<T>& got, bool subset) {
        const auto d = ref::hybrid_to_dense<T>(got.view());
        int bad = 0;
        for (std::int64_t i = 0; i < s.m; ++i)
          for (std::int64_t j = 0; j < s.n; ++j) {
            const double g = to_float(d.view().at(i, j));
            if (subset && g == 0.0) continue;
            if (want(i, j) == 0.0 ? g != 0.0 : !close(g, want(i, j), eps<T>() * std::fabs(want(i, j)))) ++bad;
          }
        CHECK(bad == 0);
      };

      ConvertReport report;
      ConvertOptions hybrid = hybrid_overflow();
      hybrid.report = &report;
      const auto h = ref::gemm_to_sparse<T>(x.view(), w.view(), act, kNarrow, hybrid);
      CHECK(h.overflow_rows() == overflow_rows);
      CHECK(report.overflow_rows == overflow_rows);
      CHECK(report.nnz == nnz);
      check_values(h, false);

      ConvertOptions error;
      if (overflow_rows > 0) {
        try {
          ref::gemm_to_sparse<T>(x.view(), w.view(), act, kNarrow, error);
          FAIL("overflow under the error policy did not throw");
        } catch (const Error& e) {
          CHECK(e.code() == ErrorCode::overflow);
        }
      } else {
        const auto plain = ref::gemm_to_sparse<T>(x.view(), w.view(), act, kNarrow, error);
        CHECK(plain.overflow_rows() == 0);
        check_values(plain, false);
      }

      ConvertOptions drop;
      drop.overflow = OverflowPolicy::drop;
      drop.report = &report;
      const auto dropped = ref::gemm_to_sparse<T>(x.view(), w.view(), act, kNarrow, drop);
      CHECK(dropped.overflow_rows() == 0);
      CHECK(report.dropped == surplus);
      CHECK(ref::l0_norm<T>(dropped.view()) == nnz - surplus);
      int mapped = 0;
      for (const auto r : dropped.row_to_overflow().host_span()) mapped += r != -1 ? 1 : 0;
      CHECK(mapped == 0);
      check_values(dropped, true);
    }
  }
}

TEST_CASE("every bad input throws twell::Error with the right code") {
  using T = float;
  using testing::code_of;
  const testing::SparseDenseOptions so{.density = 0.3};
  const auto a = testing::random_sparse_dense<T>(6, 9, so, testing::fresh_seed());
  const auto csr = ref::dense_to_csr<T>(a.view());
  const auto b = testing::random_dense<T>(9, 4, 1.0f, testing::fresh_seed());
  const auto wrong_b = testing::random_dense<T>(8, 4, 1.0f, testing::fresh_seed());
  DenseMatrix<T> c(6, 4), wrong_c(6, 5);

  CHECK(code_of([&] { ref::spmm<T>(Op::none, csr.view(), wrong_b.view(), c.view(), 1, 0); }) ==
        ErrorCode::shape_mismatch);
  CHECK(code_of([&] { ref::spmm<T>(Op::none, csr.view(), b.view(), wrong_c.view(), 1, 0); }) ==
        ErrorCode::shape_mismatch);
  CHECK(code_of([&] { ref::spmm<T>(Op::transpose, csr.view(), b.view(), c.view(), 1, 0); }) ==
        ErrorCode::shape_mismatch);
  CHECK(code_of([&] { ref::spmm<T>(static_cast<Op>(7), csr.view(), b.view(), c.view(), 1, 0); }) ==
        ErrorCode::invalid_argument);
  KernelOptions unknown_algorithm;  // ignored by the reference, refused as on the device
  unknown_algorithm.spmm_algorithm = static_cast<SpmmAlgorithm>(9);
  CHECK(code_of([&] { ref::spmm<T>(Op::none, csr.view(), b.view(), c.view(), 1, 0, unknown_algorithm); }) ==
        ErrorCode::invalid_argument);
  try {
    ref::spmm<T>(Op::none, csr.view(), wrong_b.view(), c.view(), 1, 0);
  } catch (const Error& e) {
    const std::string what = e.what();
    CHECK(what.find("twell::reference::spmm") != std::string::npos);
    CHECK(what.find("6 x 9") != std::string::npos);
    CHECK(what.find("8 x 4") != std::string::npos);
  }

  // A dense operand that starts inside a value (a byte offset into its buffer) is misaligned.
  const DenseView<const T> shifted = testing::off_boundary<T>(b.view());
  CHECK(code_of([&] { ref::spmm<T>(Op::none, csr.view(), shifted, c.view(), 1, 0); }) == ErrorCode::misaligned);
  CHECK(code_of([&] { twell::spmm<T>(Op::none, csr.view(), shifted, c.view()); }) == ErrorCode::misaligned);
  const DenseView<const T> b3{b.view().data + 1, 9, 3, 4, MemorySpace::host};
  const DenseView<T> c3{c.view().data, 6, 3, 4, MemorySpace::host};
  twell::spmm<T>(Op::none, csr.view(), b3, c3);  // an offset of whole values is fine
  // C over B (here a square product, C = B, and C one row into B) is refused on both backends: the
  // GPU kernels read B while they write C.
  const auto square = ref::dense_to_csr<T>(testing::random_sparse_dense<T>(9, 9, so, testing::fresh_seed()).view());
  DenseMatrix<T> bc = testing::random_dense<T>(10, 4, 1.0f, testing::fresh_seed());
  const DenseView<T> top{bc.view().data, 9, 4, 4, MemorySpace::host};
  const DenseView<T> below{bc.view().data + 4, 9, 4, 4, MemorySpace::host};
  CHECK(code_of([&] { ref::spmm<T>(Op::none, square.view(), DenseView<const T>(top), top, 1, 0); }) ==
        ErrorCode::invalid_argument);
  CHECK(code_of([&] { twell::spmm<T>(Op::transpose, square.view(), DenseView<const T>(top), below); }) ==
        ErrorCode::invalid_argument);

  // Device operands: the reference backend refuses them; the public API has no device here
  // (this build's tests run without CUDA) or dispatches; mixing spaces is refused either way.
  DenseView<const T> b_dev = b.view();
  b_dev.space = MemorySpace::device;
  CsrView<const T> csr_dev = csr.view();
  csr_dev.space = MemorySpace::device;
  DenseView<T> c_dev = c.view();
  c_dev.space = MemorySpace::device;
  CHECK(code_of([&] { ref::spmm<T>(Op::none, csr.view(), b_dev, c.view(), 1, 0); }) == ErrorCode::space_mismatch);
  CHECK(code_of([&] { twell::spmm<T>(Op::none, csr.view(), b_dev, c.view()); }) == ErrorCode::space_mismatch);
  if (!cuda_available()) {
    CHECK(code_of([&] { twell::spmm<T>(Op::none, csr_dev, b_dev, c_dev); }) == ErrorCode::no_device);
    CHECK(code_of([&] { twell::l1_norm<T>(csr_dev); }) == ErrorCode::no_device);
  }

  // The public API on host operands gives the reference's results.
  DenseMatrix<T> c_ref(6, 4);
  ref::spmm<T>(Op::none, csr.view(), b.view(), c_ref.view(), 1, 0);
  twell::spmm<T>(Op::none, csr.view(), b.view(), c.view());
  CHECK(testing::bitwise_equal<T>(std::as_const(c).view(), std::as_const(c_ref).view()));
  CHECK(twell::l0_norm(csr.view()) == ref::l0_norm<T>(csr.view()));

  // sddmm: shapes, and an out that does not share the pattern's structure.
  const auto other = ref::dense_to_csr<T>(testing::random_sparse_dense<T>(6, 9, so, testing::fresh_seed()).view());
  auto out = ref::dense_to_csr<T>(a.view());
  const auto x = testing::random_dense<T>(6, 3, 1.0f, testing::fresh_seed());
  const auto y = testing::random_dense<T>(3, 9, 1.0f, testing::fresh_seed());
  CHECK(code_of([&] { ref::sddmm<T>(x.view(), Op::transpose, y.view(), csr.view(), out.view(), 1, 0); }) ==
        ErrorCode::shape_mismatch);
  if (other.nnz() != csr.nnz() ||
      !std::equal(other.col_idx().data(), other.col_idx().data() + other.nnz(), csr.col_idx().data())) {
    auto other_out = ref::dense_to_csr<T>(testing::random_sparse_dense<T>(6, 9, so, testing::fresh_seed() + 9).view());
    CHECK(code_of([&] { ref::sddmm<T>(x.view(), Op::none, y.view(), csr.view(), other_out.view(), 1, 0); }) ==
          ErrorCode::shape_mismatch);
    auto out2 = ref::dense_to_csr<T>(a.view());
    CHECK(code_of([&] { ref::multiply_on_pattern<T>(csr.view(), other.view(), out2.view()); }) ==
          ErrorCode::shape_mismatch);
  }

  // Malformed structures: a column out of range, a plain TwELL count past its capacity.
  auto broken = ref::dense_to_csr<T>(a.view());
  if (broken.nnz() > 0) {
    broken.col_idx().data()[0] = 9;
    CHECK(code_of([&] { ref::l1_norm<T>(std::as_const(broken).view()); }) == ErrorCode::malformed);
  }
  auto tw = ref::dense_to_twell<T>(a.view(), TwellLayout{16, 1});
  tw.packed().data()[0] = 16;
  CHECK(code_of([&] { ref::l0_norm<T>(std::as_const(tw).view()); }) == ErrorCode::malformed);
  auto hy = ref::dense_to_hybrid<T>(a.view(), TwellLayout{16, 1});
  REQUIRE(hy.overflow_rows() == 0);
  hy.twell().packed().data()[0] = 16;  // an overflowed tile in a row outside the overflow block
  CHECK(code_of([&] { ref::l1_norm<T>(std::as_const(hy).view()); }) == ErrorCode::malformed);
  hy.twell().packed().data()[0] = 0;
  hy.row_to_overflow().data()[2] = 0;  // a map into an empty overflow block
  CHECK(code_of([&] { ref::l1_norm<T>(std::as_const(hy).view()); }) == ErrorCode::malformed);
  const auto fresh = ref::dense_to_hybrid<T>(a.view(), TwellLayout{16, 1});
  HybridView<const T> too_many = fresh.view();
  too_many.overflow.rows = too_many.rows() + 1;  // more overflow rows than the matrix has rows
  CHECK(code_of([&] { ref::l1_norm<T>(too_many); }) == ErrorCode::shape_mismatch);

  // gemm_to_sparse and transpose: shapes, layouts, activation.
  CHECK(code_of([&] { ref::gemm_to_sparse<T>(x.view(), b.view(), {}, TwellLayout{}, hybrid_overflow()); }) ==
        ErrorCode::shape_mismatch);
  CHECK(code_of([&] {
          ref::gemm_to_sparse<T>(x.view(), y.view(), {}, TwellLayout{12, 4}, hybrid_overflow());
        }) == ErrorCode::invalid_argument);
  CHECK(code_of([&] {
          ref::gemm_to_sparse<T>(x.view(), y.view(), {Activation::relu, -1.0f}, TwellLayout{}, hybrid_overflow());
        }) == ErrorCode::invalid_argument);
  CHECK(code_of([&] { ref::transpose<T>(tw.view(), TwellLayout{16, 32}); }) == ErrorCode::invalid_argument);
}

TEST_CASE_TEMPLATE("the public API runs host operands on the reference backend", T, bf16, float) {
  const std::uint64_t seed = testing::fresh_seed();
  CAPTURE(seed);
  const testing::SparseDenseOptions so{.density = 0.2};
  const auto d = testing::random_sparse_dense<T>(20, 40, so, seed);
  auto hybrid = ref::dense_to_hybrid<T>(d.view(), kNarrow);  // mutable: views convert to const ones
  auto b = testing::random_dense<T>(40, 5, 1.0f, seed + 1);
  auto x = testing::random_dense<T>(20, 6, 1.0f, seed + 2);
  auto w = testing::random_dense<T>(6, 40, 1.0f, seed + 3);

  DenseMatrix<T> c(20, 5), c_ref(20, 5);
  twell::spmm<T>(Op::none, hybrid.view(), b.view(), c.view());
  ref::spmm<T>(Op::none, hybrid.view(), b.view(), c_ref.view(), 1.0f, 0.0f);
  CHECK(testing::bitwise_equal<T>(std::as_const(c).view(), std::as_const(c_ref).view()));

  HybridMatrix<T> s(20, 40, kNarrow, hybrid.overflow_rows()), s_ref(20, 40, kNarrow, hybrid.overflow_rows());
  twell::sddmm<T>(x.view(), Op::none, w.view(), hybrid.view(), s.view(), 1.0f, 0.0f);
  ref::sddmm<T>(x.view(), Op::none, w.view(), hybrid.view(), s_ref.view(), 1.0f, 0.0f);
  CHECK(testing::bitwise_equal<T>(ref::hybrid_to_dense<T>(std::as_const(s).view()).view(),
                                  ref::hybrid_to_dense<T>(std::as_const(s_ref).view()).view()));

  twell::multiply_on_pattern<T>(hybrid.view(), s.view(), s.view());
  ref::multiply_on_pattern<T>(hybrid.view(), s_ref.view(), s_ref.view());
  twell::add_scaled_sign<T>(s.view(), 0.5f, s.view());
  ref::add_scaled_sign<T>(s_ref.view(), 0.5f, s_ref.view());
  CHECK(twell::l1_norm(s.view()) == ref::l1_norm<T>(s_ref.view()));
  CHECK(twell::l0_norm(s.view()) == ref::l0_norm<T>(s_ref.view()));

  const auto t = twell::transpose(hybrid.view(), TwellLayout{});
  CHECK(testing::bitwise_equal<T>(
      ref::hybrid_to_dense<T>(t.view()).view(),
      ref::hybrid_to_dense<T>(ref::transpose<T>(hybrid.view(), TwellLayout{}).view()).view()));
  auto csr = ref::dense_to_csr<T>(d.view());
  CHECK(twell::transpose(csr.view()).nnz() == csr.nnz());

  const auto g = twell::gemm_to_sparse(x.view(), w.view(), ActivationSpec{}, kNarrow);
  const auto g_ref = ref::gemm_to_sparse<T>(x.view(), w.view(), ActivationSpec{}, kNarrow, hybrid_overflow());
  CHECK(g.overflow_rows() == g_ref.overflow_rows());
  CHECK(testing::bitwise_equal<T>(ref::hybrid_to_dense<T>(g.view()).view(),
                                  ref::hybrid_to_dense<T>(g_ref.view()).view()));
}

TEST_CASE_TEMPLATE("gemm_to_sparse's overflow error names gemm_to_sparse, not the converter it reuses", T, bf16,
                   float) {
  // act(X W) is positive everywhere: 8 nonzeros in every (row, tile) of (8, 2), capacity 3.
  DenseMatrix<T> x(4, 5), w(5, 16);
  for (auto& v : x.values().host_span()) v = from_float<T>(1.0f);
  for (auto& v : w.values().host_span()) v = from_float<T>(0.5f);
  const ConvertOptions error;  // OverflowPolicy::error
  const std::function<void()> calls[] = {
      [&] { (void)ref::gemm_to_sparse<T>(x.view(), w.view(), {}, TwellLayout{8, 2}, error); },
      [&] { (void)twell::gemm_to_sparse<T>(x.view(), w.view(), {}, TwellLayout{8, 2}, error); }};
  for (const auto& call : calls) {
    try {
      call();
      FAIL("no overflow reported");
    } catch (const Error& e) {
      const std::string what = e.what();
      CAPTURE(what);
      CHECK(e.code() == ErrorCode::overflow);
      CHECK(what.rfind("twell::reference::gemm_to_sparse: row 0, tile 0 ", 0) == 0);
    }
  }
}

TEST_CASE("gemm_to_sparse refuses a convert.threshold: act.threshold decides what is stored") {
  const DenseMatrix<float> x(4, 5), w(5, 16);
  ConvertOptions thresholded = hybrid_overflow();
  thresholded.threshold = 0.5f;
  const std::function<void()> calls[] = {
      [&] {
        (void)ref::gemm_to_sparse<float>(x.view(), w.view(), {}, TwellLayout{8, 2}, thresholded);
      },
      [&] {
        (void)twell::gemm_to_sparse<float>(x.view(), w.view(), {}, TwellLayout{8, 2}, thresholded);
      }};
  for (const auto& call : calls) {
    CHECK(testing::code_of(call) == ErrorCode::invalid_argument);
    CHECK(testing::message_of(call).find("convert.threshold = 0.5 has no effect here") != std::string::npos);
  }
}

TEST_CASE("a dense view's ld is at least its cols, empty views included, in every function that takes one") {
  using T = float;
  using testing::code_of;
  // 0 x 4 with ld 0: no element, but ld < cols, as validate and the converters have always said.
  const DenseView<const T> none_ld0{nullptr, 0, 4, 0, MemorySpace::host};
  CHECK(code_of([&] { validate(none_ld0); }) == ErrorCode::malformed);
  CHECK(code_of([&] { (void)to_csr(none_ld0); }) == ErrorCode::malformed);
  const CsrMatrix<T> a(0, 9, 0);
  const auto b = testing::random_dense<T>(9, 4, 1.0f, testing::fresh_seed());
  const DenseView<T> c_ld0{nullptr, 0, 4, 0, MemorySpace::host};
  try {
    ref::spmm<T>(Op::none, a.view(), b.view(), c_ld0, 1, 0);
    FAIL("C with ld 0 < 4 columns was accepted");
  } catch (const Error& e) {
    CHECK(e.code() == ErrorCode::invalid_argument);
    CHECK(std::string(e.what()).find("C has leading dimension 0 below its 4 columns") != std::string::npos);
  }
  CHECK(code_of([&] { twell::spmm<T>(Op::none, a.view(), b.view(), c_ld0); }) == ErrorCode::invalid_argument);
  const CsrMatrix<T> k0(3, 0, 0);
  const DenseView<const T> b_ld0{nullptr, 0, 4, 0, MemorySpace::host};
  DenseMatrix<T> c(3, 4);
  CHECK(code_of([&] { twell::spmm<T>(Op::none, k0.view(), b_ld0, c.view()); }) == ErrorCode::invalid_argument);
  // The same shapes with ld = cols, and M x 0 views with ld 0 (>= their 0 columns), are fine.
  twell::spmm<T>(Op::none, a.view(), b.view(), DenseView<T>{nullptr, 0, 4, 4, MemorySpace::host});
  twell::spmm<T>(Op::none, k0.view(), DenseView<const T>{nullptr, 0, 4, 4, MemorySpace::host}, c.view());
  const CsrMatrix<T> a9(6, 9, 0);
  twell::spmm<T>(Op::none, a9.view(), DenseView<const T>{nullptr, 9, 0, 0, MemorySpace::host},
                 DenseView<T>{nullptr, 6, 0, 0, MemorySpace::host});
  const DenseView<const T> cols0{nullptr, 4, 0, 0, MemorySpace::host};
  validate(cols0);
  CHECK(to_csr(cols0).rows() == 4);
  // A Hybrid's empty overflow block follows the same rule.
  DenseMatrix<T> diagonal(5, 16);
  for (std::int64_t i = 0; i < 5; ++i) diagonal.view().at(i, i) = 1.0f;
  const auto hy = ref::dense_to_hybrid<T>(diagonal.view(), kNarrow);
  REQUIRE(hy.overflow_rows() == 0);
  HybridView<const T> v = hy.view();
  v.overflow = DenseView<const T>{nullptr, 0, 16, 0, MemorySpace::host};
  CHECK(code_of([&] { validate(v); }) == ErrorCode::malformed);
  CHECK(code_of([&] { (void)ref::l1_norm<T>(v); }) == ErrorCode::invalid_argument);
}
