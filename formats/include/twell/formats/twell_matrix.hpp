// TwELL(tile, C): M x (tiles * S) packed 32-bit slots; see TwellLayout and docs/format.md.
// bf16/fp16: slot word = value bits << 16 | tile-local column. fp32: the packed plane holds the
// columns and a value plane of the same geometry holds the values (slot 0 of it is zero).
#pragma once

#include <cstdint>

#include <twell/formats/layout.hpp>
#include <twell/formats/view_traits.hpp>
#include <twell/memory.hpp>

namespace twell {

template <class T>
struct TwellView {
  std::int64_t rows = 0;
  std::int64_t cols = 0;
  TwellLayout layout{};
  IndexPtr<T, std::uint32_t> packed = nullptr;  // rows * layout.packed_width(cols) words
  T* value_plane = nullptr;                     // fp32 only, same geometry; null for 16-bit types
  MemorySpace space = MemorySpace::host;

  template <class U>
    requires(std::is_same_v<U, const T> && !std::is_const_v<T>)
  operator TwellView<U>() const { return {rows, cols, layout, packed, value_plane, space}; }
  std::int64_t packed_width() const { return layout.packed_width(cols); }
};

template <Value T>
class TwellMatrix {
 public:
  static constexpr bool kHasValuePlane = !ValueTraits<T>::packs_in_slot;

  TwellMatrix() = default;
  TwellMatrix(std::int64_t rows, std::int64_t cols, TwellLayout layout, MemorySpace space = MemorySpace::host)
      : rows_(rows), cols_(cols), layout_(checked(rows, cols, layout)),
        packed_(words(rows, cols, layout), space), value_plane_(kHasValuePlane ? words(rows, cols, layout) : 0, space) {}
  // Slots left undefined (Buffer's Uninitialized): for a producer that writes every slot.
  TwellMatrix(std::int64_t rows, std::int64_t cols, TwellLayout layout, MemorySpace space, Uninitialized tag)
      : rows_(rows), cols_(cols), layout_(checked(rows, cols, layout)),
        packed_(words(rows, cols, layout), space, tag),
        value_plane_(kHasValuePlane ? words(rows, cols, layout) : 0, space, tag) {}

  std::int64_t rows() const { return rows_; }
  std::int64_t cols() const { return cols_; }
  const TwellLayout& layout() const { return layout_; }
  std::int64_t packed_width() const { return layout_.packed_width(cols_); }
  MemorySpace space() const { return packed_.space(); }
  Buffer<std::uint32_t>& packed() { return packed_; }
  const Buffer<std::uint32_t>& packed() const { return packed_; }
  Buffer<T>& value_plane() { return value_plane_; }
  const Buffer<T>& value_plane() const { return value_plane_; }

  TwellView<T> view() {
    return {rows_, cols_, layout_, packed_.data(), kHasValuePlane ? value_plane_.data() : nullptr, space()};
  }
  TwellView<const T> view() const {
    return {rows_, cols_, layout_, packed_.data(), kHasValuePlane ? value_plane_.data() : nullptr, space()};
  }
  TwellMatrix to(MemorySpace space) const {
    TwellMatrix out;
    out.rows_ = rows_;
    out.cols_ = cols_;
    out.layout_ = layout_;
    out.packed_ = packed_.copy_to(space);
    out.value_plane_ = value_plane_.copy_to(space);
    return out;
  }

 private:
  static TwellLayout checked(std::int64_t rows, std::int64_t cols, TwellLayout layout) {
    check_layout(layout, "twell::TwellMatrix");
    require(rows >= 0 && cols >= 0, ErrorCode::invalid_argument, "twell::TwellMatrix", "shape ", rows, " x ", cols,
            " is negative");
    // packed_width rounds cols up to whole tiles; past this bound that rounding would overflow.
    require(cols <= INT64_MAX - layout.tile + 1, ErrorCode::invalid_argument, "twell::TwellMatrix", "cols = ", cols,
            " is too large to round up to tiles of ", layout.tile);
    return layout;
  }
  // Slot words of the shape (after checked(), which layout_ runs first), refused past 2^63 - 1.
  static std::size_t words(std::int64_t rows, std::int64_t cols, TwellLayout layout) {
    return detail::checked_elements(rows, layout.packed_width(cols), "twell::TwellMatrix");
  }

  std::int64_t rows_ = 0;
  std::int64_t cols_ = 0;
  TwellLayout layout_{};
  Buffer<std::uint32_t> packed_;
  Buffer<T> value_plane_;
};

}  // namespace twell
