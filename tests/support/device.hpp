// Device helpers of the GPU suites; include only where the CUDA runtime is available.
#pragma once

#include <doctest/doctest.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <vector>

#include <cuda_runtime.h>

#include <twell/memory.hpp>

namespace twell::testing {

inline void cuda_ok(cudaError_t status) { REQUIRE_MESSAGE(status == cudaSuccess, cudaGetErrorString(status)); }

// A non-blocking stream (not ordered after the legacy default stream), destroyed with its owner
// also when a REQUIRE ends the test case early.
class NonBlockingStream {
 public:
  NonBlockingStream() { cuda_ok(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking)); }
  NonBlockingStream(const NonBlockingStream&) = delete;
  NonBlockingStream& operator=(const NonBlockingStream&) = delete;
  ~NonBlockingStream() { cudaStreamDestroy(stream_); }
  cudaStream_t get() const { return stream_; }

 private:
  cudaStream_t stream_ = nullptr;
};

// The current device's streaming multiprocessors.
inline int device_multiprocessors() {
  int device = 0, sms = 0;
  cuda_ok(cudaGetDevice(&device));
  cuda_ok(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device));
  return sms;
}

#if defined(TWELL_TEST_BUILT_SM90A)
// Whether a GemmToSparsePlan on FusedMainloop::best_decode_split (the FFN plans' gate) whose
// policy and capacity allow the split must take the split-K decode kernel (path suffix
// "_ksplit4"): a compute capability 9.0 device, a build with sm_90a code, M <= 64, K > 448, and
// ceil(N / tile) clusters of 4 CTAs resident at once. The last is the device's answer
// (cudaOccupancyMaxActiveClusters); clusters do not span GPCs, so it is taken as sure up to SMs / 8
// clusters, and up to the paper shape's 22 (N 5632, tile 256) on the 132 SMs of an H100 SXM or
// H200 (an H200 held them, 2026-12-02). Between that and SMs / 4: nothing (empty).
inline std::optional<bool> decode_split_expected(std::int64_t m, std::int64_t k, std::int64_t n, std::int32_t tile) {
  int device = 0;
  cudaDeviceProp p{};
  cuda_ok(cudaGetDevice(&device));
  cuda_ok(cudaGetDeviceProperties(&p, device));
  if (TWELL_TEST_BUILT_SM90A != 1 || p.major != 9 || p.minor != 0) return false;
  if (m < 1 || m > 64 || (k + 63) / 64 < 8) return false;
  const std::int64_t tiles = (n + tile - 1) / tile;
  if (tiles <= p.multiProcessorCount / 8 || (p.multiProcessorCount == 132 && tiles <= 22)) return true;
  if (tiles > p.multiProcessorCount / 4) return false;
  return std::nullopt;
}
#endif

// Every byte of a device buffer set to 0xFF: NaN in every value type and an out-of-range index, so
// that an element a kernel leaves unwritten, or reads before writing, shows in the comparison.
template <class U>
void poison_device(Buffer<U>& b) {
  if (b.bytes() > 0) cuda_ok(cudaMemset(b.data(), 0xff, b.bytes()));
}
// The same queued on `stream`: a non-blocking stream (a graph replayed on one, too) is not ordered
// after the legacy stream's cudaMemset, which is asynchronous for device memory.
template <class U>
void poison_device(Buffer<U>& b, cudaStream_t stream) {
  if (b.bytes() > 0) cuda_ok(cudaMemsetAsync(b.data(), 0xff, b.bytes(), stream));
}

// Whether every byte of a device buffer still holds poison_device's 0xFF: nothing was written.
template <class U>
bool still_poisoned(const Buffer<U>& b) {
  const Buffer<U> host = b.copy_to(MemorySpace::host);
  const auto* bytes = reinterpret_cast<const unsigned char*>(host.data());
  return std::all_of(bytes, bytes + host.bytes(), [](unsigned char c) { return c == 0xff; });
}

// Leaves twell's pool of the current device keeping nearly all of the device's memory, as at a
// process's peak, for as long as it lives: blocks of shrinking sizes allocated until none fits
// (each failure trims an empty pool and throws out_of_memory), then all freed into the pool. Some
// memory stays free (33-36 MB on an H200, 2026-11-29, as much with blocks down to 32 KiB),
// and plain cudaMalloc blocks taken after the fill left the pool keeping less than half the
// device: the driver hands a pool's unused memory to cudaMalloc. So the cases check that work
// goes on with the pool this full, not that another library's allocation had to wait for a trim.
// On destruction, also when a check fails first, the pool gives its memory back: a suite whose
// case left the pool full would fail later cases at their kernels' first launches.
class FilledDevice {
 public:
  FilledDevice() {
    release_cached_device_memory();
    {
      std::vector<Buffer<unsigned char>> peak;
      for (std::size_t block = std::size_t{1} << 30; block >= std::size_t{2} << 20; block /= 8) {
        try {
          for (;;) peak.emplace_back(block, MemorySpace::device, Uninitialized{});
        } catch (const Error& e) {
          REQUIRE(e.code() == ErrorCode::out_of_memory);
        }
      }
      REQUIRE(cudaGetLastError() == cudaSuccess);
    }
    cuda_ok(cudaDeviceSynchronize());
    std::size_t total = 0;
    cuda_ok(cudaMemGetInfo(&free_, &total));
    REQUIRE(detail::kept_device_bytes() > total / 2);
  }
  FilledDevice(const FilledDevice&) = delete;
  FilledDevice& operator=(const FilledDevice&) = delete;
  std::size_t free_bytes() const { return free_; }  // the device's free bytes once filled

 private:
  // A member, so that the release also runs when a check in the constructor's body fails.
  struct ReleasePoolAtExit {
    ReleasePoolAtExit() = default;
    ReleasePoolAtExit(const ReleasePoolAtExit&) = delete;
    ReleasePoolAtExit& operator=(const ReleasePoolAtExit&) = delete;
    ~ReleasePoolAtExit() {
      try {
        release_cached_device_memory();
      } catch (const Error&) {  // a destructor cannot report it; the next case's checks would
      }
    }
  } release_;
  std::size_t free_ = 0;
};

}  // namespace twell::testing
