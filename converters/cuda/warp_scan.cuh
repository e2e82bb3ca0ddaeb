// The inclusive prefix sum over the lanes of a warp or of its segments (lane order) by shuffles,
// for any integer type. Self-contained, so kernels/cuda includes it too. Not installed.
#pragma once

#include <cuda_runtime.h>

namespace twell::cuda::detail {

// Lane l gets the sum of v over the lanes of its segment of kWidth lanes (32, or 16, 8, ...: the
// halves, quarters, ... of the warp) up to and including itself; the segment's last lane holds its
// total. Called by the whole warp.
template <class I, int kWidth = 32>
__device__ __forceinline__ I warp_inclusive_sum(I v, int lane) {
  static_assert(kWidth >= 1 && kWidth <= 32 && (kWidth & (kWidth - 1)) == 0, "a segment is a power of two lanes");
#pragma unroll
  for (int d = 1; d < kWidth; d <<= 1) {
    const I up = __shfl_up_sync(0xffffffffu, v, d, kWidth);
    if ((lane & (kWidth - 1)) >= d) v += up;
  }
  return v;
}

}  // namespace twell::cuda::detail
