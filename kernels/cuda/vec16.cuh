// Internal to the cuda kernels: 16-byte vector accesses of stored values (4 fp32 or 8 bf16/fp16
// in one uint4). Not installed.
#pragma once

#include <cstdint>
#include <type_traits>

#include <cuda_runtime.h>

#include "sparse_common.cuh"

namespace twell::cuda::detail {

// Whether p may be read or written as a uint4.
inline bool aligned16(const void* p) { return reinterpret_cast<std::uintptr_t>(p) % 16 == 0; }

// Whether a TwELL structure's slot words may be taken four at a time: S a power of two of at
// least 4 (so no 16-byte word crosses a slot group, and the slot of a word is its index masked
// by S - 1) and every word array 16-byte aligned.
template <class... Words>
bool quad_words(const TwellLayout& layout, const Words*... arrays) {
  const std::int32_t s = layout.slots();
  return s >= 4 && (s & (s - 1)) == 0 && (aligned16(arrays) && ...);
}

// Of the four slot words `w` = packed[q] (quad_words holds; slot_mask = S - 1): the slot of the
// first and the entries their group stores (its slot 0's count, at most capacity).
struct QuadSlots {
  std::uint32_t first;
  std::uint32_t entries;
};
__device__ __forceinline__ QuadSlots quad_slots(const uint4* packed, std::int64_t q, const uint4& w,
                                                std::uint32_t slot_mask, std::uint32_t capacity) {
  const std::uint32_t first = static_cast<std::uint32_t>(q * 4) & slot_mask;
  const std::uint32_t count = first == 0 ? w.x : reinterpret_cast<const std::uint32_t*>(packed)[q * 4 - first];
  return {first, min(count, capacity)};
}

// Whether B and C can be read and written 16 bytes at a time along their rows: both 16-byte
// aligned, with leading dimensions and B's columns whole 16-byte words.
template <class T>
bool vector_operands(DenseView<const T> b, DenseView<T> c) {
  constexpr std::int64_t v = 16 / sizeof(T);
  return aligned16(b.data) && aligned16(c.data) && b.ld % v == 0 && c.ld % v == 0 && b.cols % v == 0;
}

// The 16 / sizeof(T) values of one 16-byte word as floats, in memory order.
template <class T>
__device__ __forceinline__ void unpack16(const uint4& u, float (&out)[16 / sizeof(T)]) {
  if constexpr (std::is_same_v<T, float>) {
    out[0] = __uint_as_float(u.x);
    out[1] = __uint_as_float(u.y);
    out[2] = __uint_as_float(u.z);
    out[3] = __uint_as_float(u.w);
  } else {
    const std::uint32_t w[4] = {u.x, u.y, u.z, u.w};
#pragma unroll
    for (int q = 0; q < 4; ++q) {
      out[2 * q] = bits_to_f<T>(w[q] & 0xffffu);
      out[2 * q + 1] = bits_to_f<T>(w[q] >> 16);
    }
  }
}

}  // namespace twell::cuda::detail
