// Memory layer of a build with the cuda backend.
#include <atomic>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <mutex>
#include <vector>

#include <cuda_runtime.h>

#include <twell/memory.hpp>

#include "cuda_check.hpp"
#include "device_pool.hpp"

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

namespace {
// twell's pool of each device (device_pool.hpp), created on first use. Never destroyed: a pool
// lives as long as the CUDA context, which process exit tears down after static destructors may
// have run.
class DevicePools {
 public:
  static DevicePools& instance() {
    static auto* pools = new DevicePools();
    return *pools;
  }

  cudaMemPool_t of(int device, const char* where) {
    const std::lock_guard lock(mutex_);
    if (static_cast<std::size_t>(device) >= pools_.size()) pools_.resize(static_cast<std::size_t>(device) + 1);
    cudaMemPool_t& pool = pools_[static_cast<std::size_t>(device)];
    if (pool == nullptr) pool = create(device, where);
    return pool;
  }

  // The pools created so far, with their devices.
  std::vector<std::pair<int, cudaMemPool_t>> created() {
    const std::lock_guard lock(mutex_);
    std::vector<std::pair<int, cudaMemPool_t>> out;
    for (std::size_t d = 0; d < pools_.size(); ++d)
      if (pools_[d] != nullptr) out.emplace_back(static_cast<int>(d), pools_[d]);
    return out;
  }

 private:
  static cudaMemPool_t create(int device, const char* where) {
    cudaMemPoolProps props{};
    props.allocType = cudaMemAllocationTypePinned;
    props.location.type = cudaMemLocationTypeDevice;
    props.location.id = device;
    cudaMemPool_t pool = nullptr;
    check_memory_call(cudaMemPoolCreate(&pool, &props), where, "cudaMemPoolCreate");
    // Keep every freed byte until asked (release_cached_device_memory) or out of memory.
    std::uint64_t keep = std::numeric_limits<std::uint64_t>::max();
    check_memory_call(cudaMemPoolSetAttribute(pool, cudaMemPoolAttrReleaseThreshold, &keep), where,
                      "cudaMemPoolSetAttribute");
    return pool;
  }

  std::mutex mutex_;
  std::vector<cudaMemPool_t> pools_;  // by device; null until first used
};

// Makes `device` current for its scope (the calls on a pool and its memory run on its device).
class CurrentDevice {
 public:
  explicit CurrentDevice(int device) {
    if (cudaGetDevice(&previous_) == cudaSuccess && previous_ != device)
      switched_ = cudaSetDevice(device) == cudaSuccess;
  }
  CurrentDevice(const CurrentDevice&) = delete;
  CurrentDevice& operator=(const CurrentDevice&) = delete;
  ~CurrentDevice() {
    if (switched_) cudaSetDevice(previous_);
  }

 private:
  int previous_ = 0;
  bool switched_ = false;
};

// Returns what `pool` keeps to its device, once the device's queued work (and so every pending
// stream-ordered free) has ended.
cudaError_t trim(int device, cudaMemPool_t pool) {
  const CurrentDevice on(device);
  const cudaError_t status = cudaDeviceSynchronize();
  return status != cudaSuccess ? status : cudaMemPoolTrimTo(pool, 0);
}
}  // namespace

void* allocate_from_pool(std::size_t bytes, cudaStream_t stream, const char* where) {
  int device = 0;
  check_memory_call(cudaGetDevice(&device), where, "cudaGetDevice");
  const cudaMemPool_t pool = DevicePools::instance().of(device, where);
  void* p = nullptr;
  cudaError_t status = cudaMallocFromPoolAsync(&p, bytes, pool, stream);
  if (status == cudaErrorMemoryAllocation) {
    cudaGetLastError();  // not sticky; cleared so that the retry's status is its own
    status = trim(device, pool);
    if (status == cudaSuccess) status = cudaMallocFromPoolAsync(&p, bytes, pool, stream);
  }
  check_memory_call(status, where, "cudaMallocFromPoolAsync");
  return p;
}

std::uint64_t kept_device_bytes() {
  std::uint64_t kept = 0;
  for (const auto& [device, pool] : DevicePools::instance().created()) {
    std::uint64_t reserved = 0, used = 0;
    check_cuda(cudaMemPoolGetAttribute(pool, cudaMemPoolAttrReservedMemCurrent, &reserved), "twell::kept_device_bytes");
    check_cuda(cudaMemPoolGetAttribute(pool, cudaMemPoolAttrUsedMemCurrent, &used), "twell::kept_device_bytes");
    kept += reserved - used;
  }
  return kept;
}

void* allocate_bytes(std::size_t bytes, MemorySpace space) {
  if (space == MemorySpace::host) return allocate_host_bytes(bytes);
  constexpr const char* where = "twell::Buffer";
  void* p = allocate_from_pool(bytes, cudaStreamLegacy, where);
  // Usable on every stream from here: the pool may have handed out memory that Scratch freed in
  // stream order on another stream, behind a dependency that the legacy stream now waits for.
  const cudaError_t status = cudaStreamSynchronize(cudaStreamLegacy);
  if (status != cudaSuccess) {
    cudaFreeAsync(p, cudaStreamLegacy);
    check_memory_call(status, where, "cudaStreamSynchronize");
  }
  device_allocations.fetch_add(1, std::memory_order_relaxed);
  return p;
}

void free_bytes(void* p, MemorySpace space) noexcept {
  if (space == MemorySpace::host) {
    std::free(p);
    return;
  }
  // On p's device, after its queued work, as cudaFree did: the free functions destroy their
  // intermediates while kernels that read them may still be queued on the caller's stream.
  // Failures cannot be reported from a destructor.
  cudaPointerAttributes attributes{};
  int device = 0;
  if (cudaPointerGetAttributes(&attributes, p) == cudaSuccess && attributes.type == cudaMemoryTypeDevice) {
    device = attributes.device;
  } else {
    cudaGetLastError();
    cudaGetDevice(&device);
  }
  const CurrentDevice on(device);
  cudaDeviceSynchronize();
  cudaFreeAsync(p, cudaStreamLegacy);
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

void release_cached_device_memory() {
  for (const auto& [device, pool] : detail::DevicePools::instance().created())
    detail::check_cuda(detail::trim(device, pool), "twell::release_cached_device_memory");
}

void require_cuda_device(const char* where) {
  if (!cuda_available()) fail(ErrorCode::no_device, where, "operands live in device memory, but no CUDA device is visible");
}

}  // namespace twell
