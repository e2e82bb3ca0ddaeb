// cuda hybrid -> csr: per-row count, scan, fill, a warp per row (row_builders.cuh).
#include <twell/instantiate.hpp>

#include "row_builders.cuh"

namespace twell::cuda {

template <Value T>
CsrMatrix<T> hybrid_to_csr(HybridView<const T> src, const ConvertOptions& options) {
  constexpr const char* where = "twell::cuda::hybrid_to_csr";
  detail::check_device_operand(src, where, "src");
  check_convert_options(options, where);
  check_layout(src.twell.layout, where);
  return detail::rows_to_csr<T>(detail::HybridRows<T>(src), src.rows(), src.cols(), options, where);
}

#define TWELL_INSTANTIATE(T) template CsrMatrix<T> hybrid_to_csr<T>(HybridView<const T>, const ConvertOptions&);
TWELL_FOR_EACH_VALUE_TYPE(TWELL_INSTANTIATE)
#undef TWELL_INSTANTIATE

}  // namespace twell::cuda
