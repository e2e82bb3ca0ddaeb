// CSR: 64-bit row_ptr[M+1], 32-bit col_idx[nnz] strictly increasing within a row, values[nnz].
#pragma once

#include <cstdint>

#include <twell/formats/view_traits.hpp>
#include <twell/memory.hpp>

namespace twell {

template <class T>
struct CsrView {
  std::int64_t rows = 0;
  std::int64_t cols = 0;
  std::int64_t nnz = 0;
  IndexPtr<T, std::int64_t> row_ptr = nullptr;
  IndexPtr<T, std::int32_t> col_idx = nullptr;
  T* values = nullptr;
  MemorySpace space = MemorySpace::host;

  template <class U>
    requires(std::is_same_v<U, const T> && !std::is_const_v<T>)
  operator CsrView<U>() const { return {rows, cols, nnz, row_ptr, col_idx, values, space}; }
};

template <Value T>
class CsrMatrix {
 public:
  CsrMatrix() = default;
  CsrMatrix(std::int64_t rows, std::int64_t cols, std::int64_t nnz, MemorySpace space = MemorySpace::host)
      : rows_(checked(rows, cols, nnz)), cols_(cols), row_ptr_(static_cast<std::size_t>(rows) + 1, space),
        col_idx_(static_cast<std::size_t>(nnz), space), values_(static_cast<std::size_t>(nnz), space) {}

  std::int64_t rows() const { return rows_; }
  std::int64_t cols() const { return cols_; }
  std::int64_t nnz() const { return static_cast<std::int64_t>(values_.size()); }
  MemorySpace space() const { return values_.space(); }
  Buffer<std::int64_t>& row_ptr() { return row_ptr_; }
  const Buffer<std::int64_t>& row_ptr() const { return row_ptr_; }
  Buffer<std::int32_t>& col_idx() { return col_idx_; }
  const Buffer<std::int32_t>& col_idx() const { return col_idx_; }
  Buffer<T>& values() { return values_; }
  const Buffer<T>& values() const { return values_; }

  CsrView<T> view() { return {rows_, cols_, nnz(), row_ptr_.data(), col_idx_.data(), values_.data(), space()}; }
  CsrView<const T> view() const {
    return {rows_, cols_, nnz(), row_ptr_.data(), col_idx_.data(), values_.data(), space()};
  }
  CsrMatrix to(MemorySpace space) const {
    CsrMatrix out;
    out.rows_ = rows_;
    out.cols_ = cols_;
    out.row_ptr_ = row_ptr_.copy_to(space);
    out.col_idx_ = col_idx_.copy_to(space);
    out.values_ = values_.copy_to(space);
    return out;
  }

 private:
  // Runs before any buffer is sized, so a negative count never reaches an allocation.
  static std::int64_t checked(std::int64_t rows, std::int64_t cols, std::int64_t nnz) {
    require(rows >= 0 && cols >= 0 && nnz >= 0, ErrorCode::invalid_argument, "twell::CsrMatrix", "shape ", rows,
            " x ", cols, " with nnz ", nnz, " is negative");
    return rows;
  }

  std::int64_t rows_ = 0;
  std::int64_t cols_ = 0;
  Buffer<std::int64_t> row_ptr_{1};
  Buffer<std::int32_t> col_idx_;
  Buffer<T> values_;
};

}  // namespace twell
