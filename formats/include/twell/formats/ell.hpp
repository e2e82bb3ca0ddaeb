// ELL: width W; row_count[M]; col_idx[M*W] and values[M*W] row-major, entries of a row in
// increasing column order, padding (slots past row_count) zeroed.
#pragma once

#include <cstdint>

#include <twell/formats/view_traits.hpp>
#include <twell/memory.hpp>

namespace twell {

template <class T>
struct EllView {
  std::int64_t rows = 0;
  std::int64_t cols = 0;
  std::int64_t width = 0;
  IndexPtr<T, std::int32_t> row_count = nullptr;
  IndexPtr<T, std::int32_t> col_idx = nullptr;
  T* values = nullptr;
  MemorySpace space = MemorySpace::host;

  template <class U>
    requires(std::is_same_v<U, const T> && !std::is_const_v<T>)
  operator EllView<U>() const { return {rows, cols, width, row_count, col_idx, values, space}; }
};

template <Value T>
class EllMatrix {
 public:
  EllMatrix() = default;
  EllMatrix(std::int64_t rows, std::int64_t cols, std::int64_t width, MemorySpace space = MemorySpace::host)
      : rows_(checked(rows, cols, width)), cols_(cols), width_(width), row_count_(static_cast<std::size_t>(rows), space),
        col_idx_(static_cast<std::size_t>(rows * width), space), values_(static_cast<std::size_t>(rows * width), space) {}

  std::int64_t rows() const { return rows_; }
  std::int64_t cols() const { return cols_; }
  std::int64_t width() const { return width_; }
  MemorySpace space() const { return row_count_.space(); }
  Buffer<std::int32_t>& row_count() { return row_count_; }
  const Buffer<std::int32_t>& row_count() const { return row_count_; }
  Buffer<std::int32_t>& col_idx() { return col_idx_; }
  const Buffer<std::int32_t>& col_idx() const { return col_idx_; }
  Buffer<T>& values() { return values_; }
  const Buffer<T>& values() const { return values_; }

  EllView<T> view() { return {rows_, cols_, width_, row_count_.data(), col_idx_.data(), values_.data(), space()}; }
  EllView<const T> view() const {
    return {rows_, cols_, width_, row_count_.data(), col_idx_.data(), values_.data(), space()};
  }
  EllMatrix to(MemorySpace space) const {
    EllMatrix out;
    out.rows_ = rows_;
    out.cols_ = cols_;
    out.width_ = width_;
    out.row_count_ = row_count_.copy_to(space);
    out.col_idx_ = col_idx_.copy_to(space);
    out.values_ = values_.copy_to(space);
    return out;
  }

 private:
  // Runs before any buffer is sized, so a negative count never reaches an allocation.
  static std::int64_t checked(std::int64_t rows, std::int64_t cols, std::int64_t width) {
    require(rows >= 0 && cols >= 0 && width >= 0, ErrorCode::invalid_argument, "twell::EllMatrix", "shape ", rows,
            " x ", cols, " with width ", width, " is negative");
    detail::checked_elements(rows, width, "twell::EllMatrix");  // before any buffer is sized
    return rows;
  }

  std::int64_t rows_ = 0;
  std::int64_t cols_ = 0;
  std::int64_t width_ = 0;
  Buffer<std::int32_t> row_count_;
  Buffer<std::int32_t> col_idx_;
  Buffer<T> values_;
};

}  // namespace twell
