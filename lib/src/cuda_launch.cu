#include "cuda_launch.cuh"

#include <algorithm>
#include <array>
#include <atomic>
#include <cstdint>

namespace twell::detail {
namespace {

// p's first `head` bytes one by one (up to its 16-byte boundary), then `body` 16-byte words, then
// `tail` bytes.
__global__ void fill_bytes_kernel(unsigned char* p, unsigned char value, std::size_t head, std::size_t body,
                                  std::size_t tail) {
  wait_for_prior_grids();
  const std::size_t first = static_cast<std::size_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  const std::size_t stride = static_cast<std::size_t>(gridDim.x) * blockDim.x;
  const unsigned word = 0x01010101u * value;
  auto* words = reinterpret_cast<uint4*>(p + head);
  for (std::size_t i = first; i < body; i += stride) words[i] = make_uint4(word, word, word, word);
  if (first < head) p[first] = value;
  if (first < tail) p[head + 16 * body + first] = value;
}

// Compiled like every kernel of the library, so its PTX version is theirs on any device.
__global__ void compiled_target_probe_kernel() { ::twell::detail::wait_for_prior_grids(); }

}  // namespace

bool early_launch_allowed() {
  int device = 0;
  if (cudaGetDevice(&device) != cudaSuccess) {
    (void)cudaGetLastError();  // the launch that asks reports its own error
    return false;
  }
  // 0: not asked yet, 1: no, 2: yes. Two threads asking at once get the same answer.
  static std::array<std::atomic<int>, 64> known{};
  const bool cached = device >= 0 && device < static_cast<int>(known.size());
  if (cached) {
    if (const int answer = known[static_cast<std::size_t>(device)].load(std::memory_order_relaxed); answer != 0)
      return answer == 2;
  }
  int major = 0;
  cudaFuncAttributes attributes{};
  if (cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device) != cudaSuccess ||
      cudaFuncGetAttributes(&attributes, compiled_target_probe_kernel) != cudaSuccess) {
    (void)cudaGetLastError();  // e.g. no image for this device: the launch reports it
    return false;
  }
  const bool allowed = major >= 9 && attributes.ptxVersion >= 90;
  if (cached) known[static_cast<std::size_t>(device)].store(allowed ? 2 : 1, std::memory_order_relaxed);
  return allowed;
}

void fill_bytes_async(void* p, unsigned char value, std::size_t bytes, cudaStream_t stream, const char* where) {
  if (bytes == 0) return;
  const std::size_t head = std::min(bytes, (16 - reinterpret_cast<std::uintptr_t>(p) % 16) % 16);
  const std::size_t body = (bytes - head) / 16, tail = bytes - head - 16 * body;
  constexpr unsigned kThreads = 256;
  const auto blocks =
      static_cast<unsigned>(std::clamp<std::size_t>((body + kThreads - 1) / kThreads, 1, std::size_t{4096}));
  launch_kernel(where, fill_bytes_kernel, blocks, kThreads, 0, stream, static_cast<unsigned char*>(p), value, head,
                body, tail);
}

}  // namespace twell::detail
