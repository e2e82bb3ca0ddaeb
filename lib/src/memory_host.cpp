// Host half of the memory layer; the device half is memory_cuda.cpp or memory_nocuda.cpp.
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <new>

#include <twell/memory.hpp>

namespace twell::detail {

void* allocate_host_bytes(std::size_t bytes) {
  constexpr std::size_t kAlign = 64;
  void* p = std::aligned_alloc(kAlign, (bytes + kAlign - 1) / kAlign * kAlign);
  if (p == nullptr) fail(ErrorCode::out_of_memory, "twell::Buffer", "cannot allocate ", bytes, " bytes of host memory");
  return p;
}

std::size_t checked_bytes(std::size_t n, std::size_t size) {
  // PTRDIFF_MAX, as std::allocator's limit: pointer differences over the block stay defined and
  // the 64-byte rounding above cannot wrap.
  constexpr auto kMax = static_cast<std::size_t>(PTRDIFF_MAX);
  require(size != 0 && n <= kMax / size, ErrorCode::invalid_argument, "twell::Buffer", n, " elements of ", size,
          " bytes exceed the address space");
  return n * size;
}

MemorySpace checked_space(MemorySpace space, const char* where) {
  // A value cast from outside the enum once allocated on the host, said "device" and leaked.
  require(is_memory_space(space), ErrorCode::invalid_argument, where, "memory space ", static_cast<int>(space),
          " is neither host nor device");
  return space;
}

std::size_t checked_elements(std::int64_t rows, std::int64_t cols, const char* where) {
  require(rows >= 0 && cols >= 0, ErrorCode::invalid_argument, where, "shape ", rows, " x ", cols, " is negative");
  require(cols == 0 || rows <= INT64_MAX / cols, ErrorCode::invalid_argument, where, "shape ", rows, " x ", cols,
          " has more elements than a 64-bit index holds");
  return static_cast<std::size_t>(rows) * static_cast<std::size_t>(cols);
}

}  // namespace twell::detail
