// File type by extension, whole-file reads and atomic writes, CRC-32, and the by-extension
// read_matrix / write_matrix used by the twell tool.
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <array>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <random>
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

namespace {

// Closes a descriptor however the scope ends.
struct Descriptor {
  explicit Descriptor(int f) : fd(f) {}
  Descriptor(const Descriptor&) = delete;
  Descriptor& operator=(const Descriptor&) = delete;
  ~Descriptor() {
    if (fd >= 0) ::close(fd);
  }
  int fd;
};

// A fresh file beside `path`, ".twell-<64 random bits>.partial": hidden, and of a fixed length
// (31 bytes), so that any name the file system takes for the target can be written. Created
// exclusively: never a file that a planted link points at, nor one that another writer uses.
// Mode 0666 less the umask, as fopen gives.
Descriptor create_temporary(const std::filesystem::path& path, std::filesystem::path& tmp) {
  std::random_device random;
  const std::uint64_t suffix = (std::uint64_t{random()} << 32) ^ random();
  char name[32];
  std::snprintf(name, sizeof name, ".twell-%016llx.partial", static_cast<unsigned long long>(suffix));
  tmp = path.parent_path() / name;
  return Descriptor(::open(tmp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0666));
}

}  // namespace

std::vector<std::byte> read_file(const std::filesystem::path& path) {
  constexpr std::string_view kWhere = "twell::read_file";
  // O_NONBLOCK: opening a pipe that no one writes returns at once, to be refused below.
  const Descriptor f(::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK));
  if (f.fd < 0) {
    const int err = errno;
    fail(ErrorCode::io, kWhere, "cannot open '", path.string(), "': ", std::strerror(err));
  }
  // Only a regular file, whose size bounds what is read: /dev/zero or an endless pipe would take
  // memory until the process is killed.
  struct stat st {};
  if (::fstat(f.fd, &st) != 0 || !S_ISREG(st.st_mode))
    fail(ErrorCode::io, kWhere, "cannot read '", path.string(), "': not a regular file");
  // A file larger than the memory is out_of_memory, as in the readers, not a std::bad_alloc.
  return io_detail::guard_allocation(kWhere, [&] {
    std::vector<std::byte> bytes;
    // The size is reserved up front (failing before any read when it cannot be had); the read
    // still runs to the end, as the file may have grown.
    bytes.reserve(static_cast<std::size_t>(st.st_size));
    std::array<std::byte, 1 << 16> chunk;
    for (;;) {
      const ssize_t got = ::read(f.fd, chunk.data(), chunk.size());
      if (got == 0) break;
      if (got < 0 && errno == EINTR) continue;
      if (got < 0) {
        const int err = errno;
        fail(ErrorCode::io, kWhere, "error reading '", path.string(), "': ", std::strerror(err));
      }
      bytes.insert(bytes.end(), chunk.begin(), chunk.begin() + got);
    }
    return bytes;
  });
}

void write_file(const std::filesystem::path& path, std::span<const std::byte> bytes) {
  constexpr std::string_view kWhere = "twell::write_file";
  // Through a symlink: the link stays and the file it leads to is replaced, as editors and cp do.
  std::filesystem::path target = path;
  std::error_code ec;
  if (std::filesystem::is_symlink(path, ec) && std::filesystem::exists(path, ec)) {
    target = std::filesystem::canonical(path, ec);
    if (ec) fail(ErrorCode::io, kWhere, "cannot resolve the link '", path.string(), "': ", ec.message());
  }
  // Only a regular file is replaced: a rename over a device or a pipe (/dev/full, as root) would
  // take its place instead of writing to it.
  struct stat existing {};
  const bool replaces = ::stat(target.c_str(), &existing) == 0;
  if (replaces && !S_ISREG(existing.st_mode))
    fail(ErrorCode::io, kWhere, "cannot write '", path.string(), "': not a regular file");
  // A rename needs only the directory's write permission; a read-only file is refused as the
  // shell's > refuses it.
  if (replaces && ::faccessat(AT_FDCWD, target.c_str(), W_OK, AT_EACCESS) != 0) {
    const int err = errno;
    fail(ErrorCode::io, kWhere, "cannot write '", path.string(), "': ", std::strerror(err));
  }
  std::filesystem::path tmp;
  {
    const Descriptor f = create_temporary(target, tmp);
    if (f.fd < 0) {
      const int err = errno;
      fail(ErrorCode::io, kWhere, "cannot create '", tmp.string(), "' to write '", path.string(),
           "': ", std::strerror(err));
    }
    const auto fail_removing = [&](const char* what) {
      const int err = errno;
      ::unlink(tmp.c_str());
      fail(ErrorCode::io, kWhere, "error ", what, " '", tmp.string(), "' (", bytes.size(),
           " bytes): ", std::strerror(err));
    };
    // The replacement keeps the permissions of the file it replaces (a private 0600 file stays
    // private), set before any byte is written; not setuid and setgid, which a write clears too
    // (a root process replacing a user's setuid file would otherwise make a root-owned one).
    if (replaces && ::fchmod(f.fd, existing.st_mode & 01777) != 0) fail_removing("setting the mode of");
    // All of it, and on the disk before the rename: the target is never seen half written.
    for (std::size_t done = 0; done < bytes.size();) {
      const ssize_t n = ::write(f.fd, bytes.data() + done, bytes.size() - done);
      if (n < 0 && errno == EINTR) continue;
      if (n < 0) fail_removing("writing");
      done += static_cast<std::size_t>(n);
    }
    if (::fsync(f.fd) != 0) fail_removing("syncing");
  }
  std::filesystem::rename(tmp, target, ec);
  if (ec) {
    ::unlink(tmp.c_str());
    fail(ErrorCode::io, kWhere, "cannot rename '", tmp.string(), "' to '", target.string(), "': ", ec.message());
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
