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
// set_device_memory_cache_limit's bound: every pool's release threshold.
std::atomic<std::uint64_t> cache_limit{std::numeric_limits<std::uint64_t>::max()};

// What twell holds on one device: its pool (device_pool.hpp) and a private non-blocking stream on
// which Buffers are allocated, zero-filled and freed, so that making a Buffer waits for nothing
// but the pool's own dependencies (a block that Scratch freed on another stream), not for the
// work of the caller's blocking streams as the legacy stream would.
struct DevicePool {
  cudaMemPool_t pool = nullptr;
  cudaStream_t stream = nullptr;
};

// The pools of the devices, each created at twell's first allocation there. Never destroyed: a
// Buffer destroyed at exit (a static one) may free into its pool after any destructor of this
// table had run, and cudaMemPoolDestroy fails once the CUDA runtime has been torn down; the
// driver reclaims the pools with the process.
class DevicePools {
 public:
  static DevicePools& instance() {
    static auto* pools = new DevicePools();
    return *pools;
  }

  // The current device's pool and stream (`device` must be current: the stream is created there).
  DevicePool of(int device, const char* where) {
    const std::lock_guard lock(mutex_);
    if (static_cast<std::size_t>(device) >= pools_.size()) pools_.resize(static_cast<std::size_t>(device) + 1);
    DevicePool& entry = pools_[static_cast<std::size_t>(device)];
    if (entry.pool == nullptr) entry = create(device, where);
    return entry;
  }

  // The pool and stream of `device`, both null before its first allocation. Creates nothing
  // (frees call it from destructors).
  DevicePool existing(int device) noexcept {
    const std::lock_guard lock(mutex_);
    return static_cast<std::size_t>(device) < pools_.size() ? pools_[static_cast<std::size_t>(device)] : DevicePool{};
  }

  // Sets every pool's release threshold to `bytes`, then cache_limit, under the lock that pool
  // creation holds, so that no pool is made with the previous bound after this returns. A pool
  // that refuses leaves cache_limit as it was; the others keep the new bound.
  void set_cache_limit(std::uint64_t bytes) {
    const std::lock_guard lock(mutex_);
    cudaError_t first = cudaSuccess;
    for (DevicePool& entry : pools_) {
      if (entry.pool == nullptr) continue;
      const cudaError_t status = cudaMemPoolSetAttribute(entry.pool, cudaMemPoolAttrReleaseThreshold, &bytes);
      if (first == cudaSuccess) first = status;
    }
    check_cuda(first, "twell::set_device_memory_cache_limit");
    cache_limit.store(bytes, std::memory_order_relaxed);
  }

  // The entries created so far, with their devices.
  std::vector<std::pair<int, DevicePool>> created() {
    const std::lock_guard lock(mutex_);
    std::vector<std::pair<int, DevicePool>> out;
    for (std::size_t d = 0; d < pools_.size(); ++d)
      if (pools_[d].pool != nullptr) out.emplace_back(static_cast<int>(d), pools_[d]);
    return out;
  }

 private:
  static DevicePool create(int device, const char* where) {
    int supported = 0;
    check_memory_call(cudaDeviceGetAttribute(&supported, cudaDevAttrMemoryPoolsSupported, device), where,
                      "cudaDeviceGetAttribute");
    require(supported != 0, ErrorCode::unsupported, where, "device ", device,
            " has no stream-ordered memory pools (cudaDevAttrMemoryPoolsSupported), which twell allocates from");
    cudaMemPoolProps props{};
    props.allocType = cudaMemAllocationTypePinned;
    props.location.type = cudaMemLocationTypeDevice;
    props.location.id = device;
    DevicePool entry;
    check_memory_call(cudaMemPoolCreate(&entry.pool, &props), where, "cudaMemPoolCreate");
    // By default keep every freed byte until asked (release_cached_device_memory) or out of memory.
    std::uint64_t keep = cache_limit.load(std::memory_order_relaxed);
    cudaError_t status = cudaMemPoolSetAttribute(entry.pool, cudaMemPoolAttrReleaseThreshold, &keep);
    if (status == cudaSuccess) status = cudaStreamCreateWithFlags(&entry.stream, cudaStreamNonBlocking);
    if (status != cudaSuccess) {
      cudaMemPoolDestroy(entry.pool);
      check_memory_call(status, where, "twell's pool set-up");
    }
    return entry;
  }

  std::mutex mutex_;
  std::vector<DevicePool> pools_;  // by device; null until first used
};

