// Argument checks of a dense view that every backend and converter shares, so that all word their
// errors alike; the memory-space check stays with each caller, which names the space it takes.
#pragma once

#include <cstdint>
#include <string>

#include <twell/error.hpp>
#include <twell/formats/dense.hpp>

namespace twell::detail {

inline std::string shape(std::int64_t rows, std::int64_t cols) {
  return std::to_string(rows) + " x " + std::to_string(cols);
}

// The bytes [begin, end) an operand occupies (empty for no element), for the checks that refuse an
// output sharing a byte with an input that is still read while it is written.
struct ByteRange {
  std::uintptr_t begin = 0, end = 0;
  bool overlaps(ByteRange o) const { return begin < o.end && o.begin < end; }
};

// A span past the address space (a view that no memory backs) reaches the end of it: wrapped,
// it once looked short enough to miss an operand it covers.
template <class T>
ByteRange byte_range(const T* p, std::int64_t count) {
  if (count <= 0) return {};
  const auto begin = reinterpret_cast<std::uintptr_t>(p);
  std::uintptr_t bytes = 0, end = 0;
  if (__builtin_mul_overflow(static_cast<std::uintptr_t>(count), sizeof(T), &bytes) ||
      __builtin_add_overflow(begin, bytes, &end))
    end = UINTPTR_MAX;
  return {begin, end};
}

// A dense view spans from its first element to the last element of its last row.
template <class T>
ByteRange byte_range(DenseView<T> v) {
  if (v.rows == 0 || v.cols == 0) return {};
  std::int64_t count = 0;
  if (__builtin_mul_overflow(v.rows - 1, v.ld, &count) || __builtin_add_overflow(count, v.cols, &count))
    count = INT64_MAX;
  return byte_range(v.data, count);
}

// Every path reads whole values: a pointer between value boundaries (a byte offset into a buffer)
// faults on the GPU and is undefined on the host. Wider alignment is never required: the kernels
// fall back to narrower loads.
template <class T>
bool on_value_boundary(DenseView<T> v) {
  return reinterpret_cast<std::uintptr_t>(v.data) % alignof(T) == 0;
}
template <class T>
void check_value_boundary(DenseView<T> v, const char* where, const char* name) {
  require(on_value_boundary(v), ErrorCode::misaligned, where, name, " starts at ", static_cast<const void*>(v.data),
          ", not on a ", alignof(T), "-byte value boundary");
}

// Shape, leading dimension and data pointer of a dense view. ld >= cols holds for empty views too
// (docs/api.md), as validate() has it: 0 x N with ld < N is refused, M x 0 with ld = 0 is not.
template <class T>
void check_dense_geometry(DenseView<T> v, const char* where, const char* name) {
  require(v.rows >= 0 && v.cols >= 0, ErrorCode::invalid_argument, where, name, " has negative shape ",
          shape(v.rows, v.cols));
  require(v.ld >= v.cols, ErrorCode::invalid_argument, where, name, " has leading dimension ", v.ld, " below its ",
          v.cols, " columns");
  require(v.rows == 0 || v.cols == 0 || v.data != nullptr, ErrorCode::invalid_argument, where, name,
          " is null with shape ", shape(v.rows, v.cols));
  check_value_boundary(v, where, name);
}

}  // namespace twell::detail
