// Internal to the cuda kernels: what the Hopper (sm_90a) paths share. On the host: whether the
// device runs this build's sm_90a code, and 2-D tensor maps for TMA copies (sm90_support.cu). On
// the device: whether this pass compiles the sm_90a code. Not installed.
#pragma once

#include <cstdint>
#include <type_traits>

#include <cuda.h>  // CUtensorMap and its enums only: the driver is reached through the runtime's entry-point query
#include <cudaTypedefs.h>

#include <twell/types.hpp>

// wgmma, setmaxnreg and the sm_90a descriptors exist only in the architecture-specific target;
// every other device pass (and the host pass) sees 0. A kernel with an sm_90a path asks
// device_runs_sm90a_code before launching it in that form.
#if defined(__CUDA_ARCH__) && defined(__CUDA_ARCH_FEAT_SM90_ALL)
#define TWELL_SM90A_DEVICE 1
#else
#define TWELL_SM90A_DEVICE 0
#endif

namespace twell::cuda::detail {

// Whether kernels launched on `device` run this build's sm_90a image. A build whose code for the
// device at hand comes from another target (compute_80 PTX that the driver compiles for a
// Hopper, or plain sm_90) does not, and cudaFuncGetAttributes reports binary version 90 for
// both, so a probe kernel tells. Asked once per device and process.
bool device_runs_sm90a_code(int device, const char* where);

// The driver's cuTensorMapEncodeTiled, or null where the driver has none.
PFN_cuTensorMapEncodeTiled_v12000 tensor_map_encoder();

// Whether cuTensorMapEncodeTiled takes a matrix whose rows start `ld` elements of `bytes` bytes
// apart: its global strides are below 2^40 bytes (the rows and columns of twell's operands are
// below its 2^32 bound wherever the paths' other limits hold). A path that stages by TMA refuses
// such an operand in its applies() check, so another kernel takes it instead of the encode
// failing at launch.
constexpr bool tma_row_stride_ok(std::int64_t ld, std::int64_t bytes) {
  return ld >= 0 && ld < (std::int64_t{1} << 40) / bytes;
}

// A tensor map of a row-major rows x cols matrix of `type` elements whose rows start ld_bytes
// apart (a multiple of 16; base 16-byte aligned), read in boxes of box_rows x box_cols elements;
// elements outside the matrix arrive as zeros. Throws twell::Error where the driver refuses it.
CUtensorMap tensor_map_2d(CUtensorMapDataType type, const void* base, std::int64_t rows, std::int64_t cols,
                          std::int64_t ld_bytes, int box_cols, int box_rows, CUtensorMapSwizzle swizzle,
                          const char* where);

// The tensor-map element type of a 16-bit T (bf16 or fp16).
template <class T>
constexpr CUtensorMapDataType tensor_map_type() {
  static_assert(sizeof(T) == 2, "tensor maps of 16-bit values only");
  return std::is_same_v<T, bf16> ? CU_TENSOR_MAP_DATA_TYPE_BFLOAT16 : CU_TENSOR_MAP_DATA_TYPE_FLOAT16;
}

}  // namespace twell::cuda::detail
