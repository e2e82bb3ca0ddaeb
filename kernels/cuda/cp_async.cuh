// Internal to the cuda kernels: cp.async (sm_80+) copies of 16 bytes from global into shared
// memory, their commit groups and waits. Not installed.
#pragma once

#include <cstdint>

namespace twell::cuda::detail {

// Copies 16 bytes from `src` to the shared address `dst`, or writes 16 zero bytes when !full
// (src is then not read; it must still be a valid global address).
__device__ __forceinline__ void cp_async16_or_zero(std::uint32_t dst, const void* src, bool full) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src), "r"(full ? 16 : 0) : "memory");
}
// Copies 16 bytes from `src` to the shared address `dst`.
__device__ __forceinline__ void cp_async16(std::uint32_t dst, const void* src) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(dst), "l"(src) : "memory");
}
__device__ __forceinline__ void cp_async_commit_group() { asm volatile("cp.async.commit_group;\n" ::: "memory"); }
// Waits until at most N of this thread's committed groups are still in flight.
template <int N>
__device__ __forceinline__ void cp_async_wait_groups() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory");
}

__device__ __forceinline__ std::uint32_t shared_address(const void* p) {
  return static_cast<std::uint32_t>(__cvta_generic_to_shared(p));
}

}  // namespace twell::cuda::detail
