// The .twell container: one matrix of any format and value type, bit-exact, CRC-32 checked.
// Byte layout (all little-endian), also in docs/io.md:
//   0   8    magic 89 54 57 45 4C 4C 0D 0A ("\x89TWELL\r\n")
//   8   2    version (1)
//   10  1    format (0 dense, 1 csr, 2 ell, 3 twell, 4 hybrid)
//   11  1    dtype (0 bf16, 1 fp16, 2 fp32)
//   12  1    flags (0)
//   13  1    section count k
//   14  2    reserved (0)
//   16  8    rows
//   24  8    cols
//   32  8    aux: csr nnz, ell width, hybrid overflow rows, else 0
//   40  4    tile (twell, hybrid; else 0)
//   44  4    compression C (twell, hybrid; else 0)
//   48  8k   byte size of each section
//   ...      the sections back to back, in the order of sections_of()
//   end-4 4  CRC-32 of every byte before it
#include <array>
#include <cstring>

#include <twell/instantiate.hpp>

#include "io_detail.hpp"

namespace twell {
namespace {

constexpr std::string_view kWhere = "twell::read_twell";
constexpr std::array<unsigned char, 8> kMagic = {0x89, 'T', 'W', 'E', 'L', 'L', '\r', '\n'};
constexpr std::uint16_t kVersion = 1;
constexpr std::size_t kFixedHeader = 48;

std::size_t item_size(DType t) { return t == DType::fp32 ? 4 : 2; }

// The sections of a format, with element size and element count derived from the header:
// the reader checks the stored sizes against these, the writer emits them in this order.
struct Section {
  const char* name;
  std::uint64_t elem;
  std::uint64_t count;  // UINT64_MAX when the count overflowed
};

struct Header {
  Format format = Format::dense;
  DType dtype = DType::fp32;
  std::int64_t rows = 0, cols = 0, aux = 0;
  TwellLayout layout{0, 0};
};

std::uint64_t product(std::initializer_list<std::uint64_t> xs) {
  std::uint64_t r = 1;
  for (std::uint64_t x : xs) {
    if (!io_detail::checked_mul(r, x, r)) return UINT64_MAX;
  }
  return r;
}

std::vector<Section> sections_of(const Header& h) {
  const auto rows = static_cast<std::uint64_t>(h.rows);
  const auto cols = static_cast<std::uint64_t>(h.cols);
  const auto aux = static_cast<std::uint64_t>(h.aux);
  const std::uint64_t item = item_size(h.dtype);
  std::vector<Section> s;
  switch (h.format) {
    case Format::dense:
      s.push_back({"values", item, product({rows, cols})});
      break;
    case Format::csr:
      s.push_back({"row_ptr", 8, rows == UINT64_MAX ? UINT64_MAX : rows + 1});
      s.push_back({"col_idx", 4, aux});
      s.push_back({"values", item, aux});
      break;
    case Format::ell:
      s.push_back({"row_count", 4, rows});
      s.push_back({"col_idx", 4, product({rows, aux})});
      s.push_back({"values", item, product({rows, aux})});
      break;
    case Format::twell:
    case Format::hybrid: {
      const std::uint64_t words = product({rows, static_cast<std::uint64_t>(h.layout.packed_width(h.cols))});
      s.push_back({"packed", 4, words});
      if (h.dtype == DType::fp32) s.push_back({"value_plane", 4, words});
      if (h.format == Format::hybrid) {
        s.push_back({"row_to_overflow", 4, rows});
        s.push_back({"overflow_to_row", 4, aux});
        s.push_back({"overflow", item, product({aux, cols})});
      }
      break;
    }
  }
  return s;
}

// Bounds-checked little-endian field reads; a short input is ErrorCode::io naming the field.
class Cursor {
 public:
  explicit Cursor(std::span<const std::byte> b) : b_(b) {}
  template <class U>
  U read(std::size_t offset, const char* name) const {
    if (offset + sizeof(U) > b_.size()) {
      fail(ErrorCode::io, kWhere, "input ends at byte ", b_.size(), " inside header field '", name, "' (bytes ",
           offset, "..", offset + sizeof(U) - 1, ")");
    }
    U v;
    std::memcpy(&v, b_.data() + offset, sizeof(U));
    return v;
  }

