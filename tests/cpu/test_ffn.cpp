// Reference FFN against fp64 loops written here; the composed sparse forward against the dense
// reference; the backward against central finite differences of the loss in fp64.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <functional>
#include <limits>
#include <string>
#include <utility>
#include <vector>

#include <twell/convert.hpp>
#include <twell/ffn.hpp>
#include <twell/kernels/ffn.hpp>

#include "checks.hpp"
#include "fp64.hpp"
#include "random.hpp"

using namespace twell;
namespace ref = twell::reference;

namespace {

using testing::act64;
using testing::Matrix64;
using testing::to64;

Matrix64 matmul(const Matrix64& a, const Matrix64& b) {
  Matrix64 c(a.rows, b.cols);
  for (std::int64_t i = 0; i < a.rows; ++i)
    for (std::int64_t p = 0; p < a.cols; ++p)
      for (std::int64_t j = 0; j < b.cols; ++j) c(i, j) += a(i, p) * b(p, j);
  return c;
}

// The hidden state h = act(x wg) * (x wu) (gated) or act(x wu) (not gated), threshold applied.
Matrix64 hidden64(const Matrix64& x, const Matrix64* wg, const Matrix64& wu, ActivationSpec act) {
  const Matrix64 u = matmul(x, wu);
  if (wg == nullptr) {
    Matrix64 h(u.rows, u.cols);
    for (std::size_t e = 0; e < u.v.size(); ++e) {
      const double a = act64(act.kind, u.v[e]);
      h.v[e] = std::fabs(a) <= act.threshold ? 0.0 : a;
    }
    return h;
  }
  const Matrix64 g = matmul(x, *wg);
  Matrix64 h(u.rows, u.cols);
  for (std::size_t e = 0; e < u.v.size(); ++e) {
    const double a = act64(act.kind, g.v[e]);
    h.v[e] = (std::fabs(a) <= act.threshold ? 0.0 : a) * u.v[e];
  }
  return h;
}

template <class T>
double rel_error(DenseView<const T> got, const Matrix64& want) {
  double diff = 0.0, norm = 0.0;
  for (std::int64_t i = 0; i < want.rows; ++i)
    for (std::int64_t j = 0; j < want.cols; ++j) {
      const double d = to_float(got.at(i, j)) - want(i, j);
      diff += d * d;
      norm += want(i, j) * want(i, j);
    }
  return std::sqrt(diff) / std::max(std::sqrt(norm), 1e-30);
}

template <class T>
double tolerance() {
  if constexpr (std::is_same_v<T, bf16>) return 2e-2;
  if constexpr (std::is_same_v<T, fp16>) return 3e-3;
  return 2e-5;
}

struct FfnShape {
  std::int64_t m, k, n;
};
constexpr FfnShape kShapes[] = {{1, 8, 16}, {7, 24, 40}, {33, 64, 96}, {50, 16, 300}};
constexpr ActivationSpec kActs[] = {{Activation::relu, 0.0f}, {Activation::silu, 0.0f}, {Activation::gelu, 0.0f}};

template <class T>
struct Weights {
  DenseMatrix<T> x, wg, wu, wd;
  Weights(const FfnShape& s, std::uint64_t seed)
      : x(testing::random_dense<T>(s.m, s.k, 1.0f, seed)),
        wg(testing::random_dense<T>(s.k, s.n, 1.0f / std::sqrt(float(s.k)), seed + 1)),
        wu(testing::random_dense<T>(s.k, s.n, 1.0f / std::sqrt(float(s.k)), seed + 2)),
        wd(testing::random_dense<T>(s.n, s.k, 1.0f / std::sqrt(float(s.n)), seed + 3)) {}
};

}  // namespace

TEST_CASE_TEMPLATE("dense reference forward matches fp64", T, bf16, fp16, float) {
  for (const FfnShape& s : kShapes) {
    for (const ActivationSpec& act : kActs) {
      const std::uint64_t seed = testing::fresh_seed();
      CAPTURE(seed);
      CAPTURE(s.m);
      CAPTURE(s.n);
      CAPTURE(static_cast<int>(act.kind));
      const Weights<T> w(s, seed);
      const Matrix64 x = to64<T>(w.x.view()), wg = to64<T>(w.wg.view()), wu = to64<T>(w.wu.view());
      const Matrix64 wd = to64<T>(w.wd.view());
      DenseMatrix<T> y(s.m, s.k);
      ref::gated_ffn_forward<T>(w.x.view(), w.wg.view(), w.wu.view(), w.wd.view(), act, y.view());
      CHECK(rel_error<T>(std::as_const(y).view(), matmul(hidden64(x, &wg, wu, act), wd)) < tolerance<T>());
      ref::ffn_forward<T>(w.x.view(), w.wu.view(), w.wd.view(), act, y.view());
      CHECK(rel_error<T>(std::as_const(y).view(), matmul(hidden64(x, nullptr, wu, act), wd)) < tolerance<T>());
    }
  }
}

TEST_CASE_TEMPLATE("composed sparse forward matches the dense reference", T, bf16, fp16, float) {
  const ActivationSpec acts[] = {
      {Activation::relu, 0.0f}, {Activation::relu, 0.4f}, {Activation::silu, 0.2f}, {Activation::gelu, 0.0f}};
  for (const FfnShape& s : kShapes) {
    for (const ActivationSpec& act : acts) {
      for (const TwellLayout layout : {TwellLayout{16, 4}, TwellLayout{}, TwellLayout{32, 2}}) {
        const std::uint64_t seed = testing::fresh_seed();
        CAPTURE(seed);
        CAPTURE(s.m);
        CAPTURE(s.n);
        CAPTURE(static_cast<int>(act.kind));
        CAPTURE(act.threshold);
        CAPTURE(layout.tile);
        const Weights<T> w(s, seed);
        DenseMatrix<T> dense(s.m, s.k), sparse(s.m, s.k);
        for (auto& v : sparse.values().host_span()) v = from_float<T>(NAN);
        ref::gated_ffn_forward<T>(w.x.view(), w.wg.view(), w.wu.view(), w.wd.view(), act, dense.view());
        sparse_gated_ffn_forward<T>(w.x.view(), w.wg.view(), w.wu.view(), w.wd.view(), act, layout, sparse.view());
        const Matrix64 want = to64<T>(std::as_const(dense).view());
        CHECK(rel_error<T>(std::as_const(sparse).view(), want) < 2 * tolerance<T>());

        for (auto& v : sparse.values().host_span()) v = from_float<T>(NAN);
        ref::ffn_forward<T>(w.x.view(), w.wu.view(), w.wd.view(), act, dense.view());
        sparse_ffn_forward<T>(w.x.view(), w.wu.view(), w.wd.view(), act, layout, sparse.view());
        CHECK(rel_error<T>(std::as_const(sparse).view(), to64<T>(std::as_const(dense).view())) < 2 * tolerance<T>());
      }
    }
  }
}

