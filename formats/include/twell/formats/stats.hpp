// Statistics of a sparse matrix: nonzeros per row and per (row, tile), overflow of candidate
// TwELL layouts, bytes per format and a recommended layout. Computed from CSR; the public
// twell::stats overloads for the other formats convert to CSR first.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include <twell/formats/csr.hpp>
#include <twell/formats/layout.hpp>
#include <twell/instantiate.hpp>

namespace twell {

// Distribution of a non-negative integer quantity (nonzeros per row, per (row, tile)).
// Percentiles are nearest-rank: the smallest sample with at least p % of samples <= it.
struct CountDistribution {
  std::int64_t samples = 0;
  std::int64_t min = 0;
  std::int64_t max = 0;
  double mean = 0.0;
  std::int64_t p50 = 0;
  std::int64_t p90 = 0;
  std::int64_t p99 = 0;
  // Power-of-two bins: histogram[0] counts zeros, histogram[k] (k >= 1) counts samples in
  // [2^(k-1), 2^k). Trailing empty bins are not stored.
  std::vector<std::int64_t> histogram;
};

// What one TwELL layout would do with this matrix.
struct LayoutStats {
  TwellLayout layout{};
  std::int64_t overflowed_tiles = 0;  // (row, tile) pairs with count > S-1
  std::int64_t overflow_rows = 0;     // rows with at least one such tile (the hybrid's dense block)
  std::int64_t values_beyond_capacity = 0;  // sum over (row, tile) of max(0, count - (S-1))
  std::int64_t twell_bytes = 0;       // packed slots (plus the value plane for fp32)
  std::int64_t hybrid_bytes = 0;      // TwELL part + dense block + both row maps
};

struct FormatBytes {
  std::int64_t dense = 0;
  std::int64_t csr = 0;
  std::int64_t ell = 0;     // width = longest row
  std::int64_t twell = 0;   // at StatsOptions::default_layout (meaningful only without overflow)
  std::int64_t hybrid = 0;  // at the recommended layout
};

struct StatsOptions {
  std::vector<std::int32_t> tiles{128, 256};
  std::vector<std::int32_t> compressions{2, 4, 8, 16, 32};
  // The layout whose tile defines the per (row, tile) distribution and whose TwELL size is
  // reported in FormatBytes::twell.
  TwellLayout default_layout{};
};

// Throws ErrorCode::invalid_argument, naming `where`, for options that stats() refuses: a default
// layout that check_layout refuses, a candidate tile that no layout has (not a multiple of 8 in
// [8, kMaxTile]) or a candidate C that is not a power of two. (A candidate pair whose C does not
// divide the tile or leaves fewer than two slots is skipped, not refused.)
void check_stats_options(const StatsOptions& options, const char* where);

struct MatrixStats {
  DType dtype = DType::fp32;
  std::int64_t rows = 0;
  std::int64_t cols = 0;
  std::int64_t nnz = 0;
  double density = 0.0;  // nnz / (rows * cols); 0 for an empty shape
  std::int64_t max_row_nnz = 0;
  CountDistribution per_row;
  CountDistribution per_row_tile;  // tiles of default_layout.tile columns
  TwellLayout default_layout{};
  LayoutStats at_default;              // default_layout's own figures
  std::vector<LayoutStats> candidates;  // every valid (tile, C) of the options, tiles outer
  // Recommendation rule: the candidate with the fewest Hybrid bytes (a Hybrid is exact at any
  // layout, so bytes are the cost that differs); ties go to fewer overflow rows, then to the
  // larger tile (fewer GEMM epilogue tiles), then to the smaller C (more headroom per tile).
  TwellLayout recommended{};
  FormatBytes bytes;
};

// Throws ErrorCode::unsupported for a matrix whose byte figures pass 2^63 - 1 (a dense copy of
// 2^31 x 2^31 values), which no int64 field can hold.
#define TWELL_DECLARE_STATS(T) MatrixStats stats(CsrView<const T> m, const StatsOptions& options = {});
TWELL_FOR_EACH_VALUE_TYPE(TWELL_DECLARE_STATS)
#undef TWELL_DECLARE_STATS

// A human-readable multi-line report (used by `twell stats` and the demo).
std::string format_stats(const MatrixStats& s);

}  // namespace twell
