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

}  // namespace twell::detail
