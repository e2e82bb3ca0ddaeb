// Options and report shared by every conversion, on both backends.
#pragma once

#include <cstdint>
#include <limits>

#include <twell/memory.hpp>

namespace twell {

// What a conversion into TwELL (or ELL of fixed width) does with a (row, tile) that has more
// nonzeros than its slots: throw (naming the first overflowed row and tile), route the row to
// the hybrid's dense block (to_hybrid does this always), or drop the surplus, counted.
enum class OverflowPolicy : std::uint8_t { error, hybrid, drop };

struct ConvertReport {
  std::int64_t nnz = 0;            // values in the result
  std::int64_t dropped = 0;        // values removed by OverflowPolicy::drop
  std::int64_t overflow_rows = 0;  // rows placed in a hybrid's dense block
};

// Throws invalid_argument, naming `where`, unless policy is one of the enumerators: a value cast
// from anything else would otherwise read as one of them (as drop, losing values silently).
inline void check_overflow_policy(OverflowPolicy policy, const char* where) {
  require(policy == OverflowPolicy::error || policy == OverflowPolicy::hybrid || policy == OverflowPolicy::drop,
          ErrorCode::invalid_argument, where, "overflow policy ", static_cast<int>(policy),
          " is none of error, hybrid, drop");
}

struct ConvertOptions {
  float threshold = 0.0f;  // |v| <= threshold counts as zero; 0 keeps every nonzero (and NaN)
  OverflowPolicy overflow = OverflowPolicy::error;
  std::int64_t ell_width = -1;  // ELL width, at most the columns; -1: the longest row
  Stream stream{};              // cuda backend: where the work is queued
  ConvertReport* report = nullptr;
};

// What every converter of both backends checks first, naming `where`: a threshold that is a
// finite non-negative number (NaN refused; +Inf would drop Inf values, which are always stored)
// and a policy that is one of the enumerators (also where the
// target ignores it: a value outside the enum is a caller's bug, whatever it converts to).
inline void check_convert_options(const ConvertOptions& options, const char* where) {
  require(options.threshold >= 0.0f && options.threshold <= std::numeric_limits<float>::max(),
          ErrorCode::invalid_argument, where, "options.threshold = ", options.threshold,
          " must be a finite non-negative number");
  check_overflow_policy(options.overflow, where);
}

// ELL has no overflow block: with a width that rows may exceed, the hybrid policy is refused.
inline void check_ell_overflow_policy(const ConvertOptions& options, const char* where) {
  require(options.ell_width == -1 || options.overflow != OverflowPolicy::hybrid, ErrorCode::invalid_argument, where,
          "options.overflow = hybrid has no meaning for ELL (it has no overflow block); use error or drop");
}

}  // namespace twell
