// The sparse FFN forward composed from the public operations.
#include <string>

#include <twell/ffn.hpp>
#include <twell/instantiate.hpp>

namespace twell {
namespace {

std::string shape(std::int64_t rows, std::int64_t cols) { return std::to_string(rows) + " x " + std::to_string(cols); }

// Checked here so that a mistake is reported with the FFN's names, not an inner operation's.
template <class T>
void check_shapes(const char* where, DenseView<const T> x, DenseView<const T> w_in, DenseView<const T> wd,
                  DenseView<T> y) {
  const std::int64_t m = x.rows, k = x.cols, n = w_in.cols;
  require(w_in.rows == k, ErrorCode::shape_mismatch, where, "x is ", shape(m, k), " but wu is ",
          shape(w_in.rows, w_in.cols));
  require(wd.rows == n && wd.cols == k, ErrorCode::shape_mismatch, where, "wd is ", shape(wd.rows, wd.cols),
          " but x and wu need ", shape(n, k));
  require(y.rows == m && y.cols == k, ErrorCode::shape_mismatch, where, "y is ", shape(y.rows, y.cols), " but x needs ",
          shape(m, k));
}

}  // namespace

template <Value T>
void sparse_gated_ffn_forward(In<DenseView<const T>> x, In<DenseView<const T>> wg, In<DenseView<const T>> wu,
                              In<DenseView<const T>> wd, ActivationSpec act, TwellLayout layout, DenseView<T> y,
                              const KernelOptions& options) {
  constexpr const char* where = "twell::sparse_gated_ffn_forward";
  check_shapes(where, x, wu, wd, y);
  require(wg.rows == wu.rows && wg.cols == wu.cols, ErrorCode::shape_mismatch, where, "wg is ", shape(wg.rows, wg.cols),
          " but wu is ", shape(wu.rows, wu.cols));
  for (const auto s : {wg.space, wu.space, wd.space, y.space})
    require(s == x.space, ErrorCode::space_mismatch, where, "x is in ", to_string(x.space),
            " memory but a weight or y is in ", to_string(s), " memory");
  ConvertOptions convert = hybrid_overflow();
  convert.stream = options.stream;
  const HybridMatrix<T> g = gemm_to_sparse<T>(x, wg, act, layout, convert, options);
  HybridMatrix<T> h(g.rows(), g.cols(), layout, g.overflow_rows(), x.space);
  sddmm<T>(x, Op::none, wu, g.view(), h.view(), 1.0f, 0.0f, options);
  multiply_on_pattern<T>(g.view(), h.view(), h.view(), options);
  spmm<T>(Op::none, h.view(), wd, y, 1.0f, 0.0f, options);
}

template <Value T>
void sparse_ffn_forward(In<DenseView<const T>> x, In<DenseView<const T>> wu, In<DenseView<const T>> wd,
                        ActivationSpec act, TwellLayout layout, DenseView<T> y, const KernelOptions& options) {
  constexpr const char* where = "twell::sparse_ffn_forward";
  check_shapes(where, x, wu, wd, y);
  for (const auto s : {wu.space, wd.space, y.space})
    require(s == x.space, ErrorCode::space_mismatch, where, "x is in ", to_string(x.space),
            " memory but a weight or y is in ", to_string(s), " memory");
  ConvertOptions convert = hybrid_overflow();
  convert.stream = options.stream;
  const HybridMatrix<T> h = gemm_to_sparse<T>(x, wu, act, layout, convert, options);
  spmm<T>(Op::none, h.view(), wd, y, 1.0f, 0.0f, options);
}

#define TWELL_INSTANTIATE(T)                                                                                        \
  template void sparse_gated_ffn_forward<T>(In<DenseView<const T>>, In<DenseView<const T>>, In<DenseView<const T>>, \
                                            In<DenseView<const T>>, ActivationSpec, TwellLayout, DenseView<T>,      \
                                            const KernelOptions&);                                                  \
  template void sparse_ffn_forward<T>(In<DenseView<const T>>, In<DenseView<const T>>, In<DenseView<const T>>,       \
                                      ActivationSpec, TwellLayout, DenseView<T>, const KernelOptions&);
TWELL_FOR_EACH_VALUE_TYPE(TWELL_INSTANTIATE)
#undef TWELL_INSTANTIATE

}  // namespace twell
