// Device helpers of the GPU suites; include only where the CUDA runtime is available.
#pragma once

#include <doctest/doctest.h>

#include <cuda_runtime.h>

#include <twell/memory.hpp>

namespace twell::testing {

inline void cuda_ok(cudaError_t status) { REQUIRE_MESSAGE(status == cudaSuccess, cudaGetErrorString(status)); }

// Every byte of a device buffer set to 0xFF: NaN in every value type and an out-of-range index, so
// that an element a kernel leaves unwritten, or reads before writing, shows in the comparison.
template <class U>
void poison_device(Buffer<U>& b) {
  if (b.bytes() > 0) cuda_ok(cudaMemset(b.data(), 0xff, b.bytes()));
}

}  // namespace twell::testing
