// Deep copies of any view into an owning matrix in a chosen memory space. Views may be strided
// (dense ld > cols) or live in device memory; the copy is compact and owns its storage.
// The caller vouches for the view's sizes (validate() checks them before it copies).
#pragma once

#include <cstddef>
#include <type_traits>

#include <twell/formats/csr.hpp>
#include <twell/formats/dense.hpp>
#include <twell/formats/ell.hpp>
#include <twell/formats/hybrid.hpp>
#include <twell/formats/twell_matrix.hpp>

namespace twell {

namespace detail {
template <class T>
void copy_elements(T* dst, MemorySpace dst_space, const T* src, MemorySpace src_space, std::int64_t n) {
  if (n > 0) copy_bytes(dst, dst_space, src, src_space, static_cast<std::size_t>(n) * sizeof(T));
}
}  // namespace detail

template <class T>
  requires Value<T>
DenseMatrix<std::remove_const_t<T>> copy_to(DenseView<T> v, MemorySpace space) {
  DenseMatrix<std::remove_const_t<T>> out(v.rows, v.cols, space);
  if (v.ld == v.cols) {
    detail::copy_elements(out.values().data(), space, v.data, v.space, v.rows * v.cols);
  } else {
    for (std::int64_t i = 0; i < v.rows; ++i)
      detail::copy_elements(out.values().data() + i * v.cols, space, v.data + i * v.ld, v.space, v.cols);
  }
  return out;
}

template <class T>
  requires Value<T>
CsrMatrix<std::remove_const_t<T>> copy_to(CsrView<T> v, MemorySpace space) {
  CsrMatrix<std::remove_const_t<T>> out(v.rows, v.cols, v.nnz, space);
  detail::copy_elements(out.row_ptr().data(), space, v.row_ptr, v.space, v.rows + 1);
  detail::copy_elements(out.col_idx().data(), space, v.col_idx, v.space, v.nnz);
  detail::copy_elements(out.values().data(), space, v.values, v.space, v.nnz);
  return out;
}

template <class T>
  requires Value<T>
EllMatrix<std::remove_const_t<T>> copy_to(EllView<T> v, MemorySpace space) {
  EllMatrix<std::remove_const_t<T>> out(v.rows, v.cols, v.width, space);
  detail::copy_elements(out.row_count().data(), space, v.row_count, v.space, v.rows);
  detail::copy_elements(out.col_idx().data(), space, v.col_idx, v.space, v.rows * v.width);
  detail::copy_elements(out.values().data(), space, v.values, v.space, v.rows * v.width);
  return out;
}

template <class T>
  requires Value<T>
TwellMatrix<std::remove_const_t<T>> copy_to(TwellView<T> v, MemorySpace space) {
  using U = std::remove_const_t<T>;
  TwellMatrix<U> out(v.rows, v.cols, v.layout, space);
  const std::int64_t words = v.rows * v.packed_width();
  detail::copy_elements(out.packed().data(), space, v.packed, v.space, words);
  if constexpr (TwellMatrix<U>::kHasValuePlane)
    detail::copy_elements(out.value_plane().data(), space, v.value_plane, v.space, words);
  return out;
}

template <class T>
  requires Value<T>
HybridMatrix<std::remove_const_t<T>> copy_to(HybridView<T> v, MemorySpace space) {
  HybridMatrix<std::remove_const_t<T>> out;
  out.twell() = copy_to(v.twell, space);
  out.overflow() = copy_to(v.overflow, space);
  out.row_to_overflow() = Buffer<std::int32_t>(static_cast<std::size_t>(v.rows()), space);
  out.overflow_to_row() = Buffer<std::int32_t>(static_cast<std::size_t>(v.overflow_rows()), space);
  detail::copy_elements(out.row_to_overflow().data(), space, v.row_to_overflow, v.space(), v.rows());
  detail::copy_elements(out.overflow_to_row().data(), space, v.overflow_to_row, v.space(), v.overflow_rows());
  return out;
}

}  // namespace twell
