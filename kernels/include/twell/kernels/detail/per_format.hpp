// Internal to the kernels of both backends: what the four sparse formats of one signature family
// (signatures.inc) have in common, written once so that the reference and cuda backends neither
// repeat the per-format overloads and explicit instantiations nor let the two lists drift apart.
// The macros expand inside twell::reference or twell::cuda; plain host C++.
#pragma once

#include <cstdint>
#include <string>

#include <twell/instantiate.hpp>
#include <twell/kernels/options.hpp>

namespace twell::detail {

template <class V>
std::int64_t rows_of(const V& v) {
  if constexpr (requires { v.twell; }) {
    return v.rows();
  } else {
    return v.rows;
  }
}
template <class V>
std::int64_t cols_of(const V& v) {
  if constexpr (requires { v.twell; }) {
    return v.cols();
  } else {
    return v.cols;
  }
}

// Reports "<kernel>/<format>" or "<kernel>/<format>/<variant>"; the string is built only when a
// report is asked for, so the hot path allocates nothing.
inline void report_format_path(const KernelOptions& options, const char* kernel, const char* format,
                               const char* variant = nullptr) {
  if (options.report == nullptr) return;
  options.report->path = std::string(kernel) + "/" + format;
  if (variant != nullptr) options.report->path += std::string("/") + variant;
}

}  // namespace twell::detail

// X(View, format) once per sparse view template, with the format's name as report paths spell it.
#define TWELL_FOR_EACH_SPARSE_VIEW(X) \
  X(CsrView, "csr")                   \
  X(EllView, "ell")                   \
  X(TwellView, "twell")               \
  X(HybridView, "hybrid")

// ---- per-format overloads that only forward ---------------------------------------------------
// Expanded by TWELL_FOR_EACH_SPARSE_VIEW: each overload calls the backend's generic <kernel>_impl
// with the same arguments and the format's name.

#define TWELL_DEFINE_SPMM(View, format)                                                              \
  template <Value T>                                                                                 \
  void spmm(Op op_a, View<const T> a, DenseView<const T> b, DenseView<T> c, float alpha, float beta, \
            const KernelOptions& options) {                                                          \
    spmm_impl(op_a, a, b, c, alpha, beta, options, format);                                          \
  }

#define TWELL_DEFINE_SDDMM(View, format)                                                                           \
  template <Value T>                                                                                               \
  void sddmm(DenseView<const T> a, Op op_b, DenseView<const T> b, View<const T> pattern, View<T> out, float alpha, \
             float beta, const KernelOptions& options) {                                                           \
    sddmm_impl(a, op_b, b, pattern, out, alpha, beta, options, format);                                            \
  }

#define TWELL_DEFINE_ELEMENTWISE(View, format)                                                            \
  template <Value T>                                                                                      \
  void multiply_on_pattern(View<const T> x, View<const T> y, View<T> out, const KernelOptions& options) { \
    multiply_impl(x, y, out, options, format);                                                            \
  }                                                                                                       \
  template <Value T>                                                                                      \
  void add_scaled_sign(View<const T> x, float s, View<T> out, const KernelOptions& options) {             \
    add_scaled_sign_impl(x, s, x, out, options, format);                                                  \
  }                                                                                                       \
  template <Value T>                                                                                      \
  void add_scaled_sign(View<const T> x, float s, View<const T> y, View<T> out, const KernelOptions& options) { \
    add_scaled_sign_impl(x, s, y, out, options, format);                                                  \
  }                                                                                                       \
  template <Value T>                                                                                      \
  void multiply_by_activation_derivative(View<const T> x, View<const T> g, Activation act, View<T> out,   \
                                         const KernelOptions& options) {                                  \
    activation_derivative_impl(x, g, act, out, options, format);                                          \
  }

#define TWELL_DEFINE_NORMS(View, format)                                \
  template <Value T>                                                    \
  double l1_norm(View<const T> x, const KernelOptions& options) {       \
    return l1_impl(x, options, format);                                 \
  }                                                                     \
  template <Value T>                                                    \
  std::int64_t l0_norm(View<const T> x, const KernelOptions& options) { \
    return l0_impl(x, options, format);                                 \
  }

// ---- explicit instantiations, one macro per family --------------------------------------------
// Expanded by TWELL_FOR_EACH_VALUE_TYPE. TWELL_AT_EACH_VIEW(X, T) expands X(T, View) per view.

#define TWELL_AT_EACH_VIEW(X, T) X(T, CsrView) X(T, EllView) X(T, TwellView) X(T, HybridView)

#define TWELL_SPMM_AT(T, View) \
  template void spmm<T>(Op, View<const T>, DenseView<const T>, DenseView<T>, float, float, const KernelOptions&);
#define TWELL_INSTANTIATE_SPMM(T) TWELL_AT_EACH_VIEW(TWELL_SPMM_AT, T)

#define TWELL_SDDMM_AT(T, View)                                                                            \
  template void sddmm<T>(DenseView<const T>, Op, DenseView<const T>, View<const T>, View<T>, float, float, \
                         const KernelOptions&);
#define TWELL_INSTANTIATE_SDDMM(T) TWELL_AT_EACH_VIEW(TWELL_SDDMM_AT, T)

#define TWELL_ELEMENTWISE_AT(T, View)                                                                \
  template void multiply_on_pattern<T>(View<const T>, View<const T>, View<T>, const KernelOptions&); \
  template void add_scaled_sign<T>(View<const T>, float, View<T>, const KernelOptions&);          \
  template void add_scaled_sign<T>(View<const T>, float, View<const T>, View<T>, const KernelOptions&); \
  template void multiply_by_activation_derivative<T>(View<const T>, View<const T>, Activation, View<T>,   \
                                                     const KernelOptions&);
#define TWELL_INSTANTIATE_ELEMENTWISE(T) TWELL_AT_EACH_VIEW(TWELL_ELEMENTWISE_AT, T)

#define TWELL_NORMS_AT(T, View)                                    \
  template double l1_norm<T>(View<const T>, const KernelOptions&); \
  template std::int64_t l0_norm<T>(View<const T>, const KernelOptions&);
#define TWELL_INSTANTIATE_NORMS(T) TWELL_AT_EACH_VIEW(TWELL_NORMS_AT, T)

// transpose returns a different type per format, so its four signatures are listed.
#define TWELL_INSTANTIATE_TRANSPOSE(T)                                                          \
  template CsrMatrix<T> transpose<T>(CsrView<const T>, const KernelOptions&);                   \
  template EllMatrix<T> transpose<T>(EllView<const T>, const KernelOptions&);                   \
  template HybridMatrix<T> transpose<T>(TwellView<const T>, TwellLayout, const KernelOptions&); \
  template HybridMatrix<T> transpose<T>(HybridView<const T>, TwellLayout, const KernelOptions&); \
  template void transpose<T>(DenseView<const T>, DenseView<T>, const KernelOptions&);
