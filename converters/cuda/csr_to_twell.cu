// cuda csr -> twell: a warp per (row, tile) binary-searches the row and packs (twell_pack.cuh).
#include <twell/instantiate.hpp>

#include "twell_pack.cuh"

namespace twell::cuda {

template <Value T>
TwellMatrix<T> csr_to_twell(CsrView<const T> src, TwellLayout layout, const ConvertOptions& options) {
  constexpr const char* where = "twell::cuda::csr_to_twell";
  return detail::csr_to_twell_as(src, layout, options, where);
}

#define TWELL_INSTANTIATE(T) template TwellMatrix<T> csr_to_twell<T>(CsrView<const T>, TwellLayout, const ConvertOptions&);
TWELL_FOR_EACH_VALUE_TYPE(TWELL_INSTANTIATE)
#undef TWELL_INSTANTIATE

}  // namespace twell::cuda