TEST_CASE_TEMPLATE("FFN layers on the host: GatedFfn / Ffn equal the composed forward, stats count the pattern", T,
                   bf16, float) {
  const ActivationSpec relu{Activation::relu, 0.3f};
  // TwELL(16, 4) holds 3 entries per (row, tile), so some rows of these shapes overflow.
  const TwellLayout layout{16, 4};
  for (const FfnShape& s : kShapes) {
    const std::uint64_t seed = testing::fresh_seed();
    CAPTURE(seed);
    CAPTURE(s.m);
    CAPTURE(s.n);
    const Weights<T> w(s, seed);
    DenseMatrix<T> want(s.m, s.k), got(s.m, s.k);
    GatedFfn<T> layer(s.m, w.wg.view(), w.wu.view(), w.wd.view(), relu, layout);
    FfnStats stats;
    for (int call = 0; call < 2; ++call) {
      for (auto& v : got.values().host_span()) v = from_float<T>(NAN);
      layer.forward(w.x.view(), got.view(), &stats);
      sparse_gated_ffn_forward<T>(w.x.view(), w.wg.view(), w.wu.view(), w.wd.view(), relu, layout, want.view());
      CHECK(testing::bitwise_equal<T>(std::as_const(got).view(), std::as_const(want).view()));
    }
    CHECK(layer.path() == "composed:reference");

    // The pattern from fp64: act(x wg) stored where |act| > threshold (T's rounding aside).
    const Matrix64 g = matmul(to64<T>(w.x.view()), to64<T>(w.wg.view()));
    std::int64_t nnz = 0, overflow_rows = 0, diff = 0;
    for (std::int64_t i = 0; i < s.m; ++i) {
      std::int64_t row = 0;
      bool overflowed = false;
      for (std::int64_t t = 0; t < layout.tiles(s.n); ++t) {
        std::int64_t in_tile = 0;
        for (std::int64_t j = layout.tile_begin(t); j < layout.tile_begin(t) + layout.tile_cols(t, s.n); ++j)
          in_tile += act64(relu.kind, g(i, j)) > relu.threshold ? 1 : 0;
        overflowed = overflowed || layout.overflows(in_tile);
        row += in_tile;
      }
      nnz += row;
      overflow_rows += overflowed ? 1 : 0;
      diff += std::abs(row - stats.row_nnz[static_cast<std::size_t>(i)]);
    }
    CAPTURE(nnz);
    CAPTURE(diff);
    CHECK(stats.tokens == s.m);
    CHECK(diff <= 1 + nnz / 100);
    CHECK(std::abs(stats.nnz - nnz) <= 1 + nnz / 100);
    CHECK(std::abs(stats.overflow_rows - overflow_rows) <= 1 + s.m / 10);
    CHECK(stats.overflow_capacity == stats.overflow_rows);
    CHECK(stats.fallback_rows == 0);

    Ffn<T> plain(s.m, w.wu.view(), w.wd.view(), relu, layout);
    plain.forward(w.x.view(), got.view());
    sparse_ffn_forward<T>(w.x.view(), w.wu.view(), w.wd.view(), relu, layout, want.view());
    CHECK(testing::bitwise_equal<T>(std::as_const(got).view(), std::as_const(want).view()));
  }
  const Weights<T> w(FfnShape{4, 8, 12}, 3);
  GatedFfn<T> layer(4, w.wg.view(), w.wu.view(), w.wd.view());
  DenseMatrix<T> y(3, 8);
  const DenseView<const T> x3{w.x.view().data, 3, 8, 8, MemorySpace::host};
  CHECK(testing::code_of([&] { layer.forward(x3, y.view()); }) == ErrorCode::shape_mismatch);
  CHECK(testing::code_of([&] { GatedFfn<T>(4, w.wg.view(), w.wu.view(), w.wg.view()); }) == ErrorCode::shape_mismatch);
  DenseView<const T> wd_dev = w.wd.view();
  wd_dev.space = MemorySpace::device;
  CHECK(testing::code_of([&] { Ffn<T>(4, w.wu.view(), wd_dev); }) == ErrorCode::space_mismatch);
  // A host layer refuses at construction what a device layer refuses: a negative overflow
  // capacity, an unknown activation, a negative threshold.
  CHECK(testing::code_of([&] { GatedFfn<T>(4, w.wg.view(), w.wu.view(), w.wd.view(), {}, {}, -7); }) ==
        ErrorCode::invalid_argument);
  CHECK(testing::code_of([&] { Ffn<T>(4, w.wu.view(), w.wd.view(), {}, {}, -7); }) == ErrorCode::invalid_argument);
  CHECK(testing::code_of([&] {
          GatedFfn<T>(4, w.wg.view(), w.wu.view(), w.wd.view(), ActivationSpec{static_cast<Activation>(9), 0.0f});
        }) == ErrorCode::invalid_argument);
  CHECK(testing::code_of([&] { Ffn<T>(4, w.wu.view(), w.wd.view(), ActivationSpec{Activation::relu, -1.0f}); }) ==
        ErrorCode::invalid_argument);
  // A moved-from layer says so, from path() too (it dereferenced null before).
  // ... and a null weight or one whose rows overlap, by the layer's names (once accepted here,
  // then refused by every forward() as an inner operation's "B" or "W").
  const DenseView<const T> wg_null{nullptr, 8, 12, 12, MemorySpace::host};
  CHECK(testing::message_of([&] {
          GatedFfn<T>(4, wg_null, w.wu.view(), w.wd.view());
        }).find("wg is null with shape 8 x 12") != std::string::npos);
  DenseView<const T> wd_short = w.wd.view();
  wd_short.ld = 7;
  DenseMatrix<T> y4(4, 8);
  CHECK(testing::message_of([&] {
          Ffn<T>(4, w.wu.view(), wd_short);
        }).find("wd has leading dimension 7 below its 8 columns") != std::string::npos);
  CHECK(testing::message_of([&] {
          sparse_gated_ffn_forward<T>(w.x.view(), w.wg.view(), w.wu.view(), wd_short, ActivationSpec{}, TwellLayout{},
                                      y4.view());
        }).find("twell::sparse_gated_ffn_forward: wd has leading dimension 7") != std::string::npos);
  GatedFfn<T> gated_moved = std::move(layer);
  CHECK(testing::code_of([&] { layer.path(); }) == ErrorCode::invalid_argument);
  Ffn<T> plain(4, w.wu.view(), w.wd.view());
  Ffn<T> plain_moved = std::move(plain);
  CHECK(testing::code_of([&] { plain.path(); }) == ErrorCode::invalid_argument);
}

namespace {

// w^T, written out element by element (independent of twell::transpose).
template <class T>
DenseMatrix<T> transposed_by_hand(const DenseMatrix<T>& w) {
  DenseMatrix<T> t(w.cols(), w.rows());
  for (std::int64_t i = 0; i < w.rows(); ++i)
    for (std::int64_t j = 0; j < w.cols(); ++j)
      t.values().data()[j * w.rows() + i] = w.values().data()[i * w.cols() + j];
  return t;
}

}  // namespace

