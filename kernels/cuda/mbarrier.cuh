// Internal to the cuda kernels: shared-memory mbarriers, and bulk copies by the TMA engine (1-D,
// and boxes of 2-D tensor maps) that complete on them (sm_90 and up; call them only from device
// code compiled for such a target). Not installed.
#pragma once

#include <cstdint>

#include <cuda.h>  // CUtensorMap

#include "cp_async.cuh"

namespace twell::cuda::detail {

__device__ __forceinline__ void mbar_init(std::uint64_t* bar, std::uint32_t count) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(shared_address(bar)), "r"(count) : "memory");
}
// Makes initialised mbarriers visible to the async proxy (the TMA engine's completions) and to
// the other CTAs of a cluster; a barrier across the CTA (or cluster) must follow.
__device__ __forceinline__ void mbar_init_fence() {
  asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
}
// Arrives once and adds `bytes` of asynchronous copies that must land before the phase completes.
__device__ __forceinline__ void mbar_expect_tx(std::uint64_t* bar, std::uint32_t bytes) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(shared_address(bar)), "r"(bytes)
               : "memory");
}
__device__ __forceinline__ void mbar_arrive(std::uint64_t* bar) {
  asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];\n" ::"r"(shared_address(bar)) : "memory");
}
// Waits until the phase of parity `parity` has completed.
__device__ __forceinline__ void mbar_wait(std::uint64_t* bar, std::uint32_t parity) {
  const std::uint32_t addr = shared_address(bar);
  std::uint32_t done = 0;
  do {
    asm volatile("{\n.reg .pred p;\nmbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\nselp.u32 %0, 1, 0, p;\n}\n"
                 : "=r"(done)
                 : "r"(addr), "r"(parity)
                 : "memory");
  } while (done == 0);
}

// Orders this thread's (and, behind a barrier, the CTA's) generic-proxy accesses to shared memory
// before later async-proxy ones, e.g. reads of a buffer before a bulk copy overwrites it.
__device__ __forceinline__ void fence_proxy_async_shared() {
  asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
}

// Copies `bytes` (a multiple of 16; both addresses 16-byte aligned) from global memory to the
// shared address `dst` by the TMA engine; the bytes complete on `bar`.
__device__ __forceinline__ void bulk_copy_to_shared(std::uint32_t dst, const void* src, std::uint32_t bytes,
                                                    std::uint64_t* bar) {
  asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];\n" ::"r"(dst),
               "l"(src), "r"(bytes), "r"(shared_address(bar))
               : "memory");
}

// One box of a 2-D tensor map into shared memory; the bytes complete on `bar`. Out-of-bounds
// elements arrive as zeros (and count toward the bytes): ragged edges need no special case.
__device__ __forceinline__ void tma_load_2d(void* dst, const CUtensorMap* map, std::uint64_t* bar, int inner,
                                            int outer) {
  asm volatile(
      "cp.async.bulk.tensor.2d.shared::cluster.global.tile.mbarrier::complete_tx::bytes [%0], [%1, {%3, %4}], "
      "[%2];\n" ::"r"(shared_address(dst)),
      "l"(reinterpret_cast<std::uint64_t>(map)), "r"(shared_address(bar)), "r"(inner), "r"(outer)
      : "memory");
}

}  // namespace twell::cuda::detail
