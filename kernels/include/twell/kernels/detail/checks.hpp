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
}

}  // namespace twell::detail
