#include <twell/formats/layout.hpp>

namespace twell {

void check_layout(const TwellLayout& layout, const char* where) {
  const auto tile = layout.tile;
  const auto c = layout.compression;
  require(tile >= 8 && tile <= TwellLayout::kMaxTile && tile % 8 == 0, ErrorCode::invalid_argument, where,
          "layout.tile = ", tile, " must be a multiple of 8 in [8, ", TwellLayout::kMaxTile, "]");
  require(c >= 1 && (c & (c - 1)) == 0, ErrorCode::invalid_argument, where, "layout.compression (C) = ", c,
          " must be a power of two");
  require(tile % c == 0, ErrorCode::invalid_argument, where, "layout.compression (C) = ", c,
          " does not divide layout.tile = ", tile);
  require(tile / c >= 2, ErrorCode::invalid_argument, where, "layout tile = ", tile, ", C = ", c,
          " gives S = ", tile / c, " slots per (row, tile); S must be at least 2");
}

}  // namespace twell
