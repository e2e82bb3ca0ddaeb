#include "packing.hpp"

namespace twell::reference {

template <Value T>
DenseMatrix<T> ell_to_dense(EllView<const T> src, const ConvertOptions& options) {
  constexpr const char* kWhere = "twell::reference::ell_to_dense";
  packing::check_source(src, options, kWhere);
  const packing::EllSource<T> source{src, options.threshold};
  return packing::build_dense<T>(source, options);
}

#define TWELL_INSTANTIATE(T) template DenseMatrix<T> ell_to_dense<T>(EllView<const T>, const ConvertOptions&);
TWELL_FOR_EACH_VALUE_TYPE(TWELL_INSTANTIATE)
#undef TWELL_INSTANTIATE

}  // namespace twell::reference
