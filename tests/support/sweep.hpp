// How much of a test's parameter sweep runs. Everything by default; with the environment variable
// TWELL_TEST_SWEEP=reduced (what `scripts/gpu-check.sh --sanitize` sets: under compute-sanitizer
// every kernel launch costs 10-100x more) the heaviest sweeps keep their first, middle and last
// items, and the largest problem sizes shrink to ones that take the same code paths, so every test
// case still runs every path it names on fresh random data.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <initializer_list>
#include <span>
#include <vector>

namespace twell::testing {

inline bool reduced_sweep() {
  static const bool reduced = [] {
    const char* v = std::getenv("TWELL_TEST_SWEEP");
    return v != nullptr && std::strcmp(v, "reduced") == 0;
  }();
  return reduced;
}

// A problem size: `full`, or `reduced` under a reduced sweep.
inline std::int64_t sweep_size(std::int64_t full, std::int64_t reduced) { return reduced_sweep() ? reduced : full; }

// The items of a minor axis of a sweep: all, or under a reduced sweep the first and the last.
template <class T>
std::vector<T> sweep_ends(std::initializer_list<T> items) {
  if (!reduced_sweep() || items.size() <= 2) return {items.begin(), items.end()};
  return {*items.begin(), *(items.end() - 1)};
}

// The items of a sweep that run: all of them, or under a reduced sweep the first, middle and last.
template <class T>
std::vector<T> sweep(std::span<const T> items) {
  if (!reduced_sweep() || items.size() <= 3) return {items.begin(), items.end()};
  return {items.front(), items[items.size() / 2], items.back()};
}

template <class T, std::size_t N>
std::vector<T> sweep(const T (&items)[N]) {
  return sweep(std::span<const T>(items));
}

template <class T>
std::vector<T> sweep(std::initializer_list<T> items) {
  return sweep(std::span<const T>(items.begin(), items.size()));
}

}  // namespace twell::testing
