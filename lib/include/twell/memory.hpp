// Owning, move-only buffers in host or device memory, and the copies between them.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <utility>

#include <twell/error.hpp>
#include <twell/types.hpp>

namespace twell {

// An explicit CUDA stream (cudaStream_t, kept opaque so public headers need no CUDA).
// The default, null, is the legacy default stream.
struct Stream {
  void* handle = nullptr;
};

// True when this build has the cuda backend and a device is visible (asked once per process).
bool cuda_available();

// twell allocates device memory (its buffers and the scratch of calls that allocate per call) from
// a pool per device that keeps what is freed for reuse, so that repeated calls do not pay for
// mapping fresh pages each time (docs/api.md, "Conventions"). This returns the kept memory to the
// devices, for callers that need it elsewhere (another library's cudaMalloc): it waits for
// each device that twell has allocated on to finish its queued work, then trims its pool; live
// buffers are untouched. Every device is trimmed before the first failure (a CUDA error surfaced
// by the synchronisation) is thrown. A twell allocation that finds its device out of memory trims
// that device's pool and tries once more before it throws out_of_memory (not when the request
// exceeds the device's whole memory). Nothing to do in a build without the cuda backend.
void release_cached_device_memory();

// Bounds the memory each of twell's device pools holds across synchronisations (default: no
// bound; the pools' release threshold): at every synchronisation (of a stream, an event or the
// device), a pool that has more than `bytes` reserved, in use or not, returns its unused memory
// to the device until it is back under the bound (best effort, in whole chunks of the pool). So
// while more than `bytes` is in use, the pool keeps nothing spare. For a process that shares its
// GPU with another allocator (a framework's caching allocator, another library's cudaMalloc)
// and cannot call release_cached_device_memory at the right moments. 0 gives memory back at every
// synchronisation, as the default pool does, so calls that allocate per call map fresh pages
// again (docs/api.md, "Conventions"). Applies to the pools already made and to those made later;
// if a pool refuses the bound, this throws and the bound read back stays the previous one. Nothing
// to do in a build without the cuda backend.
void set_device_memory_cache_limit(std::uint64_t bytes);
// The bound set last (the largest std::uint64_t: none).
std::uint64_t device_memory_cache_limit() noexcept;

// Throws Error(no_device) naming `where` unless cuda_available(): the public API calls it before
// routing device operands to the cuda backend, so a missing GPU reads the same in every build.
void require_cuda_device(const char* where);

namespace detail {
// Uninitialised bytes; on the device from twell's pool, usable on every stream on return (the
// host waits for the pool's own dependencies, not for other work).
void* allocate_bytes(std::size_t bytes, MemorySpace space);
// The same, zero-filled before return.
void* allocate_zeroed_bytes(std::size_t bytes, MemorySpace space);
void free_bytes(void* p, MemorySpace space) noexcept;
// Copies between any two spaces; complete on return (a device copy is waited for), so that work
// on any stream may read the copy.
void copy_bytes(void* dst, MemorySpace dst_space, const void* src, MemorySpace src_space, std::size_t bytes);
// Sets every byte to `value` (synchronous on the device, like the copies).
void fill_bytes(void* p, MemorySpace space, unsigned char value, std::size_t bytes);
// Device buffers this process has allocated so far (Buffer's allocations from the pool), for
// tests and diagnostics that check a steady state allocates nothing; 0 in a build without the
// cuda backend.
std::uint64_t device_allocation_count() noexcept;
// Bytes that twell's device pools hold but no allocation uses, summed over devices (0 in a build
// without the cuda backend), for tests and diagnostics. Frees are stream-ordered: synchronise
// first. A release may not return all of it (a pool returns whole chunks, and a chunk that also
// holds a live allocation stays).
std::uint64_t kept_device_bytes();
// Test hooks, process-wide (for single-threaded tests; no effect without the cuda backend):
// the next `count` pool allocations fail once each as if the device were out of memory, so that
// their trim-and-retry runs; after `succeeding` more pool allocations, the next one fails for good
// (its retry too), as on a full device, so that a test can reach every allocation of a call in
// turn (negative: off, the default; armed until it fires); and, while `byte` is 0-255, every
// uninitialised device Buffer is filled with it when made, so that an output word a kernel
// forgets to write shows (negative: off, the default).
void fail_next_pool_allocations(int count);
void fail_pool_allocation_after(int succeeding);
bool pool_allocation_failure_armed() noexcept;
void set_uninitialized_device_fill(int byte);

// Bytes of n elements of `size` bytes each; throws invalid_argument when they exceed the address
// space (a wrapped product would allocate a small block and be overrun).
std::size_t checked_bytes(std::size_t n, std::size_t size);
// `space`, or Error(invalid_argument) naming `where` for a value outside the enum.
MemorySpace checked_space(MemorySpace space, const char* where = "twell::Buffer");

// A member value that a move carries to its destination and resets to kMovedFrom in its source,
// so that a class with defaulted moves can tell a moved-from object (whose buffers are gone) from
// a live one and refuse to run it instead of handing null pointers to a kernel.
template <class V, V kMovedFrom>
class ResetOnMove {
 public:
  ResetOnMove(V v) : v_(v) {}  // NOLINT(google-explicit-constructor): initialised like the value
  ResetOnMove(const ResetOnMove&) = delete;
  ResetOnMove& operator=(const ResetOnMove&) = delete;
  ResetOnMove(ResetOnMove&& o) noexcept : v_(std::exchange(o.v_, kMovedFrom)) {}
  ResetOnMove& operator=(ResetOnMove&& o) noexcept {
    v_ = std::exchange(o.v_, kMovedFrom);
    return *this;
  }
  ~ResetOnMove() = default;
  ResetOnMove& operator=(V v) {
    v_ = v;
    return *this;
  }
  operator V() const { return v_; }  // NOLINT(google-explicit-constructor)

