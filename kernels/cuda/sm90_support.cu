// The host side of sm90_support.cuh: the sm_90a probe and the tensor-map encoder.
#include "sm90_support.cuh"

#include <map>
#include <mutex>

#include <cuda_runtime.h>

#include <twell/error.hpp>

#include "cuda_check.hpp"
#include "cuda_launch.cuh"

namespace twell::cuda::detail {
namespace {

// This file is compiled for the same targets as every kernel, so the image the probe runs from is
// the one their launches run from.
__device__ int sm90a_code_flag;
__global__ void sm90a_probe_kernel() {
  ::twell::detail::wait_for_prior_grids();
  sm90a_code_flag = TWELL_SM90A_DEVICE;
}

}  // namespace

bool device_runs_sm90a_code(int device, const char* where) {
  static std::mutex mutex;
  static std::map<int, bool> known;
  const std::lock_guard lock(mutex);
  if (const auto it = known.find(device); it != known.end()) return it->second;
  // The probe runs on a private stream of its own.
  cudaStream_t probe_stream = nullptr;
  ::twell::detail::check_cuda(cudaStreamCreateWithFlags(&probe_stream, cudaStreamNonBlocking), where);
  int flag = 0;
  cudaError_t status = ::twell::detail::try_launch_kernel(sm90a_probe_kernel, 1, 1, 0, probe_stream);
  if (status == cudaSuccess)
    status = cudaMemcpyFromSymbolAsync(&flag, sm90a_code_flag, sizeof flag, 0, cudaMemcpyDeviceToHost, probe_stream);
  if (status == cudaSuccess) status = cudaStreamSynchronize(probe_stream);
  (void)cudaStreamDestroy(probe_stream);
  ::twell::detail::check_cuda(status, where);
  return known[device] = flag == 1;
}

PFN_cuTensorMapEncodeTiled_v12000 tensor_map_encoder() {
  static const PFN_cuTensorMapEncodeTiled_v12000 fn = [] {
    void* p = nullptr;
    cudaDriverEntryPointQueryResult found{};
    if (cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &p, 12000, cudaEnableDefault, &found) !=
            cudaSuccess ||
        found != cudaDriverEntryPointSuccess) {
      (void)cudaGetLastError();
      p = nullptr;
    }
    return reinterpret_cast<PFN_cuTensorMapEncodeTiled_v12000>(p);
  }();
  return fn;
}

CUtensorMap tensor_map_2d(CUtensorMapDataType type, const void* base, std::int64_t rows, std::int64_t cols,
                          std::int64_t ld_bytes, int box_cols, int box_rows, CUtensorMapSwizzle swizzle,
                          const char* where) {
  const PFN_cuTensorMapEncodeTiled_v12000 encode = tensor_map_encoder();
  require(encode != nullptr, ErrorCode::cuda, where, "the driver has no cuTensorMapEncodeTiled");
  CUtensorMap map;
  const cuuint64_t dims[2] = {static_cast<cuuint64_t>(cols), static_cast<cuuint64_t>(rows)};
  const cuuint64_t strides[1] = {static_cast<cuuint64_t>(ld_bytes)};
  const cuuint32_t box[2] = {static_cast<cuuint32_t>(box_cols), static_cast<cuuint32_t>(box_rows)};
  const cuuint32_t element_strides[2] = {1, 1};
  const CUresult r =
      encode(&map, type, 2, const_cast<void*>(base), dims, strides, box, element_strides, CU_TENSOR_MAP_INTERLEAVE_NONE,
             swizzle, CU_TENSOR_MAP_L2_PROMOTION_L2_256B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
  require(r == CUDA_SUCCESS, ErrorCode::cuda, where, "cuTensorMapEncodeTiled failed (CUresult ", static_cast<int>(r),
          ") for a ", rows, " x ", cols, " matrix with rows ", ld_bytes, " bytes apart in boxes of ", box_rows, " x ",
          box_cols);
  return map;
}

}  // namespace twell::cuda::detail
