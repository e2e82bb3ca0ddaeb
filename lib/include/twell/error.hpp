// twell::Error and the helpers every function uses to name what is wrong with its input.
#pragma once

#include <cstdint>
#include <new>
#include <sstream>
#include <stdexcept>
#include <string>
#include <string_view>
#include <utility>

namespace twell {

enum class ErrorCode : std::uint8_t {
  invalid_argument,  // out-of-range parameter (layout, option, index)
  shape_mismatch,    // operand shapes that do not fit together
  dtype_mismatch,    // a matrix of another value type than asked for (matrix_as on what a file held)
  space_mismatch,    // host and device operands mixed in one call
  misaligned,        // a dense operand that does not start on a value boundary
  malformed,         // a matrix that breaks its format's invariants
  overflow,          // a (row, tile) with more nonzeros than its slots, under the error policy
  cuda,              // a CUDA runtime, cuBLAS or cuSPARSE call failed
  io,                // a file that cannot be read or written, or is truncated/corrupt
  unsupported,       // a valid request this build or device cannot serve
  no_device,         // device memory or a GPU kernel requested in a build or machine without one
  out_of_memory,     // a host or device allocation failed (the library's or cuBLAS/cuSPARSE's); the device
                     // stays usable (the CUDA error is cleared): a caller may free memory and retry
};

std::string_view to_string(ErrorCode code);

class Error : public std::runtime_error {
 public:
  Error(ErrorCode code, const std::string& message) : std::runtime_error(message), code_(code) {}
  ErrorCode code() const noexcept { return code_; }

 private:
  ErrorCode code_;
};

namespace detail {
template <class... Args>
std::string concat(Args&&... args) {
  std::ostringstream os;
  (os << ... << std::forward<Args>(args));
  return os.str();
}
}  // namespace detail

// Throws Error(code, "where: what..."), e.g. fail(ErrorCode::shape_mismatch, "twell::spmm",
// "B has ", b.rows, " rows but op(A) has ", k, " columns").
template <class... Args>
[[noreturn]] void fail(ErrorCode code, std::string_view where, Args&&... what) {
  throw Error(code, detail::concat(where, ": ", std::forward<Args>(what)...));
}

template <class... Args>
void require(bool condition, ErrorCode code, std::string_view where, Args&&... what) {
  if (!condition) fail(code, where, std::forward<Args>(what)...);
}

namespace detail {
// Runs f; a std::bad_alloc from it (a host allocation the machine cannot serve, such as a
// std::vector inside the reference backend) becomes ErrorCode::out_of_memory naming `where`, as
// a failed Buffer allocation does, instead of escaping as a non-twell exception.
template <class F>
decltype(auto) map_host_allocation_failure(std::string_view where, F&& f) {
  try {
    return std::forward<F>(f)();
  } catch (const std::bad_alloc&) {
    fail(ErrorCode::out_of_memory, where, "a host allocation failed (std::bad_alloc)");
  }
}
}  // namespace detail

}  // namespace twell
