// cuda twell -> hybrid: re-layout through CSR (exact; one extra pass, not a performance path).
#include <twell/instantiate.hpp>

#include "row_builders.cuh"
#include "twell_pack.cuh"

namespace twell::cuda {

template <Value T>
HybridMatrix<T> twell_to_hybrid(TwellView<const T> src, TwellLayout layout, const ConvertOptions& options) {
  constexpr const char* where = "twell::cuda::twell_to_hybrid";
  detail::check_device_operand(src, where, "src");
  check_convert_options(options, where);
  check_layout(src.layout, where);
  check_layout(layout, where);
  detail::check_relayout_range(src.cols, where);
  const CsrMatrix<T> csr =
      detail::rows_to_csr<T>(detail::TwellSlotRows<T>(src), src.rows, src.cols, detail::quiet(options), where);
  return detail::csr_to_hybrid_as(csr.view(), layout, options, where);
}

#define TWELL_INSTANTIATE(T) template HybridMatrix<T> twell_to_hybrid<T>(TwellView<const T>, TwellLayout, const ConvertOptions&);
TWELL_FOR_EACH_VALUE_TYPE(TWELL_INSTANTIATE)
#undef TWELL_INSTANTIATE

}  // namespace twell::cuda
