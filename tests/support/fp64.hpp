// fp64 ground truth for the reference suites: a plain row-major matrix, widening of a host view,
// and the activations evaluated in double.
#pragma once

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <vector>

#include <twell/formats/dense.hpp>
#include <twell/kernels/options.hpp>
#include <twell/types.hpp>

namespace twell::testing {

struct Matrix64 {
  std::int64_t rows = 0, cols = 0;
  std::vector<double> v;
  Matrix64(std::int64_t r, std::int64_t c) : rows(r), cols(c), v(static_cast<std::size_t>(r * c), 0.0) {}
  double& operator()(std::int64_t i, std::int64_t j) { return v[static_cast<std::size_t>(i * cols + j)]; }
  double operator()(std::int64_t i, std::int64_t j) const { return v[static_cast<std::size_t>(i * cols + j)]; }
};

template <class T>
Matrix64 to64(DenseView<const T> d) {
  Matrix64 out(d.rows, d.cols);
  for (std::int64_t i = 0; i < d.rows; ++i)
    for (std::int64_t j = 0; j < d.cols; ++j) out(i, j) = to_float(d.at(i, j));
  return out;
}

inline double act64(Activation a, double v) {
  switch (a) {
    case Activation::relu:
      return v > 0 ? v : 0.0;
    case Activation::silu:
      return v / (1.0 + std::exp(-v));
    case Activation::gelu:
      return 0.5 * v * (1.0 + std::erf(v / std::sqrt(2.0)));
  }
  return v;
}

}  // namespace twell::testing
