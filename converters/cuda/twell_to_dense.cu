// cuda twell -> dense: zero-and-scatter, a warp per row (row_builders.cuh).
#include <twell/instantiate.hpp>

#include "row_builders.cuh"

namespace twell::cuda {

template <Value T>
DenseMatrix<T> twell_to_dense(TwellView<const T> src, const ConvertOptions& options) {
  constexpr const char* where = "twell::cuda::twell_to_dense";
  detail::check_device_operand(src, where, "src");
  check_convert_options(options, where);
  check_layout(src.layout, where);
  return detail::rows_to_dense<T>(detail::TwellSlotRows<T>(src), src.rows, src.cols, options, where);
}

#define TWELL_INSTANTIATE(T) template DenseMatrix<T> twell_to_dense<T>(TwellView<const T>, const ConvertOptions&);
TWELL_FOR_EACH_VALUE_TYPE(TWELL_INSTANTIATE)
#undef TWELL_INSTANTIATE

}  // namespace twell::cuda
