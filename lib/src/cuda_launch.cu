#include "cuda_launch.cuh"

#include <array>
#include <atomic>

namespace twell::detail {
namespace {

// Compiled like every kernel of the library, so its PTX version is theirs on any device.
__global__ void compiled_target_probe_kernel() { ::twell::detail::wait_for_prior_grids(); }

}  // namespace

bool early_launch_allowed() {
  constexpr const char* where = "twell (kernel launch)";
  int device = 0;
  check_cuda(cudaGetDevice(&device), where);
  // 0: not asked yet, 1: no, 2: yes. Two threads asking at once get the same answer.
  static std::array<std::atomic<int>, 64> known{};
  const bool cached = device >= 0 && device < static_cast<int>(known.size());
  if (cached) {
    if (const int answer = known[static_cast<std::size_t>(device)].load(std::memory_order_relaxed); answer != 0)
      return answer == 2;
  }
  int major = 0;
  check_cuda(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device), where);
  cudaFuncAttributes attributes{};
  check_cuda(cudaFuncGetAttributes(&attributes, compiled_target_probe_kernel), where);
  const bool allowed = major >= 9 && attributes.ptxVersion >= 90;
  if (cached) known[static_cast<std::size_t>(device)].store(allowed ? 2 : 1, std::memory_order_relaxed);
  return allowed;
}

}  // namespace twell::detail