// Makes `device` current for its scope (the calls on a pool and its memory run on its device);
// status() says whether that worked.
class CurrentDevice {
 public:
  explicit CurrentDevice(int device) {
    status_ = cudaGetDevice(&previous_);
    if (status_ == cudaSuccess && previous_ != device) {
      status_ = cudaSetDevice(device);
      switched_ = status_ == cudaSuccess;
    }
  }
  CurrentDevice(const CurrentDevice&) = delete;
  CurrentDevice& operator=(const CurrentDevice&) = delete;
  ~CurrentDevice() {
    if (switched_) cudaSetDevice(previous_);
  }
  cudaError_t status() const { return status_; }

 private:
  int previous_ = 0;
  bool switched_ = false;
  cudaError_t status_ = cudaSuccess;
};

// Returns what `pool` keeps to its device, once the device's queued work (and so every pending
// stream-ordered free) has ended.
cudaError_t trim(int device, cudaMemPool_t pool) {
  const CurrentDevice on(device);
  cudaError_t status = on.status();
  if (status == cudaSuccess) status = cudaDeviceSynchronize();
  return status != cudaSuccess ? status : cudaMemPoolTrimTo(pool, 0);
}

// Test hooks (memory.hpp): pool allocations to fail as if the device were out of memory, and the
// byte to fill uninitialised Buffers with (negative: none).
std::atomic<int> failures_to_inject{0};
std::atomic<int> allocations_before_failure{-1};
std::atomic<int> uninitialized_fill{-1};

// What an injected failure asks for: a request no device can serve, so that the runtime's error
// state is a real failure's.
constexpr std::size_t kUnservable = std::size_t{1} << 50;

// Whether the hook that fails an allocation for good fires on this one (it then disarms).
bool fails_for_good() {
  int left = allocations_before_failure.load(std::memory_order_relaxed);
  while (left >= 0)
    if (allocations_before_failure.compare_exchange_weak(left, left - 1, std::memory_order_relaxed)) return left == 0;
  return false;
}

// The first try of a pool allocation, or an injected failure (not spent on a request that fails
// anyway).
cudaError_t try_allocate(void** p, std::size_t bytes, cudaMemPool_t pool, cudaStream_t stream) {
  int pending = bytes == kUnservable ? 0 : failures_to_inject.load(std::memory_order_relaxed);
  while (pending > 0)
    if (failures_to_inject.compare_exchange_weak(pending, pending - 1, std::memory_order_relaxed))
      return cudaMallocFromPoolAsync(p, kUnservable, pool, stream);
  return cudaMallocFromPoolAsync(p, bytes, pool, stream);
}

// Whether `bytes` fits the current device at all: a request that does not is refused without
// emptying the pool for nothing.
bool fits_device(std::size_t bytes) {
  std::size_t free = 0, total = 0;
  if (cudaMemGetInfo(&free, &total) != cudaSuccess) {
    cudaGetLastError();
    return true;
  }
  return bytes <= total;
}

// From the current device's pool `entry`.
void* allocate_in(const DevicePool& entry, std::size_t bytes, cudaStream_t stream, const char* where) {
  void* p = nullptr;
  const std::size_t asked = fails_for_good() ? kUnservable : bytes;
  cudaError_t status = try_allocate(&p, asked, entry.pool, stream);
  if (status == cudaErrorMemoryAllocation && fits_device(bytes)) {
    // Clears the failure too, so that a retry that succeeds leaves no error for the next launch
    // check to report.
    trim_current_pool(where);
    status = cudaMallocFromPoolAsync(&p, asked, entry.pool, stream);
  }
  check_memory_call(status, where, "cudaMallocFromPoolAsync");
  return p;
}

DevicePool current_pool(const char* where) {
  int device = 0;
  check_memory_call(cudaGetDevice(&device), where, "cudaGetDevice");
  return DevicePools::instance().of(device, where);
}
}  // namespace

void fail_next_pool_allocations(int count) { failures_to_inject.store(count, std::memory_order_relaxed); }

void fail_pool_allocation_after(int succeeding) {
  allocations_before_failure.store(succeeding < 0 ? -1 : succeeding, std::memory_order_relaxed);
}

bool pool_allocation_failure_armed() noexcept {
  return allocations_before_failure.load(std::memory_order_relaxed) >= 0;
}

int plan_device(const char* where) {
  int device = 0;
  check_memory_call(cudaGetDevice(&device), where, "cudaGetDevice");
  return device;
}

void set_uninitialized_device_fill(int byte) { uninitialized_fill.store(byte, std::memory_order_relaxed); }

