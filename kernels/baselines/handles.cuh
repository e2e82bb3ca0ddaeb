// Internal to the baselines: what Handles owns, and shared conversions.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <type_traits>

#include <cublasLt.h>
#include <cublas_v2.h>
#include <cuda_runtime.h>
#include <cusparse.h>

#include <twell/error.hpp>
#include <twell/formats/dense.hpp>
#include <twell/kernels/baselines.hpp>
#include <twell/kernels/detail/checks.hpp>
#include <twell/memory.hpp>

#include "cuda_check.hpp"
#include "device_pool.hpp"

namespace twell::baseline {

// The cuBLASLt descriptors and chosen algorithm of one ReLU GEMM shape, kept by Handles so that
// repeated calls skip the descriptor set-up and the heuristic query.
struct LtReluPlan {
  cudaDataType_t type{};
  std::int64_t m = 0, n = 0, k = 0, lda = 0, ldb = 0, ldc = 0;
  cublasLtMatmulDesc_t desc = nullptr;
  cublasLtMatrixLayout_t la = nullptr, lb = nullptr, lc = nullptr;
  cublasLtMatmulAlgo_t algo{};
  LtReluPlan() = default;
  LtReluPlan(const LtReluPlan&) = delete;
  LtReluPlan& operator=(const LtReluPlan&) = delete;
  ~LtReluPlan() {
    if (lc != nullptr) cublasLtMatrixLayoutDestroy(lc);
    if (lb != nullptr) cublasLtMatrixLayoutDestroy(lb);
    if (la != nullptr) cublasLtMatrixLayoutDestroy(la);
    if (desc != nullptr) cublasLtMatmulDescDestroy(desc);
  }
  bool matches(cudaDataType_t t, std::int64_t m_, std::int64_t n_, std::int64_t k_, std::int64_t lda_,
               std::int64_t ldb_, std::int64_t ldc_) const {
    return t == type && m_ == m && n_ == n && k_ == k && lda_ == lda && ldb_ == ldb && ldc_ == ldc;
  }
};

struct Handles::Impl {
  std::unique_ptr<LtReluPlan> relu_plan;
  cusparseHandle_t sparse = nullptr;
  cublasHandle_t blas = nullptr;
  cublasLtHandle_t lt = nullptr;
  Buffer<std::byte> lt_workspace;  // from twell's pool, whose out-of-memory retry it shares
  std::size_t lt_workspace_bytes = 0;
  cudaStream_t stream = nullptr;
};

namespace detail {

using twell::detail::check_cublas;
using twell::detail::check_cuda;
using twell::detail::check_cusparse;

template <class T>
constexpr cudaDataType_t cuda_type() {
  if constexpr (std::is_same_v<T, bf16>) {
    return CUDA_R_16BF;
  } else if constexpr (std::is_same_v<T, fp16>) {
    return CUDA_R_16F;
  } else {
    return CUDA_R_32F;
  }
}

using twell::detail::shape;

// Operands are device views, checked before a library call reads them.
template <class View>
void check_operand(View v, const char* where, const char* name) {
  twell::detail::check_view(v, MemorySpace::device, "cuSPARSE/cuBLAS baseline", where, name);
}

inline void require_int32(std::int64_t v, const char* where, const char* what) {
  require(v >= 0 && v <= 0x7fffffffLL, ErrorCode::unsupported, where, what, " ", v,
          " is outside the 32-bit range the library takes");
}

}  // namespace detail
}  // namespace twell::baseline
