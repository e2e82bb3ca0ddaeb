// Fixtures shared by the suites: NaN-poisoned outputs, per-dtype error bounds and the workload
// settings the GPU suites sweep.
#pragma once

#include <cstdint>
#include <limits>
#include <type_traits>

#include <twell/converters/backends.hpp>
#include <twell/formats/dense.hpp>
#include <twell/formats/hybrid.hpp>
#include <twell/kernels/backends.hpp>
#include <twell/types.hpp>
#include <twell/workload.hpp>

#include "random.hpp"

namespace twell::testing {

// A host dense matrix of quiet NaNs: an output a kernel must overwrite whole, so that a read of it
// under beta = 0, or an element left unwritten, surfaces as NaN.
template <Value T>
DenseMatrix<T> nan_dense(std::int64_t rows, std::int64_t cols) {
  DenseMatrix<T> m(rows, cols);
  auto v = m.view();
  for (std::int64_t i = 0; i < rows; ++i)
    for (std::int64_t j = 0; j < cols; ++j) v.at(i, j) = from_float<T>(std::numeric_limits<float>::quiet_NaN());
  return m;
}

// Relative Frobenius bounds of a result against another backend's or fp64: one rounding into T plus
// fp32 accumulation in another order.
template <Value T>
double relative_bound() {
  if constexpr (std::is_same_v<T, bf16>) return 1e-2;
  if constexpr (std::is_same_v<T, fp16>) return 2e-3;
  return 1e-5;
}

// A sampled Hybrid with exact zeros in its structure: y is m x n at 40 % density in layout
// (16, 4) (capacity 3, so most rows are dense overflow rows), and x = A B on y's pattern with the
// even rows of A (m x k) zero, as dh for tokens outside the loss. x's TwELL slots keep those
// zeros; its dense overflow rows cannot store them. Two operands for a second operation on x's
// pattern: resample_a (m x k, no zero row), whose sddmm samples nonzeros at those places, and
// infinite, sampled on y's pattern (no zeros) with an Inf in every value of A's column 0, so that
// x * infinite is 0 * Inf = NaN there. Host matrices from the reference backend.
template <Value T>
struct ZeroRowSample {
  DenseMatrix<T> yd;  // y as dense
  HybridMatrix<T> y;
  DenseMatrix<T> a, b;
  HybridMatrix<T> x;
  DenseMatrix<T> resample_a;
  HybridMatrix<T> infinite;
};

template <Value T>
ZeroRowSample<T> zero_row_sample(std::int64_t m, std::int64_t n, std::int64_t k, std::uint64_t seed) {
  ZeroRowSample<T> s;
  s.yd = random_sparse_dense<T>(m, n, SparseDenseOptions{.density = 0.4}, seed);
  ConvertOptions hybrid;
  hybrid.overflow = OverflowPolicy::hybrid;
  s.y = reference::dense_to_hybrid<T>(s.yd.view(), TwellLayout{16, 4}, hybrid);
  s.a = random_dense<T>(m, k, 1.0f, seed + 1);
  s.b = random_dense<T>(k, n, 1.0f, seed + 2);
  for (std::int64_t i = 0; i < m; i += 2)
    for (std::int64_t p = 0; p < k; ++p) s.a.view().at(i, p) = T{};
  s.x = HybridMatrix<T>(m, n, s.y.layout(), s.y.overflow_rows());
  reference::sddmm<T>(s.a.view(), Op::none, s.b.view(), s.y.view(), s.x.view(), 1.0f, 0.0f);
  s.resample_a = random_dense<T>(m, k, 1.0f, seed + 3);
  auto big = random_dense<T>(m, k, 1.0f, seed + 4);
  for (std::int64_t i = 0; i < m; ++i) big.view().at(i, 0) = from_float<T>(std::numeric_limits<float>::infinity());
  s.infinite = HybridMatrix<T>(m, n, s.y.layout(), s.y.overflow_rows());
  reference::sddmm<T>(big.view(), Op::none, s.b.view(), s.y.view(), s.infinite.view(), 1.0f, 0.0f);
  return s;
}

// One FFN-shaped workload: x is m x k, the sparse hidden state m x n.
struct WorkloadSetting {
  std::int64_t m, k, n;
  double density;
  workload::Distribution d;
};

// The FFN operands of one setting from the workload generator, its activations drawn from seed.
template <Value T>
workload::FfnInputs<T> workload_inputs(const WorkloadSetting& s, std::uint64_t seed) {
  workload::ActivationOptions o;
  o.tokens = s.m;
  o.units = s.n;
  o.density = s.density;
  o.distribution = s.d;
  o.seed = seed;
  return workload::ffn_inputs<T>(o, s.k);
}

}  // namespace twell::testing
