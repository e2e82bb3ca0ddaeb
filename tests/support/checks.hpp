// Checks shared by the suites.
#pragma once

#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include <twell/error.hpp>
#include <twell/formats/dense.hpp>

namespace twell::testing {

// The code of the twell::Error that f() throws; the test case fails when f() returns normally.
template <class F>
ErrorCode code_of(F&& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.code();
  }
  FAIL("no twell::Error thrown");
  return ErrorCode::invalid_argument;
}

// The message of the twell::Error that f() throws ("" and a failed test case when none is thrown).
template <class F>
std::string message_of(F&& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  FAIL("no twell::Error thrown");
  return "";
}

// v starting one byte into its buffer, shape unchanged: no longer on a value boundary, which every
// entry point must refuse (ErrorCode::misaligned) before reading anything.
template <class T>
DenseView<const T> off_boundary(DenseView<const T> v) {
  v.data = reinterpret_cast<const T*>(reinterpret_cast<const char*>(v.data) + 1);
  return v;
}

// The largest relative error of one row of got against the same row of want (Frobenius norms); a
// row that want holds as zero must be zero. NaN when a NaN is found: poison that leaked under
// beta = 0, or an element left unwritten. With norm_floor > 0 a row's error is relative to at
// least that norm, so that a row whose terms cancel (a tiny norm, a large relative rounding)
// does not fail while a wrong row still does.
template <class T>
double worst_row_error(const DenseMatrix<T>& got, const DenseMatrix<T>& want, double norm_floor = 0.0) {
  const auto g = got.view();
  const auto w = want.view();
  double worst = 0.0;
  for (std::int64_t i = 0; i < w.rows; ++i) {
    double diff = 0.0, norm = 0.0;
    for (std::int64_t j = 0; j < w.cols; ++j) {
      const double a = to_float(g.at(i, j)), b = to_float(w.at(i, j));
      diff += (a - b) * (a - b);
      norm += b * b;
    }
    if (std::isnan(diff)) return std::numeric_limits<double>::quiet_NaN();
    norm = std::max(norm, norm_floor * norm_floor);
    const double err = norm > 0.0 ? std::sqrt(diff / norm) : (diff > 0.0 ? 1.0 : 0.0);
    worst = std::max(worst, err);
  }
  return worst;
}

// The root mean square of want's row norms: a norm_floor for worst_row_error that leaves each
// row's error relative to a typical row of the matrix at least.
template <class T>
double rms_row_norm(const DenseMatrix<T>& want) {
  const auto w = want.view();
  double sum = 0.0;
  for (std::int64_t i = 0; i < w.rows; ++i)
    for (std::int64_t j = 0; j < w.cols; ++j) {
      const double v = to_float(w.at(i, j));
      sum += v * v;
    }
  return w.rows > 0 ? std::sqrt(sum / static_cast<double>(w.rows)) : 0.0;
}

// Elementwise check of the non-finite elements: NaN where want has NaN, the same infinity where it
// has one, finite where want is finite. Sets both to zero where want is not finite, so that a norm
// check of the rest can follow. Returns {mismatched elements, non-finite elements of want}.
template <class T>
std::pair<std::int64_t, std::int64_t> split_non_finite(DenseMatrix<T>& got, DenseMatrix<T>& want) {
  std::int64_t mismatched = 0, non_finite = 0;
  auto g = got.view();
  auto w = want.view();
  for (std::int64_t i = 0; i < w.rows; ++i) {
    for (std::int64_t j = 0; j < w.cols; ++j) {
      const float gv = to_float(g.at(i, j)), wv = to_float(w.at(i, j));
      if (std::isfinite(wv)) {
        mismatched += std::isfinite(gv) ? 0 : 1;
      } else {
        ++non_finite;
        mismatched += (std::isnan(wv) ? std::isnan(gv) : gv == wv) ? 0 : 1;
        g.at(i, j) = w.at(i, j) = from_float<T>(0.0f);
      }
    }
  }
  return {mismatched, non_finite};
}

// Elements of got further from want than rounding into T once allows, where both are fp32 sums
// of the same terms (exact 16-bit products) in another order, each rounded once: at least a unit
// in the last place (2^-7 of the larger value for bf16, 2^-10 for fp16), plus 2^-12 of
// `magnitude` (row-major like want: at each element, the sum of the terms' absolute values; two
// fp32 sums of n terms in any order differ by at most about 2 n 2^-24 of it, within the bound up
// to ~2000 terms; for cuBLAS's tensor-core accumulation the margin is statistical, not
// worst-case), plus 2^-24 (fp16's subnormal spacing). A result rounded twice, a partial sum stored
// in T and then added to, is off by up to half a unit of the partial sum, which exceeds this where
// the partial sum carries much of the magnitude and later terms cancel it. NaN counts, and so
// does an infinity unless both hold the same one; the unit is taken of the larger value but of
// at most twice want's, so that a wild value in got does not widen its own bound.
template <class T>
std::int64_t beyond_one_rounding(const DenseMatrix<T>& got, const DenseMatrix<T>& want,
                                 const std::vector<double>& magnitude) {
  static_assert(std::is_same_v<T, bf16> || std::is_same_v<T, fp16>, "one rounding into a 16-bit type");
  constexpr double kUnit = std::is_same_v<T, bf16> ? 0x1p-7 : 0x1p-10;
  const auto g = got.view();
  const auto w = want.view();
  REQUIRE(magnitude.size() == static_cast<std::size_t>(w.rows * w.cols));
  std::int64_t beyond = 0;
  for (std::int64_t i = 0; i < w.rows; ++i)
    for (std::int64_t j = 0; j < w.cols; ++j) {
      const double a = to_float(g.at(i, j)), b = to_float(w.at(i, j));
      if (!std::isfinite(a) || !std::isfinite(b)) {
        beyond += a == b ? 0 : 1;
        continue;
      }
      const double larger = std::min(std::max(std::abs(a), std::abs(b)), 2 * std::abs(b));
      const double bound = kUnit * larger + 0x1p-12 * magnitude[i * w.cols + j] + 0x1p-24;
      beyond += std::abs(a - b) <= bound ? 0 : 1;
    }
  return beyond;
}

}  // namespace twell::testing
