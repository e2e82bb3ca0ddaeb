// Dense: row-major with a leading dimension.
#pragma once

#include <cstdint>

#include <twell/formats/view_traits.hpp>
#include <twell/memory.hpp>

namespace twell {

template <class T>
struct DenseView {
  T* data = nullptr;
  std::int64_t rows = 0;
  std::int64_t cols = 0;
  std::int64_t ld = 0;  // elements between the starts of consecutive rows, >= cols
  MemorySpace space = MemorySpace::host;

  template <class U>
    requires(std::is_same_v<U, const T> && !std::is_const_v<T>)
  operator DenseView<U>() const { return {data, rows, cols, ld, space}; }
  T& at(std::int64_t i, std::int64_t j) const { return data[i * ld + j]; }  // host views only
};

template <Value T>
class DenseMatrix {
 public:
  DenseMatrix() = default;
  DenseMatrix(std::int64_t rows, std::int64_t cols, MemorySpace space = MemorySpace::host)
      : rows_(rows), cols_(cols), data_(checked_size(rows, cols), space) {}

  std::int64_t rows() const { return rows_; }
  std::int64_t cols() const { return cols_; }
  std::int64_t ld() const { return cols_; }
  MemorySpace space() const { return data_.space(); }
  Buffer<T>& values() { return data_; }
  const Buffer<T>& values() const { return data_; }

  DenseView<T> view() { return {data_.data(), rows_, cols_, cols_, space()}; }
  DenseView<const T> view() const { return {data_.data(), rows_, cols_, cols_, space()}; }
  DenseMatrix to(MemorySpace space) const {
    DenseMatrix out;
    out.rows_ = rows_;
    out.cols_ = cols_;
    out.data_ = data_.copy_to(space);
    return out;
  }

 private:
  static std::size_t checked_size(std::int64_t rows, std::int64_t cols) {
    return detail::checked_elements(rows, cols, "twell::DenseMatrix");
  }

  std::int64_t rows_ = 0;
  std::int64_t cols_ = 0;
  Buffer<T> data_;
};

}  // namespace twell
