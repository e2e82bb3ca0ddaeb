#include "cuda_launch.cuh"

#include <algorithm>
#include <array>
#include <atomic>
#include <cstdint>
#include <map>
#include <mutex>
#include <tuple>
#include <type_traits>

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

namespace {

// What the launch helpers below remember, per device and kernel: the dynamic shared memory a
// kernel is allowed, and occupancy answers.
struct LaunchFacts {
  std::mutex mutex;
  std::map<std::pair<int, const void*>, int> allowed_shared, shared_limit;
  std::map<std::tuple<int, const void*, int, std::size_t>, int> resident;
  // ... and the cluster's dimensions.
  std::map<std::tuple<int, const void*, int, std::size_t, unsigned, unsigned, unsigned>, int> clusters;
};
LaunchFacts& launch_facts() {
  // Never destroyed, so that a launch from another static's destructor still finds it.
  static LaunchFacts& facts = *new LaunchFacts;
  return facts;
}

int current_device(const char* where) {
  int device = 0;
  check_cuda(cudaGetDevice(&device), where);
  return device;
}

// known[key], from ask() the first time (under the facts' lock, so that one thread asks).
template <class Key, class Ask>
int remembered(std::map<Key, int>& known, const std::type_identity_t<Key>& key, Ask ask) {
  const std::lock_guard lock(launch_facts().mutex);
  if (const auto found = known.find(key); found != known.end()) return found->second;
  const int answer = ask();
  known.emplace(key, answer);
  return answer;
}

}  // namespace

int dynamic_shared_limit(const void* kernel, const char* where) {
  const int device = current_device(where);
  return remembered(launch_facts().shared_limit, std::pair(device, kernel), [&] {
    int optin = 0;
    check_cuda(cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, device), where);
    cudaFuncAttributes attributes{};
    check_cuda(cudaFuncGetAttributes(&attributes, kernel), where);
    return optin - static_cast<int>(attributes.sharedSizeBytes);
  });
}

void allow_dynamic_shared(const void* kernel, int bytes, const char* where) {
  // Past the device's opt-in limit the attribute call fails as a bare CUDA error; the operands'
  // sizes decide the bytes (the TwELL spmm's per-tile prefix, for one), so say that they do.
  const int limit = dynamic_shared_limit(kernel, where);
  require(bytes <= limit, ErrorCode::unsupported, where, "these operands need ", bytes,
          " bytes of shared memory per block; the device allows this kernel ", limit);
  const int device = current_device(where);
  LaunchFacts& facts = launch_facts();
  const std::lock_guard lock(facts.mutex);
  int& allowed = facts.allowed_shared[{device, kernel}];
  if (bytes <= allowed) return;
  check_cuda(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, bytes), where);
  allowed = bytes;
}

int resident_blocks_per_sm(const void* kernel, int threads, std::size_t bytes, const char* where) {
  return remembered(launch_facts().resident, std::tuple(current_device(where), kernel, threads, bytes), [&] {
    int per_sm = 0;
    check_cuda(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kernel, threads, bytes), where);
    return per_sm;
  });
}

int resident_clusters(const void* kernel, const cudaLaunchConfig_t& config, const char* where) {
  dim3 cluster(1, 1, 1);
  for (unsigned i = 0; i < config.numAttrs; ++i)
    if (config.attrs[i].id == cudaLaunchAttributeClusterDimension)
      cluster =
          dim3(config.attrs[i].val.clusterDim.x, config.attrs[i].val.clusterDim.y, config.attrs[i].val.clusterDim.z);
  const auto key = std::tuple(current_device(where), kernel,
                              static_cast<int>(config.blockDim.x * config.blockDim.y * config.blockDim.z),
                              config.dynamicSmemBytes, cluster.x, cluster.y, cluster.z);
  return remembered(launch_facts().clusters, key, [&] {
    int clusters = 0;
    check_cuda(cudaOccupancyMaxActiveClusters(&clusters, kernel, &config), where);
    return clusters;
  });
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
