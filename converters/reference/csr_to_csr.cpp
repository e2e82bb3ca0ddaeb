#include "packing.hpp"

namespace twell::reference {

template <Value T>
CsrMatrix<T> csr_to_csr(CsrView<const T> src, const ConvertOptions& options) {
  constexpr const char* kWhere = "twell::reference::csr_to_csr";
  packing::check_source(src, options, kWhere);
  const packing::CsrSource<T> source{src, options.threshold};
  return packing::build_csr<T>(source, options, kWhere);
}

#define TWELL_INSTANTIATE(T) template CsrMatrix<T> csr_to_csr<T>(CsrView<const T>, const ConvertOptions&);
TWELL_FOR_EACH_VALUE_TYPE(TWELL_INSTANTIATE)
#undef TWELL_INSTANTIATE

}  // namespace twell::reference
