#include <twell/formats/stats.hpp>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdio>
#include <initializer_list>
#include <sstream>

#include <twell/formats/copy.hpp>
#include <twell/formats/validate.hpp>

namespace twell {
namespace {

// frequency[v] = how many samples equal v.
CountDistribution from_frequencies(const std::vector<std::int64_t>& frequency) {
  CountDistribution d;
  double sum = 0.0;
  for (std::size_t v = 0; v < frequency.size(); ++v) {
    d.samples += frequency[v];
    sum += static_cast<double>(frequency[v]) * static_cast<double>(v);
  }
  if (d.samples == 0) return d;
  d.mean = sum / static_cast<double>(d.samples);
  const auto rank = [&](double p) {
    return std::max<std::int64_t>(1, static_cast<std::int64_t>(std::ceil(p / 100.0 * static_cast<double>(d.samples))));
  };
  const std::int64_t r50 = rank(50), r90 = rank(90), r99 = rank(99);
  std::int64_t seen = 0;
  bool first = true;
  for (std::size_t v = 0; v < frequency.size(); ++v) {
    if (frequency[v] == 0) continue;
    const auto value = static_cast<std::int64_t>(v);
    if (first) d.min = value;
    first = false;
    d.max = value;
    const std::int64_t before = seen;
    seen += frequency[v];
    if (before < r50 && seen >= r50) d.p50 = value;
    if (before < r90 && seen >= r90) d.p90 = value;
    if (before < r99 && seen >= r99) d.p99 = value;
    const auto bin = static_cast<std::size_t>(std::bit_width(static_cast<std::uint64_t>(v)));
    if (d.histogram.size() <= bin) d.histogram.resize(bin + 1, 0);
    d.histogram[bin] += frequency[v];
  }
  return d;
}

void add_sample(std::vector<std::int64_t>& frequency, std::int64_t value, std::int64_t times = 1) {
  const auto v = static_cast<std::size_t>(value);
  if (frequency.size() <= v) frequency.resize(v + 1, 0);
  frequency[v] += times;
}

// A sum of products of shape figures, refused (unsupported, naming `figure`) rather than wrapped
// when it passes 2^63 - 1: a valid CSR can be 2^31 x 2^31, whose dense copy no int64 counts.
std::int64_t checked_sum(const char* figure, std::initializer_list<std::initializer_list<std::int64_t>> products) {
  std::int64_t sum = 0;
  for (const auto& factors : products) {
    std::int64_t product = 1;
    bool overflow = false;
    for (const std::int64_t f : factors) overflow = overflow || __builtin_mul_overflow(product, f, &product);
    if (overflow || __builtin_add_overflow(sum, product, &sum))
      fail(ErrorCode::unsupported, "twell::stats", "the ", figure, " of this matrix passes 2^63 - 1");
  }
  return sum;
}

std::int64_t twell_bytes(std::int64_t rows, std::int64_t cols, const TwellLayout& layout, DType dtype) {
  return checked_sum("TwELL bytes", {{rows, layout.packed_width(cols), 4, dtype == DType::fp32 ? 2 : 1}});
}

std::int64_t value_size(DType dtype) { return dtype == DType::fp32 ? 4 : 2; }

// Overflow figures of every layout that shares one tile size, gathered row by row.
struct TileFamily {
  std::int32_t tile = 0;
  std::vector<LayoutStats*> layouts;
};

template <class T>
MatrixStats compute(CsrView<const T> m, const StatsOptions& options) {
  constexpr const char* kWhere = "twell::stats";
  check_stats_options(options, kWhere);
  validate(m, ValidateOptions{.allow_explicit_zeros = true});

  MatrixStats s;
  s.dtype = dtype_of<T>;
  s.rows = m.rows;
  s.cols = m.cols;
  s.default_layout = options.default_layout;
  // The figures of the shape alone first (and the TwELL bytes below), so that a matrix too large
  // to count fails before the walk over its rows; the CSR bytes of every stored entry bound those
  // of its nonzeros.
  const std::int64_t vsize = value_size(s.dtype);
  s.bytes.dense = checked_sum("dense bytes", {{m.rows, m.cols, vsize}});
  (void)checked_sum("CSR bytes", {{m.rows, 8}, {8}, {m.nnz, 4 + vsize}});
  // Explicit zeros (an sddmm output holds them) are counted as the converters count them: not at
  // all. Counting them once reported overflow that no conversion of the matrix has.
  const auto nonzero = [&](std::int64_t k) { return is_stored(m.values[k]); };
  for (std::int64_t k = 0; k < m.nnz; ++k) s.nnz += nonzero(k) ? 1 : 0;
  s.density = m.rows > 0 && m.cols > 0
                  ? static_cast<double>(s.nnz) / (static_cast<double>(m.rows) * static_cast<double>(m.cols))
                  : 0.0;
  s.bytes.csr = (m.rows + 1) * 8 + s.nnz * (4 + vsize);
  s.at_default.layout = options.default_layout;

  for (const std::int32_t tile : options.tiles) {
    for (const std::int32_t c : options.compressions) {
      // A (tile, C) pair with C not dividing the tile or fewer than two slots cannot exist; the
      // cross product skips it.
      if (tile % c == 0 && c <= tile / 2) s.candidates.push_back(LayoutStats{.layout = TwellLayout{tile, c}});
    }
  }
  // TwELL bytes depend on the shape alone too (at C = 1 in fp32 they are twice the dense bytes).
  s.at_default.twell_bytes = twell_bytes(m.rows, m.cols, s.at_default.layout, s.dtype);
  for (auto& c : s.candidates) c.twell_bytes = twell_bytes(m.rows, m.cols, c.layout, s.dtype);
  const std::int64_t default_tiles = checked_sum("(row, tile) count", {{m.rows, options.default_layout.tiles(m.cols)}});

  std::vector<TileFamily> families;
  const auto family_of = [&](std::int32_t tile) -> TileFamily& {
    for (auto& f : families)
      if (f.tile == tile) return f;
    families.push_back(TileFamily{tile, {}});
    return families.back();
  };
  family_of(options.default_layout.tile);
  for (auto& c : s.candidates) family_of(c.layout.tile);
  for (auto& f : families) {
    for (auto& c : s.candidates)
      if (c.layout.tile == f.tile) f.layouts.push_back(&c);
    if (f.tile == options.default_layout.tile) f.layouts.push_back(&s.at_default);
  }

  std::vector<std::int64_t> row_frequency;
  std::vector<std::int64_t> tile_frequency;
  std::int64_t nonempty_default_tiles = 0;
  std::vector<std::vector<char>> row_overflowed;
  for (const auto& f : families) row_overflowed.emplace_back(f.layouts.size(), 0);
  for (std::int64_t i = 0; i < m.rows; ++i) {
    const std::int64_t begin = m.row_ptr[i];
    const std::int64_t end = m.row_ptr[i + 1];
    std::int64_t row_nnz = 0;
    for (std::int64_t k = begin; k < end; ++k) row_nnz += nonzero(k) ? 1 : 0;
    add_sample(row_frequency, row_nnz);
    s.max_row_nnz = std::max(s.max_row_nnz, row_nnz);
    for (std::size_t f = 0; f < families.size(); ++f) {
      TileFamily& family = families[f];
      const bool is_default = family.tile == options.default_layout.tile;
      std::vector<char>& overflowed = row_overflowed[f];
      std::fill(overflowed.begin(), overflowed.end(), 0);
      // Columns increase within a row, so each tile's entries form one run.
      for (std::int64_t k = begin; k < end;) {
        const std::int64_t tile = m.col_idx[k] / family.tile;
        std::int64_t run = k;
        std::int64_t count = 0;
        for (; run < end && m.col_idx[run] / family.tile == tile; ++run) count += nonzero(run) ? 1 : 0;
        if (count == 0) {  // explicit zeros only: an empty tile
          k = run;
          continue;
        }
        if (is_default) {
          add_sample(tile_frequency, count);
          ++nonempty_default_tiles;
        }
        for (std::size_t l = 0; l < family.layouts.size(); ++l) {
          LayoutStats& ls = *family.layouts[l];
          const std::int64_t capacity = ls.layout.capacity();
          if (count > capacity) {
            ++ls.overflowed_tiles;
            ls.values_beyond_capacity += count - capacity;
            overflowed[l] = 1;
          }
        }
        k = run;
      }
      for (std::size_t l = 0; l < family.layouts.size(); ++l)
        if (overflowed[l] != 0) ++family.layouts[l]->overflow_rows;
    }
  }

  add_sample(tile_frequency, 0, default_tiles - nonempty_default_tiles);
  s.per_row = from_frequencies(row_frequency);
  s.per_row_tile = from_frequencies(tile_frequency);

  const auto finish = [&](LayoutStats& ls) {
    ls.hybrid_bytes = checked_sum("Hybrid bytes", {{ls.twell_bytes}, {ls.overflow_rows, m.cols, vsize}, {4, m.rows}, {4, ls.overflow_rows}});
  };
  finish(s.at_default);
  for (auto& c : s.candidates) finish(c);

  const LayoutStats* best = &s.at_default;
  const auto better = [](const LayoutStats& a, const LayoutStats& b) {
    if (a.hybrid_bytes != b.hybrid_bytes) return a.hybrid_bytes < b.hybrid_bytes;
    if (a.overflow_rows != b.overflow_rows) return a.overflow_rows < b.overflow_rows;
    if (a.layout.tile != b.layout.tile) return a.layout.tile > b.layout.tile;
    return a.layout.compression < b.layout.compression;
  };
  if (!s.candidates.empty()) {
    best = &s.candidates.front();
    for (const auto& c : s.candidates)
      if (better(c, *best)) best = &c;
  }
  s.recommended = best->layout;

  s.bytes.ell = checked_sum("ELL bytes", {{m.rows, 4}, {m.rows, s.max_row_nnz, 4 + vsize}});
  s.bytes.twell = s.at_default.twell_bytes;
  s.bytes.hybrid = best->hybrid_bytes;
  return s;
}

template <class T>
MatrixStats stats_any_space(CsrView<const T> m, const StatsOptions& options) {
  if (m.space == MemorySpace::device) {
    validate(m, ValidateOptions{.allow_explicit_zeros = true});
    const auto host = copy_to(m, MemorySpace::host);
    return compute(host.view(), options);
  }
  return compute(m, options);
}

std::string fixed(double v, int digits) {
  char buffer[64];
  std::snprintf(buffer, sizeof buffer, "%.*f", digits, v);
  return buffer;
}

std::string megabytes(std::int64_t bytes) { return fixed(static_cast<double>(bytes) / 1e6, 3) + " MB"; }

void write_distribution(std::ostringstream& os, const std::string& name, const CountDistribution& d) {
  os << name << ": min " << d.min << ", mean " << fixed(d.mean, 2) << ", p50 " << d.p50 << ", p90 " << d.p90
     << ", p99 " << d.p99 << ", max " << d.max << "\n  histogram:";
  for (std::size_t k = 0; k < d.histogram.size(); ++k) {
    if (d.histogram[k] == 0) continue;
    if (k == 0) {
      os << " [0] " << d.histogram[k];
    } else {
      const std::uint64_t lo = std::uint64_t{1} << (k - 1);
      const std::uint64_t hi = (std::uint64_t{1} << k) - 1;
      os << " [" << lo;
      if (hi != lo) os << "-" << hi;
      os << "] " << d.histogram[k];
    }
  }
  os << "\n";
}

std::string pad(const std::string& text, std::size_t width) {
  return text.size() >= width ? text : std::string(width - text.size(), ' ') + text;
}

}  // namespace

void check_stats_options(const StatsOptions& options, const char* where) {
  check_layout(options.default_layout, where);
  for (const std::int32_t tile : options.tiles) check_layout(TwellLayout{tile, 1}, where);
  for (const std::int32_t c : options.compressions) {
    require(c >= 1 && (c & (c - 1)) == 0, ErrorCode::invalid_argument, where, "candidate C = ", c,
            " is not a power of two");
  }
}

#define TWELL_DEFINE_STATS(T) \
  MatrixStats stats(CsrView<const T> m, const StatsOptions& options) { return stats_any_space(m, options); }
TWELL_FOR_EACH_VALUE_TYPE(TWELL_DEFINE_STATS)
#undef TWELL_DEFINE_STATS

std::string format_stats(const MatrixStats& s) {
  std::ostringstream os;
  os << "matrix " << s.rows << " x " << s.cols << " " << to_string(s.dtype) << ", nnz " << s.nnz << " (density "
     << fixed(100.0 * s.density, 3) << " %)\n";
  write_distribution(os, "nonzeros per row", s.per_row);
  write_distribution(os, "nonzeros per (row, tile of " + std::to_string(s.default_layout.tile) + ")", s.per_row_tile);
  os << "layouts (overflow: count > S-1 in a (row, tile); Hybrid keeps such rows dense):\n";
  os << pad("tile", 6) << pad("C", 4) << pad("S", 6) << pad("overflowed tiles", 18) << pad("overflow rows", 15)
     << pad("values beyond", 15) << pad("TwELL", 14) << pad("Hybrid", 14) << "\n";
  for (const auto& c : s.candidates) {
    os << pad(std::to_string(c.layout.tile), 6) << pad(std::to_string(c.layout.compression), 4)
       << pad(std::to_string(c.layout.slots()), 6) << pad(std::to_string(c.overflowed_tiles), 18)
       << pad(std::to_string(c.overflow_rows), 15) << pad(std::to_string(c.values_beyond_capacity), 15)
       << pad(megabytes(c.twell_bytes), 14) << pad(megabytes(c.hybrid_bytes), 14);
    if (c.layout == s.recommended) os << "  <- recommended";
    os << "\n";
  }
  os << "bytes: dense " << megabytes(s.bytes.dense) << ", CSR " << megabytes(s.bytes.csr) << ", ELL (width "
     << s.max_row_nnz << ") " << megabytes(s.bytes.ell) << ", TwELL (" << s.default_layout.tile << ", "
     << s.default_layout.compression << ") " << megabytes(s.bytes.twell);
  if (s.at_default.overflowed_tiles > 0) os << " [overflows " << s.at_default.overflowed_tiles << " tiles]";
  os << ", Hybrid (" << s.recommended.tile << ", " << s.recommended.compression << ") " << megabytes(s.bytes.hybrid)
     << "\n";
  os << "recommended layout: tile " << s.recommended.tile << ", C " << s.recommended.compression
     << (s.candidates.empty() ? " (the default layout: no candidate layout)\n" : " (fewest Hybrid bytes)\n");
  return os.str();
}

}  // namespace twell
