// Internal: one "visit every stored entry" walker per format, shared by spmm, sddmm, the
// elementwise kernels and the reductions, so that no kernel repeats a format's loop.
//
// An Entry names where a value lives, so the same Entry reads or writes operands that share one
// structure (x, y and out of multiply_on_pattern; pattern and out of sddmm).
// Walkers go row by row in column order, so results that depend on order are deterministic,
// and they throw ErrorCode::malformed on an index that would leave the arrays.
#pragma once

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <type_traits>
#include <vector>

#include <twell/formats/csr.hpp>
#include <twell/formats/ell.hpp>
#include <twell/formats/hybrid.hpp>
#include <twell/formats/twell_matrix.hpp>

#include "common.hpp"

namespace twell::reference::detail {

struct Entry {
  std::int64_t row = 0;
  std::int64_t col = 0;
  // CSR: index into values; ELL: row * width + slot; TwELL (and a Hybrid's TwELL part): offset
  // of the slot word; a Hybrid's overflow block: the overflow row (the offset is row * ld + col).
  std::int64_t pos = 0;
  bool in_overflow = false;
};

// ---- loads and stores at an Entry -------------------------------------------------------------

template <class T>
float load(CsrView<T> v, const Entry& e) {
  return to_float(v.values[e.pos]);
}
template <class T>
float load(EllView<T> v, const Entry& e) {
  return to_float(v.values[e.pos]);
}
template <class T>
float load(TwellView<T> v, const Entry& e) {
  using U = std::remove_const_t<T>;
  if constexpr (ValueTraits<U>::packs_in_slot) {
    return to_float(ValueTraits<U>::from_bits(TwellLayout::slot_value_bits(v.packed[e.pos])));
  } else {
    return v.value_plane[e.pos];
  }
}
template <class T>
float load(HybridView<T> v, const Entry& e) {
  if (e.in_overflow) return to_float(v.overflow.data[e.pos * v.overflow.ld + e.col]);
  return load(v.twell, e);
}

// The stored value itself, bit for bit (NaN payloads survive), for kernels that move values.
template <class T>
std::remove_const_t<T> load_value(CsrView<T> v, const Entry& e) {
  return v.values[e.pos];
}
template <class T>
std::remove_const_t<T> load_value(EllView<T> v, const Entry& e) {
  return v.values[e.pos];
}
template <class T>
std::remove_const_t<T> load_value(TwellView<T> v, const Entry& e) {
  using U = std::remove_const_t<T>;
  if constexpr (ValueTraits<U>::packs_in_slot) {
    return ValueTraits<U>::from_bits(TwellLayout::slot_value_bits(v.packed[e.pos]));
  } else {
    return v.value_plane[e.pos];
  }
}
template <class T>
std::remove_const_t<T> load_value(HybridView<T> v, const Entry& e) {
  if (e.in_overflow) return v.overflow.data[e.pos * v.overflow.ld + e.col];
  return load_value(v.twell, e);
}

template <class T>
void store(CsrView<T> v, const Entry& e, float x) {
  v.values[e.pos] = from_float<T>(x);
}
template <class T>
void store(EllView<T> v, const Entry& e, float x) {
  v.values[e.pos] = from_float<T>(x);
}
// The slot word must already hold its column (16-bit types keep value and column in one word).
template <class T>
void store(TwellView<T> v, const Entry& e, float x) {
  if constexpr (ValueTraits<T>::packs_in_slot) {
    const std::uint16_t bits = ValueTraits<T>::to_bits(from_float<T>(x));
    v.packed[e.pos] = TwellLayout::pack(bits, TwellLayout::slot_column(v.packed[e.pos]));
  } else {
    v.value_plane[e.pos] = x;
  }
}
template <class T>
void store(HybridView<T> v, const Entry& e, float x) {
  if (e.in_overflow) {
    v.overflow.data[e.pos * v.overflow.ld + e.col] = from_float<T>(x);
  } else {
    store(v.twell, e, x);
  }
}

inline void bad_column(const char* where, std::int64_t row, std::int64_t col, std::int64_t cols) {
  fail(ErrorCode::malformed, where, "row ", row, " holds column ", col, " outside [0, ", cols, ")");
}

// ---- walkers ----------------------------------------------------------------------------------

template <class T, class F>
void for_each_entry(CsrView<T> v, const char* where, F&& f) {
  for (std::int64_t i = 0; i < v.rows; ++i) {
    const std::int64_t begin = v.row_ptr[i], end = v.row_ptr[i + 1];
    require(begin <= end && begin >= 0 && end <= v.nnz, ErrorCode::malformed, where, "row_ptr of row ", i, " spans [",
            begin, ", ", end, ") outside [0, ", v.nnz, "]");
    for (std::int64_t k = begin; k < end; ++k) {
      const std::int64_t col = v.col_idx[k];
      if (col < 0 || col >= v.cols) bad_column(where, i, col, v.cols);
      f(Entry{i, col, k, false});
    }
  }
}

template <class T, class F>
void for_each_entry(EllView<T> v, const char* where, F&& f) {
  for (std::int64_t i = 0; i < v.rows; ++i) {
    const std::int64_t count = v.row_count[i];
    require(count >= 0 && count <= v.width, ErrorCode::malformed, where, "row ", i, " count ", count, " outside [0, ",
            v.width, "]");
    for (std::int64_t s = 0; s < count; ++s) {
      const std::int64_t pos = i * v.width + s;
      const std::int64_t col = v.col_idx[pos];
      if (col < 0 || col >= v.cols) bad_column(where, i, col, v.cols);
      f(Entry{i, col, pos, false});
    }
  }
}

// The tile-local column of a slot word: a 16-bit value shares its word with the column, an fp32
// slot holds the column alone, so its high bits count (masking them would read a bad word as a
// valid column).
template <class T>
std::uint32_t slot_column_of(std::uint32_t word) {
  return ValueTraits<std::remove_const_t<T>>::packs_in_slot ? TwellLayout::slot_column(word) : word;
}

// Every slot entry of one TwELL row; a tile whose count passes the capacity yields its first
// capacity entries (the shadow of a Hybrid overflow row).
template <class T, class F>
void for_each_slot_in_row(TwellView<T> v, std::int64_t i, const char* where, F&& f) {
  const TwellLayout& l = v.layout;
  const std::int64_t tiles = l.tiles(v.cols);
  for (std::int64_t t = 0; t < tiles; ++t) {
    const std::int64_t base = l.slot_offset(i, t, v.cols);
    const std::int64_t used = std::min<std::int64_t>(v.packed[base], l.capacity());
    const std::int32_t width = l.tile_cols(t, v.cols);
    for (std::int64_t s = 1; s <= used; ++s) {
      const std::uint32_t local = slot_column_of<T>(v.packed[base + s]);
      if (local >= static_cast<std::uint32_t>(width)) bad_column(where, i, l.tile_begin(t) + local, v.cols);
      f(Entry{i, l.tile_begin(t) + local, base + s, false});
    }
  }
}

// A row of a plain TwELL, or a Hybrid row outside the overflow block, must not overflow.
template <class T>
void require_no_overflow(TwellView<T> v, std::int64_t i, const char* where) {
  const TwellLayout& l = v.layout;
  for (std::int64_t t = 0; t < l.tiles(v.cols); ++t) {
    const std::uint32_t count = v.packed[l.slot_offset(i, t, v.cols)];
    require(!l.overflows(count), ErrorCode::malformed, where, "TwELL row ", i, " tile ", t, " counts ", count,
            " entries but has ", l.capacity(), " slots, and the row is not in an overflow block");
  }
}

template <class T, class F>
void for_each_entry(TwellView<T> v, const char* where, F&& f) {
  for (std::int64_t i = 0; i < v.rows; ++i) {
    require_no_overflow(v, i, where);
    for_each_slot_in_row(v, i, where, f);
  }
}

// The overflow row of Hybrid row i, or -1; throws malformed when the two maps disagree.
template <class T>
std::int64_t overflow_row(HybridView<T> v, std::int64_t i, const char* where) {
  const std::int64_t r = v.row_to_overflow[i];
  if (r < 0) return -1;
  require(r < v.overflow.rows && v.overflow_to_row[r] == i, ErrorCode::malformed, where, "row_to_overflow[", i,
          "] = ", r, " does not map back (", v.overflow.rows, " overflow rows)");
  return r;
}

// Authoritative entries only: TwELL slots of ordinary rows, stored values of overflow rows.
template <class T, class F>
void for_each_entry(HybridView<T> v, const char* where, F&& f) {
  for (std::int64_t i = 0; i < v.rows(); ++i) {
    const std::int64_t r = overflow_row(v, i, where);
    if (r < 0) {
      require_no_overflow(v.twell, i, where);
      for_each_slot_in_row(v.twell, i, where, f);
      continue;
    }
    for (std::int64_t j = 0; j < v.cols(); ++j)
      if (is_stored(v.overflow.data[r * v.overflow.ld + j])) f(Entry{i, j, r, true});
  }
}

// ---- structure comparison ---------------------------------------------------------------------

template <class T, class U>
bool same_structure(CsrView<T> a, CsrView<U> b) {
  if (a.rows != b.rows || a.cols != b.cols || a.nnz != b.nnz) return false;
  if (static_cast<const void*>(a.row_ptr) != static_cast<const void*>(b.row_ptr) &&
      !std::equal(a.row_ptr, a.row_ptr + a.rows + 1, b.row_ptr))
    return false;
  return static_cast<const void*>(a.col_idx) == static_cast<const void*>(b.col_idx) ||
         std::equal(a.col_idx, a.col_idx + a.nnz, b.col_idx);
}
template <class T, class U>
bool same_structure(EllView<T> a, EllView<U> b) {
  if (a.rows != b.rows || a.cols != b.cols || a.width != b.width) return false;
  if (static_cast<const void*>(a.row_count) != static_cast<const void*>(b.row_count) &&
      !std::equal(a.row_count, a.row_count + a.rows, b.row_count))
    return false;
  if (static_cast<const void*>(a.col_idx) == static_cast<const void*>(b.col_idx)) return true;
  for (std::int64_t i = 0; i < a.rows; ++i)
    for (std::int64_t s = 0; s < std::clamp<std::int64_t>(a.row_count[i], 0, a.width); ++s)
      if (a.col_idx[i * a.width + s] != b.col_idx[i * a.width + s]) return false;
  return true;
}
// Counts and the columns of the used slots (values may differ).
template <class T, class U>
bool same_structure(TwellView<T> a, TwellView<U> b) {
  if (a.rows != b.rows || a.cols != b.cols || !(a.layout == b.layout)) return false;
  const TwellLayout& l = a.layout;
  for (std::int64_t i = 0; i < a.rows; ++i)
    for (std::int64_t t = 0; t < l.tiles(a.cols); ++t) {
      const std::int64_t base = l.slot_offset(i, t, a.cols);
      if (a.packed[base] != b.packed[base]) return false;
      const std::int64_t used = std::min<std::int64_t>(a.packed[base], l.capacity());
      for (std::int64_t s = 1; s <= used; ++s)
        if (slot_column_of<T>(a.packed[base + s]) != slot_column_of<U>(b.packed[base + s])) return false;
    }
  return true;
}
template <class T, class U>
bool same_structure(HybridView<T> a, HybridView<U> b) {
  if (!same_structure(a.twell, b.twell) || a.overflow.rows != b.overflow.rows) return false;
  return std::equal(a.row_to_overflow, a.row_to_overflow + a.rows(), b.row_to_overflow) &&
         std::equal(a.overflow_to_row, a.overflow_to_row + a.overflow.rows, b.overflow_to_row);
}

template <class A, class B>
void require_same_structure(A a, B b, const char* where, const char* name_a, const char* name_b) {
  require(same_structure(a, b), ErrorCode::shape_mismatch, where, name_b, " does not share the structure of ", name_a,
          " (same shape, index arrays and counts required)");
}

// ---- writing a result that has the structure of `pattern` -------------------------------------
// `name` is the pattern's name in the caller's signature (errors say it). value(e) computes the
// new value at each entry of the pattern (it may read `out`, which may
// alias the pattern). Every value is computed first, so a pattern found malformed on the way
// leaves `out` (and what it aliases) untouched. CSR/ELL: `out` must already share the pattern's
// index arrays and only its values are written. TwELL/Hybrid: `out` then receives the pattern's
// whole structure (counts, columns, maps, shadow slots) and the new values; a Hybrid's overflow
// rows are written whole, with zeros outside the pattern.

// Every value, in the pattern's entry order; the walk throws on a malformed pattern.
template <class View, class F>
std::vector<float> values_on_pattern(View pattern, const char* where, F&& value) {
  std::vector<float> values;
  for_each_entry(pattern, where, [&](const Entry& e) { values.push_back(value(e)); });
  return values;
}

// Stores them at the same entries of `out`, walking the pattern (now known well formed) again.
template <class View, class Out>
void store_on_pattern(View pattern, Out out, const char* where, const std::vector<float>& values) {
  std::size_t i = 0;
  for_each_entry(pattern, where, [&](const Entry& e) { store(out, e, values[i++]); });
}

template <class T, class F>
void write_on_pattern(CsrView<const T> pattern, CsrView<T> out, const char* where, const char* name, F&& value) {
  require_same_structure(pattern, out, where, name, "out");
  store_on_pattern(pattern, out, where, values_on_pattern(pattern, where, value));
}

template <class T, class F>
void write_on_pattern(EllView<const T> pattern, EllView<T> out, const char* where, const char* name, F&& value) {
  require_same_structure(pattern, out, where, name, "out");
  store_on_pattern(pattern, out, where, values_on_pattern(pattern, where, value));
}

template <class T>
void copy_twell_structure(TwellView<const T> pattern, TwellView<T> out) {
  const std::size_t words = static_cast<std::size_t>(pattern.rows * pattern.packed_width());
  if (words == 0) return;
  std::memmove(out.packed, pattern.packed, words * sizeof(std::uint32_t));
  if constexpr (!ValueTraits<T>::packs_in_slot) std::fill(out.value_plane, out.value_plane + words, 0.0f);
}

template <class T, class F>
void write_on_pattern(TwellView<const T> pattern, TwellView<T> out, const char* where, const char* name, F&& value) {
  require_shape(out.rows, out.cols, pattern.rows, pattern.cols, where, "out", name);
  require(out.layout == pattern.layout, ErrorCode::shape_mismatch, where, "out has layout (tile ", out.layout.tile,
          ", C ", out.layout.compression, ") but ", name, " has (tile ", pattern.layout.tile, ", C ",
          pattern.layout.compression, ")");
  const std::vector<float> values = values_on_pattern(pattern, where, value);
  copy_twell_structure(pattern, out);
  store_on_pattern(pattern, out, where, values);
}

// `also` (a Hybrid of the pattern's structure, or null) widens the overflow rows' pattern to the
// elements where either stores a value: dense rows hold no explicit zeros. In an overflow row the
// dense row is computed and the shadow slots copy it, so a slot whose place the dense row does
// not visit (a pattern value that came out exactly zero earlier) holds zero, as the dense row
// does, instead of a value that no later reader of the dense row would see.
template <class T, class F>
void write_on_pattern(HybridView<const T> pattern, HybridView<T> out, const char* where, const char* name, F&& value,
                      const HybridView<const T>* also = nullptr) {
  require_shape(out.rows(), out.cols(), pattern.rows(), pattern.cols(), where, "out", name);
  require(out.twell.layout == pattern.twell.layout && out.overflow.rows == pattern.overflow.rows,
          ErrorCode::shape_mismatch, where, "out has layout (tile ", out.twell.layout.tile, ", C ",
          out.twell.layout.compression, ") and ", out.overflow.rows, " overflow rows but ", name, " has (tile ",
          pattern.twell.layout.tile, ", C ", pattern.twell.layout.compression, ") and ", pattern.overflow.rows);
  std::vector<std::pair<Entry, float>> values;
  std::vector<float> overflow(static_cast<std::size_t>(pattern.overflow.rows * pattern.cols()), 0.0f);
  for (std::int64_t i = 0; i < pattern.rows(); ++i) {
    const std::int64_t r = overflow_row(pattern, i, where);
    if (r < 0) {
      require_no_overflow(pattern.twell, i, where);
      for_each_slot_in_row(pattern.twell, i, where, [&](const Entry& e) { values.emplace_back(e, value(e)); });
      continue;
    }
    float* dense = overflow.data() + r * pattern.cols();
    for (std::int64_t j = 0; j < pattern.cols(); ++j)
      if (is_stored(pattern.overflow.data[r * pattern.overflow.ld + j]) ||
          (also != nullptr && is_stored(also->overflow.data[r * also->overflow.ld + j])))
        dense[j] = value(Entry{i, j, r, true});
    for_each_slot_in_row(pattern.twell, i, where, [&](const Entry& e) { values.emplace_back(e, dense[e.col]); });
  }
  copy_twell_structure(pattern.twell, out.twell);
  if (pattern.rows() > 0)
    std::memmove(out.row_to_overflow, pattern.row_to_overflow, static_cast<std::size_t>(pattern.rows()) * 4);
  if (pattern.overflow.rows > 0)
    std::memmove(out.overflow_to_row, pattern.overflow_to_row, static_cast<std::size_t>(pattern.overflow.rows) * 4);
  for (const auto& [e, x] : values) store(out.twell, e, x);
  for (std::int64_t r = 0; r < pattern.overflow.rows; ++r)
    for (std::int64_t j = 0; j < pattern.cols(); ++j)
      out.overflow.data[r * out.overflow.ld + j] =
          from_float<T>(overflow[static_cast<std::size_t>(r * pattern.cols() + j)]);
}

}  // namespace twell::reference::detail
