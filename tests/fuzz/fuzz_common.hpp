// Shared by the libFuzzer targets: a reader may throw twell::Error and nothing else; whatever
// it accepts must write back and read back to the identical bytes.
#pragma once

#include <cstdio>
#include <cstdlib>
#include <span>
#include <type_traits>
#include <variant>

#include <twell/io.hpp>

namespace twell::fuzz {

// ReadOptions::max_implicit_bytes for the targets: small enough that a hostile header cannot make
// a run slow under the sanitizers (rows that take no bytes still cost a loop each), large
// enough for every seed.
constexpr std::uint64_t kImplicitBytes = std::uint64_t{16} << 20;

inline std::span<const std::byte> as_bytes(const std::uint8_t* data, std::size_t size) {
  return {reinterpret_cast<const std::byte*>(data), size};
}

[[noreturn]] inline void die(const char* what) {
  std::fprintf(stderr, "fuzz invariant broken: %s\n", what);
  std::abort();
}

// Whatever was accepted must survive the .twell container bit for bit.
inline void check_twell_round_trip(const AnyMatrix& m) {
  const std::vector<std::byte> once = encode_twell(m);
  const std::vector<std::byte> twice = encode_twell(read_twell(once));
  if (once != twice) die(".twell round trip changed the bytes");
}

// The frame of a reader target: `read` may refuse the bytes (twell::Error ends the run); what it
// accepts must survive .twell, hold a Kind<T> matrix (else `wrong_kind` is reported) and pass
// `check(matrix)`, the format's own round trip.
template <template <class> class Kind, class Read, class Check>
int check_reader(const std::uint8_t* data, std::size_t size, Read&& read, const char* wrong_kind, Check&& check) {
  AnyMatrix m;
  try {
    m = read(as_bytes(data, size));
  } catch (const Error&) {
    return 0;
  }
  check_twell_round_trip(m);
  std::visit(
      [&](const auto& x) {
        using M = std::remove_cvref_t<decltype(x)>;
        if constexpr (std::is_same_v<M, Kind<ValueOfMatrix<M>>>) {
          check(x);
        } else {
          die(wrong_kind);
        }
      },
      m);
  return 0;
}

}  // namespace twell::fuzz
