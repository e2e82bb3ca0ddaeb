// Host-side argument checks shared by the reference, cuda and baseline kernels, so that both
// backends word their errors alike. Plain host C++; the memory-space check stays with each backend
// because each names the space it takes.
#pragma once

#include <cstdint>
#include <string>

#include <twell/error.hpp>
#include <twell/formats/dense.hpp>
#include <twell/kernels/options.hpp>

namespace twell::detail {

inline std::string shape(std::int64_t rows, std::int64_t cols) {
  return std::to_string(rows) + " x " + std::to_string(cols);
}

inline void report_path(const KernelOptions& options, const char* path) {
  if (options.report != nullptr) options.report->path = path;
}

// Shape, leading dimension and data pointer of a dense view; the caller checks its space first.
template <class T>
void check_dense_geometry(DenseView<T> v, const char* where, const char* name) {
  require(v.rows >= 0 && v.cols >= 0, ErrorCode::invalid_argument, where, name, " has negative shape ",
          shape(v.rows, v.cols));
  require(v.rows == 0 || v.ld >= v.cols, ErrorCode::invalid_argument, where, name, " has leading dimension ", v.ld,
          " below its ", v.cols, " columns");
  require(v.rows == 0 || v.cols == 0 || v.data != nullptr, ErrorCode::invalid_argument, where, name,
          " is null with shape ", shape(v.rows, v.cols));
  // Every path reads whole values: a pointer between value boundaries (a byte offset into a
  // buffer) faults on the GPU and is undefined on the host. Wider alignment is never required:
  // kernels fall back to narrower loads, and their reported path says which ran.
  require(reinterpret_cast<std::uintptr_t>(v.data) % alignof(T) == 0, ErrorCode::misaligned, where, name,
          " starts at ", static_cast<const void*>(v.data), ", not on a ", alignof(T), "-byte value boundary");
}

// A dense transpose's out: N x M for an M x N a, and no byte shared with a (the kernels read a
// while writing out). Geometry of both is checked by the caller.
template <class T>
void check_dense_transpose(DenseView<const T> a, DenseView<T> out, const char* where) {
  require(out.rows == a.cols && out.cols == a.rows, ErrorCode::shape_mismatch, where, "out is ",
          shape(out.rows, out.cols), " but the transpose of a (", shape(a.rows, a.cols), ") is ",
          shape(a.cols, a.rows));
  if (a.rows == 0 || a.cols == 0) return;
  const auto a_begin = reinterpret_cast<std::uintptr_t>(a.data);
  const auto a_end = reinterpret_cast<std::uintptr_t>(a.data + (a.rows - 1) * a.ld + a.cols);
  const auto o_begin = reinterpret_cast<std::uintptr_t>(out.data);
  const auto o_end = reinterpret_cast<std::uintptr_t>(out.data + (out.rows - 1) * out.ld + out.cols);
  require(o_end <= a_begin || a_end <= o_begin, ErrorCode::invalid_argument, where,
          "out overlaps a; a transpose cannot be done in place");
}

}  // namespace twell::detail
