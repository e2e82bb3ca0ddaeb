// Internal to the cuda kernels that write a Hybrid on another's structure (sddmm, elementwise):
// the shadow slots of the overflow rows copied from the dense rows just written. Not installed.
#pragma once

#include <cstdint>
#include <type_traits>

#include "cuda_launch.cuh"
#include "sparse_common.cuh"

namespace twell::cuda::detail {

// A thread per slot word of the overflow rows: an entry slot of `structure` (the count in its
// tile's slot 0, at most the capacity) takes the value out's dense row holds at its column, bit
// for bit; slot 0 and padding are left as written. Why: a dense row stores no explicit zeros, so
// where the structure has an entry whose value came out exactly zero earlier, the kernels compute
// the slot but leave the dense element zero, and the shadow must equal the dense row.
template <class T>
__global__ void shadows_from_dense_rows_kernel(std::int64_t r_rows, const std::int32_t* overflow_to_row,
                                               const std::uint32_t* structure, TwellView<T> out, DenseView<T> dense) {
  ::twell::detail::wait_for_prior_grids();
  const std::int64_t width = out.layout.packed_width(out.cols);
  const std::int64_t slots = out.layout.slots();
  for (std::int64_t idx = blockIdx.x * static_cast<std::int64_t>(blockDim.x) + threadIdx.x; idx < r_rows * width;
       idx += static_cast<std::int64_t>(gridDim.x) * blockDim.x) {
    const std::int64_t r = idx / width, w = idx % width, t = w / slots, s = w % slots;
    const std::int64_t row = overflow_to_row[r];
    if (row < 0 || row >= out.rows) continue;  // a malformed map: as the overflow kernels, skip it
    const std::int64_t row_word = row * width;
    const std::uint32_t count = structure[row_word + t * slots];
    if (s == 0 || s > static_cast<std::int64_t>(min(count, static_cast<std::uint32_t>(out.layout.capacity()))))
      continue;
    const std::uint32_t col = TwellLayout::slot_column(structure[row_word + w]);
    const T* element = dense.data + r * dense.ld + out.layout.tile_begin(t) + col;
    if constexpr (std::is_same_v<T, float>) {
      out.value_plane[row_word + w] = *element;
    } else {
      out.packed[row_word + w] = TwellLayout::pack(*reinterpret_cast<const std::uint16_t*>(element), col);
    }
  }
}

// Runs the kernel above on out (a Hybrid whose slots and dense rows the caller's kernels just
// wrote on `structure`'s TwELL part and maps), in stream order after them.
template <class T>
void copy_dense_rows_into_shadows(TwellView<const T> structure, const std::int32_t* overflow_to_row, HybridView<T> out,
                                  cudaStream_t stream, const char* where) {
  const std::int64_t r = out.overflow.rows, words = r * structure.layout.packed_width(structure.cols);
  if (words == 0) return;
  constexpr int kThreads = 256;
  ::twell::detail::launch_kernel(where, shadows_from_dense_rows_kernel<T>, grid_for(words, kThreads), kThreads, 0,
                                 stream, r, overflow_to_row, structure.packed, out.twell, out.overflow);
}

}  // namespace twell::cuda::detail
