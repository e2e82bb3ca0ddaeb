// Fixtures shared by the suites: NaN-poisoned outputs, per-dtype error bounds and the workload
// settings the GPU suites sweep.
#pragma once

#include <cstdint>
#include <limits>
#include <type_traits>

#include <twell/formats/dense.hpp>
#include <twell/types.hpp>
#include <twell/workload.hpp>

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
