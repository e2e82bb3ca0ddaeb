// Shared pieces of the file readers and writers (lib/src/io_*.cpp); not installed.
#pragma once

#include <bit>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <limits>
#include <new>
#include <stdexcept>
#include <span>
#include <string>
#include <string_view>
#include <type_traits>
#include <vector>

#include <twell/any_matrix.hpp>
#include <twell/error.hpp>
#include <twell/formats/validate.hpp>
#include <twell/io.hpp>

namespace twell::io_detail {

static_assert(std::endian::native == std::endian::little,
              "twell's file formats are little-endian and its payloads are copied as they lie in memory");

// Text taken from a file, as an error message shows it: bytes outside printable ASCII as \xNN
// (a NUL or an escape sequence would cut or garble the message) and at most 64 of them.
inline std::string printable(std::string_view text) {
  constexpr std::size_t kShown = 64;
  std::string out;
  for (std::size_t i = 0; i < text.size() && i < kShown; ++i) {
    const auto c = static_cast<unsigned char>(text[i]);
    if (c >= 0x20 && c < 0x7f && c != '\\') {
      out += static_cast<char>(c);
    } else {
      constexpr char kHex[] = "0123456789abcdef";
      out += {'\\', 'x', kHex[c >> 4], kHex[c & 15]};
    }
  }
  if (text.size() > kShown) out += "...";
  return out;
}

// An argument of a reader's error message: strings (pieces of the file) through printable, the
// rest (literals, numbers) as they are.
template <class Arg>
decltype(auto) shown(const Arg& arg) {
  if constexpr (std::is_same_v<Arg, std::string_view> || std::is_same_v<Arg, std::string>) {
    return printable(arg);
  } else {
    return (arg);
  }
}

// a * b and a + b, or false when the result does not fit 64 bits.
inline bool checked_mul(std::uint64_t a, std::uint64_t b, std::uint64_t& out) {
  return !__builtin_mul_overflow(a, b, &out);
}
inline bool checked_add(std::uint64_t a, std::uint64_t b, std::uint64_t& out) {
  return !__builtin_add_overflow(a, b, &out);
}

// Whether `count` items of `size` bytes fit the bytes that a reader may take for an input of
// `input_bytes`: the input's size plus ReadOptions::max_implicit_bytes.
inline bool fits_implicit(std::uint64_t count, std::uint64_t size, std::size_t input_bytes,
                          const ReadOptions& options) {
  std::uint64_t need = 0;
  std::uint64_t allowed = 0;
  if (!checked_add(input_bytes, options.max_implicit_bytes, allowed)) allowed = UINT64_MAX;
  return checked_mul(count, size, need) && need <= allowed;
}

// The widest sparse matrix a file may hold: its column indices are 32-bit, and the readers take
// no column count they could not index (dense matrices have no such limit).
constexpr std::int64_t kMaxSparseCols = std::numeric_limits<std::int32_t>::max();

// Throws, naming `where`, if a view about to be written is one the readers would refuse: wider
// than kMaxSparseCols (ErrorCode::unsupported, as the .mtx reader says), or breaking its format's
// invariants (ErrorCode::malformed: twell::validate's first violation; for a dense view, its
// geometry). A writer checks what it is given, so that it neither reads outside the caller's
// arrays nor writes a file that no reader takes. `options` as the format's reader accepts (mtx:
// explicit zeros).
template <class View>
void validate_to_write(View m, std::string_view where, const ValidateOptions& options = {}) {
  if constexpr (!requires { m.ld; }) {
    std::int64_t cols = 0;
    if constexpr (requires { m.cols(); }) {
      cols = m.cols();
    } else {
      cols = m.cols;
    }
    if (cols > kMaxSparseCols) {
      fail(ErrorCode::unsupported, where, "a sparse matrix of ", cols,
           " columns cannot be written: the readers take at most ", kMaxSparseCols, " (32-bit column indices)");
    }
  }
  const std::string violation = find_violation(m, options);
  if (!violation.empty()) fail(ErrorCode::malformed, where, "the matrix to write breaks an invariant: ", violation);
}

// Throws ErrorCode::malformed, naming `where`, if a freshly read sparse matrix breaks its
// format's invariants (twell::validate's first violation); dense matrices always pass.
void validate_loaded(const AnyMatrix& m, std::string_view where);

// Runs read(bytes of path), prefixing any twell::Error's message with the path.
template <class Read>
AnyMatrix read_path(const std::filesystem::path& path, Read&& read) {
  const std::vector<std::byte> bytes = read_file(path);
  try {
    return read(std::span<const std::byte>(bytes));
  } catch (const Error& e) {
    throw Error(e.code(), path.string() + ": " + e.what());
  }
}

// Runs a reader, turning a failed allocation (a size the caller allowed but the machine cannot
// serve) into ErrorCode::out_of_memory, as the readers' own Buffers report it, rather than
// letting std::bad_alloc or std::length_error escape.
template <class Read>
auto guard_allocation(std::string_view where, Read&& read) {
  try {
    return detail::map_host_allocation_failure(where, read);
  } catch (const std::length_error&) {
    fail(ErrorCode::out_of_memory, where, "sizes exceed what this machine can allocate");
  }
}

inline void append_bytes(std::vector<std::byte>& out, const void* p, std::size_t n) {
  if (n == 0) return;
  const std::size_t old = out.size();
  out.resize(old + n);
  std::memcpy(out.data() + old, p, n);
}
inline void append_text(std::vector<std::byte>& out, std::string_view s) { append_bytes(out, s.data(), s.size()); }

}  // namespace twell::io_detail
