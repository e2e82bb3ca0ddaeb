// Internal: turns CUDA runtime, cuBLAS and cuSPARSE status codes into twell::Error.
#pragma once

#include <cublasLt.h>
#include <cublas_v2.h>
#include <cuda_runtime.h>
#include <cusparse.h>

#include <twell/error.hpp>

namespace twell::detail {

inline void check_cuda(cudaError_t status, const char* where) {
  if (status == cudaErrorMemoryAllocation) {
    // Not sticky: cleared here so that a later cudaGetLastError does not report it again, and
    // the caller can free memory and retry.
    cudaGetLastError();
    fail(ErrorCode::out_of_memory, where, "out of device memory (", cudaGetErrorName(status), ")");
  }
  if (status != cudaSuccess) {
    fail(ErrorCode::cuda, where, cudaGetErrorName(status), " (", cudaGetErrorString(status), ")");
  }
}

inline void check_cublas(cublasStatus_t status, const char* where) {
  if (status == CUBLAS_STATUS_ALLOC_FAILED) fail(ErrorCode::out_of_memory, where, "cuBLAS could not allocate its resources");
  if (status != CUBLAS_STATUS_SUCCESS) {
    fail(ErrorCode::cuda, where, "cuBLAS status ", static_cast<int>(status), " (", cublasGetStatusString(status), ")");
  }
}

inline void check_cusparse(cusparseStatus_t status, const char* where) {
  if (status == CUSPARSE_STATUS_ALLOC_FAILED) fail(ErrorCode::out_of_memory, where, "cuSPARSE could not allocate its resources");
  if (status != CUSPARSE_STATUS_SUCCESS) {
    fail(ErrorCode::cuda, where, "cuSPARSE status ", static_cast<int>(status), " (", cusparseGetErrorString(status),
         ")");
  }
}

}  // namespace twell::detail