void* allocate_from_pool(std::size_t bytes, cudaStream_t stream, const char* where) {
  return allocate_in(current_pool(where), bytes, stream, where);
}

void trim_current_pool(const char* where) {
  // The failure that led here is handled by the retry; any other pending error stays.
  if (cudaPeekAtLastError() == cudaErrorMemoryAllocation) cudaGetLastError();
  int device = 0;
  check_memory_call(cudaGetDevice(&device), where, "cudaGetDevice");
  const DevicePool entry = DevicePools::instance().existing(device);
  if (entry.pool != nullptr) check_memory_call(trim(device, entry.pool), where, "trimming twell's pool");
}

std::uint64_t kept_device_bytes() {
  std::uint64_t kept = 0;
  for (const auto& [device, entry] : DevicePools::instance().created()) {
    std::uint64_t reserved = 0, used = 0;
    check_cuda(cudaMemPoolGetAttribute(entry.pool, cudaMemPoolAttrReservedMemCurrent, &reserved),
               "twell::kept_device_bytes");
    check_cuda(cudaMemPoolGetAttribute(entry.pool, cudaMemPoolAttrUsedMemCurrent, &used), "twell::kept_device_bytes");
    kept += reserved - used;
  }
  return kept;
}

namespace {
// A Buffer's device block: allocated (and zero-filled where asked) on its device's private
// stream, which is then waited for, so that the block is usable on every stream on return.
void* allocate_buffer(std::size_t bytes, bool zeroed) {
  constexpr const char* where = "twell::Buffer";
  const DevicePool entry = current_pool(where);
  void* p = allocate_in(entry, bytes, entry.stream, where);
  const int fill = zeroed ? 0 : uninitialized_fill.load(std::memory_order_relaxed);
  cudaError_t status = fill >= 0 ? cudaMemsetAsync(p, fill, bytes, entry.stream) : cudaSuccess;
  if (status == cudaSuccess) status = cudaStreamSynchronize(entry.stream);
  if (status != cudaSuccess) {
    cudaFreeAsync(p, entry.stream);
    check_memory_call(status, where, "fill or cudaStreamSynchronize");
  }
  device_allocations.fetch_add(1, std::memory_order_relaxed);
  return p;
}
}  // namespace

void* allocate_bytes(std::size_t bytes, MemorySpace space) {
  return space == MemorySpace::host ? allocate_host_bytes(bytes) : allocate_buffer(bytes, false);
}

void* allocate_zeroed_bytes(std::size_t bytes, MemorySpace space) {
  if (space == MemorySpace::device) return allocate_buffer(bytes, true);
  void* p = allocate_host_bytes(bytes);
  std::memset(p, 0, bytes);
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
  // Not on p's device: p cannot be freed after its work, so it is left allocated.
  if (on.status() != cudaSuccess) return;
  cudaDeviceSynchronize();
  const cudaStream_t stream = DevicePools::instance().existing(device).stream;
  cudaFreeAsync(p, stream != nullptr ? stream : cudaStreamLegacy);
}

void copy_bytes(void* dst, MemorySpace dst_space, const void* src, MemorySpace src_space, std::size_t bytes) {
  checked_space(dst_space, "twell::copy");
  checked_space(src_space, "twell::copy");
  if (bytes == 0) return;
  if (dst_space == MemorySpace::host && src_space == MemorySpace::host) {
    std::memcpy(dst, src, bytes);
    return;
  }
  check_memory_call(cudaMemcpy(dst, src, bytes, cudaMemcpyDefault), "twell::copy", "cudaMemcpy");
  // cudaMemcpy returns before a device-to-device copy, or the last DMA of a copy from pageable
  // host memory, has landed: wait, so that work on any stream may read the copy.
  check_cuda(cudaStreamSynchronize(cudaStreamLegacy), "twell::copy (cudaStreamSynchronize)");
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
  cudaError_t first = cudaSuccess;
  for (const auto& [device, entry] : detail::DevicePools::instance().created()) {
    const cudaError_t status = detail::trim(device, entry.pool);
    if (first == cudaSuccess) first = status;
  }
  detail::check_cuda(first, "twell::release_cached_device_memory");
}

void set_device_memory_cache_limit(std::uint64_t bytes) { detail::DevicePools::instance().set_cache_limit(bytes); }

std::uint64_t device_memory_cache_limit() noexcept { return detail::cache_limit.load(std::memory_order_relaxed); }

void require_cuda_device(const char* where) {
  if (!cuda_available()) fail(ErrorCode::no_device, where, "operands live in device memory, but no CUDA device is visible");
}

}  // namespace twell
