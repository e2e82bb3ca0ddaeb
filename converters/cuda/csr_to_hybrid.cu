// cuda csr -> hybrid: sparse_to_twell_kernel with per-row overflow flags, then scan, maps and the dense block.
#include <twell/instantiate.hpp>

#include "twell_pack.cuh"

namespace twell::cuda {

template <Value T>
HybridMatrix<T> csr_to_hybrid(CsrView<const T> src, TwellLayout layout, const ConvertOptions& options) {
  constexpr const char* where = "twell::cuda::csr_to_hybrid";
  return detail::csr_to_hybrid_as(src, layout, options, where);
}

#define TWELL_INSTANTIATE(T) template HybridMatrix<T> csr_to_hybrid<T>(CsrView<const T>, TwellLayout, const ConvertOptions&);
TWELL_FOR_EACH_VALUE_TYPE(TWELL_INSTANTIATE)
#undef TWELL_INSTANTIATE

}  // namespace twell::cuda
