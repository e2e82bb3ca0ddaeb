// How much of a test's parameter sweep runs. Everything by default; with the environment variable
// TWELL_TEST_SWEEP=reduced (what `scripts/gpu-check.sh --sanitize` sets: under compute-sanitizer
// every kernel launch costs 10-100x more) the heaviest sweeps keep their first, middle and last
// items, and the largest problem sizes shrink to ones that take the same code paths, so every test
// case still runs every path it names on fresh random data.
//
// With TWELL_TEST_PART=i/n (0 <= i < n; what `scripts/gpu-check.sh --sanitize-parts n` sets, one
// run per part) a process runs only part i of its first sweep(): the outermost axis of the one
// test case a sanitizer run executes. Every later sweep runs whole, so the n parts together run
// every item of every axis, and a case too long for one run under racecheck fits in n.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <initializer_list>
#include <span>
#include <stdexcept>
#include <string>
#include <vector>

namespace twell::testing {

inline bool reduced_sweep() {
  static const bool reduced = [] {
    const char* v = std::getenv("TWELL_TEST_SWEEP");
    return v != nullptr && std::strcmp(v, "reduced") == 0;
  }();
  return reduced;
}

// Part `index` of `count` (TWELL_TEST_PART).
struct SweepPart {
  std::size_t index = 0;
  std::size_t count = 1;
};

// "i/n" with 0 <= i < n as a SweepPart; anything else throws std::invalid_argument naming it.
inline SweepPart parse_sweep_part(const char* text) {
  const std::string t = text;
  const std::size_t slash = t.find('/');
  const auto digits = [](const std::string& d) {
    return !d.empty() && d.size() <= 6 && d.find_first_not_of("0123456789") == std::string::npos;
  };
  if (slash != std::string::npos && digits(t.substr(0, slash)) && digits(t.substr(slash + 1))) {
    const SweepPart part{std::stoul(t.substr(0, slash)), std::stoul(t.substr(slash + 1))};
    if (part.index < part.count) return part;
  }
  throw std::invalid_argument("TWELL_TEST_PART is '" + t + "'; it must be i/n with 0 <= i < n");
}

inline SweepPart sweep_part() {
  static const SweepPart part = [] {
    const char* v = std::getenv("TWELL_TEST_PART");
    return v == nullptr ? SweepPart{} : parse_sweep_part(v);
  }();
  return part;
}

// The items at positions part.index, part.index + part.count, ...
template <class T>
std::vector<T> items_of_part(const std::vector<T>& items, SweepPart part) {
  std::vector<T> kept;
  for (std::size_t i = part.index; i < items.size(); i += part.count) kept.push_back(items[i]);
  return kept;
}

// Whether this process runs whole sweeps (no TWELL_TEST_PART split): a check of a total over a
// sweep, made after its loop, holds only then.
inline bool whole_sweep() { return sweep_part().count == 1; }

// True on the process's first call only.
inline bool first_sweep_of_process() {
  static std::atomic<bool> taken{false};
  return !taken.exchange(true);
}

// A problem size: `full`, or `reduced` under a reduced sweep.
inline std::int64_t sweep_size(std::int64_t full, std::int64_t reduced) { return reduced_sweep() ? reduced : full; }

// The items of a minor axis of a sweep: all, or under a reduced sweep the first and the last.
template <class T>
std::vector<T> sweep_ends(std::initializer_list<T> items) {
  if (!reduced_sweep() || items.size() <= 2) return {items.begin(), items.end()};
  return {*items.begin(), *(items.end() - 1)};
}

// The items of a sweep that run: all of them, or under a reduced sweep the first, middle and last;
// of the process's first sweep, only its part's share of those (TWELL_TEST_PART).
template <class T>
std::vector<T> sweep(std::span<const T> items) {
  std::vector<T> kept = !reduced_sweep() || items.size() <= 3
                            ? std::vector<T>(items.begin(), items.end())
                            : std::vector<T>{items.front(), items[items.size() / 2], items.back()};
  const SweepPart part = sweep_part();
  return part.count > 1 && first_sweep_of_process() ? items_of_part(kept, part) : kept;
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