TEST_CASE_TEMPLATE("FFN layers take weights as InOut or OutIn (torch.nn.Linear) by type, with the same result", T, bf16,
                   float) {
  const ActivationSpec relu{Activation::relu, 0.1f};
  const TwellLayout layout{16, 4};
  // K == N: the shapes cannot tell the conventions apart, only the types do.
  for (const FfnShape& s : {FfnShape{9, 24, 24}, FfnShape{5, 16, 40}}) {
    const std::uint64_t seed = testing::fresh_seed();
    CAPTURE(seed);
    CAPTURE(s.k);
    CAPTURE(s.n);
    const Weights<T> w(s, seed);
    const DenseMatrix<T> wg_t = transposed_by_hand(w.wg), wu_t = transposed_by_hand(w.wu),
                         wd_t = transposed_by_hand(w.wd);
    DenseMatrix<T> want(s.m, s.k), got(s.m, s.k);
    GatedFfn<T>(s.m, InOut<T>{w.wg.view()}, InOut<T>{w.wu.view()}, InOut<T>{w.wd.view()}, relu, layout)
        .forward(w.x.view(), want.view());
    for (auto& v : got.values().host_span()) v = from_float<T>(NAN);
    GatedFfn<T> torch_style(s.m, OutIn<T>{wg_t.view()}, OutIn<T>{wu_t.view()}, OutIn<T>{wd_t.view()}, relu, layout);
    torch_style.forward(w.x.view(), got.view());
    CHECK(testing::bitwise_equal<T>(std::as_const(got).view(), std::as_const(want).view()));

    Ffn<T>(s.m, InOut<T>{w.wu.view()}, InOut<T>{w.wd.view()}, relu, layout).forward(w.x.view(), want.view());
    for (auto& v : got.values().host_span()) v = from_float<T>(NAN);
    Ffn<T>(s.m, OutIn<T>{wu_t.view()}, OutIn<T>{wd_t.view()}, relu, layout).forward(w.x.view(), got.view());
    CHECK(testing::bitwise_equal<T>(std::as_const(got).view(), std::as_const(want).view()));
  }
  // The type, not the shape, decides: in x out weights passed as OutIn make a layer of the
  // transposed sizes (K = 12 here), so an x with the real K = 8 columns is refused at forward().
  const Weights<T> w(FfnShape{4, 8, 12}, 5);
  GatedFfn<T> swapped(4, OutIn<T>{w.wg.view()}, OutIn<T>{w.wu.view()}, OutIn<T>{w.wd.view()});
  DenseMatrix<T> y(4, 8);
  CHECK(testing::code_of([&] { swapped.forward(w.x.view(), y.view()); }) == ErrorCode::shape_mismatch);
}

TEST_CASE_TEMPLATE("dense transpose moves every value bit for bit and rejects bad outputs", T, bf16, fp16, float) {
  for (const auto& [rows, cols] :
       std::vector<std::pair<std::int64_t, std::int64_t>>{{0, 5}, {1, 1}, {7, 33}, {40, 3}}) {
    const std::uint64_t seed = testing::fresh_seed();
    CAPTURE(seed);
    CAPTURE(rows);
    CAPTURE(cols);
    // A view with a leading dimension above its columns, and NaN / -0 among the values.
    DenseMatrix<T> backing = testing::random_dense<T>(rows, cols + 3, 1.0f, seed);
    if (rows > 0) {
      backing.values().data()[0] = from_float<T>(NAN);
      backing.values().data()[cols + 3 - 1] = from_float<T>(-0.0f);
    }
    const DenseView<const T> a{backing.values().data(), rows, cols, cols + 3, MemorySpace::host};
    DenseMatrix<T> out(cols, rows);
    for (auto& v : out.values().host_span()) v = from_float<T>(1.5f);
    KernelReport report;
    twell::transpose<T>(a, out.view(), KernelOptions{{}, &report});
    CHECK(report.path == "reference/transpose/dense");
    bool same = true;
    for (std::int64_t i = 0; i < rows; ++i)
      for (std::int64_t j = 0; j < cols; ++j)
        same = same && std::memcmp(&out.values().data()[j * rows + i], &a.data[i * a.ld + j], sizeof(T)) == 0;
    CHECK(same);
  }
  DenseMatrix<T> a = testing::random_dense<T>(4, 6, 1.0f, 9);
  DenseMatrix<T> wrong(4, 6);
  CHECK(testing::code_of([&] { twell::transpose<T>(std::as_const(a).view(), wrong.view()); }) ==
        ErrorCode::shape_mismatch);
  DenseMatrix<T> square = testing::random_dense<T>(5, 5, 1.0f, 10);
  CHECK(testing::code_of([&] { twell::transpose<T>(std::as_const(square).view(), square.view()); }) ==
        ErrorCode::invalid_argument);
  DenseView<T> on_device = wrong.view();
  on_device.space = MemorySpace::device;
  CHECK(testing::code_of([&] { twell::transpose<T>(std::as_const(a).view(), on_device); }) ==
        ErrorCode::space_mismatch);
}

namespace {

// L = sum(y * R) + lambda * sum(|h|) / Z in fp64.
double loss64(const Matrix64& x, const Matrix64& wg, const Matrix64& wu, const Matrix64& wd, const Matrix64& r,
              ActivationSpec act, double lambda, double z) {
  const Matrix64 h = hidden64(x, &wg, wu, act);
  const Matrix64 y = matmul(h, wd);
  double l = 0.0, l1 = 0.0;
  for (std::size_t e = 0; e < y.v.size(); ++e) l += y.v[e] * r.v[e];
  for (const double v : h.v) l1 += std::fabs(v);
  return l + lambda * l1 / z;
}

}  // namespace

TEST_CASE("gated backward matches central finite differences (float)") {
  constexpr FfnShape shapes[] = {{5, 6, 8}, {3, 4, 20}, {1, 8, 8}, {9, 7, 11}};
  constexpr float lambda = 0.3f;
  for (const FfnShape& s : shapes) {
    for (const ActivationSpec& act : kActs) {
      for (const L1Normalization norm : {L1Normalization::per_token, L1Normalization::per_entry}) {
        const std::uint64_t seed = testing::fresh_seed();
        CAPTURE(seed);
        CAPTURE(s.m);
        CAPTURE(s.k);
        CAPTURE(s.n);
        CAPTURE(static_cast<int>(act.kind));
        CAPTURE(static_cast<int>(norm));
        const Weights<float> w(s, seed);
        const auto dy = testing::random_dense<float>(s.m, s.k, 1.0f, seed + 4);
        const auto grads = ref::gated_ffn_backward<float>(w.x.view(), w.wg.view(), w.wu.view(), w.wd.view(), dy.view(),
                                                          act, lambda, norm);
        const double z = norm == L1Normalization::per_token ? double(s.m) : double(s.m * s.n);
        CHECK(grads.z == z);

        Matrix64 params[] = {to64<float>(w.x.view()), to64<float>(w.wg.view()), to64<float>(w.wu.view()),
                             to64<float>(w.wd.view())};
        const Matrix64 r = to64<float>(dy.view());
        auto loss = [&] { return loss64(params[0], params[1], params[2], params[3], r, act, lambda, z); };
        {
          const Matrix64 h = hidden64(params[0], &params[1], params[2], act);
          double l1 = 0.0;
          for (const double v : h.v) l1 += std::fabs(v);
          CHECK(grads.l1_term == doctest::Approx(lambda * l1 / z).epsilon(1e-5));
        }
        const DenseMatrix<float>* analytic[] = {&grads.dx, &grads.dwg, &grads.dwu, &grads.dwd};
        const char* names[] = {"dx", "dwg", "dwu", "dwd"};
        for (int p = 0; p < 4; ++p) {
          const std::string name = names[p];
          CAPTURE(name);
          Matrix64 numeric(params[p].rows, params[p].cols);
          for (std::size_t e = 0; e < params[p].v.size(); ++e) {
            const double keep = params[p].v[e];
            const double step = 1e-6;
            params[p].v[e] = keep + step;
            const double up = loss();
            params[p].v[e] = keep - step;
            const double down = loss();
            params[p].v[e] = keep;
            numeric.v[e] = (up - down) / (2 * step);
          }
          REQUIRE(analytic[p]->rows() == numeric.rows);
          REQUIRE(analytic[p]->cols() == numeric.cols);
          CHECK(rel_error<float>(analytic[p]->view(), numeric) < 1e-4);
        }
      }
    }
  }
}

