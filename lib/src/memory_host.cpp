// Host half of the memory layer; the device half is memory_cuda.cpp or memory_nocuda.cpp.
#include <cstdlib>
#include <cstring>
#include <new>

#include <twell/memory.hpp>

namespace twell::detail {

void* allocate_host_bytes(std::size_t bytes) {
  constexpr std::size_t kAlign = 64;
  void* p = std::aligned_alloc(kAlign, (bytes + kAlign - 1) / kAlign * kAlign);
  if (p == nullptr) fail(ErrorCode::invalid_argument, "twell::Buffer", "cannot allocate ", bytes, " bytes of host memory");
  return p;
}

}  // namespace twell::detail
