// Internal: turns CUDA runtime, cuBLAS and cuSPARSE status codes into twell::Error.
#pragma once

#include <cuda_runtime.h>

#include <twell/error.hpp>

namespace twell::detail {

inline void check_cuda(cudaError_t status, const char* where) {
  if (status != cudaSuccess) {
    fail(ErrorCode::cuda, where, cudaGetErrorName(status), " (", cudaGetErrorString(status), ")");
  }
}

// After a kernel launch: reports launch-configuration errors at the call that caused them.
inline void check_launch(const char* where) { check_cuda(cudaGetLastError(), where); }

}  // namespace twell::detail
