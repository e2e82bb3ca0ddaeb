// Hybrid: a TwELL part plus a dense overflow block of R rows.
// Every row with at least one overflowed (row, tile) lives whole and authoritative as a dense row
// of the overflow block; row_to_overflow[M] (-1 for none) and overflow_to_row[R] (increasing)
// map both ways. In the TwELL part such a row is a shadow: slot 0 of each tile keeps the true
// count and the slots keep the tile's first entries, as the GEMM epilogue writes them.
// Rows without an overflowed tile are never in the block, so the hybrid of a matrix is unique.
#pragma once

#include <cstdint>

#include <twell/formats/dense.hpp>
#include <twell/formats/twell_matrix.hpp>

namespace twell {

template <class T>
struct HybridView {
  TwellView<T> twell;
  DenseView<T> overflow;  // R x cols
  IndexPtr<T, std::int32_t> row_to_overflow = nullptr;  // rows entries
  IndexPtr<T, std::int32_t> overflow_to_row = nullptr;  // R entries

  template <class U>
    requires(std::is_same_v<U, const T> && !std::is_const_v<T>)
  operator HybridView<U>() const { return {twell, overflow, row_to_overflow, overflow_to_row}; }
  std::int64_t rows() const { return twell.rows; }
  std::int64_t cols() const { return twell.cols; }
  std::int64_t overflow_rows() const { return overflow.rows; }
  MemorySpace space() const { return twell.space; }
};

template <Value T>
class HybridMatrix {
 public:
  HybridMatrix() = default;
  // Every row maps to -1 (in no block row) and every value is zero: at overflow_rows = 0 the valid
  // all-zero matrix. The block holds whole rows, at most one per row, for a producer that fills it
  // and both maps.
  HybridMatrix(std::int64_t rows, std::int64_t cols, TwellLayout layout, std::int64_t overflow_rows,
               MemorySpace space = MemorySpace::host)
      : twell_(rows_with_block(rows, overflow_rows), cols, layout, space), overflow_(overflow_rows, cols, space),
        row_to_overflow_(static_cast<std::size_t>(rows), space, Uninitialized{}),
        overflow_to_row_(static_cast<std::size_t>(overflow_rows), space) {
    detail::fill_bytes(row_to_overflow_.data(), space, 0xff, row_to_overflow_.bytes());  // all bits set: -1
  }

  std::int64_t rows() const { return twell_.rows(); }
  std::int64_t cols() const { return twell_.cols(); }
  std::int64_t overflow_rows() const { return overflow_.rows(); }
  const TwellLayout& layout() const { return twell_.layout(); }
  MemorySpace space() const { return twell_.space(); }
  TwellMatrix<T>& twell() { return twell_; }
  const TwellMatrix<T>& twell() const { return twell_; }
  DenseMatrix<T>& overflow() { return overflow_; }
  const DenseMatrix<T>& overflow() const { return overflow_; }
  Buffer<std::int32_t>& row_to_overflow() { return row_to_overflow_; }
  const Buffer<std::int32_t>& row_to_overflow() const { return row_to_overflow_; }
  Buffer<std::int32_t>& overflow_to_row() { return overflow_to_row_; }
  const Buffer<std::int32_t>& overflow_to_row() const { return overflow_to_row_; }

  HybridView<T> view() {
    return {twell_.view(), overflow_.view(), row_to_overflow_.data(), overflow_to_row_.data()};
  }
  HybridView<const T> view() const {
    return {twell_.view(), overflow_.view(), row_to_overflow_.data(), overflow_to_row_.data()};
  }
  HybridMatrix to(MemorySpace space) const {
    HybridMatrix out;
    out.twell_ = twell_.to(space);
    out.overflow_ = overflow_.to(space);
    out.row_to_overflow_ = row_to_overflow_.copy_to(space);
    out.overflow_to_row_ = overflow_to_row_.copy_to(space);
    return out;
  }

 private:
  // rows, once R is known to fit them: checked in the first member's initializer, before any
  // storage is allocated.
  static std::int64_t rows_with_block(std::int64_t rows, std::int64_t overflow_rows) {
    require(overflow_rows >= 0 && overflow_rows <= rows, ErrorCode::invalid_argument, "twell::HybridMatrix",
            overflow_rows, " overflow rows for ", rows, " rows; a block holds whole rows, each at most once");
    return rows;
  }

  TwellMatrix<T> twell_;
  DenseMatrix<T> overflow_;
  Buffer<std::int32_t> row_to_overflow_;
  Buffer<std::int32_t> overflow_to_row_;
};

}  // namespace twell
