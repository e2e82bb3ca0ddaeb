// cuda dense -> twell: the performance path, one pass of dense_to_twell_kernel (twell_pack.cuh).
#include <twell/instantiate.hpp>

#include "twell_pack.cuh"

namespace twell::cuda {

template <Value T>
TwellMatrix<T> dense_to_twell(DenseView<const T> src, TwellLayout layout, const ConvertOptions& options) {
  constexpr const char* where = "twell::cuda::dense_to_twell";
  return detail::dense_to_twell_as(src, layout, options, where);
}

#define TWELL_INSTANTIATE(T) template TwellMatrix<T> dense_to_twell<T>(DenseView<const T>, TwellLayout, const ConvertOptions&);
TWELL_FOR_EACH_VALUE_TYPE(TWELL_INSTANTIATE)
#undef TWELL_INSTANTIATE

}  // namespace twell::cuda
