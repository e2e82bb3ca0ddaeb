// The inclusive prefix sum over the 32 lanes of a warp (lane order) by shuffles, for any integer
// type. Self-contained, so kernels/cuda includes it too. Not installed.
#pragma once

#include <cuda_runtime.h>

namespace twell::cuda::detail {

// Lane l gets v(0) + ... + v(l); lane 31 holds the warp's total. Called by the whole warp.
template <class I>
__device__ __forceinline__ I warp_inclusive_sum(I v, int lane) {
#pragma unroll
  for (int d = 1; d < 32; d <<= 1) {
    const I up = __shfl_up_sync(0xffffffffu, v, d);
    if (lane >= d) v += up;
  }
  return v;
}

}  // namespace twell::cuda::detail
