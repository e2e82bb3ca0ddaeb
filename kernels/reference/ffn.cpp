// Dense reference FFN forward and backward: fp32 Eigen products, storage T at the boundary.
#include <cmath>

#include <twell/instantiate.hpp>
#include <twell/kernels/ffn.hpp>

#include "common.hpp"

namespace twell::reference {
namespace {

struct FfnShapes {
  std::int64_t m, k, n;
};

// x: M x K, w_in (wg, wu): K x N, wd: N x K; y (or dy): M x K.
template <class T>
FfnShapes check_ffn(const char* where, DenseView<const T> x, DenseView<const T> w_in, DenseView<const T> wd,
                    const ActivationSpec& act) {
  detail::check_host_operand(x, where, "x");
  detail::check_host_operand(w_in, where, "wu");
  detail::check_host_operand(wd, where, "wd");
  twell::detail::check_activation(act, where);
  const FfnShapes s{x.rows, x.cols, w_in.cols};
  require(w_in.rows == s.k, ErrorCode::shape_mismatch, where, "x is ", detail::shape(x.rows, x.cols), " but wu is ",
          detail::shape(w_in.rows, w_in.cols));
  require(wd.rows == s.n && wd.cols == s.k, ErrorCode::shape_mismatch, where, "wd is ", detail::shape(wd.rows, wd.cols),
          " but x ", detail::shape(x.rows, x.cols), " and wu ", detail::shape(w_in.rows, w_in.cols), " need ",
          detail::shape(s.n, s.k));
  return s;
}

template <class T>
void check_gate(const char* where, DenseView<const T> wg, DenseView<const T> wu) {
  detail::check_host_operand(wg, where, "wg");
  require(wg.rows == wu.rows && wg.cols == wu.cols, ErrorCode::shape_mismatch, where, "wg is ",
          detail::shape(wg.rows, wg.cols), " but wu is ", detail::shape(wu.rows, wu.cols));
}

template <class T>
void check_out(const char* where, const char* name, DenseView<T> y, const FfnShapes& s) {
  detail::check_host_operand(y, where, name);
  detail::require_shape(y.rows, y.cols, s.m, s.k, where, name, "x");
}

detail::MatrixF activated(const detail::MatrixF& g, const ActivationSpec& act) {
  return g.unaryExpr([&](float v) { return detail::activate_thresholded(act, v); });
}

}  // namespace

template <Value T>
void gated_ffn_forward(DenseView<const T> x, DenseView<const T> wg, DenseView<const T> wu, DenseView<const T> wd,
                       ActivationSpec act, DenseView<T> y, const KernelOptions& options) {
  constexpr const char* where = "twell::reference::gated_ffn_forward";
  const FfnShapes s = check_ffn(where, x, wu, wd, act);
  check_gate(where, wg, wu);
  check_out(where, "y", y, s);
  const detail::MatrixF xf = detail::to_matrix(x);
  const detail::MatrixF h = activated(xf * detail::to_matrix(wg), act).cwiseProduct(xf * detail::to_matrix(wu));
  detail::store_matrix(detail::MatrixF(h * detail::to_matrix(wd)), y);
  detail::report_path(options, "reference/gated_ffn_forward");
}

template <Value T>
void ffn_forward(DenseView<const T> x, DenseView<const T> wu, DenseView<const T> wd, ActivationSpec act, DenseView<T> y,
                 const KernelOptions& options) {
  constexpr const char* where = "twell::reference::ffn_forward";
  const FfnShapes s = check_ffn(where, x, wu, wd, act);
  check_out(where, "y", y, s);
  const detail::MatrixF h = activated(detail::to_matrix(x) * detail::to_matrix(wu), act);
  detail::store_matrix(detail::MatrixF(h * detail::to_matrix(wd)), y);
  detail::report_path(options, "reference/ffn_forward");
}

template <Value T>
GatedFfnGradients<T> gated_ffn_backward(DenseView<const T> x, DenseView<const T> wg, DenseView<const T> wu,
                                        DenseView<const T> wd, DenseView<const T> dy, ActivationSpec act, float lambda,
                                        L1Normalization norm, const KernelOptions& options) {
  constexpr const char* where = "twell::reference::gated_ffn_backward";
  const FfnShapes s = check_ffn(where, x, wu, wd, act);
  check_gate(where, wg, wu);
  check_out(where, "dy", dy, s);
  check_l1_penalty(lambda, norm, where);

  const detail::MatrixF xf = detail::to_matrix(x), wgf = detail::to_matrix(wg), wuf = detail::to_matrix(wu);
  const detail::MatrixF wdf = detail::to_matrix(wd), dyf = detail::to_matrix(dy);
  const detail::MatrixF g = xf * wgf, u = xf * wuf;
  const detail::MatrixF a = activated(g, act);
  const detail::MatrixF h = a.cwiseProduct(u);

  GatedFfnGradients<T> out;
  out.z = norm == L1Normalization::per_token ? double(s.m) : double(s.m) * double(s.n);
  // Z = 0 only for an empty batch, whose L1 term and gradients are all empty sums.
  const double scale = out.z > 0.0 ? double(lambda) / out.z : 0.0;
  double l1 = 0.0;
  for (std::int64_t i = 0; i < s.m; ++i)
    for (std::int64_t j = 0; j < s.n; ++j) l1 += std::fabs(double(h(i, j)));
  out.l1_term = scale * l1;

  const detail::MatrixF dh_dense = dyf * wdf.transpose();
  detail::MatrixF dg = detail::MatrixF::Zero(s.m, s.n), du = detail::MatrixF::Zero(s.m, s.n);
  for (std::int64_t i = 0; i < s.m; ++i)
    for (std::int64_t j = 0; j < s.n; ++j) {
      if (std::fabs(a(i, j)) <= 0.0f) continue;  // outside the pattern (NaN is inside)
      const float hv = h(i, j);
      const float sign = hv > 0.0f ? 1.0f : (hv < 0.0f ? -1.0f : (std::isnan(hv) ? hv : 0.0f));
      const float dh = dh_dense(i, j) + static_cast<float>(scale) * sign;
      dg(i, j) = dh * u(i, j) * detail::activate_derivative(act.kind, g(i, j));
      du(i, j) = dh * a(i, j);
    }
  out.dwd = detail::to_dense_matrix<T>(h.transpose() * dyf);
  out.dx = detail::to_dense_matrix<T>(dg * wgf.transpose() + du * wuf.transpose());
  out.dwg = detail::to_dense_matrix<T>(xf.transpose() * dg);
  out.dwu = detail::to_dense_matrix<T>(xf.transpose() * du);
  detail::report_path(options, "reference/gated_ffn_backward");
  return out;
}

#define TWELL_INSTANTIATE(T)                                                                                         \
  template void gated_ffn_forward<T>(DenseView<const T>, DenseView<const T>, DenseView<const T>, DenseView<const T>, \
                                     ActivationSpec, DenseView<T>, const KernelOptions&);                            \
  template void ffn_forward<T>(DenseView<const T>, DenseView<const T>, DenseView<const T>, ActivationSpec,           \
                               DenseView<T>, const KernelOptions&);                                                  \
  template GatedFfnGradients<T> gated_ffn_backward<T>(DenseView<const T>, DenseView<const T>, DenseView<const T>,    \
                                                      DenseView<const T>, DenseView<const T>, ActivationSpec, float, \
                                                      L1Normalization, const KernelOptions&);
TWELL_FOR_EACH_VALUE_TYPE(TWELL_INSTANTIATE)
#undef TWELL_INSTANTIATE

}  // namespace twell::reference
