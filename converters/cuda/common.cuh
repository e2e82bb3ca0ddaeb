// Internal plumbing shared by the cuda converters: streams, stream-ordered temporaries, the
// device counters every conversion reads back, CUB wrappers and launch geometry.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>

#include <cuda_runtime.h>

#include <cub/device/device_reduce.cuh>
#include <cub/device/device_scan.cuh>

#include <twell/converters/backends.hpp>
#include <twell/formats/view_checks.hpp>

#include "cuda_check.hpp"
#include "cuda_launch.cuh"
#include "cuda_scratch.hpp"

namespace twell::cuda::detail {

using twell::detail::check_cuda;
using twell::detail::check_device_operand;

constexpr int kWarpSize = 32;
constexpr int kBlockThreads = 256;
constexpr int kWarpsPerBlock = kBlockThreads / kWarpSize;
// Kernels are grid-stride; more blocks than a few waves only adds scheduling and atomics.
constexpr std::int64_t kMaxBlocks = 4096;
constexpr unsigned kFullMask = 0xffffffffu;

inline cudaStream_t stream_of(const ConvertOptions& options) {
  return static_cast<cudaStream_t>(options.stream.handle);
}

// Blocks for one warp per work item (grid-stride beyond kMaxBlocks); 0 when there is no work,
// and callers skip the launch then (a zero-sized grid is a launch error).
inline unsigned blocks_for_warps(std::int64_t warps) {
  const std::int64_t blocks = (warps + kWarpsPerBlock - 1) / kWarpsPerBlock;
  return static_cast<unsigned>(std::min(blocks, kMaxBlocks));
}

// A non-blocking user stream is not ordered after work on the legacy default stream, such as a
// caller's cudaMemset into an operand (the gpu tests poison outputs so), which that stream runs
// without the host waiting; before a conversion writes its outputs its stream waits for the
// legacy stream. (The Buffers twell makes are complete when their constructors return, and
// twell's copies when they return.)
inline void order_after_allocations(cudaStream_t stream) {
  if (stream == nullptr || stream == cudaStreamLegacy) return;
  cudaEvent_t done = nullptr;
  check_cuda(cudaEventCreateWithFlags(&done, cudaEventDisableTiming), "twell::cuda converter (cudaEventCreate)");
  const cudaError_t recorded = cudaEventRecord(done, cudaStreamLegacy);
  const cudaError_t waited = recorded == cudaSuccess ? cudaStreamWaitEvent(stream, done, 0) : recorded;
  cudaEventDestroy(done);
  check_cuda(waited, "twell::cuda converter (cudaStreamWaitEvent)");
}

// n values of T in stream-ordered scratch memory on the conversion's stream (Scratch): no zero
// fill and no ordering hazard with other streams. Converters allocate these per call;
// conversion plans (later) will own them instead.
template <class T>
class DeviceTemp {
 public:
  DeviceTemp(std::size_t n, cudaStream_t stream) : memory_(n * sizeof(T), stream, "twell::cuda converter (scratch)") {}
  T* get() const { return memory_.as<T>(); }

 private:
  Scratch memory_;
};

// What every conversion may need to bring back to the host, in one small block of device memory.
struct Counters {
  unsigned long long first_overflow;  // smallest overflowed key (row * tiles + tile, or row for ELL); ~0: none
  unsigned long long dropped;         // values removed under OverflowPolicy::drop
  unsigned long long nnz;             // values in the result
};
constexpr unsigned long long kNoOverflow = ~0ull;

class DeviceCounters {
 public:
  explicit DeviceCounters(cudaStream_t stream) : temp_(1, stream), stream_(stream) {
    ::twell::detail::fill_bytes_async(&temp_.get()->first_overflow, 0xff, sizeof(unsigned long long), stream,
                                      "twell::cuda converter (fill)");
    ::twell::detail::fill_bytes_async(&temp_.get()->dropped, 0, 2 * sizeof(unsigned long long), stream,
                                      "twell::cuda converter (fill)");
  }
  Counters* get() const { return temp_.get(); }
  // One small copy and a stream sync: the only host round trip of most conversions.
  Counters read() const {
    Counters host{};
    check_cuda(cudaMemcpyAsync(&host, temp_.get(), sizeof host, cudaMemcpyDeviceToHost, stream_),
               "twell::cuda converter (cudaMemcpyAsync)");
    check_cuda(cudaStreamSynchronize(stream_), "twell::cuda converter (cudaStreamSynchronize)");
    return host;
  }

 private:
  DeviceTemp<Counters> temp_;
  cudaStream_t stream_;
};

template <class T>
T read_value(const T* device_ptr, cudaStream_t stream) {
  T host{};
  check_cuda(cudaMemcpyAsync(&host, device_ptr, sizeof host, cudaMemcpyDeviceToHost, stream),
             "twell::cuda converter (cudaMemcpyAsync)");
  check_cuda(cudaStreamSynchronize(stream), "twell::cuda converter (cudaStreamSynchronize)");
  return host;
}

// The temporary storage inclusive_sum needs for n items.
template <class In, class Out>
std::size_t inclusive_sum_bytes(std::int64_t n) {
  std::size_t bytes = 0;
  if (n > 0)
    check_cuda(cub::DeviceScan::InclusiveSum(nullptr, bytes, In{}, Out{}, n), "twell::cuda converter (cub scan)");
  return bytes;
}

// out[i] = in[0] + ... + in[i], with `bytes` (inclusive_sum_bytes) of temporary storage at temp.
template <class In, class Out>
void inclusive_sum(In in, Out out, std::int64_t n, void* temp, std::size_t bytes, cudaStream_t stream) {
  if (n == 0) return;
  check_cuda(cub::DeviceScan::InclusiveSum(temp, bytes, in, out, n, stream), "twell::cuda converter (cub scan)");
}

// The same with the temporary storage allocated per call.
template <class In, class Out>
void inclusive_sum(In in, Out out, std::int64_t n, cudaStream_t stream) {
  const std::size_t bytes = inclusive_sum_bytes<In, Out>(n);
  DeviceTemp<std::byte> temp(bytes, stream);
  inclusive_sum(in, out, n, temp.get(), bytes, stream);
}

// *out = max(in[0..n)); temporary storage sized and allocated per call. Requires n > 0.
template <class In, class Out>
void maximum(In in, Out out, std::int64_t n, cudaStream_t stream) {
  std::size_t bytes = 0;
  check_cuda(cub::DeviceReduce::Max(nullptr, bytes, in, out, n, stream), "twell::cuda converter (cub max)");
  DeviceTemp<std::byte> temp(bytes, stream);
  check_cuda(cub::DeviceReduce::Max(temp.get(), bytes, in, out, n, stream), "twell::cuda converter (cub max)");
}

// options without the report: the steps of a composed conversion must not fill it.
inline ConvertOptions quiet(const ConvertOptions& options) {
  ConvertOptions o = options;
  o.report = nullptr;
  return o;
}

__device__ inline int lane_id() { return static_cast<int>(threadIdx.x % kWarpSize); }
__device__ inline std::int64_t global_warp() {
  return (static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x) / kWarpSize;
}
__device__ inline std::int64_t warp_count() { return static_cast<std::int64_t>(gridDim.x) * blockDim.x / kWarpSize; }

// Adds a warp's private total to a counter once, at the end of a grid-stride kernel.
__device__ inline void add_count(unsigned long long* counter, std::int64_t value) {
  if (counter != nullptr && lane_id() == 0 && value != 0)
    atomicAdd(counter, static_cast<unsigned long long>(value));
}

}  // namespace twell::cuda::detail
