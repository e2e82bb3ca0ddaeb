// Internal to the cuda sparse kernels (spmm, sddmm, transpose, elementwise, reductions): value
// conversions on the device, argument checks of device views, launch helpers, and the cached
// cuBLAS handle the Hybrid overflow path uses. Not installed.
#pragma once

#include <cstdint>
#include <string>
#include <type_traits>

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <twell/error.hpp>
#include <twell/formats/csr.hpp>
#include <twell/formats/dense.hpp>
#include <twell/formats/ell.hpp>
#include <twell/formats/hybrid.hpp>
#include <twell/formats/twell_matrix.hpp>
#include <twell/kernels/detail/checks.hpp>
#include <twell/kernels/options.hpp>
#include <twell/types.hpp>

#include "cuda_check.hpp"
#include "cuda_scratch.hpp"

namespace twell::cuda::detail {

using twell::detail::check_cublas;
using twell::detail::check_cuda;

// ---- values on the device ----------------------------------------------------------------------

template <class T>
__device__ __forceinline__ float load_f(const T* p) {
  if constexpr (std::is_same_v<T, bf16>) {
    return __uint_as_float(static_cast<std::uint32_t>(*reinterpret_cast<const unsigned short*>(p)) << 16);
  } else if constexpr (std::is_same_v<T, fp16>) {
    return __half2float(__ushort_as_half(*reinterpret_cast<const unsigned short*>(p)));
  } else {
    return *p;
  }
}

template <class T>
__device__ __forceinline__ std::uint16_t bits_of(float f) {
  if constexpr (std::is_same_v<T, bf16>) {
    return __bfloat16_as_ushort(__float2bfloat16_rn(f));
  } else {
    return __half_as_ushort(__float2half_rn(f));
  }
}

template <class T>
__device__ __forceinline__ float bits_to_f(std::uint32_t bits16) {
  if constexpr (std::is_same_v<T, bf16>) {
    return __uint_as_float(bits16 << 16);
  } else {
    return __half2float(__ushort_as_half(static_cast<unsigned short>(bits16)));
  }
}

template <class T>
__device__ __forceinline__ void store_f(T* p, float f) {
  if constexpr (std::is_same_v<T, float>) {
    *p = f;
  } else {
    *reinterpret_cast<unsigned short*>(p) = bits_of<T>(f);
  }
}

// Value of TwELL slot `pos` (16-bit types: the high half of the word; fp32: the value plane).
template <class T>
__device__ __forceinline__ float twell_value(std::uint32_t word, const T* value_plane, std::int64_t pos) {
  if constexpr (std::is_same_v<T, float>) {
    return value_plane[pos];
  } else {
    return bits_to_f<T>(word >> 16);
  }
}

// ---- host-side checks and launch helpers ------------------------------------------------------

inline cudaStream_t stream_of(const KernelOptions& options) { return static_cast<cudaStream_t>(options.stream.handle); }

using twell::detail::check_device_operand;
using twell::detail::report_path;
using twell::detail::shape;

// Streaming multiprocessors of the current device.
inline int multiprocessor_count(const char* where) {
  int device = 0, sms = 0;
  check_cuda(cudaGetDevice(&device), where);
  check_cuda(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device), where);
  return sms;
}

// Grid size for a grid-stride loop over n items with `threads` per block.
inline unsigned grid_for(std::int64_t n, int threads, std::int64_t max_blocks = 65535LL * 16) {
  std::int64_t blocks = (n + threads - 1) / threads;
  if (blocks < 1) blocks = 1;
  if (blocks > max_blocks) blocks = max_blocks;
  return static_cast<unsigned>(blocks);
}

}  // namespace twell::cuda::detail
