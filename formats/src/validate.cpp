#include <twell/formats/validate.hpp>

#include <algorithm>
#include <limits>
#include <sstream>
#include <vector>

#include <twell/formats/copy.hpp>
#include <twell/formats/dense_checks.hpp>

namespace twell {
namespace {

using detail::concat;

std::string hex(std::uint64_t v) {
  std::ostringstream os;
  os << "0x" << std::hex << v;
  return os.str();
}

template <class T>
std::uint32_t bits_of(T v) {
  if constexpr (ValueTraits<T>::packs_in_slot) {
    return ValueTraits<T>::to_bits(v);
  } else {
    return float_bits(v);
  }
}

template <class T>
std::string show(T v) {
  return concat(to_float(v), " (bits ", hex(bits_of(v)), ")");
}

template <class T>
bool acceptable(T v, const ValidateOptions& options) {
  return options.allow_explicit_zeros || is_stored(v);
}

std::string null_array(std::string_view format, std::string_view array, std::int64_t n) {
  return concat(format, ": ", array, " is null but must hold ", n, " elements");
}

// CSR and ELL column indices are int32: a wider matrix is one that no consumer can index (the
// converters, readers and writers refuse it too; stats overflowed on it).
std::string beyond_int32_cols(std::string_view format, std::int64_t cols) {
  if (cols <= std::numeric_limits<std::int32_t>::max()) return {};
  return concat(format, ": cols = ", cols, " exceeds ", std::numeric_limits<std::int32_t>::max(),
                ", the most its 32-bit column indices serve");
}

// ---- dense ----

template <class T>
std::string dense_shape(DenseView<const T> m, std::string_view what) {
  if (m.rows < 0 || m.cols < 0) return concat(what, ": shape ", m.rows, " x ", m.cols, " is negative");
  if (m.ld < m.cols) return concat(what, ": ld = ", m.ld, " is smaller than cols = ", m.cols);
  // (rows - 1) * ld + cols values, in bytes: past 2^63 a writer's sizes wrapped, and it wrote a
  // file its reader refused.
  std::int64_t span = 0;
  if (m.rows > 0 && m.cols > 0 &&
      (__builtin_mul_overflow(m.rows - 1, m.ld, &span) || __builtin_add_overflow(span, m.cols, &span) ||
       __builtin_mul_overflow(span, static_cast<std::int64_t>(sizeof(T)), &span)))
    return concat(what, ": ", m.rows, " x ", m.cols, " with ld = ", m.ld, " spans more than 2^63 bytes");
  if (m.rows > 0 && m.cols > 0 && m.data == nullptr) return null_array(what, "data", m.rows * m.cols);
  // What every entry point refuses as ErrorCode::misaligned (check_value_boundary).
  if (!detail::on_value_boundary(m))
    return concat(what, ": data starts at ", static_cast<const void*>(m.data), ", not on a ", alignof(T),
                  "-byte value boundary");
  return {};
}

// ---- CSR ----

template <class T>
std::string csr_shape(CsrView<const T> m) {
  if (m.rows < 0 || m.cols < 0 || m.nnz < 0)
    return concat("CSR: shape ", m.rows, " x ", m.cols, " with nnz ", m.nnz, " is negative");
  if (auto v = beyond_int32_cols("CSR", m.cols); !v.empty()) return v;
  if (m.row_ptr == nullptr) return null_array("CSR", "row_ptr", m.rows + 1);
  if (m.nnz > 0 && m.col_idx == nullptr) return null_array("CSR", "col_idx", m.nnz);
  if (m.nnz > 0 && m.values == nullptr) return null_array("CSR", "values", m.nnz);
  return {};
}

template <class T>
std::string csr_content(CsrView<const T> m, const ValidateOptions& options) {
  if (m.row_ptr[0] != 0) return concat("CSR: row_ptr[0] = ", m.row_ptr[0], ", must be 0");
  for (std::int64_t i = 0; i < m.rows; ++i) {
    const std::int64_t begin = m.row_ptr[i];
    const std::int64_t end = m.row_ptr[i + 1];
    if (end < begin)
      return concat("CSR row ", i, ": row_ptr[", i + 1, "] = ", end, " is smaller than row_ptr[", i, "] = ", begin);
    if (end > m.nnz) return concat("CSR row ", i, ": row_ptr[", i + 1, "] = ", end, " exceeds nnz = ", m.nnz);
    for (std::int64_t k = begin; k < end; ++k) {
      const std::int32_t c = m.col_idx[k];
      if (c < 0 || c >= m.cols)
        return concat("CSR row ", i, ": col_idx[", k, "] = ", c, " is outside [0, ", m.cols, ")");
      if (k > begin && c <= m.col_idx[k - 1])
        return concat("CSR row ", i, ": col_idx[", k, "] = ", c, " does not follow col_idx[", k - 1,
                      "] = ", m.col_idx[k - 1], " (columns must strictly increase within a row)");
      if (!acceptable(m.values[k], options))
        return concat("CSR row ", i, ", column ", c, ": values[", k, "] = ", show(m.values[k]),
                      " is a stored zero");
    }
  }
  if (m.row_ptr[m.rows] != m.nnz)
    return concat("CSR: row_ptr[", m.rows, "] = ", m.row_ptr[m.rows], " differs from nnz = ", m.nnz);
  return {};
}

// ---- ELL ----

template <class T>
std::string ell_shape(EllView<const T> m) {
  if (m.rows < 0 || m.cols < 0 || m.width < 0)
    return concat("ELL: shape ", m.rows, " x ", m.cols, " with width ", m.width, " is negative");
  if (auto v = beyond_int32_cols("ELL", m.cols); !v.empty()) return v;
  if (m.width > m.cols)
    return concat("ELL: width = ", m.width, " exceeds cols = ", m.cols, ": a row holds at most one entry per column");
  std::int64_t slots = 0;  // checked: a wrapped product once skipped the null checks below
  if (__builtin_mul_overflow(m.rows, m.width, &slots))
    return concat("ELL: shape ", m.rows, " x width ", m.width, " holds more than 2^63 - 1 slots");
  if (m.rows > 0 && m.row_count == nullptr) return null_array("ELL", "row_count", m.rows);
  if (slots > 0 && m.col_idx == nullptr) return null_array("ELL", "col_idx", slots);
  if (slots > 0 && m.values == nullptr) return null_array("ELL", "values", slots);
  return {};
}

template <class T>
std::string ell_content(EllView<const T> m, const ValidateOptions& options) {
  for (std::int64_t i = 0; i < m.rows; ++i) {
    const std::int32_t n = m.row_count[i];
    if (n < 0 || n > m.width)
      return concat("ELL row ", i, ": row_count = ", n, " is outside [0, width = ", m.width, "]");
    const std::int32_t* cols = m.col_idx + i * m.width;
    const T* values = m.values + i * m.width;
    for (std::int64_t s = 0; s < n; ++s) {
      if (cols[s] < 0 || cols[s] >= m.cols)
        return concat("ELL row ", i, ", slot ", s, ": column ", cols[s], " is outside [0, ", m.cols, ")");
      if (s > 0 && cols[s] <= cols[s - 1])
        return concat("ELL row ", i, ", slot ", s, ": column ", cols[s], " does not follow column ", cols[s - 1],
                      " of slot ", s - 1, " (columns must strictly increase within a row)");
      if (!acceptable(values[s], options))
        return concat("ELL row ", i, ", slot ", s, " (column ", cols[s], "): stored value ", show(values[s]),
                      " is zero");
    }
    for (std::int64_t s = n; s < m.width; ++s) {
      if (cols[s] != 0)
        return concat("ELL row ", i, ", padding slot ", s, ": column ", cols[s], ", must be 0");
      if (bits_of(values[s]) != 0)
        return concat("ELL row ", i, ", padding slot ", s, ": value ", show(values[s]), ", must be zero bits");
    }
  }
  return {};
}

// ---- TwELL ----

template <class T>
std::string twell_shape(TwellView<const T> m, std::string_view what) {
  if (m.rows < 0 || m.cols < 0) return concat(what, ": shape ", m.rows, " x ", m.cols, " is negative");
  try {
    check_layout(m.layout, std::string(what).c_str());
  } catch (const Error& e) {
    return e.what();
  }
  // rows x tiles x S words, each step checked: TwellLayout's index math is int64.
  std::int64_t words = 0;
  if (m.cols > std::numeric_limits<std::int64_t>::max() - (m.layout.tile - 1) ||
      __builtin_mul_overflow(m.layout.tiles(m.cols), std::int64_t{m.layout.slots()}, &words) ||
      __builtin_mul_overflow(m.rows, words, &words))
    return concat(what, ": shape ", m.rows, " x ", m.cols, " at tile ", m.layout.tile, ", C ", m.layout.compression,
                  " holds more than 2^63 - 1 packed words");
  if (words > 0 && m.packed == nullptr) return null_array(what, "packed", words);
  if constexpr (ValueTraits<T>::packs_in_slot) {
    if (m.value_plane != nullptr)
      return concat(what, ": value_plane is set, but ", to_string(dtype_of<T>),
                    " values live in the slots and the view must leave it null");
  } else {
    if (words > 0 && m.value_plane == nullptr) return null_array(what, "value_plane", words);
  }
  return {};
}

// Checks the tiles of row i. Counts above capacity are allowed only when `shadow_allowed` (a
// hybrid's block rows); the first such tile is reported through `first_overflow`.
template <class T>
std::string twell_row(TwellView<const T> m, std::int64_t i, bool shadow_allowed, const ValidateOptions& options,
                      std::string_view what, std::int64_t* first_overflow) {
  const TwellLayout& layout = m.layout;
  const std::int64_t tiles = layout.tiles(m.cols);
  const std::int32_t slots = layout.slots();
  for (std::int64_t t = 0; t < tiles; ++t) {
    const std::int64_t offset = layout.slot_offset(i, t, m.cols);
    const std::uint32_t* words = m.packed + offset;
    const T* plane = ValueTraits<T>::packs_in_slot ? nullptr : m.value_plane + offset;
    const std::int32_t width = layout.tile_cols(t, m.cols);
    const std::int64_t begin = layout.tile_begin(t);
    const std::uint32_t count = words[0];
    const auto where = [&] { return concat(what, " row ", i, ", tile ", t); };
    if (count > static_cast<std::uint32_t>(width))
      return concat(where(), ": count ", count, " exceeds the tile's ", width, " columns");
    if (layout.overflows(count)) {
      if (!shadow_allowed)
        return concat(where(), ": count ", count, " exceeds the capacity S-1 = ", layout.capacity(),
                      " of layout (tile ", layout.tile, ", C ", layout.compression, ")");
      if (*first_overflow < 0) *first_overflow = t;
    }
    if (plane != nullptr && bits_of(plane[0]) != 0)
      return concat(where(), ": value-plane slot 0 holds ", show(plane[0]), ", must be zero bits");
    const std::int32_t used = static_cast<std::int32_t>(std::min<std::uint32_t>(count, layout.capacity()));
    std::uint32_t previous = 0;
    for (std::int32_t s = 1; s <= used; ++s) {
      std::uint32_t col = words[s];
      T value{};
      if constexpr (ValueTraits<T>::packs_in_slot) {
        col = TwellLayout::slot_column(words[s]);
        value = ValueTraits<T>::from_bits(TwellLayout::slot_value_bits(words[s]));
      } else {
        value = plane[s];
      }
      if (col >= static_cast<std::uint32_t>(width))
        return concat(where(), ", slot ", s, ": column ", col, " is outside the tile's ", width, " columns");
      if (s > 1 && col <= previous)
        return concat(where(), ", slot ", s, ": column ", col, " does not follow column ", previous, " of slot ",
                      s - 1, " (columns must strictly increase)");
      if (!acceptable(value, options))
        return concat(where(), ", slot ", s, " (column ", begin + col, "): stored value ", show(value), " is zero");
      previous = col;
    }
    for (std::int32_t s = used + 1; s < slots; ++s) {
      if (words[s] != 0)
        return concat(where(), ", slot ", s, ": unused slot holds ", hex(words[s]), ", must be 0 (count ", count,
                      ")");
      if (plane != nullptr && bits_of(plane[s]) != 0)
        return concat(where(), ", slot ", s, ": unused value-plane slot holds ", show(plane[s]),
                      ", must be zero bits (count ", count, ")");
    }
  }
  return {};
}

template <class T>
std::string twell_content(TwellView<const T> m, const ValidateOptions& options) {
  std::int64_t unused = -1;
  for (std::int64_t i = 0; i < m.rows; ++i)
    if (auto v = twell_row(m, i, false, options, "TwELL", &unused); !v.empty()) return v;
  return {};
}

// ---- Hybrid ----

template <class T>
std::string hybrid_shape(HybridView<const T> m) {
  if (auto v = twell_shape(m.twell, "Hybrid TwELL part"); !v.empty()) return v;
  if (auto v = dense_shape(m.overflow, "Hybrid overflow block"); !v.empty()) return v;
  if (m.overflow.cols != m.cols())
    return concat("Hybrid: the overflow block has ", m.overflow.cols, " columns but the matrix has ", m.cols());
  if (m.overflow.rows > m.rows())
    return concat("Hybrid: the overflow block has ", m.overflow.rows, " rows, more than the matrix's ", m.rows());
  if (m.overflow.space != m.twell.space)
    return concat("Hybrid: the overflow block lives in ", to_string(m.overflow.space), " memory, the TwELL part in ",
                  to_string(m.twell.space));
  if (m.rows() > 0 && m.row_to_overflow == nullptr) return null_array("Hybrid", "row_to_overflow", m.rows());
  if (m.overflow.rows > 0 && m.overflow_to_row == nullptr)
    return null_array("Hybrid", "overflow_to_row", m.overflow.rows);
  return {};
}

// The block row of row i (block row r) against the shadow in the TwELL part.
template <class T>
std::string hybrid_shadow(HybridView<const T> m, std::int64_t i, std::int64_t r, const ValidateOptions& options,
                          std::vector<std::int32_t>& nonzeros) {
  const TwellLayout& layout = m.twell.layout;
  const T* dense = m.overflow.data + r * m.overflow.ld;
  for (std::int64_t t = 0; t < layout.tiles(m.cols()); ++t) {
    const std::int64_t offset = layout.slot_offset(i, t, m.cols());
    const std::uint32_t* words = m.twell.packed + offset;
    const std::int64_t begin = layout.tile_begin(t);
    const std::int32_t width = layout.tile_cols(t, m.cols());
    const std::uint32_t count = words[0];
    const std::int32_t used = static_cast<std::int32_t>(std::min<std::uint32_t>(count, layout.capacity()));
    const auto where = [&] { return concat("Hybrid row ", i, " (overflow block row ", r, "), tile ", t); };
    const auto slot_col = [&](std::int32_t s) -> std::int32_t {
      if constexpr (ValueTraits<T>::packs_in_slot) {
        return static_cast<std::int32_t>(TwellLayout::slot_column(words[s]));
      } else {
        return static_cast<std::int32_t>(words[s]);
      }
    };
    const auto slot_value = [&](std::int32_t s) -> T {
      if constexpr (ValueTraits<T>::packs_in_slot) {
        return ValueTraits<T>::from_bits(TwellLayout::slot_value_bits(words[s]));
      } else {
        return m.twell.value_plane[offset + s];
      }
    };
    nonzeros.clear();
    for (std::int32_t j = 0; j < width; ++j)
      if (is_stored(dense[begin + j])) nonzeros.push_back(j);
    const auto k = static_cast<std::uint32_t>(nonzeros.size());
    if (!options.allow_explicit_zeros) {
      if (k != count)
        return concat(where(), ": slot 0 says count ", count, " but the dense row holds ", k, " nonzeros in the tile");
      for (std::int32_t s = 1; s <= used; ++s) {
        const std::int32_t c = nonzeros[static_cast<std::size_t>(s - 1)];
        if (slot_col(s) != c || bits_of(slot_value(s)) != bits_of(dense[begin + c]))
          return concat(where(), ", slot ", s, ": shadow entry (column ", begin + slot_col(s), ", value ",
                        show(slot_value(s)), ") differs from the dense row's nonzero number ", s, " (column ",
                        begin + c, ", value ", show(dense[begin + c]), ")");
      }
      continue;
    }
    // Explicit zeros allowed: the tile's pattern holds `count` columns, of which the shadow
    // shows the first `used`; the dense nonzeros must lie inside that pattern.
    if (k > count)
      return concat(where(), ": the dense row holds ", k, " nonzeros in the tile, more than its count ", count);
    for (std::int32_t s = 1; s <= used; ++s) {
      const std::int32_t c = slot_col(s);
      if (bits_of(slot_value(s)) != bits_of(dense[begin + c]))
        return concat(where(), ", slot ", s, ": shadow entry (column ", begin + c, ", value ", show(slot_value(s)),
                      ") differs from the dense row's value ", show(dense[begin + c]));
    }
    const std::int32_t known_up_to = static_cast<std::int64_t>(count) <= layout.capacity() ? width : slot_col(used) + 1;
    std::int32_t s = 1;
    for (const std::int32_t c : nonzeros) {
      if (c >= known_up_to) break;
      while (s <= used && slot_col(s) < c) ++s;
      if (s > used || slot_col(s) != c)
        return concat(where(), ": the dense row's nonzero at column ", begin + c, " (value ", show(dense[begin + c]),
                      ") is not in the tile's pattern");
    }
  }
  return {};
}

template <class T>
std::string hybrid_content(HybridView<const T> m, const ValidateOptions& options) {
  const std::int64_t rows = m.rows();
  const std::int64_t block = m.overflow_rows();
  for (std::int64_t r = 0; r < block; ++r) {
    const std::int32_t i = m.overflow_to_row[r];
    if (i < 0 || i >= rows)
      return concat("Hybrid: overflow_to_row[", r, "] = ", i, " is outside [0, ", rows, ")");
    if (r > 0 && i <= m.overflow_to_row[r - 1])
      return concat("Hybrid: overflow_to_row[", r, "] = ", i, " does not follow overflow_to_row[", r - 1,
                    "] = ", m.overflow_to_row[r - 1], " (it must strictly increase)");
    if (m.row_to_overflow[i] != r)
      return concat("Hybrid: overflow_to_row[", r, "] = ", i, " but row_to_overflow[", i,
                    "] = ", m.row_to_overflow[i]);
  }
  for (std::int64_t i = 0; i < rows; ++i) {
    const std::int32_t r = m.row_to_overflow[i];
    if (r < -1 || r >= block)
      return concat("Hybrid: row_to_overflow[", i, "] = ", r, " is outside [-1, ", block, ")");
    if (r >= 0 && m.overflow_to_row[r] != i)
      return concat("Hybrid: row_to_overflow[", i, "] = ", r, " but overflow_to_row[", r,
                    "] = ", m.overflow_to_row[r]);
  }
  const TwellLayout& layout = m.twell.layout;
  std::vector<std::int32_t> nonzeros;
  for (std::int64_t i = 0; i < rows; ++i) {
    std::int64_t overflowed = -1;
    if (auto v = twell_row(m.twell, i, true, options, "Hybrid TwELL part", &overflowed); !v.empty()) return v;
    const std::int32_t r = m.row_to_overflow[i];
    if (overflowed >= 0 && r < 0)
      return concat("Hybrid row ", i, ", tile ", overflowed, ": count ",
                    m.twell.packed[layout.slot_offset(i, overflowed, m.cols())], " exceeds the capacity S-1 = ",
                    layout.capacity(), " but the row is not in the overflow block (row_to_overflow[", i,
                    "] = -1)");
    if (overflowed < 0 && r >= 0)
      return concat("Hybrid row ", i, " is in the overflow block (block row ", r,
                    ") but none of its tiles has more than S-1 = ", layout.capacity(), " nonzeros");
    if (r >= 0)
      if (auto v = hybrid_shadow(m, i, r, options, nonzeros); !v.empty()) return v;
  }
  return {};
}

// ---- entry points: shape and pointers first, then the contents (on a host copy if needed) ----

// Every view lives in host or device memory; a value outside the enum is refused by every
// operation, so validate does not call it valid.
std::string space_violation(MemorySpace s, const char* what) {
  if (is_memory_space(s)) return {};
  return concat(what, ": memory space ", static_cast<int>(s), " is neither host nor device");
}

template <class T>
std::string violation(DenseView<const T> m, const ValidateOptions&) {
  if (auto v = space_violation(m.space, "dense"); !v.empty()) return v;
  return dense_shape(m, "dense");
}

template <class T>
std::string violation(CsrView<const T> m, const ValidateOptions& options) {
  if (auto v = space_violation(m.space, "CSR"); !v.empty()) return v;
  if (auto v = csr_shape(m); !v.empty()) return v;
  if (m.space == MemorySpace::device) {
    const auto host = copy_to(m, MemorySpace::host);
    return csr_content(host.view(), options);
  }
  return csr_content(m, options);
}

template <class T>
std::string violation(EllView<const T> m, const ValidateOptions& options) {
  if (auto v = space_violation(m.space, "ELL"); !v.empty()) return v;
  if (auto v = ell_shape(m); !v.empty()) return v;
  if (m.space == MemorySpace::device) {
    const auto host = copy_to(m, MemorySpace::host);
    return ell_content(host.view(), options);
  }
  return ell_content(m, options);
}

template <class T>
std::string violation(TwellView<const T> m, const ValidateOptions& options) {
  if (auto v = space_violation(m.space, "TwELL"); !v.empty()) return v;
  if (auto v = twell_shape(m, "TwELL"); !v.empty()) return v;
  if (m.space == MemorySpace::device) {
    const auto host = copy_to(m, MemorySpace::host);
    return twell_content(host.view(), options);
  }
  return twell_content(m, options);
}

template <class T>
std::string violation(HybridView<const T> m, const ValidateOptions& options) {
  if (auto v = space_violation(m.space(), "Hybrid"); !v.empty()) return v;
  if (auto v = hybrid_shape(m); !v.empty()) return v;
  if (m.space() == MemorySpace::device) {
    const auto host = copy_to(m, MemorySpace::host);
    return hybrid_content(host.view(), options);
  }
  return hybrid_content(m, options);
}

void throw_if(const std::string& violation) {
  if (!violation.empty()) fail(ErrorCode::malformed, "twell::validate", violation);
}

}  // namespace

#define TWELL_DEFINE_VALIDATE(T, View)                                                                    \
  std::string find_violation(View<const T> m, const ValidateOptions& options) { return violation(m, options); } \
  void validate(View<const T> m, const ValidateOptions& options) { throw_if(violation(m, options)); }

#define TWELL_DEFINE_VALIDATE_ALL(T)   \
  TWELL_DEFINE_VALIDATE(T, DenseView)  \
  TWELL_DEFINE_VALIDATE(T, CsrView)    \
  TWELL_DEFINE_VALIDATE(T, EllView)    \
  TWELL_DEFINE_VALIDATE(T, TwellView)  \
  TWELL_DEFINE_VALIDATE(T, HybridView)

TWELL_FOR_EACH_VALUE_TYPE(TWELL_DEFINE_VALIDATE_ALL)
#undef TWELL_DEFINE_VALIDATE_ALL
#undef TWELL_DEFINE_VALIDATE

}  // namespace twell
