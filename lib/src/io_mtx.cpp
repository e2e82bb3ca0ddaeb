// Matrix Market coordinate files <-> CsrMatrix.
#include <locale.h>

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <limits>
#include <tuple>
#include <utility>
#include <vector>

#include <twell/config.hpp>
#include <twell/instantiate.hpp>

#include "io_detail.hpp"

namespace twell {
namespace {

constexpr std::string_view kWhere = "twell::read_mtx";

enum class Field : std::uint8_t { real, integer, pattern };
enum class Symmetry : std::uint8_t { general, symmetric, skew };

char lower(char c) { return (c >= 'A' && c <= 'Z') ? static_cast<char>(c - 'A' + 'a') : c; }
bool iequal(std::string_view a, std::string_view b) {
  return a.size() == b.size() && std::equal(a.begin(), a.end(), b.begin(), [](char x, char y) { return lower(x) == lower(y); });
}
bool is_blank(char c) { return c == ' ' || c == '\t' || c == '\r'; }

// Walks the text line by line, keeping the line number and byte offset for error messages.
class Lines {
 public:
  explicit Lines(std::string_view text) : text_(text) {}

  // The next line without its '\n' (and a trailing '\r'); false at the end of the input.
  bool next(std::string_view& line) {
    if (pos_ >= text_.size()) return false;
    start_ = pos_;
    ++number_;
    const std::size_t nl = text_.find('\n', pos_);
    const std::size_t end = nl == std::string_view::npos ? text_.size() : nl;
    line = text_.substr(pos_, end - pos_);
    pos_ = nl == std::string_view::npos ? text_.size() : nl + 1;
    return true;
  }
  std::size_t remaining() const { return text_.size() - pos_; }
  std::int64_t number() const { return number_; }
  std::size_t start() const { return start_; }

  template <class... Args>
  [[noreturn]] void fail_here(ErrorCode code, std::size_t column, Args&&... what) const {
    fail(code, kWhere, "line ", number_, " (byte ", start_ + column, "): ", io_detail::shown(what)...);
  }

 private:
  std::string_view text_;
  std::size_t pos_ = 0;
  std::size_t start_ = 0;
  std::int64_t number_ = 0;
};

// Splits a line into whitespace-separated tokens, remembering where each starts.
class Tokens {
 public:
  explicit Tokens(std::string_view line) : line_(line) {}
  bool next(std::string_view& token) {
    while (pos_ < line_.size() && is_blank(line_[pos_])) ++pos_;
    if (pos_ >= line_.size()) return false;
    at_ = pos_;
    while (pos_ < line_.size() && !is_blank(line_[pos_])) ++pos_;
    token = line_.substr(at_, pos_ - at_);
    return true;
  }
  std::size_t at() const { return at_; }
  std::size_t pos() const { return pos_; }

