// Reference gemm_to_sparse: act(X W) in fp32, thresholded, rounded to T once, then packed by the
// reference dense -> Hybrid / dense -> TwELL converters. It materialises the dense product (the
// GPU kernel does not); being obviously right is its only job.
#include <twell/converters/backends.hpp>
#include <twell/instantiate.hpp>
#include <twell/kernels/backends.hpp>

#include "common.hpp"

namespace twell::reference {

template <Value T>
HybridMatrix<T> gemm_to_sparse(DenseView<const T> x, DenseView<const T> w, ActivationSpec act, TwellLayout layout,
                               const ConvertOptions& convert, const KernelOptions& options) {
  constexpr const char* where = "twell::reference::gemm_to_sparse";
  detail::check_host_operand(x, where, "X");
  detail::check_host_operand(w, where, "W");
  twell::detail::check_activation(act, where);
  check_layout(layout, where);
  require(w.rows == x.cols, ErrorCode::shape_mismatch, where, "X is ", detail::shape(x.rows, x.cols), " but W is ",
          detail::shape(w.rows, w.cols));
  twell::detail::check_gemm_convert_options(convert, where);

  const detail::MatrixF y = (detail::to_matrix(x) * detail::to_matrix(w)).unaryExpr([&](float v) {
    return detail::activate_thresholded(act, v);
  });
  const DenseMatrix<T> dense = detail::to_dense_matrix<T>(y);

  // The threshold has been applied in fp32 (convert.threshold is 0, checked above); the converters
  // only drop what rounded to zero.
  HybridMatrix<T> out;
  if (convert.overflow == OverflowPolicy::hybrid) {
    out = dense_to_hybrid<T>(dense.view(), layout, convert);
  } else {
    TwellMatrix<T> twell = detail::dense_to_twell_as<T>(dense.view(), layout, convert, where);
    out = HybridMatrix<T>(x.rows, w.cols, layout, 0);
    out.twell() = std::move(twell);
  }
  detail::report_path(options, "reference/gemm_to_sparse");
  return out;
}

#define TWELL_INSTANTIATE(T)                                                                                      \
  template HybridMatrix<T> gemm_to_sparse<T>(DenseView<const T>, DenseView<const T>, ActivationSpec, TwellLayout, \
                                             const ConvertOptions&, const KernelOptions&);
TWELL_FOR_EACH_VALUE_TYPE(TWELL_INSTANTIATE)
#undef TWELL_INSTANTIATE

}  // namespace twell::reference