TEST_CASE("bf16 backward and sparse forward agree with float") {
  const FfnShape s{24, 32, 64};
  const std::uint64_t seed = testing::fresh_seed();
  CAPTURE(seed);
  const Weights<bf16> w(s, seed);
  const auto dy = testing::random_dense<bf16>(s.m, s.k, 1.0f, seed + 4);
  // The same (bf16-exact) inputs in float.
  auto widen = [](const DenseMatrix<bf16>& m) {
    DenseMatrix<float> out(m.rows(), m.cols());
    for (std::int64_t i = 0; i < m.rows(); ++i)
      for (std::int64_t j = 0; j < m.cols(); ++j) out.view().at(i, j) = to_float(m.view().at(i, j));
    return out;
  };
  const auto x = widen(w.x), wg = widen(w.wg), wu = widen(w.wu), wd = widen(w.wd), dyf = widen(dy);
  const ActivationSpec relu{};
  const auto g16 = ref::gated_ffn_backward<bf16>(w.x.view(), w.wg.view(), w.wu.view(), w.wd.view(), dy.view(), relu,
                                                 2e-2f, L1Normalization::per_token);
  const auto g32 = ref::gated_ffn_backward<float>(x.view(), wg.view(), wu.view(), wd.view(), dyf.view(), relu, 2e-2f,
                                                  L1Normalization::per_token);
  CHECK(rel_error<bf16>(g16.dx.view(), to64<float>(g32.dx.view())) < 2e-2);
  CHECK(rel_error<bf16>(g16.dwg.view(), to64<float>(g32.dwg.view())) < 2e-2);
  CHECK(rel_error<bf16>(g16.dwu.view(), to64<float>(g32.dwu.view())) < 2e-2);
  CHECK(rel_error<bf16>(g16.dwd.view(), to64<float>(g32.dwd.view())) < 2e-2);
  CHECK(g16.l1_term == doctest::Approx(g32.l1_term).epsilon(1e-6));

  DenseMatrix<bf16> y16(s.m, s.k);
  DenseMatrix<float> y32(s.m, s.k);
  sparse_gated_ffn_forward<bf16>(w.x.view(), w.wg.view(), w.wu.view(), w.wd.view(), relu, TwellLayout{}, y16.view());
  ref::gated_ffn_forward<float>(x.view(), wg.view(), wu.view(), wd.view(), relu, y32.view());
  CHECK(rel_error<bf16>(std::as_const(y16).view(), to64<float>(std::as_const(y32).view())) < 3e-2);
}

TEST_CASE_TEMPLATE("sparse training forward and backward match the dense reference", T, bf16, float) {
  // Intermediates (u, h, dh, dg, du, the first half of dx) are rounded to T in the composition.
  const double tol = std::is_same_v<T, float> ? 1e-4 : 4e-2;
  const ActivationSpec acts[] = {
      {Activation::relu, 0.0f}, {Activation::relu, 0.4f}, {Activation::silu, 0.2f}, {Activation::gelu, 0.1f}};
  int case_index = 0;
  for (const FfnShape& s : kShapes) {
    for (const ActivationSpec& act : acts) {
      for (const TwellLayout layout : {TwellLayout{16, 4}, TwellLayout{}, TwellLayout{32, 2}}) {
        const L1Normalization norm = ++case_index % 2 ? L1Normalization::per_token : L1Normalization::per_entry;
        const std::uint64_t seed = testing::fresh_seed();
        CAPTURE(seed);
        CAPTURE(s.m);
        CAPTURE(s.n);
        CAPTURE(static_cast<int>(act.kind));
        CAPTURE(act.threshold);
        CAPTURE(layout.tile);
        const Weights<T> w(s, seed);
        auto dy = testing::random_dense<T>(s.m, s.k, 1.0f, seed + 4);
        // A token outside the loss (dy = 0): only the L1 term's gradient reaches its hidden units,
        // through dense overflow rows too, where dh is exactly zero.
        for (std::int64_t j = 0; j < s.k; ++j) dy.view().at(0, j) = T{};
        const float lambda = 0.05f;

        DenseMatrix<T> y(s.m, s.k), y_ref(s.m, s.k);
        for (auto& v : y.values().host_span()) v = from_float<T>(NAN);
        const GatedFfnActivations<T> saved = sparse_gated_ffn_training_forward<T>(
            w.x.view(), w.wg.view(), w.wu.view(), w.wd.view(), act, layout, y.view());
        CHECK(saved.g.rows() == (act.kind == Activation::relu ? 0 : s.m));  // g kept where act' needs it
        ref::gated_ffn_forward<T>(w.x.view(), w.wg.view(), w.wu.view(), w.wd.view(), act, y_ref.view());
        CHECK(rel_error<T>(std::as_const(y).view(), to64<T>(std::as_const(y_ref).view())) < tol);

        KernelReport report;
        const auto got = sparse_gated_ffn_backward<T>(saved, w.x.view(), w.wg.view(), w.wu.view(), w.wd.view(),
                                                      dy.view(), lambda, norm, KernelOptions{.report = &report});
        CHECK(report.path == "composed:reference");
        const auto want = ref::gated_ffn_backward<T>(w.x.view(), w.wg.view(), w.wu.view(), w.wd.view(), dy.view(), act,
                                                     lambda, norm);
        CHECK(got.z == want.z);
        CHECK(got.l1_term == doctest::Approx(want.l1_term).epsilon(std::is_same_v<T, float> ? 1e-5 : 1e-2));
        const std::pair<const DenseMatrix<T>*, const DenseMatrix<T>*> pairs[] = {
            {&got.dx, &want.dx}, {&got.dwg, &want.dwg}, {&got.dwu, &want.dwu}, {&got.dwd, &want.dwd}};
        const char* names[] = {"dx", "dwg", "dwu", "dwd"};
        for (int p = 0; p < 4; ++p) {
          const std::string name = names[p];
          CAPTURE(name);
          REQUIRE(pairs[p].first->rows() == pairs[p].second->rows());
          REQUIRE(pairs[p].first->cols() == pairs[p].second->cols());
          CHECK(rel_error<T>(pairs[p].first->view(), to64<T>(pairs[p].second->view())) < tol);
        }
      }
    }
  }
}

TEST_CASE("sparse backward: the L1 gradient alone reaches a token outside the loss, in TwELL and dense rows") {
  // dy = 0 everywhere: every gradient comes from lambda / Z sign(h), so a lost sign is an error
  // of 100 %, not of rounding. Layout {16, 4} sends most rows of this dense gate to overflow rows.
  const FfnShape s{12, 16, 64};
  const std::uint64_t seed = testing::fresh_seed();
  CAPTURE(seed);
  const Weights<float> w(s, seed);
  const DenseMatrix<float> dy(s.m, s.k);
  for (const TwellLayout layout : {TwellLayout{16, 4}, TwellLayout{16, 1}}) {
    CAPTURE(layout.compression);
    DenseMatrix<float> y(s.m, s.k);
    const auto saved = sparse_gated_ffn_training_forward<float>(w.x.view(), w.wg.view(), w.wu.view(), w.wd.view(),
                                                                ActivationSpec{}, layout, y.view());
    CHECK((layout.compression == 4 ? saved.a.overflow_rows() > 0 : saved.a.overflow_rows() == 0));
    const auto got = sparse_gated_ffn_backward<float>(saved, w.x.view(), w.wg.view(), w.wu.view(), w.wd.view(),
                                                      dy.view(), 0.5f, L1Normalization::per_token);
    const auto want = ref::gated_ffn_backward<float>(w.x.view(), w.wg.view(), w.wu.view(), w.wd.view(), dy.view(),
                                                     ActivationSpec{}, 0.5f, L1Normalization::per_token);
    CHECK(rel_error<float>(got.dx.view(), to64<float>(want.dx.view())) < 1e-5);
    CHECK(rel_error<float>(got.dwg.view(), to64<float>(want.dwg.view())) < 1e-5);
    CHECK(rel_error<float>(got.dwu.view(), to64<float>(want.dwu.view())) < 1e-5);
    CHECK(rel_error<float>(got.dwd.view(), to64<float>(want.dwd.view())) == 0.0);  // h^T 0
  }
}

