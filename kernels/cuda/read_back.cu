#include "read_back.cuh"

#include <cstdint>

#include <twell/error.hpp>

#include "cuda_check.hpp"
#include "cuda_launch.cuh"

namespace twell::cuda::detail {
namespace {

using twell::detail::check_cuda;

__global__ void copy_words_kernel(const std::uint32_t* from, std::uint32_t* to, int words) {
  ::twell::detail::wait_for_prior_grids();
  if (static_cast<int>(threadIdx.x) < words) to[threadIdx.x] = from[threadIdx.x];
}

// The thread's pinned, device-mapped slots, allocated at its first read-back and kept for its life.
struct Slots {
  unsigned char* base = nullptr;
  unsigned char* device = nullptr;  // the same memory as the device addresses it
  unsigned used = 0;                // one bit per slot
  ~Slots() {
    if (base != nullptr) cudaFreeHost(base);
  }
};
thread_local Slots slots;

}  // namespace

ReadBack::ReadBack(const void* device, std::size_t bytes, cudaStream_t stream, const char* where) : where_(where) {
  require(bytes % 4 == 0 && bytes <= kMaxBytes && reinterpret_cast<std::uintptr_t>(device) % 4 == 0,
          ErrorCode::invalid_argument, where, "a read-back of ", bytes, " bytes at ", device,
          " (whole, aligned 4-byte words, at most ", kMaxBytes, " bytes)");
  if (slots.base == nullptr) {
    void* base = nullptr;
    check_cuda(cudaHostAlloc(&base, kSlots * kMaxBytes, cudaHostAllocMapped | cudaHostAllocPortable), where);
    void* mapped = nullptr;
    const cudaError_t status = cudaHostGetDevicePointer(&mapped, base, 0);
    if (status != cudaSuccess) cudaFreeHost(base);
    check_cuda(status, where);
    slots.base = static_cast<unsigned char*>(base);
    slots.device = static_cast<unsigned char*>(mapped);
  }
  int free_slot = 0;
  while (free_slot < kSlots && (slots.used >> free_slot & 1u) != 0) ++free_slot;
  require(free_slot < kSlots, ErrorCode::invalid_argument, where, "more than ", kSlots,
          " read-backs at once on one host thread");
  check_cuda(cudaEventCreateWithFlags(&done_, cudaEventDisableTiming), where);
  const auto offset = static_cast<std::size_t>(free_slot) * kMaxBytes;
  cudaError_t status = ::twell::detail::try_launch_kernel(
      copy_words_kernel, 1, 32, 0, stream, static_cast<const std::uint32_t*>(device),
      reinterpret_cast<std::uint32_t*>(slots.device + offset), static_cast<int>(bytes / 4));
  if (status == cudaSuccess) status = cudaEventRecord(done_, stream);
  if (status != cudaSuccess) {
    // A constructor that throws runs no destructor: wait for a copy that may be queued, here.
    cudaStreamSynchronize(stream);
    cudaEventDestroy(done_);
    check_cuda(status, where);
  }
  slot_ = free_slot;
  host_ = slots.base + offset;
  slots.used |= 1u << free_slot;
}

ReadBack::~ReadBack() {
  cudaEventSynchronize(done_);
  cudaEventDestroy(done_);
  slots.used &= ~(1u << slot_);
}

const void* ReadBack::wait() const {
  check_cuda(cudaEventSynchronize(done_), where_);
  return host_;
}

}  // namespace twell::cuda::detail
