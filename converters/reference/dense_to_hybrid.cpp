#include "packing.hpp"

namespace twell::reference {

template <Value T>
HybridMatrix<T> dense_to_hybrid(DenseView<const T> src, TwellLayout layout, const ConvertOptions& options) {
  constexpr const char* kWhere = "twell::reference::dense_to_hybrid";
  packing::check_source(src, options, kWhere);
  const packing::DenseSource<T> source{src, options.threshold};
  return packing::build_hybrid<T>(source, layout, options, kWhere);
}

#define TWELL_INSTANTIATE(T) template HybridMatrix<T> dense_to_hybrid<T>(DenseView<const T>, TwellLayout, const ConvertOptions&);
TWELL_FOR_EACH_VALUE_TYPE(TWELL_INSTANTIATE)
#undef TWELL_INSTANTIATE

}  // namespace twell::reference
