#include "packing.hpp"

namespace twell::reference {

template <Value T>
EllMatrix<T> dense_to_ell(DenseView<const T> src, const ConvertOptions& options) {
  constexpr const char* kWhere = "twell::reference::dense_to_ell";
  packing::check_source(src, options, kWhere);
  const packing::DenseSource<T> source{src, options.threshold};
  return packing::build_ell<T>(source, options, kWhere);
}

#define TWELL_INSTANTIATE(T) template EllMatrix<T> dense_to_ell<T>(DenseView<const T>, const ConvertOptions&);
TWELL_FOR_EACH_VALUE_TYPE(TWELL_INSTANTIATE)
#undef TWELL_INSTANTIATE

}  // namespace twell::reference
