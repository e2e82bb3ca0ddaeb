// Internal helpers of the reference kernels: argument checks, dense fp32 staging through Eigen,
// and the activations. Not installed.
#pragma once

#include <cmath>
#include <cstdint>
#include <string>

#include <Eigen/Dense>

#include <twell/error.hpp>
#include <twell/formats/csr.hpp>
#include <twell/formats/dense.hpp>
#include <twell/formats/layout.hpp>
#include <twell/kernels/detail/checks.hpp>
#include <twell/kernels/detail/per_format.hpp>
#include <twell/kernels/options.hpp>
#include <twell/types.hpp>

namespace twell::reference::detail {

using MatrixF = Eigen::Matrix<float, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;

using twell::detail::cols_of;
using twell::detail::report_format_path;
using twell::detail::report_path;
using twell::detail::rows_of;
using twell::detail::shape;

// An operand of the reference backend: host memory, then its geometry.
template <class View>
void check_host_operand(View v, const char* where, const char* name) {
  twell::detail::check_view(v, MemorySpace::host, "reference backend", where, name);
}
// A CSR's row_ptr ends too, which the host can read (the cuda backend cannot without a copy).
template <class T>
void check_host_operand(CsrView<T> v, const char* where, const char* name) {
  twell::detail::check_view(v, MemorySpace::host, "reference backend", where, name);
  require(v.row_ptr[0] == 0 && v.row_ptr[v.rows] == v.nnz, ErrorCode::malformed, where, name, " row_ptr runs from ",
          v.row_ptr[0], " to ", v.row_ptr[v.rows], " but nnz is ", v.nnz);
}

// Throws shape_mismatch naming both operands unless rows/cols match the expectation.
inline void require_shape(std::int64_t rows, std::int64_t cols, std::int64_t want_rows, std::int64_t want_cols,
                          const char* where, const char* name, const char* because) {
  require(rows == want_rows && cols == want_cols, ErrorCode::shape_mismatch, where, name, " is ", shape(rows, cols),
          " but ", because, " needs ", shape(want_rows, want_cols));
}

template <class T>
MatrixF to_matrix(DenseView<const T> v) {
  MatrixF m(v.rows, v.cols);
  for (std::int64_t i = 0; i < v.rows; ++i)
    for (std::int64_t j = 0; j < v.cols; ++j) m(i, j) = to_float(v.at(i, j));
  return m;
}

// The single rounding of an fp32 result into storage type T.
template <class T>
void store_matrix(const MatrixF& m, DenseView<T> out) {
  for (std::int64_t i = 0; i < out.rows; ++i)
    for (std::int64_t j = 0; j < out.cols; ++j) out.at(i, j) = from_float<T>(m(i, j));
}

template <class T>
DenseMatrix<T> to_dense_matrix(const MatrixF& m) {
  DenseMatrix<T> out(m.rows(), m.cols());
  store_matrix(m, out.view());
  return out;
}

// GELU is the exact (erf) form, not the tanh approximation. NaN propagates through all three.
inline float activate(Activation kind, float v) {
  switch (kind) {
    case Activation::relu:
      return v < 0.0f ? 0.0f : v;
    case Activation::silu:
      return v / (1.0f + std::exp(-v));
    case Activation::gelu:
      return 0.5f * v * (1.0f + std::erf(v * 0.70710678118654752f));
  }
  return v;
}

// d act / d v (ReLU: 1 where v > 0, else 0).
inline float activate_derivative(Activation kind, float v) {
  switch (kind) {
    case Activation::relu:
      return v > 0.0f ? 1.0f : 0.0f;
    case Activation::silu: {
      const float s = 1.0f / (1.0f + std::exp(-v));
      return s * (1.0f + v * (1.0f - s));
    }
    case Activation::gelu: {
      const float pdf = 0.39894228040143268f * std::exp(-0.5f * v * v);
      return 0.5f * (1.0f + std::erf(v * 0.70710678118654752f)) + v * pdf;
    }
  }
  return 1.0f;
}

// act(v) with the sparsifying threshold: |act(v)| <= threshold becomes +0 (NaN survives).
inline float activate_thresholded(const ActivationSpec& act, float v) {
  const float a = activate(act.kind, v);
  return std::fabs(a) <= act.threshold ? 0.0f : a;
}

}  // namespace twell::reference::detail
