#include "packing.hpp"

namespace twell::reference {

template <Value T>
TwellMatrix<T> hybrid_to_twell(HybridView<const T> src, TwellLayout layout, const ConvertOptions& options) {
  constexpr const char* kWhere = "twell::reference::hybrid_to_twell";
  packing::check_source(src, options, kWhere);
  const packing::HybridSource<T> source{src, options.threshold};
  return packing::build_twell<T>(source, layout, options, kWhere);
}

#define TWELL_INSTANTIATE(T) template TwellMatrix<T> hybrid_to_twell<T>(HybridView<const T>, TwellLayout, const ConvertOptions&);
TWELL_FOR_EACH_VALUE_TYPE(TWELL_INSTANTIATE)
#undef TWELL_INSTANTIATE

}  // namespace twell::reference