TEST_CASE_TEMPLATE("GatedFfnTraining on the host: the free functions' bits, step after step, its Hybrids growing", T,
                   bf16, float) {
  // One object for every step of a setting; each step has fresh x, weights and dy, so a buffer that
  // kept the previous step's values shows. Capacity 1 with layout {16, 4} makes the gate's
  // overflow rows outgrow the held Hybrids in the first steps.
  const ActivationSpec acts[] = {{Activation::relu, 0.0f}, {Activation::silu, 0.2f}, {Activation::gelu, 0.1f}};
  for (const FfnShape& s : kShapes) {
    for (const ActivationSpec& act : acts) {
      for (const TwellLayout layout : {TwellLayout{16, 4}, TwellLayout{}}) {
        CAPTURE(s.m);
        CAPTURE(s.n);
        CAPTURE(static_cast<int>(act.kind));
        CAPTURE(layout.tile);
        GatedFfnTraining<T> step(s.m, s.k, s.n, MemorySpace::host, act, layout, 1);
        std::int64_t most_rows = 0;
        for (int call = 0; call < 3; ++call) {
          const std::uint64_t seed = testing::fresh_seed();
          CAPTURE(seed);
          const Weights<T> w(s, seed);
          const auto dy = testing::random_dense<T>(s.m, s.k, 1.0f, seed + 4);
          const L1Normalization norm = call % 2 ? L1Normalization::per_entry : L1Normalization::per_token;
          DenseMatrix<T> y(s.m, s.k), y_want(s.m, s.k);
          for (auto& v : y.values().host_span()) v = from_float<T>(NAN);
          step.forward(w.x.view(), w.wg.view(), w.wu.view(), w.wd.view(), y.view());
          CHECK(step.path() == "composed:reference");
          const auto saved = sparse_gated_ffn_training_forward<T>(w.x.view(), w.wg.view(), w.wu.view(), w.wd.view(),
                                                                  act, layout, y_want.view());
          CHECK(testing::bitwise_equal<T>(std::as_const(y).view(), std::as_const(y_want).view()));
          const GatedFfnActivationViews<T> held = step.activations();
          const GatedFfnActivationViews<T> want = saved.view();
          const std::pair<HybridView<const T>, HybridView<const T>> parts[] = {
              {held.a, want.a}, {held.u, want.u}, {held.h, want.h}, {held.g, want.g}};
          for (const auto& [got_part, want_part] : parts) {
            REQUIRE(got_part.overflow_rows() == want_part.overflow_rows());
            if (want_part.rows() == 0) continue;  // g of ReLU
            CHECK(testing::bitwise_equal<T>(to_dense(got_part).view(), to_dense(want_part).view()));
          }
          most_rows = std::max(most_rows, want.a.overflow_rows());
          CHECK(step.overflow_capacity() >= most_rows);
          CHECK(step.overflow_capacity() <= s.m);

          DenseMatrix<T> dx(s.m, s.k), dwg(s.k, s.n), dwu(s.k, s.n), dwd(s.n, s.k);
          for (DenseMatrix<T>* g : {&dx, &dwg, &dwu, &dwd})
            for (auto& v : g->values().host_span()) v = from_float<T>(NAN);
          const double l1 = step.backward(w.x.view(), w.wg.view(), w.wu.view(), w.wd.view(), dy.view(), 0.05f, norm,
                                          {dx.view(), dwg.view(), dwu.view(), dwd.view()});
          const auto grads = sparse_gated_ffn_backward<T>(saved, w.x.view(), w.wg.view(), w.wu.view(), w.wd.view(),
                                                          dy.view(), 0.05f, norm);
          CHECK(l1 == grads.l1_term);
          CHECK(testing::bitwise_equal<T>(std::as_const(dx).view(), grads.dx.view()));
          CHECK(testing::bitwise_equal<T>(std::as_const(dwg).view(), grads.dwg.view()));
          CHECK(testing::bitwise_equal<T>(std::as_const(dwu).view(), grads.dwu.view()));
          CHECK(testing::bitwise_equal<T>(std::as_const(dwd).view(), grads.dwd.view()));
        }
        if (layout.compression == 4 && s.n >= 96) CHECK(most_rows > 1);  // the growth was exercised
      }
    }
  }
}

