#include "packing.hpp"

namespace twell::reference {

template <Value T>
HybridMatrix<T> csr_to_hybrid(CsrView<const T> src, TwellLayout layout, const ConvertOptions& options) {
  constexpr const char* kWhere = "twell::reference::csr_to_hybrid";
  packing::check_source(src, options, kWhere);
  const packing::CsrSource<T> source{src, options.threshold};
  return packing::build_hybrid<T>(source, layout, options, kWhere);
}

#define TWELL_INSTANTIATE(T) template HybridMatrix<T> csr_to_hybrid<T>(CsrView<const T>, TwellLayout, const ConvertOptions&);
TWELL_FOR_EACH_VALUE_TYPE(TWELL_INSTANTIATE)
#undef TWELL_INSTANTIATE

}  // namespace twell::reference