 private:
  std::string_view line_;
  std::size_t pos_ = 0;
  std::size_t at_ = 0;
};

bool is_blank_line(std::string_view line) {
  return std::all_of(line.begin(), line.end(), [](char c) { return is_blank(c); });
}

// from_chars takes a '-' but no '+': drops one leading '+', and refuses a '-' after it ("+-5").
bool drop_plus(std::string_view& token) {
  if (token.empty() || token.front() != '+') return true;
  token.remove_prefix(1);
  return token.empty() || token.front() != '-';
}

template <class Int>
bool parse_int(std::string_view token, Int& out) {
  if (!drop_plus(token)) return false;
  const auto [end, ec] = std::from_chars(token.data(), token.data() + token.size(), out);
  return ec == std::errc() && end == token.data() + token.size();
}

// Decimal digits after at most one sign: an integer, however long.
bool is_integer_literal(std::string_view token) {
  if (!token.empty() && (token.front() == '+' || token.front() == '-')) token.remove_prefix(1);
  return !token.empty() && std::all_of(token.begin(), token.end(), [](char c) { return c >= '0' && c <= '9'; });
}

bool parse_real(std::string_view token, double& out) {
  if (!drop_plus(token)) return false;
  const char* const token_end = token.data() + token.size();
  const auto [end, ec] = std::from_chars(token.data(), token_end, out);
  if (end != token_end) return false;
  // A decimal beyond fp64 comes without a value from from_chars; strtod_l in the C locale (strtod
  // follows the process's, whose decimal point may be ',') says on which side it fell. Past the
  // largest fp64 it is kept as the largest, which no value type holds (narrow refuses it); below
  // the smallest it is kept as the smallest subnormal, which every value type rounds to zero
  // (narrow counts it): never as Inf or 0.
  if (ec == std::errc::result_out_of_range) {
    static const locale_t c_locale = newlocale(LC_ALL_MASK, "C", locale_t{});
    if (c_locale == locale_t{}) return false;  // no C locale object (out of memory): refused, not guessed
    const std::string text(token);
    char* parsed = nullptr;
    out = strtod_l(text.c_str(), &parsed, c_locale);
    if (parsed != text.c_str() + text.size()) return false;
    if (std::isinf(out)) out = std::copysign(std::numeric_limits<double>::max(), out);
    if (out == 0) out = std::copysign(std::numeric_limits<double>::denorm_min(), out);
    return true;
  }
  return ec == std::errc();
}

// One entry line as read (a symmetric file's mirrored element is made from it when the elements
// are placed). Its line is found again only for a duplicate (fail_duplicate), so reading holds 16
// bytes a line, not a line number besides.
template <Value T>
struct Entry {
  std::int64_t row;
  std::int32_t col;
  T value;
};

// Reports a duplicate of element (row, col), 1-based: walks the entry lines again from `lines` (a
// copy of the first walk as it stood after the size line) for the first two that name it,
// as written or, in a symmetric file, mirrored. Every entry line was checked by the first walk,
// which found the two.
[[noreturn]] void fail_duplicate(Lines lines, bool mirrored, std::int64_t row, std::int64_t col) {
  std::string_view line;
  std::int64_t found_line[2] = {};
  std::size_t found_byte[2] = {};
  std::int64_t written[2] = {row, col};
  int found = 0;
  while (found < 2 && lines.next(line)) {
    if (is_blank_line(line) || line.front() == '%') continue;
    Tokens t(line);
    std::string_view s;
    std::int64_t r = 0;
    std::int64_t c = 0;
    if (!t.next(s) || !parse_int(s, r) || !t.next(s) || !parse_int(s, c)) continue;
    if ((r == row && c == col) || (mirrored && r == col && c == row)) {
      written[0] = r;
      written[1] = c;
      found_line[found] = lines.number();
      found_byte[found] = lines.start();
      ++found;
    }
  }
  fail(ErrorCode::malformed, kWhere, "duplicate entry (", written[0], ", ", written[1], ") on line ", found_line[0],
       " (byte ", found_byte[0], ") and line ", found_line[1], " (byte ", found_byte[1],
       "); Matrix Market readers that sum duplicates disagree on it, twell refuses");
}

template <Value T>
CsrMatrix<T> parse(std::span<const std::byte> bytes, const ReadOptions& options, MtxReport* report) {
  const std::string_view text(reinterpret_cast<const char*>(bytes.data()), bytes.size());
  Lines lines(text);
  std::string_view line;
  if (!lines.next(line)) fail(ErrorCode::io, kWhere, "input is empty (0 bytes); expected a %%MatrixMarket banner");

  Tokens banner(line);
  std::string_view tok[5];
  std::size_t at[5] = {};
  int n = 0;
  std::string_view extra;
  for (; n < 5 && banner.next(tok[n]); ++n) at[n] = banner.at();
  if (n < 5 || !iequal(tok[0], "%%MatrixMarket")) {
    lines.fail_here(ErrorCode::io, 0,
                    "not a Matrix Market banner; expected '%%MatrixMarket matrix coordinate <field> general'");
  }
  if (banner.next(extra)) lines.fail_here(ErrorCode::malformed, banner.at(), "unexpected '", extra, "' after the banner");
  if (!iequal(tok[1], "matrix")) lines.fail_here(ErrorCode::unsupported, at[1], "object '", tok[1], "' is not 'matrix'");
  if (!iequal(tok[2], "coordinate")) {
    lines.fail_here(ErrorCode::unsupported, at[2], "format '", tok[2], "' is not 'coordinate' (dense 'array' files: use .npy)");
  }
  Field field;
  if (iequal(tok[3], "real") || iequal(tok[3], "double")) {
    field = Field::real;
  } else if (iequal(tok[3], "integer")) {
    field = Field::integer;
  } else if (iequal(tok[3], "pattern")) {
    field = Field::pattern;
  } else {
    lines.fail_here(ErrorCode::unsupported, at[3], "field '", tok[3], "' is not real, integer or pattern");
  }
  // symmetric / skew-symmetric files store the lower triangle; the reader mirrors it (scipy's
  // mmwrite picks symmetric by itself whenever the matrix is).
  Symmetry symmetry;
  if (iequal(tok[4], "general")) {
    symmetry = Symmetry::general;
  } else if (iequal(tok[4], "symmetric")) {
    symmetry = Symmetry::symmetric;
  } else if (iequal(tok[4], "skew-symmetric")) {
    symmetry = Symmetry::skew;
  } else {
    lines.fail_here(ErrorCode::unsupported, at[4], "symmetry '", tok[4],
                    "' is not general, symmetric or skew-symmetric");
  }
  // The specification (and NIST's mm_is_valid) forbids it: a pattern holds no value to negate
  // for the mirrored entry, and a made-up -1 would be read.
  if (field == Field::pattern && symmetry == Symmetry::skew) {
    lines.fail_here(ErrorCode::malformed, at[4], "field 'pattern' with symmetry '", tok[4],
                    "' is not a valid Matrix Market combination (skew-symmetric needs values)");
  }

  // Comments and blank lines, then the size line.
  for (;;) {
    if (!lines.next(line)) fail(ErrorCode::io, kWhere, "input ends (byte ", text.size(), ") before the size line");
    if (!line.empty() && line.front() == '%') continue;
    if (is_blank_line(line)) continue;
    break;
  }
  Tokens size_tokens(line);
  std::int64_t dims[3] = {};
  const char* names[3] = {"rows", "columns", "entries"};
  for (int k = 0; k < 3; ++k) {
    std::string_view t;
    if (!size_tokens.next(t)) {
      lines.fail_here(ErrorCode::malformed, size_tokens.pos(), "size line has ", k,
                      " numbers; expected 'rows columns entries'");
    }
    if (!parse_int(t, dims[k]) || dims[k] < 0) {
      lines.fail_here(ErrorCode::malformed, size_tokens.at(), "number of ", names[k], " '", t,
                      "' is not an integer in [0, 2^63)");
    }
  }
  if (size_tokens.next(extra)) {
    lines.fail_here(ErrorCode::malformed, size_tokens.at(), "unexpected '", extra, "' after 'rows columns entries'");
  }
  const std::int64_t rows = dims[0];
  const std::int64_t cols = dims[1];
  const std::int64_t entries = dims[2];
  if (cols > io_detail::kMaxSparseCols) {
    lines.fail_here(ErrorCode::unsupported, 0, cols, " columns exceed twell's 32-bit column indices");
  }
  std::uint64_t cells = 0;
  if (io_detail::checked_mul(static_cast<std::uint64_t>(rows), static_cast<std::uint64_t>(cols), cells) &&
      static_cast<std::uint64_t>(entries) > cells) {
    lines.fail_here(ErrorCode::malformed, 0, entries, " entries do not fit a ", rows, " x ", cols, " matrix");
  }
  // Each entry line takes at least 4 bytes ("i j\n"); the last may lack its newline.
  if (static_cast<std::uint64_t>(entries) > (lines.remaining() + 1) / 4) {
    lines.fail_here(ErrorCode::io, 0, "declares ", entries, " entries but only ", lines.remaining(),
                    " bytes follow (truncated?)");
  }
  // One array of rows + 1 int64: the result's row_ptr, which the sort below fills in place.
  if (!io_detail::fits_implicit(static_cast<std::uint64_t>(rows) + 1, sizeof(std::int64_t), bytes.size(), options)) {
    lines.fail_here(ErrorCode::out_of_memory, 0, rows, " rows need (rows + 1) x 8 bytes of row offsets, more than the ",
                    bytes.size(), "-byte input plus ReadOptions::max_implicit_bytes = ", options.max_implicit_bytes);
  }

  if (symmetry != Symmetry::general && rows != cols) {
    lines.fail_here(ErrorCode::malformed, 0, "a ", tok[4], " matrix must be square, not ", rows, " x ", cols);
  }
  const Lines first_entry = lines;
  std::vector<Entry<T>> entry;
  std::int64_t rounded_to_zero = 0;
  entry.reserve(static_cast<std::size_t>(entries));
  const bool symmetric = symmetry != Symmetry::general;
  std::int64_t mirrored = 0;  // off-diagonal lines of a symmetric file: an element each besides
  std::int64_t got = 0;
  while (got < entries) {
    if (!lines.next(line)) {
      fail(ErrorCode::io, kWhere, "input ends (byte ", text.size(), ") after ", got, " of ", entries,
           " entries (truncated?)");
    }
    if (is_blank_line(line) || line.front() == '%') continue;
    Tokens t(line);
    std::string_view s;
    std::int64_t r = 0;
    std::int64_t c = 0;
    if (!t.next(s) || !parse_int(s, r)) lines.fail_here(ErrorCode::malformed, t.at(), "row index '", s, "' is not an integer");
    if (r < 1 || r > rows) lines.fail_here(ErrorCode::malformed, t.at(), "row index ", r, " is outside [1, ", rows, "]");
    if (!t.next(s)) lines.fail_here(ErrorCode::malformed, t.pos(), "entry has no column index");
    if (!parse_int(s, c)) lines.fail_here(ErrorCode::malformed, t.at(), "column index '", s, "' is not an integer");
    if (c < 1 || c > cols) lines.fail_here(ErrorCode::malformed, t.at(), "column index ", c, " is outside [1, ", cols, "]");
    double v = 1.0;
    if (field != Field::pattern) {
      if (!t.next(s)) lines.fail_here(ErrorCode::malformed, t.pos(), "entry has no value");
      bool ok;
      if (field == Field::integer) {
        // An integer past 64 bits is still an integer: it is read as the real it names, and the
        // value-type check below decides whether T holds it.
        std::int64_t iv = 0;
        ok = parse_int(s, iv);
        v = static_cast<double>(iv);
        if (!ok && is_integer_literal(s)) ok = parse_real(s, v);
      } else {
        ok = parse_real(s, v);
      }
      if (!ok) lines.fail_here(ErrorCode::malformed, t.at(), "value '", s, "' is not ", field == Field::integer ? "an integer" : "a real number");
    }
    const std::string_view value_text = s;
    const auto value_byte = lines.start() + t.at();
    if (t.next(s)) lines.fail_here(ErrorCode::malformed, t.at(), "unexpected '", s, "' after the entry");
    ++got;
    if (symmetry != Symmetry::general && (c > r || (symmetry == Symmetry::skew && c == r))) {
      lines.fail_here(ErrorCode::malformed, 0, "entry (", r, ", ", c, ") is not in the ",
                      symmetry == Symmetry::skew ? "strictly " : "", "lower triangle of a ", tok[4], " matrix");
    }
    // Rounded once the line is known to be well formed: a structural error is reported first.
    const auto element = [&] {
      return detail::concat("line ", lines.number(), " (byte ", value_byte, "): value ",
                            io_detail::printable(value_text));
    };
    bool to_zero = false;
    const T value = narrow<T>(v, kWhere, element, to_zero);
    entry.push_back(Entry<T>{r - 1, static_cast<std::int32_t>(c - 1), value});
    const bool mirror = symmetric && r != c;
    mirrored += mirror ? 1 : 0;
    rounded_to_zero += to_zero ? (mirror ? 2 : 1) : 0;
  }
  while (lines.next(line)) {
    if (is_blank_line(line) || line.front() == '%') continue;
    lines.fail_here(ErrorCode::malformed, 0, "data after the ", entries, " declared entries");
  }

  // A counting sort by row straight into the CSR arrays (explicit zeros included, so that a zero
  // duplicating a value is still found), then each row by column: duplicates become neighbours.
  // A symmetric file's off-diagonal line places its mirrored element right after its own, as the
  // file would have listed it.
  CsrMatrix<T> m(rows, cols, static_cast<std::int64_t>(entry.size()) + mirrored);  // row_ptr zeroed
  auto row_ptr = m.row_ptr().host_span();
  auto col_idx = m.col_idx().host_span();
  auto values = m.values().host_span();
  const auto rows_z = static_cast<std::size_t>(rows);
  const auto mirror_of = [&](const Entry<T>& x) { return symmetric && x.row != x.col; };
  for (const Entry<T>& x : entry) {
    ++row_ptr[static_cast<std::size_t>(x.row) + 1];
    if (mirror_of(x)) ++row_ptr[static_cast<std::size_t>(x.col) + 1];
  }
  for (std::size_t r = 0; r < rows_z; ++r) row_ptr[r + 1] += row_ptr[r];
  // row_ptr[r] is row r's fill cursor; once filled it holds row r + 1's start, shifted back below.
  const auto place = [&](std::int64_t row, std::int64_t col, T value) {
    const auto k = static_cast<std::size_t>(row_ptr[static_cast<std::size_t>(row)]++);
    col_idx[k] = static_cast<std::int32_t>(col);
    values[k] = value;
  };
  for (const Entry<T>& x : entry) {
    place(x.row, x.col, x.value);
    if (mirror_of(x)) place(x.col, x.row, symmetry == Symmetry::skew ? from_float<T>(-to_float(x.value)) : x.value);
  }
  std::vector<Entry<T>>().swap(entry);
  for (std::size_t r = rows_z; r > 0; --r) row_ptr[r] = row_ptr[r - 1];
  if (rows_z > 0) row_ptr[0] = 0;

  // Each row sorted, checked for duplicates and compacted in place: explicit zeros are dropped.
  std::vector<std::pair<std::int32_t, T>> row_entries;
  std::size_t kept = 0;
  std::size_t b = 0;
  for (std::size_t r = 0; r < rows_z; ++r) {
    const auto end = static_cast<std::size_t>(row_ptr[r + 1]);
    // The counting sort keeps the file's order within a row, so files sorted by row (twell's,
    // scipy's) or by column (SuiteSparse's, a symmetric file's mirrored triangle) skip this sort.
    if (!std::is_sorted(col_idx.begin() + b, col_idx.begin() + end)) {
      row_entries.clear();
      for (auto k = b; k < end; ++k) row_entries.emplace_back(col_idx[k], values[k]);
      std::sort(row_entries.begin(), row_entries.end(), [](const auto& x, const auto& y) { return x.first < y.first; });
      for (auto k = b; k < end; ++k) std::tie(col_idx[k], values[k]) = row_entries[k - b];
    }
    for (auto k = b; k < end; ++k) {
      if (k + 1 < end && col_idx[k + 1] == col_idx[k]) {
        fail_duplicate(first_entry, symmetric, static_cast<std::int64_t>(r) + 1,
                       static_cast<std::int64_t>(col_idx[k]) + 1);
      }
      if (!is_stored(values[k])) continue;
      col_idx[kept] = col_idx[k];
      values[kept] = values[k];
      ++kept;
    }
    row_ptr[r + 1] = static_cast<std::int64_t>(kept);
    b = end;
  }
  const auto zeros = static_cast<std::int64_t>(b - kept);
  if (report != nullptr) {
    report->field = field == Field::real ? "real" : field == Field::integer ? "integer" : "pattern";
    report->entries = entries;
    report->explicit_zeros = zeros - rounded_to_zero;
    report->rounded_to_zero = rounded_to_zero;
  }
  if (zeros == 0) return m;
  // Trimmed to the kept elements; row_ptr is already theirs.
  Buffer<std::int32_t> kept_cols(kept, MemorySpace::host, Uninitialized{});
  Buffer<T> kept_values(kept, MemorySpace::host, Uninitialized{});
  std::copy_n(col_idx.begin(), kept, kept_cols.data());
  std::copy_n(values.begin(), kept, kept_values.data());
  m.col_idx() = std::move(kept_cols);
  m.values() = std::move(kept_values);
  return m;
}

}  // namespace

AnyMatrix read_mtx(std::span<const std::byte> bytes, const ReadOptions& options, MtxReport* report) {
  AnyMatrix m = io_detail::guard_allocation(kWhere, [&] {
    return dispatch_dtype(options.dtype, [&]<class T>() { return AnyMatrix(parse<T>(bytes, options, report)); });
  });
  io_detail::validate_loaded(m, kWhere);
  return m;
}

AnyMatrix read_mtx(const std::filesystem::path& path, const ReadOptions& options, MtxReport* report) {
  return io_detail::read_path(path, [&](std::span<const std::byte> b) { return read_mtx(b, options, report); });
}

template <Value T>
std::vector<std::byte> encode_mtx(CsrView<const T> m) {
  require(m.space == MemorySpace::host, ErrorCode::space_mismatch, "twell::encode_mtx", "matrix m lives in ",
          to_string(m.space), " memory; copy it to the host first");
  io_detail::validate_to_write(m, "twell::encode_mtx", ValidateOptions{.allow_explicit_zeros = true});
  std::vector<std::byte> out;
  std::string head = detail::concat("%%MatrixMarket matrix coordinate real general\n% written by twell ", TWELL_VERSION,
                                    " from ", to_string(dtype_of<T>), " values\n", m.rows, " ", m.cols, " ", m.nnz, "\n");
  io_detail::append_text(out, head);
  out.reserve(out.size() + static_cast<std::size_t>(m.nnz) * 24);
  // Each number gets a field of its own with room for the separator after it: an int64 or the
  // shortest fp64 takes at most 24 characters, and a bound per field lets the compiler see that
  // no separator lands past the buffer (GCC 13 warned with one bound for the whole line).
  constexpr std::ptrdiff_t kField = 32;
  char buf[3 * (kField + 1)];
  for (std::int64_t r = 0; r < m.rows; ++r) {
    for (std::int64_t k = m.row_ptr[r]; k < m.row_ptr[r + 1]; ++k) {
      char* p = buf;
      p = std::to_chars(p, p + kField, r + 1).ptr;
      *p++ = ' ';
      p = std::to_chars(p, p + kField, static_cast<std::int64_t>(m.col_idx[k]) + 1).ptr;
      *p++ = ' ';
      // Shortest decimal of the fp64 that equals the value: exact, and readable by any parser.
      p = std::to_chars(p, p + kField, exact_double(to_float(m.values[k]))).ptr;
      *p++ = '\n';
      io_detail::append_bytes(out, buf, static_cast<std::size_t>(p - buf));
    }
  }
  return out;
}

template <Value T>
void write_mtx(const std::filesystem::path& path, CsrView<const T> m) {
  write_file(path, encode_mtx<T>(m));
}

#define TWELL_INSTANTIATE(T)                                                    \
  template std::vector<std::byte> encode_mtx<T>(CsrView<const T>);              \
  template void write_mtx<T>(const std::filesystem::path&, CsrView<const T>);
TWELL_FOR_EACH_VALUE_TYPE(TWELL_INSTANTIATE)
#undef TWELL_INSTANTIATE

}  // namespace twell
