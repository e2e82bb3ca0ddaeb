// Independent cross-check of the sparse-dense product against Eigen's own SparseMatrix: the same
// data through Eigen's CSR construction and product, and through every twell format.
#include <doctest/doctest.h>

#include <algorithm>

#include <Eigen/Dense>
#include <Eigen/Sparse>

#include <twell/twell.hpp>

#include "fixtures.hpp"
#include "random.hpp"

namespace {

using namespace twell;
using RowMajorSparse = Eigen::SparseMatrix<float, Eigen::RowMajor, std::int64_t>;
using RowMajorDense = Eigen::Matrix<float, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;

template <Value T>
RowMajorDense to_eigen(DenseView<const T> m) {
  RowMajorDense out(m.rows, m.cols);
  for (std::int64_t i = 0; i < m.rows; ++i)
    for (std::int64_t j = 0; j < m.cols; ++j) out(i, j) = to_float(m.data[i * m.ld + j]);
  return out;
}

// Eigen's CSR, built from triplets of the stored values only.
template <Value T>
RowMajorSparse eigen_sparse(DenseView<const T> m) {
  std::vector<Eigen::Triplet<float, std::int64_t>> triplets;
  for (std::int64_t i = 0; i < m.rows; ++i)
    for (std::int64_t j = 0; j < m.cols; ++j)
      if (is_stored(m.data[i * m.ld + j])) triplets.emplace_back(i, j, to_float(m.data[i * m.ld + j]));
  RowMajorSparse s(m.rows, m.cols);
  s.setFromTriplets(triplets.begin(), triplets.end());
  return s;
}

// Relative Frobenius error of a twell product (stored as T) against Eigen's fp32 product.
template <Value T>
double error_vs(const RowMajorDense& want, const DenseMatrix<T>& got) {
  const RowMajorDense g = to_eigen<T>(got.view());
  return (g - want).norm() / std::max(static_cast<double>(want.norm()), 1e-30);
}

using testing::relative_bound;

}  // namespace

TEST_CASE_TEMPLATE("spmm of every format agrees with Eigen's SparseMatrix product", T, bf16, fp16, float) {
  struct Shape {
    std::int64_t m, k, n;
  };
  for (const Shape s : {Shape{1, 1, 1}, Shape{37, 300, 16}, Shape{200, 1000, 33}, Shape{64, 5632, 8}}) {
    for (const double density : {0.0, 0.005, 0.05, 0.5, 1.0}) {
      const std::uint64_t seed = testing::fresh_seed();
      CAPTURE(seed);
      CAPTURE(s.m);
      CAPTURE(s.k);
      CAPTURE(density);
      testing::SparseDenseOptions so;
      so.density = density;
      const auto a = testing::random_sparse_dense<T>(s.m, s.k, so, seed);
      const auto b = testing::random_dense<T>(s.k, s.n, 1.0f, seed + 1);

      const RowMajorSparse sa = eigen_sparse<T>(a.view());
      const RowMajorDense want = sa * to_eigen<T>(b.view());
      // Eigen's CSR of the same data is twell's CSR, entry for entry.
      const CsrMatrix<T> csr = to_csr(a);
      REQUIRE(csr.nnz() == sa.nonZeros());
      const auto cols = csr.col_idx().host_span();
      CHECK(std::equal(cols.begin(), cols.end(), sa.innerIndexPtr()));

      const TwellLayout layout{128, 4};
      // Each product into a NaN-poisoned C, so that one that writes nothing fails.
      const auto check_product = [&](const auto& sparse) {
        DenseMatrix<T> c = testing::nan_dense<T>(s.m, s.n);
        spmm(Op::none, sparse.view(), b.view(), c.view());
        CHECK(error_vs(want, c) <= relative_bound<T>());
      };
      check_product(csr);
      check_product(to_ell(a));
      check_product(to_hybrid(a, layout));
      ConvertOptions drop_nothing;
      drop_nothing.overflow = OverflowPolicy::error;
      if (density <= 0.05) {  // fits TwELL(128, 1) without overflow at these densities and widths
        check_product(to_twell(a, TwellLayout{128, 1}, drop_nothing));
      }
      // op(A) = A^T against Eigen's transpose product.
      const auto bt = testing::random_dense<T>(s.m, s.n, 1.0f, seed + 2);
      const RowMajorDense want_t = RowMajorDense(sa.transpose() * to_eigen<T>(bt.view()));
      DenseMatrix<T> ct = testing::nan_dense<T>(s.k, s.n);
      spmm(Op::transpose, to_hybrid(a, layout).view(), bt.view(), ct.view());
      CHECK(error_vs(want_t, ct) <= relative_bound<T>());
    }
  }
}
