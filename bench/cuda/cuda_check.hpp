// CUDA and cuBLAS status checks of the benchmark harness (internal to bench/cuda).
#pragma once

#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <twell/error.hpp>
#include <twell/memory.hpp>

namespace twell::bench {

inline void check(cudaError_t status, const char* where) {
  if (status != cudaSuccess)
    fail(ErrorCode::cuda, where, cudaGetErrorName(status), " (", cudaGetErrorString(status), ")");
}

inline void check(cublasStatus_t status, const char* where) {
  if (status != CUBLAS_STATUS_SUCCESS) fail(ErrorCode::cuda, where, "cuBLAS status ", static_cast<int>(status));
}

inline cudaStream_t native(Stream s) { return static_cast<cudaStream_t>(s.handle); }

}  // namespace twell::bench
