// The checks on a caller-owned destination that both backends' *_into converters share, so that
// they accept and refuse the same arguments with the same codes.
#pragma once

#include <twell/error.hpp>
#include <twell/formats/dense.hpp>
#include <twell/formats/dense_checks.hpp>
#include <twell/formats/twell_matrix.hpp>

namespace twell::detail {

// dst must live in `space` (the backend's), have src's shape and a valid layout, and point at
// storage when it has any slots (fp32 also at its value plane) that lies outside src's span: the
// conversion writes dst while it still reads src, so an overlap would convert overwritten values.
// An fp32 destination's two arrays must not overlap each other either.
template <class T>
void check_twell_destination(DenseView<const T> src, TwellView<T> dst, MemorySpace space, const char* where) {
  require(dst.space == space, ErrorCode::space_mismatch, where, "dst lives in ",
          dst.space == MemorySpace::host ? "host" : "device", " memory, the source in ",
          space == MemorySpace::host ? "host" : "device", " memory");
  require(dst.rows == src.rows && dst.cols == src.cols, ErrorCode::shape_mismatch, where, "dst is ", dst.rows, " x ",
          dst.cols, " but src is ", src.rows, " x ", src.cols);
  check_layout(dst.layout, where);
  if constexpr (ValueTraits<T>::packs_in_slot) {  // an empty view too: validate refuses either
    require(dst.value_plane == nullptr, ErrorCode::invalid_argument, where, "dst.value_plane is set, but ",
            to_string(dtype_of<T>), " values live in the slots and the view must leave it null");
  }
  std::int64_t words = 0;
  require(!__builtin_mul_overflow(dst.rows, dst.layout.packed_width(dst.cols), &words), ErrorCode::invalid_argument,
          where, "dst of ", dst.rows, " x ", dst.cols, " holds more than 2^63 - 1 packed words");
  if (words == 0) return;
  require(dst.packed != nullptr, ErrorCode::invalid_argument, where, "dst.packed is null for a ", dst.rows, " x ",
          dst.cols, " TwELL");
  const ByteRange source = byte_range(src);
  require(!byte_range(dst.packed, words).overlaps(source), ErrorCode::invalid_argument, where,
          "dst.packed overlaps the source; convert into storage of its own");
  if constexpr (!ValueTraits<T>::packs_in_slot) {
    require(dst.value_plane != nullptr, ErrorCode::invalid_argument, where,
            "dst.value_plane is null, but fp32 TwELL keeps its values there");
    require(!byte_range(dst.value_plane, words).overlaps(source), ErrorCode::invalid_argument, where,
            "dst.value_plane overlaps the source; convert into storage of its own");
    require(!byte_range(dst.value_plane, words).overlaps(byte_range(dst.packed, words)), ErrorCode::invalid_argument,
            where, "dst.value_plane overlaps dst.packed; each needs storage of its own");
  }
}

}  // namespace twell::detail