TEST_CASE("GatedFfnTraining rejects bad calls with twell::Error") {
  using testing::code_of;
  const FfnShape s{4, 8, 12};
  const Weights<float> w(s, testing::fresh_seed());
  const auto dy = testing::random_dense<float>(s.m, s.k, 1.0f, testing::fresh_seed());
  DenseMatrix<float> y(s.m, s.k), dx(s.m, s.k), dwg(s.k, s.n), dwu(s.k, s.n), dwd(s.n, s.k), wide(s.k, s.n + 1);
  const GatedFfnGradientViews<float> grads{dx.view(), dwg.view(), dwu.view(), dwd.view()};
  CHECK(code_of([&] { GatedFfnTraining<float>(-1, s.k, s.n, MemorySpace::host); }) == ErrorCode::invalid_argument);
  CHECK(code_of([&] { GatedFfnTraining<float>(s.m, s.k, s.n, MemorySpace::host, {}, TwellLayout{24, 16}); }) ==
        ErrorCode::invalid_argument);
  CHECK(code_of([&] { GatedFfnTraining<float>(s.m, s.k, s.n, MemorySpace::host, {}, {}, -5); }) ==
        ErrorCode::invalid_argument);
  CHECK(code_of([&] {
          GatedFfnTraining<float>(s.m, s.k, s.n, MemorySpace::host, ActivationSpec{static_cast<Activation>(9), 0.0f});
        }) == ErrorCode::invalid_argument);
  GatedFfnTraining<float> step(s.m, s.k, s.n, MemorySpace::host);
  const auto backward = [&](const GatedFfnGradientViews<float>& g) {
    return step.backward(w.x.view(), w.wg.view(), w.wu.view(), w.wd.view(), dy.view(), 0.1f,
                         L1Normalization::per_token, g);
  };
  CHECK(code_of([&] { backward(grads); }) == ErrorCode::invalid_argument);  // no forward yet
  CHECK(code_of([&] { step.activations(); }) == ErrorCode::invalid_argument);
  // A batch of another size or another intermediate size than the object's.
  const Weights<float> other({s.m + 1, s.k, s.n + 4}, testing::fresh_seed());
  DenseMatrix<float> y_other(s.m + 1, s.k);
  CHECK(code_of([&] {
          step.forward(other.x.view(), other.wg.view(), other.wu.view(), other.wd.view(), y_other.view());
        }) == ErrorCode::shape_mismatch);
  const Weights<float> wider({s.m, s.k, s.n + 4}, testing::fresh_seed());
  CHECK(code_of([&] { step.forward(w.x.view(), wider.wg.view(), wider.wu.view(), wider.wd.view(), y.view()); }) ==
        ErrorCode::shape_mismatch);
  step.forward(w.x.view(), w.wg.view(), w.wu.view(), w.wd.view(), y.view());
  CHECK_NOTHROW(backward(grads));
  CHECK(code_of([&] { backward({dx.view(), wide.view(), dwu.view(), dwd.view()}); }) == ErrorCode::shape_mismatch);
  DenseView<float> dwd_dev = dwd.view();
  dwd_dev.space = MemorySpace::device;
  CHECK(code_of([&] { backward({dx.view(), dwg.view(), dwu.view(), dwd_dev}); }) == ErrorCode::space_mismatch);
  // Errors name the operand: dy (not "y"), and which operand is in the other memory space.
  const DenseView<const float> dy_short{dy.view().data, s.m - 1, s.k, s.k, MemorySpace::host};
  CHECK(testing::message_of([&] {
          step.backward(w.x.view(), w.wg.view(), w.wu.view(), w.wd.view(), dy_short, 0.1f, L1Normalization::per_token,
                        grads);
        }).find("dy is 3 x 8 but x needs 4 x 8") != std::string::npos);
  DenseView<const float> wd_elsewhere = w.wd.view();
  wd_elsewhere.space = MemorySpace::device;
  CHECK(testing::message_of([&] {
          step.backward(w.x.view(), w.wg.view(), w.wu.view(), wd_elsewhere, dy.view(), 0.1f, L1Normalization::per_token,
                        grads);
        }).find("but wd is in device memory") != std::string::npos);
  // A dx whose rows overlap is refused before any gradient is written (dwd is written first).
  DenseView<float> dx_overlapping = dx.view();
  dx_overlapping.ld = s.k - 1;
  std::fill(dwd.values().data(), dwd.values().data() + dwd.values().size(), 42.0f);
  CHECK(code_of([&] { backward({dx_overlapping, dwg.view(), dwu.view(), dwd.view()}); }) ==
        ErrorCode::invalid_argument);
  CHECK(
      std::all_of(dwd.values().data(), dwd.values().data() + dwd.values().size(), [](float v) { return v == 42.0f; }));
  // A gradient over an input or over another gradient is refused before any is written (dx is
  // written before dwd's product, which would refuse C over B on its own).
  std::fill(dx.values().data(), dx.values().data() + dx.values().size(), 42.0f);
  DenseMatrix<float> dy_and_dwd(s.n + s.m, s.k);
  const DenseView<float> dwd_over_dy{dy_and_dwd.view().data, s.n, s.k, s.k, MemorySpace::host};
  const DenseView<const float> dy_under_dwd{dy_and_dwd.view().data + (s.n - 1) * s.k, s.m, s.k, s.k, MemorySpace::host};
  CHECK(code_of([&] {
          step.backward(w.x.view(), w.wg.view(), w.wu.view(), w.wd.view(), dy_under_dwd, 0.1f,
                        L1Normalization::per_token, {dx.view(), dwg.view(), dwu.view(), dwd_over_dy});
        }) == ErrorCode::invalid_argument);
  CHECK(code_of([&] { backward({dx.view(), dwg.view(), dwg.view(), dwd.view()}); }) == ErrorCode::invalid_argument);
  for (const DenseMatrix<float>* kept : {&dx, &dwd})
    CHECK(std::all_of(kept->values().data(), kept->values().data() + kept->values().size(),
                      [](float v) { return v == 42.0f; }));
  CHECK(code_of([&] {
          step.backward(w.x.view(), w.wg.view(), w.wu.view(), w.wd.view(), dy.view(), -1.0f,
                        L1Normalization::per_token, grads);
        }) == ErrorCode::invalid_argument);
  DenseView<const float> x_dev = w.x.view();
  x_dev.space = MemorySpace::device;
  CHECK(code_of([&] { step.forward(x_dev, w.wg.view(), w.wu.view(), w.wd.view(), y.view()); }) ==
        ErrorCode::space_mismatch);
  // A call its checks reject changes nothing: the activations of the last forward stay.
  CHECK_NOTHROW(backward(grads));
  // wu's leading dimension is checked with the shapes, before the gate runs (the up projection
  // once caught it after, which left the object without activations): the last ones stay.
  DenseView<const float> wu_overlapping = w.wu.view();
  wu_overlapping.ld = s.n - 1;
  CHECK(testing::message_of([&] {
          step.forward(w.x.view(), w.wg.view(), wu_overlapping, w.wd.view(), y.view());
        }).find("wu has leading dimension 11 below its 12 columns") != std::string::npos);
  CHECK_NOTHROW(backward(grads));
  // So is x's in the backward: dx and dwd, written before x is read, stay as they were.
  const DenseView<const float> x_overlapping{w.x.view().data, s.m, s.k, s.k - 1, MemorySpace::host};
  std::fill(dx.values().data(), dx.values().data() + dx.values().size(), 42.0f);
  std::fill(dwd.values().data(), dwd.values().data() + dwd.values().size(), 42.0f);
  CHECK(testing::message_of([&] {
          step.backward(x_overlapping, w.wg.view(), w.wu.view(), w.wd.view(), dy.view(), 0.1f,
                        L1Normalization::per_token, grads);
        }).find("x has leading dimension 7 below its 8 columns") != std::string::npos);
  for (const DenseMatrix<float>* kept : {&dx, &dwd})
    CHECK(std::all_of(kept->values().data(), kept->values().data() + kept->values().size(),
                      [](float v) { return v == 42.0f; }));
  GatedFfnTraining<float> moved = std::move(step);
  CHECK(code_of([&] { step.forward(w.x.view(), w.wg.view(), w.wu.view(), w.wd.view(), y.view()); }) ==
        ErrorCode::invalid_argument);
  CHECK(code_of([&] { step.path(); }) == ErrorCode::invalid_argument);
  CHECK(code_of([&] { step.overflow_capacity(); }) == ErrorCode::invalid_argument);
  CHECK(moved.path() == "composed:reference");
}

TEST_CASE("GatedFfnTraining grows its Hybrids to at most M rows") {
  // Dense random weights make nearly every row overflow layout {16, 4}: R > capacity 20 and
  // 2 x 20 > M = 33, so the growth is capped at M.
  const FfnShape s{33, 64, 96};
  const Weights<float> w(s, testing::fresh_seed());
  DenseMatrix<float> y(s.m, s.k);
  GatedFfnTraining<float> step(s.m, s.k, s.n, MemorySpace::host, {}, TwellLayout{16, 4}, 20);
  CHECK(step.overflow_capacity() == 20);
  step.forward(w.x.view(), w.wg.view(), w.wu.view(), w.wd.view(), y.view());
  REQUIRE(step.activations().a.overflow_rows() > 20);
  CHECK(step.overflow_capacity() == s.m);
  // A default capacity is never more than M either.
  CHECK(GatedFfnTraining<float>(5, s.k, s.n, MemorySpace::host).overflow_capacity() == 5);
}

