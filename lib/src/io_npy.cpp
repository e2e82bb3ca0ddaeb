// NumPy .npy files <-> DenseMatrix (2-D, C order, little-endian; bf16 as '<u2' bits).
#include <charconv>
#include <cstring>
#include <limits>
#include <optional>

#include <twell/instantiate.hpp>

#include "io_detail.hpp"

namespace twell {
namespace {

constexpr std::string_view kWhere = "twell::read_npy";
constexpr char kMagic[] = "\x93NUMPY";
constexpr std::size_t kMagicSize = 6;

template <Value T>
constexpr std::string_view descr_of() {
  if constexpr (std::is_same_v<T, float>) {
    return "<f4";
  } else if constexpr (std::is_same_v<T, fp16>) {
    return "<f2";
  } else {
    return "<u2";  // bfloat16 bits; numpy has no bfloat16 (docs/decisions.md)
  }
}

// Recursive-descent reader of the header: a Python dict literal with exactly the keys descr,
// fortran_order and shape, as numpy writes it. Offsets in messages are from the file start.
class HeaderParser {
 public:
  HeaderParser(std::string_view text, std::size_t base) : s_(text), base_(base) {}

  struct Result {
    std::string descr;
    bool fortran_order = false;
    std::vector<std::int64_t> shape;
  };

  Result parse() {
    Result r;
    bool seen_descr = false, seen_order = false, seen_shape = false;
    skip_space();
    expect('{');
    for (;;) {
      skip_space();
      if (peek() == '}') break;
      const std::size_t key_at = pos_;
      const std::string key = string_literal();
      skip_space();
      expect(':');
      skip_space();
      if (key == "descr") {
        if (seen_descr) bad(key_at, "key 'descr' appears twice");
        seen_descr = true;
        // A list or dict is a structured dtype: valid .npy, but nothing twell reads.
        if (peek() == '[' || peek() == '{')
          fail(ErrorCode::unsupported, kWhere, "header byte ", base_ + pos_,
               ": descr is a structured dtype; twell reads '<f4', '<f2' and '<u2' (bf16 bits)");
        r.descr = string_literal();
      } else if (key == "fortran_order") {
        if (seen_order) bad(key_at, "key 'fortran_order' appears twice");
        seen_order = true;
        r.fortran_order = boolean();
      } else if (key == "shape") {
        if (seen_shape) bad(key_at, "key 'shape' appears twice");
        seen_shape = true;
        r.shape = tuple();
      } else {
        bad(key_at, "unexpected key '", key, "'; a .npy header has descr, fortran_order and shape");
      }
      skip_space();
      if (peek() == ',') {
        ++pos_;
        continue;
      }
      skip_space();
      if (peek() != '}') bad(pos_, "expected ',' or '}' in the header dict");
    }
    expect('}');
    if (!seen_descr || !seen_order || !seen_shape) {
      bad(pos_, "header dict lacks ", !seen_descr ? "'descr'" : !seen_order ? "'fortran_order'" : "'shape'");
    }
    // numpy pads with spaces up to a final newline and nothing else.
    while (pos_ < s_.size() && (s_[pos_] == ' ' || s_[pos_] == '\t')) ++pos_;
    if (pos_ + 1 != s_.size() || s_[pos_] != '\n') bad(pos_, "header must end with spaces and one newline after the dict");
    return r;
  }

