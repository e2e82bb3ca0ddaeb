// CUDA status checks of the benchmark harness (internal to bench/cuda).
#pragma once

#include <cuda_runtime.h>

#include <twell/error.hpp>
#include <twell/memory.hpp>

namespace twell::bench {

inline void check(cudaError_t status, const char* where) {
  if (status != cudaSuccess)
    fail(ErrorCode::cuda, where, cudaGetErrorName(status), " (", cudaGetErrorString(status), ")");
}

inline cudaStream_t native(Stream s) { return static_cast<cudaStream_t>(s.handle); }

}  // namespace twell::bench
