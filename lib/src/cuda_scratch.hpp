// Internal: stream-ordered scratch device memory for the cuda kernels and converters.
#pragma once

#include <cstddef>

#include <cuda_runtime.h>

#include "cuda_check.hpp"
#include "device_pool.hpp"

namespace twell::cuda::detail {

// Allocated from twell's pool of the current device on construction (device_pool.hpp), freed with
// cudaFreeAsync on the same stream at scope exit: no zero fill, no host wait, no ordering hazard
// with work queued on that stream, and pages that stay mapped from one call to the next.
class Scratch {
 public:
  Scratch(std::size_t bytes, cudaStream_t stream, const char* where) : stream_(stream) {
    if (bytes > 0) p_ = twell::detail::allocate_from_pool(bytes, stream, where);
  }
  Scratch(const Scratch&) = delete;
  Scratch& operator=(const Scratch&) = delete;
  ~Scratch() {
    if (p_ != nullptr) cudaFreeAsync(p_, stream_);  // a failure cannot be reported from a destructor
  }
  template <class U>
  U* as() const {
    return static_cast<U*>(p_);
  }

 private:
  void* p_ = nullptr;
  cudaStream_t stream_;
};

}  // namespace twell::cuda::detail
