// Random inputs and comparisons shared by the test suites.
#pragma once

#include <cstdint>
#include <random>

#include <twell/formats/dense.hpp>

namespace twell::testing {

// Per-call seed: a base XOR a counter, printed by doctest on failure through CAPTURE. The base is
// fixed, so that every run (CI's included) draws the same data, unless $TWELL_TEST_SEED sets it:
// `TWELL_TEST_SEED=$RANDOM ctest ...` draws new data everywhere, and the same value with the same
// test filter draws it again.
std::uint64_t seed_base();
std::uint64_t fresh_seed();

struct SparseDenseOptions {
  double density = 0.05;          // probability that an entry is nonzero
  bool specials = false;          // sprinkle NaN, +-Inf and -0.0 (which counts as zero)
  double empty_row_share = 0.0;   // rows forced to be all zero
  double full_row_share = 0.0;    // rows forced to be all nonzero
};

// A host dense matrix with random nonzeros (values uniform in [-2, 2], never exactly zero unless
// a special -0.0) at the requested density.
template <Value T>
DenseMatrix<T> random_sparse_dense(std::int64_t rows, std::int64_t cols, const SparseDenseOptions& options,
                                   std::uint64_t seed);

// A host dense matrix with every entry uniform in [-scale, scale].
template <Value T>
DenseMatrix<T> random_dense(std::int64_t rows, std::int64_t cols, float scale, std::uint64_t seed);

// Bitwise equality of two host dense matrices (so NaN payloads and -0.0 compare exactly).
template <Value T>
bool bitwise_equal(DenseView<const T> a, DenseView<const T> b);

// ||a - b||_F / max(||b||_F, tiny), computed in fp64 over host views; NaN anywhere gives NaN.
template <Value T, Value U>
double relative_error(DenseView<const T> a, DenseView<const U> b);

}  // namespace twell::testing
