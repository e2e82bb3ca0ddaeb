#include "random.hpp"

#include <atomic>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <limits>

#include <twell/instantiate.hpp>

namespace twell::testing {

std::uint64_t seed_base() {
  static const std::uint64_t base = [] {
    const char* env = std::getenv("TWELL_TEST_SEED");
    return env != nullptr && *env != '\0' ? std::strtoull(env, nullptr, 0) : 0x7457454c4cull;
  }();
  return base;
}

std::uint64_t fresh_seed() {
  static std::atomic<std::uint64_t> counter{0};
  return seed_base() ^ (0x9e3779b97f4a7c15ull * ++counter);
}

template <Value T>
DenseMatrix<T> random_sparse_dense(std::int64_t rows, std::int64_t cols, const SparseDenseOptions& options,
                                   std::uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<double> unit(0.0, 1.0);
  std::uniform_real_distribution<float> value(0.0625f, 2.0f);
  const float specials[] = {std::numeric_limits<float>::quiet_NaN(), std::numeric_limits<float>::infinity(),
                            -std::numeric_limits<float>::infinity(), -0.0f};
  DenseMatrix<T> m(rows, cols);
  auto v = m.view();
  for (std::int64_t i = 0; i < rows; ++i) {
    const double r = unit(rng);
    const bool empty = r < options.empty_row_share;
    const bool full = !empty && r < options.empty_row_share + options.full_row_share;
    for (std::int64_t j = 0; j < cols; ++j) {
      float x = 0.0f;
      if (!empty && (full || unit(rng) < options.density)) {
        x = value(rng) * (unit(rng) < 0.5 ? -1.0f : 1.0f);
        if (options.specials && unit(rng) < 0.02) x = specials[static_cast<int>(unit(rng) * 4) % 4];
      }
      v.at(i, j) = from_float<T>(x);
      // A value that rounds to zero in T would silently change the density; nudge it away.
      if (x != 0.0f && to_float(v.at(i, j)) == 0.0f) v.at(i, j) = from_float<T>(1.0f);
    }
  }
  return m;
}

template <Value T>
DenseMatrix<T> random_dense(std::int64_t rows, std::int64_t cols, float scale, std::uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<float> value(-scale, scale);
  DenseMatrix<T> m(rows, cols);
  auto v = m.view();
  for (std::int64_t i = 0; i < rows; ++i)
    for (std::int64_t j = 0; j < cols; ++j) v.at(i, j) = from_float<T>(value(rng));
  return m;
}

template <Value T>
bool bitwise_equal(DenseView<const T> a, DenseView<const T> b) {
  if (a.rows != b.rows || a.cols != b.cols) return false;
  for (std::int64_t i = 0; i < a.rows; ++i)
    if (std::memcmp(a.data + i * a.ld, b.data + i * b.ld, static_cast<std::size_t>(a.cols) * sizeof(T)) != 0)
      return false;
  return true;
}

template <Value T, Value U>
double relative_error(DenseView<const T> a, DenseView<const U> b) {
  if (a.rows != b.rows || a.cols != b.cols) return std::numeric_limits<double>::infinity();
  double diff = 0.0, ref = 0.0;
  for (std::int64_t i = 0; i < a.rows; ++i)
    for (std::int64_t j = 0; j < a.cols; ++j) {
      const double x = to_float(a.data[i * a.ld + j]);
      const double y = to_float(b.data[i * b.ld + j]);
      diff += (x - y) * (x - y);
      ref += y * y;
    }
  return std::sqrt(diff) / std::max(std::sqrt(ref), 1e-30);
}

#define TWELL_INSTANTIATE(T)                                                                                   \
  template DenseMatrix<T> random_sparse_dense<T>(std::int64_t, std::int64_t, const SparseDenseOptions&,       \
                                                 std::uint64_t);                                              \
  template DenseMatrix<T> random_dense<T>(std::int64_t, std::int64_t, float, std::uint64_t);                  \
  template bool bitwise_equal<T>(DenseView<const T>, DenseView<const T>);                                     \
  template double relative_error<T, T>(DenseView<const T>, DenseView<const T>);                               \

TWELL_FOR_EACH_VALUE_TYPE(TWELL_INSTANTIATE)
#undef TWELL_INSTANTIATE

}  // namespace twell::testing

namespace twell::testing {
template double relative_error<bf16, float>(DenseView<const bf16>, DenseView<const float>);
template double relative_error<fp16, float>(DenseView<const fp16>, DenseView<const float>);
}  // namespace twell::testing
