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

// Every path reads whole values: a pointer between value boundaries (a byte offset into a buffer)
// faults on the GPU and is undefined on the host. Wider alignment is never required: the kernels
// fall back to narrower loads.
template <class T>
void check_value_boundary(DenseView<T> v, const char* where, const char* name) {
  require(reinterpret_cast<std::uintptr_t>(v.data) % alignof(T) == 0, ErrorCode::misaligned, where, name,
          " starts at ", static_cast<const void*>(v.data), ", not on a ", alignof(T), "-byte value boundary");
}

// Shape, leading dimension and data pointer of a dense view.
template <class T>
void check_dense_geometry(DenseView<T> v, const char* where, const char* name) {
  require(v.rows >= 0 && v.cols >= 0, ErrorCode::invalid_argument, where, name, " has negative shape ",
          shape(v.rows, v.cols));
  require(v.rows == 0 || v.ld >= v.cols, ErrorCode::invalid_argument, where, name, " has leading dimension ", v.ld,
          " below its ", v.cols, " columns");
  require(v.rows == 0 || v.cols == 0 || v.data != nullptr, ErrorCode::invalid_argument, where, name,
          " is null with shape ", shape(v.rows, v.cols));
  check_value_boundary(v, where, name);
}

}  // namespace twell::detail
