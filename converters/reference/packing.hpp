// Building blocks of every reference converter. A *source* yields the stored entries of one row
// in increasing column order (threshold applied); a *builder* turns the rows of a source into
// one target format. A converter is one source plus one builder, so the per-row and per-tile
// logic (TwELL packing, overflow policies, ELL width, reports) exists exactly once, here.
#pragma once

#include <algorithm>
#include <cstdint>
#include <limits>
#include <vector>

#include <twell/converters/backends.hpp>
#include <twell/formats/dense_checks.hpp>
#include <twell/formats/validate.hpp>
#include <twell/instantiate.hpp>

namespace twell::reference::packing {

template <class T>
struct Entry {
  std::int64_t col;
  T value;
};
template <class T>
using Row = std::vector<Entry<T>>;

// The reference backend reads host memory only, and trusts nothing it reads: the source is
// validated (stored zeros allowed: sddmm outputs keep them, and they are simply not copied).
template <class View>
void check_source(View src, const ConvertOptions& options, const char* where) {
  check_convert_options(options, where);
  MemorySpace space;
  if constexpr (requires { src.space(); }) {
    space = src.space();
  } else {
    space = src.space;
  }
  require(space == MemorySpace::host, ErrorCode::space_mismatch, where,
          "the reference backend needs a host source, got device memory");
  if constexpr (requires { src.ld; }) twell::detail::check_value_boundary(src, where, "source");
  if (auto v = find_violation(src, ValidateOptions{.allow_explicit_zeros = true}); !v.empty())
    fail(ErrorCode::malformed, where, "source: ", v);
}

inline void fill_report(const ConvertOptions& options, std::int64_t nnz, std::int64_t dropped,
                        std::int64_t overflow_rows) {
  if (options.report != nullptr) *options.report = ConvertReport{nnz, dropped, overflow_rows};
}

// ---- sources ----

template <class T>
struct DenseSource {
  DenseView<const T> m;
  float threshold;
  std::int64_t rows() const { return m.rows; }
  std::int64_t cols() const { return m.cols; }
  void gather(std::int64_t i, Row<T>& out) const {
    out.clear();
    const T* row = m.data + i * m.ld;
    for (std::int64_t j = 0; j < m.cols; ++j)
      if (is_stored(row[j], threshold)) out.push_back({j, row[j]});
  }
};

template <class T>
struct CsrSource {
  CsrView<const T> m;
  float threshold;
  std::int64_t rows() const { return m.rows; }
  std::int64_t cols() const { return m.cols; }
  void gather(std::int64_t i, Row<T>& out) const {
    out.clear();
    for (std::int64_t k = m.row_ptr[i]; k < m.row_ptr[i + 1]; ++k)
      if (is_stored(m.values[k], threshold)) out.push_back({m.col_idx[k], m.values[k]});
  }
};

template <class T>
struct EllSource {
  EllView<const T> m;
  float threshold;
  std::int64_t rows() const { return m.rows; }
  std::int64_t cols() const { return m.cols; }
  void gather(std::int64_t i, Row<T>& out) const {
    out.clear();
    for (std::int64_t s = 0; s < m.row_count[i]; ++s) {
      const std::int64_t k = i * m.width + s;
      if (is_stored(m.values[k], threshold)) out.push_back({m.col_idx[k], m.values[k]});
    }
  }
};

// Entry s (1-based) of the (row, tile) whose slot 0 is at `offset`: tile-local column and value.
template <class T>
Entry<T> decode_slot(TwellView<const T> m, std::int64_t offset, std::int32_t s) {
  const std::uint32_t word = m.packed[offset + s];
  if constexpr (ValueTraits<T>::packs_in_slot) {
    return {TwellLayout::slot_column(word), ValueTraits<T>::from_bits(TwellLayout::slot_value_bits(word))};
  } else {
    return {word, m.value_plane[offset + s]};
  }
}

// Reads the slots of a row; a count above capacity (a hybrid's shadow row) yields the first S-1
// entries only, so hybrid sources read block rows from the dense block instead.
template <class T>
void gather_twell_row(TwellView<const T> m, float threshold, std::int64_t i, Row<T>& out) {
  out.clear();
  const TwellLayout& layout = m.layout;
  for (std::int64_t t = 0; t < layout.tiles(m.cols); ++t) {
    const std::int64_t offset = layout.slot_offset(i, t, m.cols);
    const auto used = static_cast<std::int32_t>(std::min<std::int64_t>(m.packed[offset], layout.capacity()));
    for (std::int32_t s = 1; s <= used; ++s) {
      Entry<T> e = decode_slot(m, offset, s);
      e.col += layout.tile_begin(t);
      if (is_stored(e.value, threshold)) out.push_back(e);
    }
  }
}

template <class T>
struct TwellSource {
  TwellView<const T> m;
  float threshold;
  std::int64_t rows() const { return m.rows; }
  std::int64_t cols() const { return m.cols; }
  void gather(std::int64_t i, Row<T>& out) const { gather_twell_row(m, threshold, i, out); }
};

template <class T>
struct HybridSource {
  HybridView<const T> m;
  float threshold;
  std::int64_t rows() const { return m.rows(); }
  std::int64_t cols() const { return m.cols(); }
  void gather(std::int64_t i, Row<T>& out) const {
    const std::int32_t r = m.row_to_overflow[i];
    if (r < 0) {
      gather_twell_row(m.twell, threshold, i, out);
      return;
    }
    DenseSource<T>{m.overflow, threshold}.gather(r, out);
  }
};

// ---- TwELL packing ----

struct RowPacking {
  std::int64_t first_overflow_tile = -1;  // first tile of the row with count > S-1, or -1
  std::int64_t first_overflow_count = 0;
  std::int64_t beyond_capacity = 0;  // entries of the row that did not fit their tile's slots
};

// Writes a row's entries into its (row, tile) slots: the first min(count, S-1) entries of each
// tile in column order, and in slot 0 the true count, or S-1 when `clamp_count` (drop policy:
// the result must be a valid TwELL). Untouched slots keep the zeros of a fresh matrix.
template <class T>
RowPacking pack_twell_row(TwellView<T> out, std::int64_t row, const Row<T>& entries, bool clamp_count) {
  const TwellLayout& layout = out.layout;
  const std::int64_t capacity = layout.capacity();
  RowPacking result;
  for (std::size_t k = 0; k < entries.size();) {
    const std::int64_t tile = layout.tile_of(entries[k].col);
    std::size_t end = k + 1;
    while (end < entries.size() && layout.tile_of(entries[end].col) == tile) ++end;
    const auto count = static_cast<std::int64_t>(end - k);
    const std::int64_t offset = layout.slot_offset(row, tile, out.cols);
    out.packed[offset] = static_cast<std::uint32_t>(clamp_count ? std::min(count, capacity) : count);
    for (std::int64_t s = 1; s <= std::min(count, capacity); ++s) {
      const Entry<T>& e = entries[k + static_cast<std::size_t>(s) - 1];
      const std::uint32_t local = static_cast<std::uint32_t>(layout.local_col(e.col));
      if constexpr (ValueTraits<T>::packs_in_slot) {
        out.packed[offset + s] = TwellLayout::pack(ValueTraits<T>::to_bits(e.value), local);
      } else {
        out.packed[offset + s] = local;
        out.value_plane[offset + s] = e.value;
      }
    }
    if (count > capacity) {
      if (result.first_overflow_tile < 0) {
        result.first_overflow_tile = tile;
        result.first_overflow_count = count;
      }
      result.beyond_capacity += count - capacity;
    }
    k = end;
  }
  return result;
}

inline bool row_overflows(const TwellLayout& layout, const auto& entries) {
  std::int64_t run = 0;
  for (std::size_t k = 0; k < entries.size(); ++k) {
    run = (k > 0 && layout.tile_of(entries[k].col) == layout.tile_of(entries[k - 1].col)) ? run + 1 : 1;
    if (layout.overflows(run)) return true;
  }
  return false;
}

// ---- builders ----

inline void check_index_range(std::int64_t cols, const char* where) {
  require(cols <= std::numeric_limits<std::int32_t>::max(), ErrorCode::invalid_argument, where, "cols = ", cols,
          " does not fit the 32-bit column indices of CSR and ELL");
}

template <class T, class Source>
DenseMatrix<T> build_dense(const Source& src, const ConvertOptions& options) {
  DenseMatrix<T> out(src.rows(), src.cols());
  auto view = out.view();
  Row<T> row;
  std::int64_t nnz = 0;
  for (std::int64_t i = 0; i < src.rows(); ++i) {
    src.gather(i, row);
    for (const auto& e : row) view.at(i, e.col) = e.value;
    nnz += static_cast<std::int64_t>(row.size());
  }
  fill_report(options, nnz, 0, 0);
  return out;
}

template <class T, class Source>
CsrMatrix<T> build_csr(const Source& src, const ConvertOptions& options, const char* where) {
  check_index_range(src.cols(), where);
  Row<T> row;
  std::vector<std::int64_t> row_ptr(static_cast<std::size_t>(src.rows()) + 1, 0);
  for (std::int64_t i = 0; i < src.rows(); ++i) {
    src.gather(i, row);
    row_ptr[static_cast<std::size_t>(i) + 1] = row_ptr[static_cast<std::size_t>(i)] + static_cast<std::int64_t>(row.size());
  }
  const std::int64_t nnz = row_ptr.back();
  CsrMatrix<T> out(src.rows(), src.cols(), nnz);
  std::copy(row_ptr.begin(), row_ptr.end(), out.row_ptr().data());
  for (std::int64_t i = 0; i < src.rows(); ++i) {
    src.gather(i, row);
    std::int64_t k = row_ptr[static_cast<std::size_t>(i)];
    for (const auto& e : row) {
      out.col_idx().data()[k] = static_cast<std::int32_t>(e.col);
      out.values().data()[k] = e.value;
      ++k;
    }
  }
  fill_report(options, nnz, 0, 0);
  return out;
}

template <class T, class Source>
EllMatrix<T> build_ell(const Source& src, const ConvertOptions& options, const char* where) {
  check_index_range(src.cols(), where);
  require(options.ell_width >= -1, ErrorCode::invalid_argument, where, "options.ell_width = ", options.ell_width,
          " must be -1 (the longest row) or a width >= 0");
  check_ell_overflow_policy(options, where);
  require(options.ell_width <= src.cols(), ErrorCode::invalid_argument, where,
          "options.ell_width = ", options.ell_width, " exceeds cols = ", src.cols(),
          ": a row holds at most one entry per column");
  Row<T> row;
  std::int64_t width = options.ell_width;
  if (width < 0) {
    width = 0;
    for (std::int64_t i = 0; i < src.rows(); ++i) {
      src.gather(i, row);
      width = std::max(width, static_cast<std::int64_t>(row.size()));
    }
  }
  EllMatrix<T> out(src.rows(), src.cols(), width);
  std::int64_t nnz = 0;
  std::int64_t dropped = 0;
  for (std::int64_t i = 0; i < src.rows(); ++i) {
    src.gather(i, row);
    auto n = static_cast<std::int64_t>(row.size());
    if (n > width) {
      if (options.overflow == OverflowPolicy::error)
        fail(ErrorCode::overflow, where, "row ", i, " holds ", n, " nonzeros but options.ell_width = ", width,
             "; use ell_width = -1 (the longest row) or OverflowPolicy::drop");
      dropped += n - width;
      n = width;
    }
    out.row_count().data()[i] = static_cast<std::int32_t>(n);
    for (std::int64_t s = 0; s < n; ++s) {
      out.col_idx().data()[i * width + s] = static_cast<std::int32_t>(row[static_cast<std::size_t>(s)].col);
      out.values().data()[i * width + s] = row[static_cast<std::size_t>(s)].value;
    }
    nnz += n;
  }
  fill_report(options, nnz, dropped, 0);
  return out;
}

inline void refuse_hybrid_policy(const ConvertOptions& options, const char* where) {
  require(options.overflow != OverflowPolicy::hybrid, ErrorCode::invalid_argument, where,
          "options.overflow = hybrid cannot produce a plain TwELL matrix; convert to Hybrid instead "
          "(twell::to_hybrid / *_to_hybrid), which routes overflowed rows to a dense block");
}

// Packs every row of src into `out` (host, src's shape, checked layout). pack_twell_row leaves
// the slots of empty tiles and the padding untouched, so `out` is cleared first: a caller-owned
// destination may hold anything. An overflow error clears it again, so that it is never left
// half written (all zeros is a valid TwELL without entries; docs/api.md, to_twell_into).
template <class T, class Source>
void build_twell_into(const Source& src, TwellView<T> out, const ConvertOptions& options, const char* where) {
  refuse_hybrid_policy(options, where);
  const TwellLayout& layout = out.layout;
  const auto slots = static_cast<std::size_t>(out.rows * layout.packed_width(out.cols));
  const auto clear = [&] {
    std::fill_n(out.packed, slots, 0u);
    if constexpr (!ValueTraits<T>::packs_in_slot) std::fill_n(out.value_plane, slots, T{});
  };
  clear();
  const bool drop = options.overflow == OverflowPolicy::drop;
  Row<T> row;
  std::int64_t nnz = 0;
  std::int64_t dropped = 0;
  for (std::int64_t i = 0; i < src.rows(); ++i) {
    src.gather(i, row);
    const RowPacking packing = pack_twell_row(out, i, row, drop);
    if (packing.first_overflow_tile >= 0 && !drop) {
      clear();
      const std::int64_t t = packing.first_overflow_tile;
      fail(ErrorCode::overflow, where, "row ", i, ", tile ", t, " (columns ", layout.tile_begin(t), "..",
           layout.tile_begin(t) + layout.tile_cols(t, src.cols()) - 1, ") holds ", packing.first_overflow_count,
           " nonzeros but layout (tile ", layout.tile, ", C ", layout.compression, ") has capacity S-1 = ",
           layout.capacity(), "; convert to Hybrid (nothing lost), pick a smaller C, or use OverflowPolicy::drop");
    }
    dropped += packing.beyond_capacity;
    nnz += static_cast<std::int64_t>(row.size()) - packing.beyond_capacity;
  }
  fill_report(options, nnz, dropped, 0);
}

template <class T, class Source>
TwellMatrix<T> build_twell(const Source& src, TwellLayout layout, const ConvertOptions& options, const char* where) {
  check_layout(layout, where);
  refuse_hybrid_policy(options, where);
  TwellMatrix<T> out(src.rows(), src.cols(), layout, MemorySpace::host, Uninitialized{});
  build_twell_into(src, out.view(), options, where);
  return out;
}

// Hybrid is exact whatever options.overflow says: that policy only concerns plain TwELL targets.
template <class T, class Source>
HybridMatrix<T> build_hybrid(const Source& src, TwellLayout layout, const ConvertOptions& options,
                             const char* where) {
  check_layout(layout, where);
  require(src.rows() <= std::numeric_limits<std::int32_t>::max(), ErrorCode::invalid_argument, where, "rows = ",
          src.rows(), " does not fit the 32-bit row maps of a Hybrid");
  Row<T> row;
  std::vector<std::int32_t> row_to_overflow(static_cast<std::size_t>(src.rows()), -1);
  std::vector<std::int32_t> overflow_to_row;
  for (std::int64_t i = 0; i < src.rows(); ++i) {
    src.gather(i, row);
    if (row_overflows(layout, row)) {
      row_to_overflow[static_cast<std::size_t>(i)] = static_cast<std::int32_t>(overflow_to_row.size());
      overflow_to_row.push_back(static_cast<std::int32_t>(i));
    }
  }
  const auto block_rows = static_cast<std::int64_t>(overflow_to_row.size());
  HybridMatrix<T> out(src.rows(), src.cols(), layout, block_rows);
  std::copy(row_to_overflow.begin(), row_to_overflow.end(), out.row_to_overflow().data());
  std::copy(overflow_to_row.begin(), overflow_to_row.end(), out.overflow_to_row().data());
  auto block = out.overflow().view();
  std::int64_t nnz = 0;
  for (std::int64_t i = 0; i < src.rows(); ++i) {
    src.gather(i, row);
    pack_twell_row(out.twell().view(), i, row, false);
    if (const std::int32_t r = row_to_overflow[static_cast<std::size_t>(i)]; r >= 0)
      for (const auto& e : row) block.at(r, e.col) = e.value;
    nnz += static_cast<std::int64_t>(row.size());
  }
  fill_report(options, nnz, 0, block_rows);
  return out;
}

}  // namespace twell::reference::packing