 private:
  template <class... Args>
  [[noreturn]] void bad(std::size_t at, Args&&... what) const {
    fail(ErrorCode::malformed, kWhere, "header byte ", base_ + at, ": ", io_detail::shown(what)...);
  }
  char peek() const { return pos_ < s_.size() ? s_[pos_] : '\0'; }
  void skip_space() {
    while (pos_ < s_.size() && (s_[pos_] == ' ' || s_[pos_] == '\t')) ++pos_;
  }
  void expect(char c) {
    if (peek() != c) bad(pos_, "expected '", c, "'");
    ++pos_;
  }
  std::string string_literal() {
    const char q = peek();
    if (q != '\'' && q != '"') bad(pos_, "expected a quoted string");
    const std::size_t end = s_.find(q, pos_ + 1);
    if (end == std::string_view::npos) bad(pos_, "unterminated string");
    std::string out(s_.substr(pos_ + 1, end - pos_ - 1));
    if (out.find('\\') != std::string::npos) bad(pos_, "escape sequences are not expected in a .npy header");
    pos_ = end + 1;
    return out;
  }
  bool boolean() {
    if (s_.substr(pos_, 4) == "True") {
      pos_ += 4;
      return true;
    }
    if (s_.substr(pos_, 5) == "False") {
      pos_ += 5;
      return false;
    }
    bad(pos_, "expected True or False");
  }
  std::vector<std::int64_t> tuple() {
    std::vector<std::int64_t> dims;
    expect('(');
    for (;;) {
      skip_space();
      if (peek() == ')') break;
      if (dims.size() >= 32) bad(pos_, "shape has more than 32 dimensions");
      std::int64_t d = 0;
      const auto [end, ec] = std::from_chars(s_.data() + pos_, s_.data() + s_.size(), d);
      if (ec != std::errc() || d < 0) bad(pos_, "shape dimension is not an integer in [0, 2^63)");
      pos_ = static_cast<std::size_t>(end - s_.data());
      dims.push_back(d);
      skip_space();
      if (peek() == ',') {
        ++pos_;
        continue;
      }
      if (peek() != ')') bad(pos_, "expected ',' or ')' in the shape");
    }
    expect(')');
    return dims;
  }