TEST_CASE("GatedFfnTraining on the host: empty batches and sizes") {
  // No tokens, no intermediate units, no hidden units: empty sums, zero gradients, no error.
  for (const FfnShape s : {FfnShape{0, 8, 16}, FfnShape{5, 8, 0}, FfnShape{5, 0, 16}}) {
    CAPTURE(s.m);
    CAPTURE(s.k);
    CAPTURE(s.n);
    for (const ActivationSpec act : {ActivationSpec{}, ActivationSpec{Activation::silu, 0.1f}}) {
      const Weights<float> w(s, testing::fresh_seed());
      const auto dy = testing::random_dense<float>(s.m, s.k, 1.0f, testing::fresh_seed());
      DenseMatrix<float> y(s.m, s.k), dx(s.m, s.k), dwg(s.k, s.n), dwu(s.k, s.n), dwd(s.n, s.k);
      for (DenseMatrix<float>* g : {&y, &dx, &dwg, &dwu, &dwd})
        for (float& v : g->values().host_span()) v = NAN;  // every output must be written
      GatedFfnTraining<float> step(s.m, s.k, s.n, MemorySpace::host, act);
      step.forward(w.x.view(), w.wg.view(), w.wu.view(), w.wd.view(), y.view());
      const double l1 = step.backward(w.x.view(), w.wg.view(), w.wu.view(), w.wd.view(), dy.view(), 0.1f,
                                      L1Normalization::per_entry, {dx.view(), dwg.view(), dwu.view(), dwd.view()});
      CHECK(l1 == 0.0);
      for (const DenseMatrix<float>* g : {&y, &dx, &dwg, &dwu, &dwd})
        for (const float v : g->values().host_span()) CHECK(v == 0.0f);
    }
  }
}

TEST_CASE("FFN bad inputs throw twell::Error with the right code") {
  using testing::code_of;
  const FfnShape s{4, 8, 12};
  const Weights<float> w(s, testing::fresh_seed());
  const auto wrong = testing::random_dense<float>(s.k + 1, s.n, 1.0f, testing::fresh_seed());
  const auto dy = testing::random_dense<float>(s.m, s.k, 1.0f, testing::fresh_seed());
  DenseMatrix<float> y(s.m, s.k), wrong_y(s.m, s.k + 1);
  const ActivationSpec relu{};

  CHECK(code_of([&] {
          ref::gated_ffn_forward<float>(w.x.view(), wrong.view(), w.wu.view(), w.wd.view(), relu, y.view());
        }) == ErrorCode::shape_mismatch);
  CHECK(code_of([&] {
          ref::gated_ffn_forward<float>(w.x.view(), w.wg.view(), w.wu.view(), w.wg.view(), relu, y.view());
        }) == ErrorCode::shape_mismatch);
  CHECK(code_of([&] { ref::ffn_forward<float>(w.x.view(), w.wu.view(), w.wd.view(), relu, wrong_y.view()); }) ==
        ErrorCode::shape_mismatch);
  CHECK(code_of([&] {
          ref::gated_ffn_backward<float>(w.x.view(), w.wg.view(), w.wu.view(), w.wd.view(), dy.view(), relu, -1.0f,
                                         L1Normalization::per_token);
        }) == ErrorCode::invalid_argument);
  CHECK(code_of([&] {
          ref::gated_ffn_backward<float>(w.x.view(), w.wg.view(), w.wu.view(), w.wd.view(), dy.view(), relu, 0.1f,
                                         static_cast<L1Normalization>(5));
        }) == ErrorCode::invalid_argument);
  CHECK(code_of([&] {
          ref::gated_ffn_backward<float>(w.x.view(), w.wg.view(), w.wu.view(), w.wd.view(), wrong_y.view(), relu, 0.1f,
                                         L1Normalization::per_token);
        }) == ErrorCode::shape_mismatch);
  CHECK(code_of([&] {
          sparse_gated_ffn_forward<float>(w.x.view(), wrong.view(), w.wu.view(), w.wd.view(), relu, TwellLayout{},
                                          y.view());
        }) == ErrorCode::shape_mismatch);
  CHECK(code_of([&] {
          sparse_gated_ffn_forward<float>(w.x.view(), w.wg.view(), w.wu.view(), w.wd.view(), relu, TwellLayout{24, 16},
                                          y.view());
        }) == ErrorCode::invalid_argument);
  DenseView<float> y_dev = y.view();
  y_dev.space = MemorySpace::device;
  CHECK(code_of([&] {
          sparse_gated_ffn_forward<float>(w.x.view(), w.wg.view(), w.wu.view(), w.wd.view(), relu, TwellLayout{},
                                          y_dev);
        }) == ErrorCode::space_mismatch);
  DenseView<const float> x_dev = w.x.view();
  x_dev.space = MemorySpace::device;
  CHECK(code_of([&] { ref::ffn_forward<float>(x_dev, w.wu.view(), w.wd.view(), relu, y.view()); }) ==
        ErrorCode::space_mismatch);

  // The sparse backward: activations of this batch and of their activation, the reference's checks.
  const auto saved = sparse_gated_ffn_training_forward<float>(w.x.view(), w.wg.view(), w.wu.view(), w.wd.view(), relu,
                                                              TwellLayout{}, y.view());
  const auto backward = [&](const GatedFfnActivations<float>& a, DenseView<const float> x, float lambda) {
    return sparse_gated_ffn_backward<float>(a, x, w.wg.view(), w.wu.view(), w.wd.view(), dy.view(), lambda,
                                            L1Normalization::per_token);
  };
  CHECK(code_of([&] { backward(saved, w.x.view(), -1.0f); }) == ErrorCode::invalid_argument);
  // An infinite or NaN lambda would make every gradient on the pattern infinite or NaN.
  CHECK(code_of([&] { backward(saved, w.x.view(), std::numeric_limits<float>::infinity()); }) ==
        ErrorCode::invalid_argument);
  CHECK(code_of([&] { backward(saved, w.x.view(), std::numeric_limits<float>::quiet_NaN()); }) ==
        ErrorCode::invalid_argument);
  CHECK(code_of([&] {
          ref::gated_ffn_backward<float>(w.x.view(), w.wg.view(), w.wu.view(), w.wd.view(), dy.view(), relu,
                                         std::numeric_limits<float>::infinity(), L1Normalization::per_token);
        }) == ErrorCode::invalid_argument);
  const Weights<float> other({s.m + 1, s.k, s.n}, testing::fresh_seed());
  DenseMatrix<float> y_other(s.m + 1, s.k);
  const auto saved_other = sparse_gated_ffn_training_forward<float>(
      other.x.view(), w.wg.view(), w.wu.view(), w.wd.view(), relu, TwellLayout{}, y_other.view());
  CHECK(code_of([&] { backward(saved_other, w.x.view(), 0.1f); }) == ErrorCode::shape_mismatch);
  // A ReLU forward's activations relabelled GELU lack g, the pre-activation GELU's derivative needs.
  GatedFfnActivations<float> as_gelu = sparse_gated_ffn_training_forward<float>(
      w.x.view(), w.wg.view(), w.wu.view(), w.wd.view(), relu, TwellLayout{}, y.view());
  as_gelu.act = ActivationSpec{Activation::gelu, 0.0f};
  CHECK(code_of([&] { backward(as_gelu, w.x.view(), 0.1f); }) == ErrorCode::shape_mismatch);
  // A GELU forward's g in another layout; an unknown activation kind.
  GatedFfnActivations<float> gelu = sparse_gated_ffn_training_forward<float>(
      w.x.view(), w.wg.view(), w.wu.view(), w.wd.view(), ActivationSpec{Activation::gelu, 0.1f}, TwellLayout{},
      y.view());
  CHECK_NOTHROW(backward(gelu, w.x.view(), 0.1f));
  gelu.g = HybridMatrix<float>(s.m, s.n, TwellLayout{16, 4}, 0);
  CHECK(code_of([&] { backward(gelu, w.x.view(), 0.1f); }) == ErrorCode::shape_mismatch);
  gelu.act.kind = static_cast<Activation>(9);
  CHECK(code_of([&] { backward(gelu, w.x.view(), 0.1f); }) == ErrorCode::invalid_argument);
  GatedFfnActivations<float> mixed = sparse_gated_ffn_training_forward<float>(
      w.x.view(), w.wg.view(), w.wu.view(), w.wd.view(), relu, TwellLayout{}, y.view());
  mixed.u = HybridMatrix<float>(s.m, s.n, TwellLayout{16, 4}, 0);
  CHECK(code_of([&] { backward(mixed, w.x.view(), 0.1f); }) == ErrorCode::shape_mismatch);

  // Found by an adversarial probe (2026-12-02): a moved-from saved part keeps its shape but not
  // its storage, and reached the inner operations (malformed, naming them); the free forwards
  // named gemm_to_sparse for their own activation and layout; OutIn weights in two memory spaces
  // were no_device in a build without CUDA, where InOut ones are space_mismatch; an spmm
  // algorithm outside the enum passed on the host.
  GatedFfnActivations<float> moved = sparse_gated_ffn_training_forward<float>(
      w.x.view(), w.wg.view(), w.wu.view(), w.wd.view(), relu, TwellLayout{}, y.view());
  const HybridMatrix<float> taken = std::move(moved.h);
  CHECK(code_of([&] { backward(moved, w.x.view(), 0.1f); }) == ErrorCode::shape_mismatch);
  CHECK(testing::message_of([&] { backward(moved, w.x.view(), 0.1f); }).find("the saved h has no storage") !=
        std::string::npos);
  const ActivationSpec unknown{static_cast<Activation>(7), 0.0f};
  CHECK(testing::message_of([&] {
          sparse_gated_ffn_forward<float>(w.x.view(), w.wg.view(), w.wu.view(), w.wd.view(), unknown, TwellLayout{},
                                          y.view());
        }).find("twell::sparse_gated_ffn_forward") != std::string::npos);
  CHECK(testing::message_of([&] {
          sparse_ffn_forward<float>(w.x.view(), w.wu.view(), w.wd.view(), relu, TwellLayout{24, 16}, y.view());
        }).find("twell::sparse_ffn_forward") != std::string::npos);
  CHECK(testing::message_of([&] {
          sparse_gated_ffn_training_forward<float>(w.x.view(), w.wg.view(), w.wu.view(), w.wd.view(), unknown,
                                                   TwellLayout{}, y.view());
        }).find("twell::sparse_gated_ffn_training_forward") != std::string::npos);
  const auto wu_t = testing::random_dense<float>(s.n, s.k, 1.0f, testing::fresh_seed());
  DenseView<const float> wu_t_dev = wu_t.view();
  wu_t_dev.space = MemorySpace::device;
  const auto wg_t = testing::random_dense<float>(s.n, s.k, 1.0f, testing::fresh_seed());
  const auto wd_t = testing::random_dense<float>(s.k, s.n, 1.0f, testing::fresh_seed());
  CHECK(code_of([&] {
          GatedFfn<float>(s.m, OutIn<float>{wg_t.view()}, OutIn<float>{wu_t_dev}, OutIn<float>{wd_t.view()});
        }) == ErrorCode::space_mismatch);
  KernelOptions bad_algorithm;
  bad_algorithm.spmm_algorithm = static_cast<SpmmAlgorithm>(99);
  CHECK(code_of([&] {
          sparse_gated_ffn_forward<float>(w.x.view(), w.wg.view(), w.wu.view(), w.wd.view(), relu, TwellLayout{},
                                          y.view(), bad_algorithm);
        }) == ErrorCode::invalid_argument);
}