 private:
  std::span<const std::byte> b_;
};

template <class... Args>
[[noreturn]] void bad(std::size_t offset, Args&&... what) {
  fail(ErrorCode::malformed, kWhere, "byte ", offset, ": ", std::forward<Args>(what)...);
}

Header parse_header(std::span<const std::byte> bytes, const ReadOptions& options, std::vector<std::uint64_t>& sizes) {
  const Cursor c(bytes);
  if (bytes.size() < kMagic.size() || std::memcmp(bytes.data(), kMagic.data(), kMagic.size()) != 0) {
    fail(ErrorCode::io, kWhere, "bytes 0..7 are not the .twell magic 89 54 57 45 4C 4C 0D 0A (input has ",
         bytes.size(), " bytes)");
  }
  const auto version = c.read<std::uint16_t>(8, "version");
  if (version != kVersion) {
    fail(ErrorCode::unsupported, kWhere, "byte 8: version ", version, " is not ", kVersion,
         ", the version this build reads");
  }
  Header h;
  const auto format = c.read<std::uint8_t>(10, "format");
  if (format > static_cast<std::uint8_t>(Format::hybrid)) bad(10, "format code ", unsigned{format}, " is not 0..4");
  h.format = static_cast<Format>(format);
  const auto dtype = c.read<std::uint8_t>(11, "dtype");
  if (dtype > static_cast<std::uint8_t>(DType::fp32)) bad(11, "dtype code ", unsigned{dtype}, " is not 0..2");
  h.dtype = static_cast<DType>(dtype);
  const auto flags = c.read<std::uint8_t>(12, "flags");
  if (flags != 0) bad(12, "flags ", unsigned{flags}, " are not 0");
  const auto count = c.read<std::uint8_t>(13, "section count");
  const auto reserved = c.read<std::uint16_t>(14, "reserved");
  if (reserved != 0) bad(14, "reserved field ", reserved, " is not 0");
  h.rows = c.read<std::int64_t>(16, "rows");
  h.cols = c.read<std::int64_t>(24, "cols");
  h.aux = c.read<std::int64_t>(32, "aux");
  const auto tile = c.read<std::int32_t>(40, "tile");
  const auto compression = c.read<std::int32_t>(44, "compression");
  if (h.rows < 0) bad(16, "rows = ", h.rows, " is negative");
  if (h.cols < 0) bad(24, "cols = ", h.cols, " is negative");
  if (h.aux < 0) bad(32, "aux = ", h.aux, " is negative");
  // Rows cost work and memory downstream (a CSR's row pointers) even when no byte describes them:
  // a dense or TwELL matrix with 0 columns has an empty payload for any row count. With 0 columns
  // each row is charged 8 bytes, as a .mtx row pointer is.
  if (h.cols == 0 && !io_detail::fits_implicit(static_cast<std::uint64_t>(h.rows), 8, bytes.size(), options)) {
    fail(ErrorCode::out_of_memory, kWhere, "byte 16: rows = ", h.rows, " of 0 columns, at 8 bytes a row, exceed the ",
         bytes.size(), "-byte input plus ReadOptions::max_implicit_bytes = ", options.max_implicit_bytes);
  }
  if (h.format != Format::dense && h.cols > io_detail::kMaxSparseCols) {
    bad(24, "cols = ", h.cols, " exceeds 32-bit column indices");
  }
  if (h.format == Format::dense || h.format == Format::twell) {
    if (h.aux != 0) bad(32, "aux = ", h.aux, " must be 0 for ", to_string(h.format));
  }
  // A Hybrid's block holds whole rows, each at most once.
  if (h.format == Format::hybrid && h.aux > h.rows) bad(32, "aux = ", h.aux, " overflow rows exceed the ", h.rows, " rows");
  if (h.format == Format::twell || h.format == Format::hybrid) {
    h.layout = TwellLayout{tile, compression};
    try {
      check_layout(h.layout, "layout");
    } catch (const Error& e) {
      bad(40, "TwELL layout is invalid: ", e.what());
    }
  } else if (tile != 0 || compression != 0) {
    bad(40, "tile = ", tile, ", compression = ", compression, " must be 0 for ", to_string(h.format));
  }
  const std::vector<Section> expect = sections_of(h);
  if (count != expect.size()) {
    bad(13, "section count ", unsigned{count}, " is not ", expect.size(), " (", to_string(h.format), ", ",
        to_string(h.dtype), ")");
  }
  sizes.clear();
  for (std::size_t k = 0; k < expect.size(); ++k) {
    const std::size_t at = kFixedHeader + 8 * k;
    const auto bytes_k = c.read<std::uint64_t>(at, "section size");
    std::uint64_t want = 0;
    if (!io_detail::checked_mul(expect[k].count, expect[k].elem, want) || expect[k].count == UINT64_MAX) {
      bad(at, "section '", expect[k].name, "' of a ", h.rows, " x ", h.cols, " ", to_string(h.format),
          " (aux ", h.aux, ") would exceed 2^64 bytes");
    }
    if (bytes_k != want) {
      bad(at, "section '", expect[k].name, "' has ", bytes_k, " bytes; the header implies ", expect[k].count, " x ",
          expect[k].elem, " = ", want);
    }
    sizes.push_back(bytes_k);
  }
  return h;
}

// Copies n bytes at offset into a fresh host buffer (sizes were checked against the input).
template <class U>
void fill(Buffer<U>& dst, std::span<const std::byte> bytes, std::size_t& offset, std::uint64_t n) {
  if (n != 0) std::memcpy(dst.data(), bytes.data() + offset, n);
  offset += n;
}

template <Value T>
AnyMatrix build(const Header& h, std::span<const std::byte> bytes, std::size_t offset) {
  switch (h.format) {
    case Format::dense: {
      DenseMatrix<T> m(h.rows, h.cols);
      fill(m.values(), bytes, offset, m.values().bytes());
      return AnyMatrix(std::move(m));
    }
    case Format::csr: {
      CsrMatrix<T> m(h.rows, h.cols, h.aux);
      fill(m.row_ptr(), bytes, offset, m.row_ptr().bytes());
      fill(m.col_idx(), bytes, offset, m.col_idx().bytes());
      fill(m.values(), bytes, offset, m.values().bytes());
      return AnyMatrix(std::move(m));
    }
    case Format::ell: {
      EllMatrix<T> m(h.rows, h.cols, h.aux);
      fill(m.row_count(), bytes, offset, m.row_count().bytes());
      fill(m.col_idx(), bytes, offset, m.col_idx().bytes());
      fill(m.values(), bytes, offset, m.values().bytes());
      return AnyMatrix(std::move(m));
    }
    case Format::twell: {
      TwellMatrix<T> m(h.rows, h.cols, h.layout);
      fill(m.packed(), bytes, offset, m.packed().bytes());
      fill(m.value_plane(), bytes, offset, m.value_plane().bytes());
      return AnyMatrix(std::move(m));
    }
    case Format::hybrid: break;
  }
  HybridMatrix<T> m(h.rows, h.cols, h.layout, h.aux);
  fill(m.twell().packed(), bytes, offset, m.twell().packed().bytes());
  fill(m.twell().value_plane(), bytes, offset, m.twell().value_plane().bytes());
  fill(m.row_to_overflow(), bytes, offset, m.row_to_overflow().bytes());
  fill(m.overflow_to_row(), bytes, offset, m.overflow_to_row().bytes());
  fill(m.overflow().values(), bytes, offset, m.overflow().values().bytes());
  return AnyMatrix(std::move(m));
}

// Writer side: the header with sizes, then each section via append.
class Encoder {
 public:
  Encoder(Format format, DType dtype, std::int64_t rows, std::int64_t cols, std::int64_t aux, TwellLayout layout) {
    h_.format = format;
    h_.dtype = dtype;
    h_.rows = rows;
    h_.cols = cols;
    h_.aux = aux;
    h_.layout = layout;
    const auto sections = sections_of(h_);
    std::uint64_t total = kFixedHeader + 8 * sections.size() + 4;
    for (const auto& s : sections) total += s.count * s.elem;
    out_.reserve(static_cast<std::size_t>(total));
    io_detail::append_bytes(out_, kMagic.data(), kMagic.size());
    put<std::uint16_t>(kVersion);
    put<std::uint8_t>(static_cast<std::uint8_t>(format));
    put<std::uint8_t>(static_cast<std::uint8_t>(dtype));
    put<std::uint8_t>(0);
    put<std::uint8_t>(static_cast<std::uint8_t>(sections.size()));
    put<std::uint16_t>(0);
    put<std::int64_t>(rows);
    put<std::int64_t>(cols);
    put<std::int64_t>(aux);
    put<std::int32_t>(layout.tile);
    put<std::int32_t>(layout.compression);
    for (const auto& s : sections) put<std::uint64_t>(s.count * s.elem);
  }
  template <class U>
  void section(const U* p, std::int64_t n) {
    io_detail::append_bytes(out_, p, static_cast<std::size_t>(n) * sizeof(U));
  }
  template <class U>
  void rows_of(DenseView<const U> d) {
    if (d.ld == d.cols || d.rows <= 1) {
      section(d.data, d.rows * d.cols);
    } else {
      for (std::int64_t r = 0; r < d.rows; ++r) section(d.data + r * d.ld, d.cols);
    }
  }
  std::vector<std::byte> finish() {
    put<std::uint32_t>(crc32(out_));
    return std::move(out_);
  }

