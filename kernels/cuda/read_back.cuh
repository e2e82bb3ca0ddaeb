// Internal to kernels/cuda: a few device words read back to the host behind the work queued on a
// stream (read_back.cu). Not installed.
#pragma once

#include <cstddef>
#include <cstring>

#include <cuda_runtime.h>

namespace twell::cuda::detail {

// Up to kMaxBytes of device memory (a count, a few status words), copied into pinned host memory
// behind the work on `stream` so far, so the host can queue more work before wait() blocks for
// the values. A one-warp kernel writes them into device-mapped pinned memory instead of a
// cudaMemcpyAsync: between two kernels of one stream, a copy costs two hand-offs between the
// compute and copy engines, each 3-9 us of idle GPU on an H200, against one launch gap of ~1 us
// for a kernel (`twell bench --timeline`, training step, 2026-11-29).
// Each host thread has kSlots pinned slots; a read-back holds one until it is destroyed, which
// waits for its copy (a copy still in flight would overwrite the slot's next use).
class ReadBack {
 public:
  static constexpr std::size_t kMaxBytes = 64;
  static constexpr int kSlots = 4;

  // `device` and `bytes` 4-byte aligned, bytes at most kMaxBytes. Throws twell::Error (cuda) when
  // the pinned slots, the event or the launch fail; (invalid_argument) on a misaligned or too
  // large read, or when the thread holds every slot.
  ReadBack(const void* device, std::size_t bytes, cudaStream_t stream, const char* where);
  ReadBack(const ReadBack&) = delete;
  ReadBack& operator=(const ReadBack&) = delete;
  ~ReadBack();

  // Blocks until the copy has landed; returns the words.
  const void* wait() const;
  // The value of type U at `offset` bytes, after wait().
  template <class U>
  U get(std::size_t offset = 0) const {
    U v;
    std::memcpy(&v, static_cast<const unsigned char*>(wait()) + offset, sizeof v);
    return v;
  }

 private:
  int slot_ = -1;
  void* host_ = nullptr;
  cudaEvent_t done_ = nullptr;
  const char* where_;
};

}  // namespace twell::cuda::detail