// Found by a review (2026-12-01): y over an input was accepted by the forwards (a training
// forward then overwrote x, and the backward's weight gradients were wrong without an error), or
// refused late by the inner spmm, after the gate ran; errors named a probe "x" or transpose's "a"
// instead of the weight; the free forwards reported their last step's path.
TEST_CASE("FFN forwards refuse y over x or a weight up front, and name what they check") {
  using testing::message_of;
  const FfnShape s{4, 8, 12};
  const Weights<float> w(s, testing::fresh_seed());
  const ActivationSpec relu{};
  DenseMatrix<float> y(s.m, s.k);
  // x itself as y, and y as the first M x K values of wd (N x K, N > M).
  DenseMatrix<float> x_copy = w.x.to(MemorySpace::host);
  const DenseView<float> y_on_x = x_copy.view();
  DenseMatrix<float> wd_copy = w.wd.to(MemorySpace::host);
  const DenseView<float> y_on_wd{wd_copy.values().data(), s.m, s.k, s.k, MemorySpace::host};
  const DenseView<const float> x = std::as_const(x_copy).view(), wd = std::as_const(wd_copy).view();
  const auto refused = [](const std::string& m, const char* what) {
    CAPTURE(m);
    CHECK(m.find(what) != std::string::npos);
  };
  for (const auto& [out, name] : {std::pair{y_on_x, "y overlaps x"}, std::pair{y_on_wd, "y overlaps wd"}}) {
    refused(message_of([&] { sparse_gated_ffn_forward<float>(x, w.wg.view(), w.wu.view(), wd, relu, {}, out); }), name);
    refused(message_of([&] { sparse_ffn_forward<float>(x, w.wu.view(), wd, relu, {}, out); }), name);
    refused(message_of([&] {
              (void)sparse_gated_ffn_training_forward<float>(x, w.wg.view(), w.wu.view(), wd, relu, {}, out);
            }),
            name);
    GatedFfn<float> gated(s.m, w.wg.view(), w.wu.view(), wd);
    refused(message_of([&] { gated.forward(x, out); }), name);
    Ffn<float> plain(s.m, w.wu.view(), wd);
    refused(message_of([&] { plain.forward(x, out); }), name);
    // The training object keeps the activations of its last good forward.
    GatedFfnTraining<float> step(s.m, s.k, s.n, MemorySpace::host);
    step.forward(x, w.wg.view(), w.wu.view(), wd, y.view());
    refused(message_of([&] { step.forward(x, w.wg.view(), w.wu.view(), wd, out); }), name);
    CHECK_NOTHROW((void)step.activations());
  }
  // The weights are named as the caller passed them.
  refused(message_of([&] {
            GatedFfn<float>(s.m, w.wg.view(), DenseView<const float>{w.wu.values().data(), -3, s.n, s.n}, w.wd.view());
          }),
          "wu has negative shape");
  const DenseView<const float> short_ld{w.wg.values().data(), s.n, s.k, 3};  // N x K, OutIn
  refused(message_of([&] {
            GatedFfn<float>(s.m, OutIn<float>{short_ld}, OutIn<float>{w.wu.view()}, OutIn<float>{w.wd.view()});
          }),
          "wg has leading dimension 3");
  // The free forwards report their own path, not their last step's.
  KernelReport report;
  KernelOptions options;
  options.report = &report;
  sparse_gated_ffn_forward<float>(w.x.view(), w.wg.view(), w.wu.view(), w.wd.view(), relu, {}, y.view(), options);
  CHECK(report.path == "composed:reference");
  report.path.clear();
  sparse_ffn_forward<float>(w.x.view(), w.wu.view(), w.wd.view(), relu, {}, y.view(), options);
  CHECK(report.path == "composed:reference");
  report.path.clear();
  (void)sparse_gated_ffn_training_forward<float>(w.x.view(), w.wg.view(), w.wu.view(), w.wd.view(), relu, {}, y.view(),
                                                 options);
  CHECK(report.path == "composed:reference");
}
