// Device helpers of the GPU suites; include only where the CUDA runtime is available.
#pragma once

#include <doctest/doctest.h>

#include <algorithm>

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

// Whether every byte of a device buffer still holds poison_device's 0xFF: nothing was written.
template <class U>
bool still_poisoned(const Buffer<U>& b) {
  const Buffer<U> host = b.copy_to(MemorySpace::host);
  const auto* bytes = reinterpret_cast<const unsigned char*>(host.data());
  return std::all_of(bytes, bytes + host.bytes(), [](unsigned char c) { return c == 0xff; });
}

}  // namespace twell::testing