 private:
  template <class U>
  void put(U v) {
    io_detail::append_bytes(out_, &v, sizeof v);
  }
  Header h_;
  std::vector<std::byte> out_;
};

void require_host(MemorySpace s) {
  require(s == MemorySpace::host, ErrorCode::space_mismatch, "twell::encode_twell", "matrix m lives in ", to_string(s),
          " memory; copy it to the host first");
}

}  // namespace

AnyMatrix read_twell(std::span<const std::byte> bytes, const ReadOptions& options) {
  std::vector<std::uint64_t> sizes;
  const Header h = parse_header(bytes, options, sizes);
  const std::size_t payload_start = kFixedHeader + 8 * sizes.size();
  std::uint64_t total = payload_start + 4;
  for (std::size_t k = 0; k < sizes.size(); ++k) {
    if (!io_detail::checked_add(total, sizes[k], total)) bad(kFixedHeader + 8 * k, "section sizes exceed 2^64 bytes");
  }
  if (total > bytes.size()) {
    fail(ErrorCode::io, kWhere, "header and sections need ", total, " bytes but the input has ", bytes.size(),
         " (truncated?)");
  }
  if (total < bytes.size()) bad(total, bytes.size() - total, " bytes follow the checksum");
  const std::size_t crc_at = bytes.size() - 4;
  std::uint32_t stored;
  std::memcpy(&stored, bytes.data() + crc_at, 4);
  const std::uint32_t computed = crc32(bytes.first(crc_at));
  if (stored != computed) {
    fail(ErrorCode::io, kWhere, "byte ", crc_at, ": CRC-32 ", stored, " stored, ", computed,
         " computed over bytes 0..", crc_at - 1, " (corrupted)");
  }
  AnyMatrix m = io_detail::guard_allocation(
      kWhere, [&] { return dispatch_dtype(h.dtype, [&]<class T>() { return build<T>(h, bytes, payload_start); }); });
  io_detail::validate_loaded(m, kWhere);
  return m;
}

AnyMatrix read_twell(const std::filesystem::path& path, const ReadOptions& options) {
  return io_detail::read_path(path, [&](std::span<const std::byte> b) { return read_twell(b, options); });
}

template <Value T>
std::vector<std::byte> encode_twell(DenseView<const T> m) {
  require_host(m.space);
  io_detail::validate_to_write(m, "twell::encode_twell");
  Encoder e(Format::dense, dtype_of<T>, m.rows, m.cols, 0, TwellLayout{0, 0});
  e.rows_of(m);
  return e.finish();
}

template <Value T>
std::vector<std::byte> encode_twell(CsrView<const T> m) {
  require_host(m.space);
  io_detail::validate_to_write(m, "twell::encode_twell");
  Encoder e(Format::csr, dtype_of<T>, m.rows, m.cols, m.nnz, TwellLayout{0, 0});
  e.section(m.row_ptr, m.rows + 1);
  e.section(m.col_idx, m.nnz);
  e.section(m.values, m.nnz);
  return e.finish();
}

template <Value T>
std::vector<std::byte> encode_twell(EllView<const T> m) {
  require_host(m.space);
  io_detail::validate_to_write(m, "twell::encode_twell");
  Encoder e(Format::ell, dtype_of<T>, m.rows, m.cols, m.width, TwellLayout{0, 0});
  e.section(m.row_count, m.rows);
  e.section(m.col_idx, m.rows * m.width);
  e.section(m.values, m.rows * m.width);
  return e.finish();
}

template <Value T>
std::vector<std::byte> encode_twell(TwellView<const T> m) {
  require_host(m.space);
  check_layout(m.layout, "twell::encode_twell");
  io_detail::validate_to_write(m, "twell::encode_twell");
  Encoder e(Format::twell, dtype_of<T>, m.rows, m.cols, 0, m.layout);
  e.section(m.packed, m.rows * m.packed_width());
  if constexpr (!ValueTraits<T>::packs_in_slot) e.section(m.value_plane, m.rows * m.packed_width());
  return e.finish();
}

template <Value T>
std::vector<std::byte> encode_twell(HybridView<const T> m) {
  require_host(m.space());
  check_layout(m.twell.layout, "twell::encode_twell");
  require(m.overflow.cols == m.cols(), ErrorCode::shape_mismatch, "twell::encode_twell", "overflow block has ",
          m.overflow.cols, " columns, the matrix ", m.cols());
  io_detail::validate_to_write(m, "twell::encode_twell");
  Encoder e(Format::hybrid, dtype_of<T>, m.rows(), m.cols(), m.overflow_rows(), m.twell.layout);
  e.section(m.twell.packed, m.rows() * m.twell.packed_width());
  if constexpr (!ValueTraits<T>::packs_in_slot) e.section(m.twell.value_plane, m.rows() * m.twell.packed_width());
  e.section(m.row_to_overflow, m.rows());
  e.section(m.overflow_to_row, m.overflow_rows());
  e.rows_of(m.overflow);
  return e.finish();
}

std::vector<std::byte> encode_twell(const AnyMatrix& m) {
  return std::visit([](const auto& x) { return encode_twell(x.view()); }, m);
}

void write_twell(const std::filesystem::path& path, const AnyMatrix& m) { write_file(path, encode_twell(m)); }

#define TWELL_INSTANTIATE(T)                                                 \
  template std::vector<std::byte> encode_twell<T>(DenseView<const T>);       \
  template std::vector<std::byte> encode_twell<T>(CsrView<const T>);         \
  template std::vector<std::byte> encode_twell<T>(EllView<const T>);         \
  template std::vector<std::byte> encode_twell<T>(TwellView<const T>);       \
  template std::vector<std::byte> encode_twell<T>(HybridView<const T>);
TWELL_FOR_EACH_VALUE_TYPE(TWELL_INSTANTIATE)
#undef TWELL_INSTANTIATE

}  // namespace twell
