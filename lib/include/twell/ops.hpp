// The sparse-activation operations of twell's public API. Each runs on the backend where its
// operands live: host memory -> twell::reference (CPU), device memory -> twell::cuda. Operands
// in different spaces are ErrorCode::space_mismatch (never a silent copy); device operands in a
// build or on a machine without CUDA are ErrorCode::no_device. Semantics, shapes and
// preconditions are those of kernels/include/twell/kernels/signatures.inc.
//
// Where a function has an output operand, T is taken from it and input views convert from
// mutable to const; functions with inputs only also accept mutable views.
#pragma once

#include <cstdint>
#include <type_traits>

#include <twell/converters/options.hpp>
#include <twell/formats/csr.hpp>
#include <twell/formats/dense.hpp>
#include <twell/formats/ell.hpp>
#include <twell/formats/hybrid.hpp>
#include <twell/formats/twell_matrix.hpp>
#include <twell/kernels/options.hpp>

namespace twell {

// An operand whose T is not deduced from it.
template <class V>
using In = std::type_identity_t<V>;

// C = alpha * op(A) * B + beta * C; A sparse, B (K x Nb) and C (M x Nb) dense. beta == 0 never reads C.
template <Value T>
void spmm(Op op_a, In<CsrView<const T>> a, In<DenseView<const T>> b, DenseView<T> c, float alpha = 1.0f,
          float beta = 0.0f, const KernelOptions& options = {});
template <Value T>
void spmm(Op op_a, In<EllView<const T>> a, In<DenseView<const T>> b, DenseView<T> c, float alpha = 1.0f,
          float beta = 0.0f, const KernelOptions& options = {});
template <Value T>
void spmm(Op op_a, In<TwellView<const T>> a, In<DenseView<const T>> b, DenseView<T> c, float alpha = 1.0f,
          float beta = 0.0f, const KernelOptions& options = {});
template <Value T>
void spmm(Op op_a, In<HybridView<const T>> a, In<DenseView<const T>> b, DenseView<T> c, float alpha = 1.0f,
          float beta = 0.0f, const KernelOptions& options = {});

// out = alpha * (A op(B)) + beta * out at the stored entries of `pattern`. out may alias pattern;
// out's values overlapping A or B are `invalid_argument` (the kernels read A and B while writing).
template <Value T>
void sddmm(In<DenseView<const T>> a, Op op_b, In<DenseView<const T>> b, In<CsrView<const T>> pattern, CsrView<T> out,
           float alpha = 1.0f, float beta = 0.0f, const KernelOptions& options = {});
template <Value T>
void sddmm(In<DenseView<const T>> a, Op op_b, In<DenseView<const T>> b, In<EllView<const T>> pattern, EllView<T> out,
           float alpha = 1.0f, float beta = 0.0f, const KernelOptions& options = {});
template <Value T>
void sddmm(In<DenseView<const T>> a, Op op_b, In<DenseView<const T>> b, In<TwellView<const T>> pattern,
           TwellView<T> out, float alpha = 1.0f, float beta = 0.0f, const KernelOptions& options = {});
template <Value T>
void sddmm(In<DenseView<const T>> a, Op op_b, In<DenseView<const T>> b, In<HybridView<const T>> pattern,
           HybridView<T> out, float alpha = 1.0f, float beta = 0.0f, const KernelOptions& options = {});

// Sparse M x N to sparse N x M (TwELL and Hybrid into a Hybrid of `layout`).
template <Value T>
CsrMatrix<T> transpose(CsrView<const T> a, const KernelOptions& options = {});
template <Value T>
EllMatrix<T> transpose(EllView<const T> a, const KernelOptions& options = {});
template <Value T>
HybridMatrix<T> transpose(TwellView<const T> a, TwellLayout layout, const KernelOptions& options = {});
template <Value T>
HybridMatrix<T> transpose(HybridView<const T> a, TwellLayout layout, const KernelOptions& options = {});
// Dense M x N into a caller-owned N x M of the same memory space (no overlap with a).
template <Value T>
void transpose(In<DenseView<const T>> a, DenseView<T> out, const KernelOptions& options = {});

// out = x * y on one structure, out = x + s * sign(x), and out = x + s * sign(y), the gradient of
// s * sum(|y|) added to x (out may alias the inputs; signatures.inc for a Hybrid's overflow rows).
template <Value T>
void multiply_on_pattern(In<CsrView<const T>> x, In<CsrView<const T>> y, CsrView<T> out,
                         const KernelOptions& options = {});
template <Value T>
void multiply_on_pattern(In<EllView<const T>> x, In<EllView<const T>> y, EllView<T> out,
                         const KernelOptions& options = {});
template <Value T>
void multiply_on_pattern(In<TwellView<const T>> x, In<TwellView<const T>> y, TwellView<T> out,
                         const KernelOptions& options = {});
template <Value T>
void multiply_on_pattern(In<HybridView<const T>> x, In<HybridView<const T>> y, HybridView<T> out,
                         const KernelOptions& options = {});
template <Value T>
void add_scaled_sign(In<CsrView<const T>> x, float s, CsrView<T> out, const KernelOptions& options = {});
template <Value T>
void add_scaled_sign(In<EllView<const T>> x, float s, EllView<T> out, const KernelOptions& options = {});
template <Value T>
void add_scaled_sign(In<TwellView<const T>> x, float s, TwellView<T> out, const KernelOptions& options = {});
template <Value T>
void add_scaled_sign(In<HybridView<const T>> x, float s, HybridView<T> out, const KernelOptions& options = {});
template <Value T>
void add_scaled_sign(In<CsrView<const T>> x, float s, In<CsrView<const T>> y, CsrView<T> out,
                     const KernelOptions& options = {});
template <Value T>
void add_scaled_sign(In<EllView<const T>> x, float s, In<EllView<const T>> y, EllView<T> out,
                     const KernelOptions& options = {});
template <Value T>
void add_scaled_sign(In<TwellView<const T>> x, float s, In<TwellView<const T>> y, TwellView<T> out,
                     const KernelOptions& options = {});
template <Value T>
void add_scaled_sign(In<HybridView<const T>> x, float s, In<HybridView<const T>> y, HybridView<T> out,
                     const KernelOptions& options = {});
// out = x * act'(g), g on x's structure (the chain rule through an activation).
template <Value T>
void multiply_by_activation_derivative(In<CsrView<const T>> x, In<CsrView<const T>> g, Activation act, CsrView<T> out,
                                       const KernelOptions& options = {});
template <Value T>
void multiply_by_activation_derivative(In<EllView<const T>> x, In<EllView<const T>> g, Activation act, EllView<T> out,
                                       const KernelOptions& options = {});
template <Value T>
void multiply_by_activation_derivative(In<TwellView<const T>> x, In<TwellView<const T>> g, Activation act, TwellView<T> out,
                                       const KernelOptions& options = {});
template <Value T>
void multiply_by_activation_derivative(In<HybridView<const T>> x, In<HybridView<const T>> g, Activation act, HybridView<T> out,
                                       const KernelOptions& options = {});

// sum |v| over stored values (fp64, deterministic) and the count of stored v != 0.
template <Value T>
double l1_norm(CsrView<const T> x, const KernelOptions& options = {});
template <Value T>
double l1_norm(EllView<const T> x, const KernelOptions& options = {});
template <Value T>
double l1_norm(TwellView<const T> x, const KernelOptions& options = {});
template <Value T>
double l1_norm(HybridView<const T> x, const KernelOptions& options = {});
template <Value T>
std::int64_t l0_norm(CsrView<const T> x, const KernelOptions& options = {});
template <Value T>
std::int64_t l0_norm(EllView<const T> x, const KernelOptions& options = {});
template <Value T>
std::int64_t l0_norm(TwellView<const T> x, const KernelOptions& options = {});
template <Value T>
std::int64_t l0_norm(HybridView<const T> x, const KernelOptions& options = {});

// Overflowed rows go to the Hybrid's dense block unless the caller asks otherwise.
inline ConvertOptions hybrid_overflow() {
  ConvertOptions o;
  o.overflow = OverflowPolicy::hybrid;
  return o;
}

// act(X W) written straight into a Hybrid of `layout` (X: M x K, W: K x N, both dense);
// |act| <= act.threshold is not stored; convert.overflow: hybrid (default), error or drop;
// convert.threshold must stay 0 (invalid_argument otherwise: act.threshold is the one that acts).
template <Value T>
HybridMatrix<T> gemm_to_sparse(DenseView<const T> x, In<DenseView<const T>> w, ActivationSpec act, TwellLayout layout,
                               const ConvertOptions& convert = hybrid_overflow(), const KernelOptions& options = {});

// The input-only operations also take mutable views.
template <Value T>
requires(!std::is_const_v<T>) CsrMatrix<T> transpose(CsrView<T> a, const KernelOptions& options = {}) {
  return transpose<T>(CsrView<const T>(a), options);
}
template <Value T>
requires(!std::is_const_v<T>) EllMatrix<T> transpose(EllView<T> a, const KernelOptions& options = {}) {
  return transpose<T>(EllView<const T>(a), options);
}
template <Value T>
requires(!std::is_const_v<T>) HybridMatrix<T> transpose(TwellView<T> a, TwellLayout layout,
                                                        const KernelOptions& options = {}) {
  return transpose<T>(TwellView<const T>(a), layout, options);
}
template <Value T>
requires(!std::is_const_v<T>) HybridMatrix<T> transpose(HybridView<T> a, TwellLayout layout,
                                                        const KernelOptions& options = {}) {
  return transpose<T>(HybridView<const T>(a), layout, options);
}
namespace detail {
// MutableView<V>::value: V is a sparse view of mutable values; Const is its read-only twin.
template <class V>
struct MutableView : std::false_type {};
template <class T>
struct MutableView<CsrView<T>> : std::bool_constant<!std::is_const_v<T>> {
  using Const = CsrView<const T>;
};
template <class T>
struct MutableView<EllView<T>> : std::bool_constant<!std::is_const_v<T>> {
  using Const = EllView<const T>;
};
template <class T>
struct MutableView<TwellView<T>> : std::bool_constant<!std::is_const_v<T>> {
  using Const = TwellView<const T>;
};
template <class T>
struct MutableView<HybridView<T>> : std::bool_constant<!std::is_const_v<T>> {
  using Const = HybridView<const T>;
};
}  // namespace detail

template <class V>
requires detail::MutableView<V>::value double l1_norm(V x, const KernelOptions& options = {}) {
  return l1_norm(typename detail::MutableView<V>::Const(x), options);
}
template <class V>
requires detail::MutableView<V>::value std::int64_t l0_norm(V x, const KernelOptions& options = {}) {
  return l0_norm(typename detail::MutableView<V>::Const(x), options);
}
template <Value T>
requires(!std::is_const_v<T>) HybridMatrix<T> gemm_to_sparse(DenseView<T> x, In<DenseView<const T>> w,
                                                             ActivationSpec act, TwellLayout layout,
                                                             const ConvertOptions& convert = hybrid_overflow(),
                                                             const KernelOptions& options = {}) {
  return gemm_to_sparse<T>(DenseView<const T>(x), w, act, layout, convert, options);
}

}  // namespace twell