  std::string_view s_;
  std::size_t base_;
  std::size_t pos_ = 0;
};

std::uint32_t load_le(const std::byte* p, std::size_t n) {
  std::uint32_t v = 0;
  for (std::size_t k = 0; k < n; ++k) v |= static_cast<std::uint32_t>(p[k]) << (8 * k);
  return v;
}

}  // namespace

AnyMatrix read_npy(std::span<const std::byte> bytes, const ReadOptions& options) {
  const std::size_t size = bytes.size();
  if (size < kMagicSize || std::memcmp(bytes.data(), kMagic, kMagicSize) != 0) {
    fail(ErrorCode::io, kWhere, "bytes 0..5 are not the .npy magic \\x93NUMPY (input has ", size, " bytes)");
  }
  if (size < 8) fail(ErrorCode::io, kWhere, "input ends at byte ", size, " inside the version (bytes 6..7)");
  const auto major = static_cast<unsigned>(bytes[6]);
  const auto minor = static_cast<unsigned>(bytes[7]);
  if (major < 1 || major > 3 || minor != 0) {
    fail(ErrorCode::unsupported, kWhere, "byte 6: .npy version ", major, ".", minor, " is not 1.0, 2.0 or 3.0");
  }
  const std::size_t len_size = major == 1 ? 2 : 4;
  if (size < 8 + len_size) {
    fail(ErrorCode::io, kWhere, "input ends at byte ", size, " inside the header length (bytes 8..", 7 + len_size, ")");
  }
  const std::size_t header_len = load_le(bytes.data() + 8, len_size);
  const std::size_t header_start = 8 + len_size;
  if (header_len > size - header_start) {
    fail(ErrorCode::io, kWhere, "byte 8: header length ", header_len, " runs past the end of the ", size,
         "-byte input");
  }
  const std::string_view header(reinterpret_cast<const char*>(bytes.data()) + header_start, header_len);
  const auto h = HeaderParser(header, header_start).parse();

  DType dtype;
  if (h.descr == "<f4") {
    dtype = DType::fp32;
  } else if (h.descr == "<f2") {
    dtype = DType::fp16;
  } else if (h.descr == "<u2") {
    dtype = DType::bf16;
  } else {
    fail(ErrorCode::unsupported, kWhere, "header: descr '", io_detail::printable(h.descr),
         "' is not '<f4' (fp32), '<f2' (fp16) or '<u2' (bf16 bits)");
  }
  if (h.fortran_order) fail(ErrorCode::unsupported, kWhere, "header: fortran_order is True; twell reads C-order arrays");
  if (h.shape.size() != 2) {
    fail(ErrorCode::unsupported, kWhere, "header: shape has ", h.shape.size(), " dimensions; twell reads 2-D arrays");
  }
  const std::int64_t rows = h.shape[0];
  const std::int64_t cols = h.shape[1];
  // A (rows, 0) array has no data for any row count, but its rows still cost work and memory
  // downstream (a CSR's row pointers): each is charged 8 bytes, as a .mtx row pointer is.
  if (cols == 0 && !io_detail::fits_implicit(static_cast<std::uint64_t>(rows), 8, size, options)) {
    fail(ErrorCode::out_of_memory, kWhere, "header: ", rows, " rows of 0 columns, at 8 bytes a row, exceed the ", size,
         "-byte input plus ReadOptions::max_implicit_bytes = ", options.max_implicit_bytes);
  }
  const std::size_t item = dtype == DType::fp32 ? 4 : 2;
  const std::size_t data_start = header_start + header_len;
  std::uint64_t cells = 0;
  std::uint64_t need = 0;
  if (!io_detail::checked_mul(static_cast<std::uint64_t>(rows), static_cast<std::uint64_t>(cols), cells) ||
      !io_detail::checked_mul(cells, item, need) || need > size - data_start) {
    fail(ErrorCode::io, kWhere, "byte ", data_start, ": shape (", rows, ", ", cols, ") of ", h.descr, " needs ",
         rows, " * ", cols, " * ", item, " bytes but ", size - data_start, " follow the header (truncated?)");
  }
  if (need != size - data_start) {
    fail(ErrorCode::malformed, kWhere, "byte ", data_start + need, ": ", size - data_start - need,
         " bytes follow the ", need, "-byte array");
  }
  return io_detail::guard_allocation(kWhere, [&] {
    return dispatch_dtype(dtype, [&]<class T>() {
      DenseMatrix<T> m(rows, cols);
      if (need != 0) std::memcpy(m.values().data(), bytes.data() + data_start, need);
      return AnyMatrix(std::move(m));
    });
  });
}

AnyMatrix read_npy(const std::filesystem::path& path, const ReadOptions& options) {
  return io_detail::read_path(path, [&](std::span<const std::byte> b) { return read_npy(b, options); });
}

template <Value T>
std::vector<std::byte> encode_npy(DenseView<const T> m) {
  require(m.space == MemorySpace::host, ErrorCode::space_mismatch, "twell::encode_npy", "matrix m lives in ",
          to_string(m.space), " memory; copy it to the host first");
  io_detail::validate_to_write(m, "twell::encode_npy");
  std::string header = detail::concat("{'descr': '", descr_of<T>(), "', 'fortran_order': False, 'shape': (", m.rows,
                                      ", ", m.cols, "), }");
  // numpy aligns the data to 64 bytes: magic, version, 2-byte length, header, padding, '\n'.
  const std::size_t unpadded = kMagicSize + 2 + 2 + header.size() + 1;
  header.append((64 - unpadded % 64) % 64, ' ');
  header.push_back('\n');
  std::vector<std::byte> out;
  out.reserve(10 + header.size() + static_cast<std::size_t>(m.rows * m.cols) * sizeof(T));
  io_detail::append_bytes(out, kMagic, kMagicSize);
  const unsigned char version_and_length[4] = {1, 0, static_cast<unsigned char>(header.size() & 0xff),
                                               static_cast<unsigned char>(header.size() >> 8)};
  io_detail::append_bytes(out, version_and_length, 4);
  io_detail::append_text(out, header);
  if (m.ld == m.cols || m.rows <= 1) {
    io_detail::append_bytes(out, m.data, static_cast<std::size_t>(m.rows * m.cols) * sizeof(T));
  } else {
    for (std::int64_t r = 0; r < m.rows; ++r) {
      io_detail::append_bytes(out, m.data + r * m.ld, static_cast<std::size_t>(m.cols) * sizeof(T));
    }
  }
  return out;
}

template <Value T>
void write_npy(const std::filesystem::path& path, DenseView<const T> m) {
  write_file(path, encode_npy<T>(m));
}

#define TWELL_INSTANTIATE(T)                                                  \
  template std::vector<std::byte> encode_npy<T>(DenseView<const T>);          \
  template void write_npy<T>(const std::filesystem::path&, DenseView<const T>);
TWELL_FOR_EACH_VALUE_TYPE(TWELL_INSTANTIATE)
#undef TWELL_INSTANTIATE

}  // namespace twell
