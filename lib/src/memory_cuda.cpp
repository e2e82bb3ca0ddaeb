// Memory layer of a build with the cuda backend.
#include <atomic>
#include <cstdint>
#include <cstdlib>
#include <cstring>

#include <cuda_runtime.h>

#include <twell/memory.hpp>

#include "cuda_check.hpp"

namespace twell {

namespace detail {
void* allocate_host_bytes(std::size_t bytes);

namespace {
std::atomic<std::uint64_t> device_allocations{0};
}  // namespace

std::uint64_t device_allocation_count() noexcept { return device_allocations.load(std::memory_order_relaxed); }

namespace {
// A build with the cuda backend on a machine without a usable GPU: the same answer as a build
// without it (ErrorCode::no_device), so callers can tell "no device" from a failing one.
void check_memory_call(cudaError_t status, const char* where, const char* call) {
  if (status == cudaErrorNoDevice || status == cudaErrorInsufficientDriver) {
    cudaGetLastError();
    fail(ErrorCode::no_device, where, "device memory used, but no CUDA device is usable (", cudaGetErrorName(status),
         ")");
  }
  if (status != cudaSuccess) check_cuda(status, detail::concat(where, " (", call, ")").c_str());
}
}  // namespace

void* allocate_bytes(std::size_t bytes, MemorySpace space) {
  if (space == MemorySpace::host) return allocate_host_bytes(bytes);
  void* p = nullptr;
  check_memory_call(cudaMalloc(&p, bytes), "twell::Buffer", "cudaMalloc");
  device_allocations.fetch_add(1, std::memory_order_relaxed);
  return p;
}

void free_bytes(void* p, MemorySpace space) noexcept {
  if (space == MemorySpace::host) {
    std::free(p);
  } else {
    cudaFree(p);  // a failure here cannot be reported from a destructor
  }
}

void copy_bytes(void* dst, MemorySpace dst_space, const void* src, MemorySpace src_space, std::size_t bytes) {
  if (bytes == 0) return;
  if (dst_space == MemorySpace::host && src_space == MemorySpace::host) {
    std::memcpy(dst, src, bytes);
    return;
  }
  check_memory_call(cudaMemcpy(dst, src, bytes, cudaMemcpyDefault), "twell::copy", "cudaMemcpy");
}

void fill_bytes(void* p, MemorySpace space, unsigned char value, std::size_t bytes) {
  if (bytes == 0) return;
  if (space == MemorySpace::host) {
    std::memset(p, value, bytes);
  } else {
    // Synchronous, so the bytes cannot land after work a caller queues on a non-blocking stream.
    check_memory_call(cudaMemset(p, value, bytes), "twell::Buffer", "cudaMemset");
    check_cuda(cudaStreamSynchronize(nullptr), "twell::Buffer (cudaMemset)");
  }
}
}  // namespace detail

bool cuda_available() {
  static const bool available = [] {
    int count = 0;
    const bool ok = cudaGetDeviceCount(&count) == cudaSuccess && count > 0;
    cudaGetLastError();  // a failed probe must not linger as the next call's error
    return ok;
  }();
  return available;
}

void require_cuda_device(const char* where) {
  if (!cuda_available()) fail(ErrorCode::no_device, where, "operands live in device memory, but no CUDA device is visible");
}

}  // namespace twell
