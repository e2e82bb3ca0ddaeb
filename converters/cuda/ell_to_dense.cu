// cuda ell -> dense: zero-and-scatter, a warp per row (row_builders.cuh).
#include <twell/instantiate.hpp>

#include "row_builders.cuh"

namespace twell::cuda {

template <Value T>
DenseMatrix<T> ell_to_dense(EllView<const T> src, const ConvertOptions& options) {
  constexpr const char* where = "twell::cuda::ell_to_dense";
  detail::check_device_operand(src, where, "src");
  check_convert_options(options, where);
  return detail::rows_to_dense<T>(detail::EllRows<T>(src), src.rows, src.cols, options, where);
}

#define TWELL_INSTANTIATE(T) template DenseMatrix<T> ell_to_dense<T>(EllView<const T>, const ConvertOptions&);
TWELL_FOR_EACH_VALUE_TYPE(TWELL_INSTANTIATE)
#undef TWELL_INSTANTIATE

}  // namespace twell::cuda