 private:
  V v_;
};

// The device a plan was made on, or -1 in the source of a move: the plans' guard against a run
// after a move (their buffers are gone) and against a run with another device current (their
// storage, stream and handles live on this one: a kernel launched on another device that reads
// them faults without peer access, and a fault ends the CUDA context).
using PlanDevice = ResetOnMove<int, -1>;
// The current device, for a plan made now (0 in a build without the cuda backend).
int plan_device(const char* where);
// Throws invalid_argument for a moved-from plan, space_mismatch when a device other than
// `device` is current.
inline void require_plan_device(int device, const char* where) {
  require(device >= 0, ErrorCode::invalid_argument, where, "this object was moved from; use the one it was moved into");
  const int current = plan_device(where);
  require(current == device, ErrorCode::space_mismatch, where, "made on device ", device, ", but device ", current,
          " is current; call cudaSetDevice(", device, ") before using it");
}
// rows x cols elements of a shape, both non-negative; throws invalid_argument naming `where` when
// the count exceeds a 64-bit index.
std::size_t checked_elements(std::int64_t rows, std::int64_t cols, const char* where);
}  // namespace detail

// Tag for Buffer's constructor that skips the zero fill: the contents are undefined until
// written, so it is only for outputs that a kernel writes completely (every element).
struct Uninitialized {};

// A zero-filled array of n trivially copyable elements in one memory space.
// Host memory is 64-byte aligned; device memory comes from twell's pool of the current device
// (release_cached_device_memory above; 256-byte aligned, like every CUDA allocation). Making one
// waits for the pool's own dependencies only; destroying one waits for its device's queued work
// first, as cudaFree does.
template <class T>
class Buffer {
  static_assert(std::is_trivially_copyable_v<T>);

 public:
  Buffer() = default;
  explicit Buffer(std::size_t n, MemorySpace space = MemorySpace::host)
      : size_(n), space_(detail::checked_space(space)) {
    if (n == 0) return;
    const std::size_t bytes = detail::checked_bytes(n, sizeof(T));
    data_ = static_cast<T*>(detail::allocate_zeroed_bytes(bytes, space));
  }
  // No zero fill: for outputs a kernel writes whole.
  Buffer(std::size_t n, MemorySpace space, Uninitialized) : size_(n), space_(detail::checked_space(space)) {
    if (n != 0) data_ = static_cast<T*>(detail::allocate_bytes(detail::checked_bytes(n, sizeof(T)), space));
  }
  Buffer(const Buffer&) = delete;
  Buffer& operator=(const Buffer&) = delete;
  Buffer(Buffer&& o) noexcept
      : data_(std::exchange(o.data_, nullptr)), size_(std::exchange(o.size_, 0)), space_(o.space_) {}
  Buffer& operator=(Buffer&& o) noexcept {
    if (this != &o) {
      release();
      data_ = std::exchange(o.data_, nullptr);
      size_ = std::exchange(o.size_, 0);
      space_ = o.space_;
    }
    return *this;
  }
  ~Buffer() { release(); }

  T* data() noexcept { return data_; }
  const T* data() const noexcept { return data_; }
  std::size_t size() const noexcept { return size_; }
  std::size_t bytes() const noexcept { return size_ * sizeof(T); }
  bool empty() const noexcept { return size_ == 0; }
  MemorySpace space() const noexcept { return space_; }

  // Host-only element access; the span throws nothing, so check space() first.
  std::span<T> host_span() {
    require(space_ == MemorySpace::host, ErrorCode::space_mismatch, "twell::Buffer::host_span",
            "buffer lives in device memory");
    return {data_, size_};
  }
  std::span<const T> host_span() const {
    require(space_ == MemorySpace::host, ErrorCode::space_mismatch, "twell::Buffer::host_span",
            "buffer lives in device memory");
    return {data_, size_};
  }

  // A copy of this buffer in the given space (same space: a deep copy).
  Buffer copy_to(MemorySpace space) const {
    Buffer out;
    out.space_ = detail::checked_space(space);
    out.size_ = size_;
    if (size_ != 0) {
      out.data_ = static_cast<T*>(detail::allocate_bytes(bytes(), space));
      detail::copy_bytes(out.data_, space, data_, space_, bytes());
    }
    return out;
  }

 private:
  void release() noexcept {
    if (data_ != nullptr) detail::free_bytes(data_, space_);
    data_ = nullptr;
  }

  T* data_ = nullptr;
  std::size_t size_ = 0;
  MemorySpace space_ = MemorySpace::host;
};

}  // namespace twell
