// Internal: the argument checks and the compositions of public operations that the FFN's free
// functions, layers (ffn.cpp) and training object (ffn_training.cpp) share. Each composition takes
// its outputs and intermediates as views and its spmm as a callable, so that one body serves
// storage allocated per call and storage a plan holds.
#pragma once

#include <array>
#include <cstdint>
#include <functional>
#include <initializer_list>
#include <span>
#include <string>
#include <utility>

#include <twell/error.hpp>
#include <twell/ffn.hpp>
#include <twell/kernels/detail/checks.hpp>
#include <twell/ops.hpp>

namespace twell::ffn_detail {

inline std::string shape(std::int64_t rows, std::int64_t cols) {
  return std::to_string(rows) + " x " + std::to_string(cols);
}

// Checked here so that a mistake is reported with the FFN's names, not an inner operation's;
// y_name names the M x K operand (y, or dy in the backward).
template <class T>
void check_shapes(const char* where, DenseView<const T> x, DenseView<const T> w_in, DenseView<const T> wd,
                  In<DenseView<const T>> y, const char* y_name) {
  // Geometry first: an inner operation would find a bad ld or pointer only after others had
  // written their outputs (the training backward's dx and dwd), and name the operand its own way.
  detail::check_dense_geometry(x, where, "x");
  detail::check_dense_geometry(w_in, where, "wu");
  detail::check_dense_geometry(wd, where, "wd");
  detail::check_dense_geometry(DenseView<const T>(y), where, y_name);
  const std::int64_t m = x.rows, k = x.cols, n = w_in.cols;
  require(w_in.rows == k, ErrorCode::shape_mismatch, where, "x is ", shape(m, k), " but wu is ",
          shape(w_in.rows, w_in.cols));
  require(wd.rows == n && wd.cols == k, ErrorCode::shape_mismatch, where, "wd is ", shape(wd.rows, wd.cols),
          " but x and wu need ", shape(n, k));
  require(y.rows == m && y.cols == k, ErrorCode::shape_mismatch, where, y_name, " is ", shape(y.rows, y.cols),
          " but x needs ", shape(m, k));
}

// The path a composed FFN call reports, on the backend of its operands (its steps report their
// own, which the call's replaces).
inline std::string composed_path(MemorySpace space) {
  return space == MemorySpace::device ? "composed:cuda" : "composed:reference";
}

// An FFN object's overflow block: at least 0 rows, or kDefaultFfnCapacity (the object picks it).
inline void check_overflow_capacity(std::int64_t capacity, const char* where) {
  require(capacity >= 0 || capacity == kDefaultFfnCapacity, ErrorCode::invalid_argument, where, "overflow capacity ",
          capacity, " is negative");
}

// Every operand in x's memory space; a mismatch names the operand.
inline void check_spaces(const char* where, MemorySpace x,
                         std::initializer_list<std::pair<const char*, MemorySpace>> rest) {
  for (const auto& [name, space] : rest)
    require(space == x, ErrorCode::space_mismatch, where, "x is in ", to_string(x), " memory but ", name, " is in ",
            to_string(space), " memory");
}

// The M x K operand of a check: the forward's result y, which shares no byte with x or the
// weights (a training forward's x is also kept for the backward), or the backward's input dy.
enum class Rows { y, dy };

// The activation and the gate's layout, under the FFN call's name (the operations it composes
// would report them under their own).
inline void check_settings(const char* where, ActivationSpec act, const TwellLayout& layout) {
  check_layout(layout, where);
  detail::check_activation(act, where);
}

template <class T>
void check_gated(const char* where, DenseView<const T> x, DenseView<const T> wg, DenseView<const T> wu,
                 DenseView<const T> wd, In<DenseView<const T>> y, Rows rows = Rows::y) {
  const char* y_name = rows == Rows::y ? "y" : "dy";
  check_shapes(where, x, wu, wd, y, y_name);
  detail::check_dense_geometry(wg, where, "wg");
  require(wg.rows == wu.rows && wg.cols == wu.cols, ErrorCode::shape_mismatch, where, "wg is ", shape(wg.rows, wg.cols),
          " but wu is ", shape(wu.rows, wu.cols));
  check_spaces(where, x.space, {{"wg", wg.space}, {"wu", wu.space}, {"wd", wd.space}, {y_name, y.space}});
  if (rows == Rows::y) detail::check_apart(y, "y", {{"x", x}, {"wg", wg}, {"wu", wu}, {"wd", wd}}, where);
}

template <class T>
void check_plain(const char* where, DenseView<const T> x, DenseView<const T> wu, DenseView<const T> wd,
                 DenseView<T> y) {
  check_shapes(where, x, wu, wd, y, "y");
  check_spaces(where, x.space, {{"wu", wu.space}, {"wd", wd.space}, {"y", y.space}});
  detail::check_apart(y, "y", {{"x", x}, {"wu", wu}, {"wd", wd}}, where);
}

// An empty Hybrid with `like`'s shape, layout and overflow row count, in its memory space.
template <class T>
HybridMatrix<T> hybrid_like(const HybridMatrix<T>& like) {
  return HybridMatrix<T>(like.rows(), like.cols(), like.layout(), like.overflow_rows(), like.space());
}

// spmm on whichever backend holds the operands, as the compositions below call it.
template <class T>
auto spmm_on_backend(const KernelOptions& options) {
  return [options](Op op, HybridView<const T> a, DenseView<const T> b, DenseView<T> c, float alpha, float beta) {
    spmm<T>(op, a, b, c, alpha, beta, options);
  };
}

// The backward's products on A^T (its weight gradients): C_i = A_i^T B_i for each i, at most three.
template <class T>
using ProductsOnTranspose = std::function<void(std::span<const HybridView<const T>> a,
                                               std::span<const DenseView<const T>> b, std::span<const DenseView<T>> c)>;

// The products on whichever backend holds the operands, one spmm after another.
template <class T>
ProductsOnTranspose<T> products_on_backend(const KernelOptions& options) {
  return [options](std::span<const HybridView<const T>> a, std::span<const DenseView<const T>> b,
                   std::span<const DenseView<T>> c) {
    for (std::size_t i = 0; i < a.size(); ++i) spmm<T>(Op::transpose, a[i], b[i], c[i], 1.0f, 0.0f, options);
  };
}

// The saved activations of an M x N gate in `space`: u, h (and g for SiLU and GELU) share a's
// layout and overflow rows, because the operations of the backward index them by a's structure.
template <class T>
void check_saved(const char* where, const GatedFfnActivationViews<T>& saved, std::int64_t m, std::int64_t n,
                 MemorySpace space) {
  twell::detail::check_activation(saved.act, where);
  const bool relu = saved.act.kind == Activation::relu;
  require(relu || saved.g.rows() > 0 || m == 0, ErrorCode::shape_mismatch, where,
          "SiLU and GELU need the pre-activation g on the pattern (saved.g), which the training forward keeps for "
          "them; these activations have none");
  const HybridView<const T> parts[] = {saved.a, saved.u, saved.h, saved.g};
  const char* const names[] = {"a", "u", "h", "g"};
  for (std::size_t i = 0; i < (relu ? 3u : 4u); ++i) {
    const HybridView<const T>& part = parts[i];
    require(part.rows() == m && part.cols() == n, ErrorCode::shape_mismatch, where, "the saved activations are ",
            shape(part.rows(), part.cols()), " but x and wu need ", shape(m, n));
    // A moved-from Hybrid keeps its shape but not its storage.
    require(part.twell.packed != nullptr || m == 0 || part.twell.packed_width() == 0, ErrorCode::shape_mismatch, where,
            "the saved ", names[i], " has no storage (moved from?)");
    require(part.space() == space, ErrorCode::space_mismatch, where, "x is in ", to_string(space),
            " memory but the saved activations are in ", to_string(part.space()), " memory");
    require(part.twell.layout == saved.a.twell.layout && part.overflow_rows() == saved.a.overflow_rows(),
            ErrorCode::shape_mismatch, where,
            "the saved u, h (and g for SiLU and GELU) must share a's layout and overflow rows (as the training "
            "forward makes them)");
  }
}

// lambda / Z of the L1 term, with Z = M (per_token) or M N (per_entry); 0 for an empty batch,
// whose L1 term and gradients are all empty sums.
struct L1Scale {
  double z = 0.0;
  double scale = 0.0;
};
inline L1Scale l1_scale(const char* where, float lambda, L1Normalization norm, std::int64_t m, std::int64_t n) {
  check_l1_penalty(lambda, norm, where);
  L1Scale s;
  s.z = norm == L1Normalization::per_token ? double(m) : double(m) * double(n);
  s.scale = s.z > 0.0 ? double(lambda) / s.z : 0.0;
  return s;
}

// The gated forward after its gate a = act(x wg): u = x wu on a's pattern, h = a * u, g = x wg on
// the pattern when `g` is given (SiLU and GELU training: the backward needs act'(g)), and
// y = h wd through spmm(op, A, B, C, alpha, beta). u and h may be one view (inference keeps
// neither), and u, h, g may share a's maps or hold their own (the operations copy them then).
template <class T, class Spmm>
void gated_after_gate(DenseView<const T> x, DenseView<const T> wg, DenseView<const T> wu, DenseView<const T> wd,
                      HybridView<const T> a, HybridView<T> u, HybridView<T> h, const HybridView<T>* g,
                      DenseView<T> y, const KernelOptions& options, Spmm&& spmm) {
  sddmm<T>(x, Op::none, wu, a, u, 1.0f, 0.0f, options);
  multiply_on_pattern<T>(a, u, h, options);
  if (g != nullptr) sddmm<T>(x, Op::none, wg, a, *g, 1.0f, 0.0f, options);
  spmm(Op::none, HybridView<const T>(h), wd, y, 1.0f, 0.0f);
}

// What the backward computes into besides the gradients: dh, dg and du on a's structure (a's
// layout and overflow rows; dh unused, and may be empty, where BackwardRows runs) and two N x K
// dense matrices: dwg and dwu before their transposes (and a weight's transpose for a composed dx).
template <class T>
struct BackwardScratch {
  HybridView<T> dh, dg, du;
  std::array<DenseView<T>, 2> n_by_k;
};

// Runs the backward's rows in one kernel (cuda::GatedUpDownPlan::backward): dg and du on a's
// pattern and dx, from dh = dy wd^T + scale sign(h) that it does not store; empty where the
// backward composes them.
template <class T>
using BackwardRows = std::function<void(HybridView<T> dg, HybridView<T> du, DenseView<T> dx)>;

// The gradients of reference::gated_ffn_backward into `out` (checked by the caller), from the
// saved activations, with `scale` = lambda / Z; returns the L1 term, read back last so that the
// host waits only after everything is queued:
//   dh  = sddmm(dy, wd^T) on P, then + scale sign(h);
//   dg  = dh * u, times act'(g) for SiLU and GELU (ReLU's act' is 1 on P), du = dh * a;
//   dx = dg wg^T + du wu^T (these three by `rows` where given);
//   dwd = h^T dy; dwg = (dg^T x)^T, dwu = (du^T x)^T (these three products by `products`).
template <class T, class Spmm>
double gated_backward(const GatedFfnActivationViews<T>& s, DenseView<const T> x, DenseView<const T> wg,
                      DenseView<const T> wu, DenseView<const T> wd, DenseView<const T> dy, double scale,
                      const BackwardScratch<T>& w, const GatedFfnGradientViews<T>& out, const KernelOptions& options,
                      Spmm&& spmm, const ProductsOnTranspose<T>& products, const BackwardRows<T>& rows) {
  const HybridView<const T> dg(w.dg), du(w.du);
  const DenseView<const T> n_by_k_0(w.n_by_k[0]), n_by_k_1(w.n_by_k[1]);
  if (rows) {
    rows(w.dg, w.du, out.dx);
  } else {
    const HybridView<const T> dh(w.dh);
    sddmm<T>(dy, Op::transpose, wd, s.a, w.dh, 1.0f, 0.0f, options);
    add_scaled_sign<T>(dh, static_cast<float>(scale), s.h, w.dh, options);
    multiply_on_pattern<T>(dh, s.u, w.dg, options);
    if (s.act.kind != Activation::relu) multiply_by_activation_derivative<T>(dg, s.g, s.act.kind, w.dg, options);
    multiply_on_pattern<T>(dh, s.a, w.du, options);
    // spmm takes its dense operand as stored, so each weight is transposed into one N x K buffer
    // in turn (same stream: the second transpose waits for the first product).
    transpose<T>(wg, w.n_by_k[0], options);
    spmm(Op::none, dg, n_by_k_0, out.dx, 1.0f, 0.0f);
    transpose<T>(wu, w.n_by_k[0], options);
    spmm(Op::none, du, n_by_k_0, out.dx, 1.0f, 1.0f);
  }
  // dwd = h^T dy; the weights are K x N, so dg^T x and du^T x go N x K first. One call, so that a
  // plan runs the three together (SpmmPlan::run_transposed).
  const HybridView<const T> at_a[] = {s.h, dg, du};
  const DenseView<const T> at_b[] = {dy, x, x};
  const DenseView<T> at_c[] = {out.dwd, w.n_by_k[0], w.n_by_k[1]};
  products(at_a, at_b, at_c);
  transpose<T>(n_by_k_0, out.dwg, options);
  transpose<T>(n_by_k_1, out.dwu, options);
  return scale * l1_norm<T>(s.h, options);
}

}  // namespace twell::ffn_detail
