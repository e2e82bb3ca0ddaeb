#include "packing.hpp"

namespace twell::reference {

template <Value T>
CsrMatrix<T> ell_to_csr(EllView<const T> src, const ConvertOptions& options) {
  constexpr const char* kWhere = "twell::reference::ell_to_csr";
  packing::check_source(src, options, kWhere);
  const packing::EllSource<T> source{src, options.threshold};
  return packing::build_csr<T>(source, options, kWhere);
}

#define TWELL_INSTANTIATE(T) template CsrMatrix<T> ell_to_csr<T>(EllView<const T>, const ConvertOptions&);
TWELL_FOR_EACH_VALUE_TYPE(TWELL_INSTANTIATE)
#undef TWELL_INSTANTIATE

}  // namespace twell::reference
