// Internal: how the library launches its kernels. Each launch (but launch_kernel_in_order's) lets
// its grid start while the kernel before it in the stream drains (programmatic dependent launch,
// sm_90 and later), so that the GPU does not idle ~1-1.5 µs at each kernel boundary launching it.
// In exchange every kernel launched here must begin with wait_for_prior_grids();
// tests/cpu/check_kernel_launches.py holds every kernel under converters/, kernels/ and lib/src/
// to that.
#pragma once

#include <cstddef>
#include <utility>

#include <cuda_runtime.h>

#include "cuda_check.hpp"

namespace twell::detail {

// The first statement of every kernel: waits until the grids before it in the stream have
// completed and their writes are visible (an early launch must not read their outputs or
// overwrite their inputs), then lets the grid after it launch. Without an early launch, and
// before sm_90, it does nothing.
__device__ __forceinline__ void wait_for_prior_grids() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;" ::: "memory");
  asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
}

// Whether launches on the current device may start early: the device is sm_90 or later and runs
// this library's code compiled for sm_90 or later (code compiled for an older target, e.g.
// compute_80 PTX that the driver compiles for a Hopper, has no wait in wait_for_prior_grids).
// Asked once per device and process; false, and not remembered, where the runtime cannot tell
// (the launch then reports its own error). Never throws.
bool early_launch_allowed();

// kernel<<<grid, block, shared, stream>>>(args...), allowed to start early where `early` (and
// early_launch_allowed()); returns the launch's status, which it also clears from
// cudaGetLastError, and never throws.
template <class... Params, class... Args>
cudaError_t try_launch_kernel_started(bool early, void (*kernel)(Params...), dim3 grid, dim3 block, std::size_t shared,
                                      cudaStream_t stream, Args&&... args) {
  cudaLaunchAttribute attribute{};
  attribute.id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attribute.val.programmaticStreamSerializationAllowed = 1;
  cudaLaunchConfig_t config{};
  config.gridDim = grid;
  config.blockDim = block;
  config.dynamicSmemBytes = shared;
  config.stream = stream;
  config.attrs = &attribute;
  config.numAttrs = early && early_launch_allowed() ? 1 : 0;
  const cudaError_t status = cudaLaunchKernelEx(&config, kernel, std::forward<Args>(args)...);
  if (status != cudaSuccess) (void)cudaGetLastError();
  return status;
}

// kernel<<<grid, block, shared, stream>>>(args...), allowed to start early where it may; returns
// the launch's status, which it also clears from cudaGetLastError, and never throws (for callers
// that must clean up before they report).
template <class... Params, class... Args>
cudaError_t try_launch_kernel(void (*kernel)(Params...), dim3 grid, dim3 block, std::size_t shared, cudaStream_t stream,
                              Args&&... args) {
  return try_launch_kernel_started(true, kernel, grid, block, shared, stream, std::forward<Args>(args)...);
}

// The per-launch queries of a kernel, answered once per device and kernel (each costs the host
// ~1-5 µs, and a plan's call made several after its wait for the gate's count, while the GPU
// idled: docs/benchmarks/README.md, "Between the kernels"). allow_dynamic_shared raises the kernel's
// dynamic shared-memory limit to at least `bytes` (cudaFuncSetAttribute only when it grows, so a
// size allowed once stays allowed). The occupancy answers depend on the kernel, its block and
// its shared memory (and cluster) only, all in the key. Keyed by device, not context: a
// cudaDeviceReset clears the attributes set, so twell is not used on a device after one, nor in
// a context of the driver API other than the device's primary one (docs/api.md, "Conventions").
void allow_dynamic_shared(const void* kernel, int bytes, const char* where);
// The dynamic shared memory the kernel may opt in to on the current device: the device's opt-in
// limit less the kernel's static shared memory.
int dynamic_shared_limit(const void* kernel, const char* where);
template <class... Params>
int dynamic_shared_limit(void (*kernel)(Params...), const char* where) {
  return dynamic_shared_limit(reinterpret_cast<const void*>(kernel), where);
}
template <class... Params>
void allow_dynamic_shared(void (*kernel)(Params...), std::size_t bytes, const char* where) {
  allow_dynamic_shared(reinterpret_cast<const void*>(kernel), static_cast<int>(bytes), where);
}
// cudaOccupancyMaxActiveBlocksPerMultiprocessor.
int resident_blocks_per_sm(const void* kernel, int threads, std::size_t bytes, const char* where);
template <class... Params>
int resident_blocks_per_sm(void (*kernel)(Params...), int threads, std::size_t bytes, const char* where) {
  return resident_blocks_per_sm(reinterpret_cast<const void*>(kernel), threads, bytes, where);
}
// cudaOccupancyMaxActiveClusters for `config`.
int resident_clusters(const void* kernel, const cudaLaunchConfig_t& config, const char* where);
template <class... Params>
int resident_clusters(void (*kernel)(Params...), const cudaLaunchConfig_t& config, const char* where) {
  return resident_clusters(reinterpret_cast<const void*>(kernel), config, where);
}

// cudaMemsetAsync(p, value, bytes) as one of the library's kernels: between two kernels it lets
// both start early, where a memset would hold the one after it until it has run. For the small
// fills between a call's kernels; a twell::Error naming `where` on a launch error.
void fill_bytes_async(void* p, unsigned char value, std::size_t bytes, cudaStream_t stream, const char* where);

// try_launch_kernel whose error becomes a twell::Error naming `where`.
template <class... Params, class... Args>
void launch_kernel(const char* where, void (*kernel)(Params...), dim3 grid, dim3 block, std::size_t shared,
                   cudaStream_t stream, Args&&... args) {
  check_cuda(try_launch_kernel(kernel, grid, block, shared, stream, std::forward<Args>(args)...), where);
}

// launch_kernel without the early start: the grid launches once the kernel before it has
// completed. For a grid of a few latency-bound CTAs that may follow a long kernel: launched early,
// its CTAs take the first SMs that have room while that kernel's last wave runs, several to an
// SM, and then share those SMs (the slice pre-pass's count kernel, 22 CTAs for 5632 rows,
// right after another product's slices kernel: ~22 us against ~5, H200, 2026-11-30).
template <class... Params, class... Args>
void launch_kernel_in_order(const char* where, void (*kernel)(Params...), dim3 grid, dim3 block, std::size_t shared,
                            cudaStream_t stream, Args&&... args) {
  check_cuda(try_launch_kernel_started(false, kernel, grid, block, shared, stream, std::forward<Args>(args)...), where);
}

}  // namespace twell::detail
