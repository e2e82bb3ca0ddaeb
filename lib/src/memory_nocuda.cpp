// Memory layer of a build without the cuda backend: host memory only.
#include <atomic>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <limits>

#include <twell/memory.hpp>

namespace twell {

namespace detail {
void* allocate_host_bytes(std::size_t bytes);

namespace {
[[noreturn]] void no_device(const char* where) {
  fail(ErrorCode::no_device, where, "device memory requested, but twell was built without the cuda backend");
}
}  // namespace

void* allocate_bytes(std::size_t bytes, MemorySpace space) {
  if (space == MemorySpace::device) no_device("twell::Buffer");
  return allocate_host_bytes(bytes);
}

void* allocate_zeroed_bytes(std::size_t bytes, MemorySpace space) {
  void* p = allocate_bytes(bytes, space);
  std::memset(p, 0, bytes);
  return p;
}

void free_bytes(void* p, MemorySpace) noexcept { std::free(p); }

std::uint64_t device_allocation_count() noexcept { return 0; }

std::uint64_t kept_device_bytes() { return 0; }

void fail_next_pool_allocations(int) {}
void fail_pool_allocation_after(int) {}
bool pool_allocation_failure_armed() noexcept { return false; }

int plan_device(const char*) { return 0; }

void set_uninitialized_device_fill(int) {}

void copy_bytes(void* dst, MemorySpace dst_space, const void* src, MemorySpace src_space, std::size_t bytes) {
  checked_space(dst_space, "twell::copy");
  checked_space(src_space, "twell::copy");
  if (dst_space == MemorySpace::device || src_space == MemorySpace::device) no_device("twell::copy");
  if (bytes != 0) std::memcpy(dst, src, bytes);
}

void fill_bytes(void* p, MemorySpace space, unsigned char value, std::size_t bytes) {
  if (bytes == 0) return;
  if (space == MemorySpace::device) no_device("twell::Buffer");
  std::memset(p, value, bytes);
}
}  // namespace detail

bool cuda_available() { return false; }

void release_cached_device_memory() {}

namespace {
std::atomic<std::uint64_t> cache_limit{std::numeric_limits<std::uint64_t>::max()};  // kept, not used
}

void set_device_memory_cache_limit(std::uint64_t bytes) { cache_limit.store(bytes, std::memory_order_relaxed); }

std::uint64_t device_memory_cache_limit() noexcept { return cache_limit.load(std::memory_order_relaxed); }

void require_cuda_device(const char* where) {
  fail(ErrorCode::no_device, where, "operands live in device memory, but twell was built without the cuda backend");
}

}  // namespace twell
