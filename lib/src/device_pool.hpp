// Internal: the memory pools from which twell allocates all of its device memory (memory_cuda.cpp).
//
// One pool per device, created on first use, that keeps what is freed into it instead of giving it
// back to the device at the next synchronisation (the default pool's release threshold of 0 does
// that, and cudaMalloc maps fresh pages every call): functions that allocate per call (the free
// functions, stream-ordered scratch) then reuse pages already mapped. What the pools keep goes
// back by twell::release_cached_device_memory(), and by itself when an allocation finds the
// device out of memory.
#pragma once

#include <cstddef>

#include <cuda_runtime.h>

namespace twell::detail {

// `bytes` of the current device's pool, stream-ordered on `stream` (usable by work queued on it
// afterwards), which must belong to the current device, as it must for the kernels launched on
// it. Out of memory: the pool's kept memory is returned to the device (after a device
// synchronisation, so that pending frees complete) and the allocation tried once more, unless
// `bytes` exceeds the device's whole memory; a failure that remains throws Error(out_of_memory)
// naming `where`.
void* allocate_from_pool(std::size_t bytes, cudaStream_t stream, const char* where);

// Returns what the current device's pool keeps to the device, after a device synchronisation (so
// that pending frees complete), and clears the runtime's last error if it is an allocation
// failure; nothing to return before twell's first allocation there. Throws Error naming `where`
// when the synchronisation fails.
void trim_current_pool(const char* where);

// Another CUDA library's call that allocates device memory (cuBLAS's and cuSPARSE's handle
// creation): `call()` returns its status, and one that equals `out_of_memory` is retried once
// after trim_current_pool, so that what twell's pool keeps never makes it fail. Returns the last
// status.
template <class Call, class Status>
Status retry_after_trim(Call&& call, Status out_of_memory, const char* where) {
  Status status = call();
  if (status == out_of_memory) {
    trim_current_pool(where);
    status = call();
  }
  return status;
}

}  // namespace twell::detail
