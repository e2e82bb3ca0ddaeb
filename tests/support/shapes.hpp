// Product shapes (op(A) m x k, B k x n) of the kernel suites: a fixed list plus fresh random ones.
#pragma once

#include <cstdint>
#include <ostream>
#include <random>
#include <span>
#include <vector>

#include <doctest/doctest.h>

#include <twell/kernels/options.hpp>

#include "random.hpp"
#include "sweep.hpp"

namespace twell::testing {

struct Shape {
  std::int64_t m, k, n;
};

// "m x k x n", so that CAPTURE(shape) names all three.
inline std::ostream& operator<<(std::ostream& os, const Shape& s) { return os << s.m << " x " << s.k << " x " << s.n; }

// `fixed`, then two shapes drawn afresh: m and n in [1, max_dim], k in [1, max_dim] times k_step.
inline std::vector<Shape> with_random_shapes(std::vector<Shape> fixed, std::int64_t max_dim, std::int64_t k_step) {
  std::mt19937_64 rng(fresh_seed());
  std::uniform_int_distribution<std::int64_t> dim(1, max_dim);
  for (int r = 0; r < 2; ++r) fixed.push_back({dim(rng), dim(rng) * k_step, dim(rng)});
  return fixed;
}

// Calls body(shape, density, op, seed) for every shape, density (of the sweep: sweep.hpp) and op
// (none, then transpose),
// each with a fresh seed; seed, shape, density and whether op transposes are captured for
// failure messages.
template <class Body>
void for_each_product_case(const std::vector<Shape>& shapes, std::span<const double> densities, Body&& body) {
  for (const Shape& s : sweep(std::span<const Shape>(shapes))) {
    for (const double density : sweep(densities)) {
      for (const Op op : {Op::none, Op::transpose}) {
        const std::uint64_t seed = fresh_seed();
        const bool transposed = op == Op::transpose;
        CAPTURE(seed);
        CAPTURE(s);
        CAPTURE(density);
        CAPTURE(transposed);
        body(s, density, op, seed);
      }
    }
  }
}

}  // namespace twell::testing
