// cuda dense -> ell: per-row count (and max when the width is free), fill with zero padding, a warp per row (row_builders.cuh).
#include <twell/instantiate.hpp>

#include "row_builders.cuh"

namespace twell::cuda {

template <Value T>
EllMatrix<T> dense_to_ell(DenseView<const T> src, const ConvertOptions& options) {
  constexpr const char* where = "twell::cuda::dense_to_ell";
  detail::check_device_operand(src, where, "src");
  check_convert_options(options, where);
  return detail::rows_to_ell<T>(detail::DenseRows<T>(src), src.rows, src.cols, options, where);
}

#define TWELL_INSTANTIATE(T) template EllMatrix<T> dense_to_ell<T>(DenseView<const T>, const ConvertOptions&);
TWELL_FOR_EACH_VALUE_TYPE(TWELL_INSTANTIATE)
#undef TWELL_INSTANTIATE

}  // namespace twell::cuda
