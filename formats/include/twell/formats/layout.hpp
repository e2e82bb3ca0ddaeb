// TwellLayout: the one place that holds TwELL index math (tiles, slots, offsets, packing).
#pragma once

#include <cstdint>

#include <twell/error.hpp>
#include <twell/types.hpp>

namespace twell {

// Where a TwELL slot keeps its column: tile-local (twell's own layout, any N) or the global
// column in 16 bits (the paper's reference code; import/export only, needs N <= 65536).
enum class ColumnEncoding : std::uint8_t { tile_local, global16 };

// Geometry of TwELL(tile, C): N columns cut into tiles of `tile` columns (last one ragged);
// each (row, tile) owns S = tile / C consecutive 32-bit slots: slot 0 the true nonzero count,
// slots 1..S-1 the entries in increasing column order, unused slots zero.
struct TwellLayout {
  static constexpr std::int32_t kDefaultTile = 256;
  static constexpr std::int32_t kDefaultCompression = 8;
  static constexpr std::int32_t kMaxTile = 65536;  // a tile-local column must fit 16 bits

  std::int32_t tile = kDefaultTile;
  std::int32_t compression = kDefaultCompression;  // C

  TWELL_HD constexpr std::int32_t slots() const { return tile / compression; }          // S
  TWELL_HD constexpr std::int32_t capacity() const { return slots() - 1; }              // entries per (row, tile)
  TWELL_HD constexpr std::int64_t tiles(std::int64_t cols) const { return (cols + tile - 1) / tile; }
  TWELL_HD constexpr std::int64_t packed_width(std::int64_t cols) const { return tiles(cols) * slots(); }
  TWELL_HD constexpr std::int64_t tile_of(std::int64_t col) const { return col / tile; }
  TWELL_HD constexpr std::int32_t local_col(std::int64_t col) const { return static_cast<std::int32_t>(col % tile); }
  TWELL_HD constexpr std::int64_t tile_begin(std::int64_t t) const { return t * tile; }
  // Columns in tile t of a matrix with `cols` columns (the last tile may be ragged).
  TWELL_HD constexpr std::int32_t tile_cols(std::int64_t t, std::int64_t cols) const {
    const std::int64_t rest = cols - t * tile;
    return static_cast<std::int32_t>(rest < tile ? rest : tile);
  }
  // Offset of (row, tile)'s slot 0 in the row-major packed array with leading dimension packed_width.
  TWELL_HD constexpr std::int64_t slot_offset(std::int64_t row, std::int64_t t, std::int64_t cols) const {
    return row * packed_width(cols) + t * slots();
  }
  TWELL_HD constexpr bool overflows(std::int64_t count) const { return count > capacity(); }

  // Slot word of a 16-bit value type: value bits high, column low.
  TWELL_HD static constexpr std::uint32_t pack(std::uint16_t value_bits, std::uint32_t column16) {
    return (static_cast<std::uint32_t>(value_bits) << 16) | (column16 & 0xffffu);
  }
  TWELL_HD static constexpr std::uint16_t slot_value_bits(std::uint32_t word) { return static_cast<std::uint16_t>(word >> 16); }
  TWELL_HD static constexpr std::uint32_t slot_column(std::uint32_t word) { return word & 0xffffu; }

  friend constexpr bool operator==(const TwellLayout&, const TwellLayout&) = default;
};

// Throws Error(invalid_argument) unless: tile a multiple of 8 in [8, 65536], C a power of two
// dividing tile, and S = tile / C >= 2.
void check_layout(const TwellLayout& layout, const char* where);

}  // namespace twell
