// cuda hybrid -> twell: through CSR (exact; one extra pass, not a performance path); overflow rows follow options.overflow.
#include <twell/instantiate.hpp>

#include "row_builders.cuh"
#include "twell_pack.cuh"

namespace twell::cuda {

template <Value T>
TwellMatrix<T> hybrid_to_twell(HybridView<const T> src, TwellLayout layout, const ConvertOptions& options) {
  constexpr const char* where = "twell::cuda::hybrid_to_twell";
  detail::check_device_operand(src, where, "src");
  check_convert_options(options, where);
  check_layout(src.twell.layout, where);
  check_layout(layout, where);
  detail::check_relayout_range(src.cols(), where);
  detail::require_twell_policy(options, where);
  const CsrMatrix<T> csr =
      detail::rows_to_csr<T>(detail::HybridRows<T>(src), src.rows(), src.cols(), detail::quiet(options), where);
  return detail::csr_to_twell_as(csr.view(), layout, options, where);
}

#define TWELL_INSTANTIATE(T) template TwellMatrix<T> hybrid_to_twell<T>(HybridView<const T>, TwellLayout, const ConvertOptions&);
TWELL_FOR_EACH_VALUE_TYPE(TWELL_INSTANTIATE)
#undef TWELL_INSTANTIATE

}  // namespace twell::cuda
