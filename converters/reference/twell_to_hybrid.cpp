#include "packing.hpp"

namespace twell::reference {

template <Value T>
HybridMatrix<T> twell_to_hybrid(TwellView<const T> src, TwellLayout layout, const ConvertOptions& options) {
  constexpr const char* kWhere = "twell::reference::twell_to_hybrid";
  packing::check_source(src, options, kWhere);
  const packing::TwellSource<T> source{src, options.threshold};
  return packing::build_hybrid<T>(source, layout, options, kWhere);
}

#define TWELL_INSTANTIATE(T) template HybridMatrix<T> twell_to_hybrid<T>(TwellView<const T>, TwellLayout, const ConvertOptions&);
TWELL_FOR_EACH_VALUE_TYPE(TWELL_INSTANTIATE)
#undef TWELL_INSTANTIATE

}  // namespace twell::reference
