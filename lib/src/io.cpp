// File type by extension, whole-file reads and atomic writes, CRC-32, and the by-extension
// read_matrix / write_matrix used by the twell tool.
#include <array>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <system_error>

#include <twell/formats/validate.hpp>

#include "io_detail.hpp"

namespace twell {

std::string_view to_string(FileType t) {
  switch (t) {
    case FileType::mtx: return "mtx";
    case FileType::npy: return "npy";
    case FileType::twell: return "twell";
  }
  return "?";
}

FileType file_type_of(const std::filesystem::path& path) {
  const std::string ext = path.extension().string();
  if (ext == ".mtx") return FileType::mtx;
  if (ext == ".npy") return FileType::npy;
  if (ext == ".twell") return FileType::twell;
  fail(ErrorCode::invalid_argument, "twell::file_type_of", "path '", path.string(), "' has extension '", ext,
       "'; expected .mtx, .npy or .twell");
}

std::vector<std::byte> read_file(const std::filesystem::path& path) {
  std::FILE* f = std::fopen(path.c_str(), "rb");
  if (f == nullptr) {
    fail(ErrorCode::io, "twell::read_file", "cannot open '", path.string(), "': ", std::strerror(errno));
  }
  std::vector<std::byte> bytes;
  std::array<std::byte, 1 << 16> chunk;
  // Read in chunks rather than trusting a size from stat: the file may be a pipe or may change.
  for (;;) {
    const std::size_t got = std::fread(chunk.data(), 1, chunk.size(), f);
    bytes.insert(bytes.end(), chunk.begin(), chunk.begin() + static_cast<std::ptrdiff_t>(got));
    if (got < chunk.size()) break;
  }
  const bool failed = std::ferror(f) != 0;
  const int err = errno;
  std::fclose(f);
  if (failed) fail(ErrorCode::io, "twell::read_file", "error reading '", path.string(), "': ", std::strerror(err));
  return bytes;
}

void write_file(const std::filesystem::path& path, std::span<const std::byte> bytes) {
  std::filesystem::path tmp = path;
  tmp += ".partial";
  std::FILE* f = std::fopen(tmp.c_str(), "wb");
  if (f == nullptr) {
    fail(ErrorCode::io, "twell::write_file", "cannot create '", tmp.string(), "': ", std::strerror(errno));
  }
  const bool wrote = bytes.empty() || std::fwrite(bytes.data(), 1, bytes.size(), f) == bytes.size();
  const int err = errno;
  const bool closed = std::fclose(f) == 0;
  if (!wrote || !closed) {
    std::remove(tmp.c_str());
    fail(ErrorCode::io, "twell::write_file", "error writing '", tmp.string(), "' (", bytes.size(),
         " bytes): ", std::strerror(wrote ? errno : err));
  }
  std::error_code ec;
  std::filesystem::rename(tmp, path, ec);
  if (ec) {
    std::remove(tmp.c_str());
    fail(ErrorCode::io, "twell::write_file", "cannot rename '", tmp.string(), "' to '", path.string(),
         "': ", ec.message());
  }
}

namespace {
// Slicing-by-8 tables for the reflected polynomial 0xEDB88320.
struct Crc32Tables {
  std::array<std::array<std::uint32_t, 256>, 8> t{};
  Crc32Tables() {
    for (std::uint32_t i = 0; i < 256; ++i) {
      std::uint32_t c = i;
      for (int k = 0; k < 8; ++k) c = (c & 1u) ? (c >> 1) ^ 0xEDB88320u : c >> 1;
      t[0][i] = c;
    }
    for (std::uint32_t i = 0; i < 256; ++i) {
      for (std::size_t k = 1; k < 8; ++k) t[k][i] = (t[k - 1][i] >> 8) ^ t[0][t[k - 1][i] & 0xffu];
    }
  }
};
}  // namespace

std::uint32_t crc32(std::span<const std::byte> bytes, std::uint32_t crc) {
  static const Crc32Tables tables;
  const auto& t = tables.t;
  std::uint32_t c = ~crc;
  const std::byte* p = bytes.data();
  std::size_t n = bytes.size();
  while (n >= 8) {
    std::uint32_t lo;
    std::uint32_t hi;
    std::memcpy(&lo, p, 4);
    std::memcpy(&hi, p + 4, 4);
    lo ^= c;
    c = t[7][lo & 0xffu] ^ t[6][(lo >> 8) & 0xffu] ^ t[5][(lo >> 16) & 0xffu] ^ t[4][lo >> 24] ^
        t[3][hi & 0xffu] ^ t[2][(hi >> 8) & 0xffu] ^ t[1][(hi >> 16) & 0xffu] ^ t[0][hi >> 24];
    p += 8;
    n -= 8;
  }
  while (n-- > 0) c = (c >> 8) ^ t[0][(c ^ static_cast<std::uint32_t>(*p++)) & 0xffu];
  return ~c;
}

void io_detail::validate_loaded(const AnyMatrix& m, std::string_view where) {
  const std::string violation = std::visit([](const auto& x) { return find_violation(x.view()); }, m);
  if (!violation.empty()) {
    fail(ErrorCode::malformed, where, "the ", to_string(format(m)), " matrix read breaks an invariant: ", violation);
  }
}

AnyMatrix read_matrix(const std::filesystem::path& path, const ReadOptions& options) {
  switch (file_type_of(path)) {
    case FileType::mtx: return read_mtx(path, options);
    case FileType::npy: return read_npy(path, options);
    case FileType::twell: break;
  }
  return read_twell(path, options);
}

void write_matrix(const std::filesystem::path& path, const AnyMatrix& m) {
  const FileType type = file_type_of(path);
  if (type == FileType::twell) {
    write_twell(path, m);
    return;
  }
  const Format want = type == FileType::mtx ? Format::csr : Format::dense;
  require(format(m) == want, ErrorCode::invalid_argument, "twell::write_matrix", "a .", to_string(type),
          " file holds a ", to_string(want), " matrix, not ", to_string(format(m)), " (convert it first): '",
          path.string(), "'");
  std::visit(
      [&](const auto& x) {
        using M = std::remove_cvref_t<decltype(x)>;
        using T = ValueOfMatrix<M>;
        if constexpr (std::is_same_v<M, CsrMatrix<T>>) {
          write_mtx<T>(path, x.view());
        } else if constexpr (std::is_same_v<M, DenseMatrix<T>>) {
          write_npy<T>(path, x.view());
        }
      },
      m);
}

}  // namespace twell
