// The FFN client of the sparse-activation API, composed from the public operations so that it
// runs on whichever backend holds its operands.
// Shapes: x is M x K; wg and wu are K x N; wd is N x K; y is M x K. Dense references and the
// training backward are in <twell/kernels/ffn.hpp> (twell::reference).
#pragma once

#include <twell/formats/dense.hpp>
#include <twell/formats/layout.hpp>
#include <twell/kernels/options.hpp>
#include <twell/ops.hpp>

namespace twell {

// y = (act(x wg) * (x wu)) wd, as: g = gemm_to_sparse(x, wg) (a Hybrid of `layout`: nothing is
// lost to overflow); u = sddmm(x, wu) at g's pattern; h = g * u on the pattern; y = spmm(h, wd).
// Intermediates are rounded to T (the fused kernel keeps them in fp32), so results agree with
// the dense reference to T's precision, not bit for bit.
template <Value T>
void sparse_gated_ffn_forward(In<DenseView<const T>> x, In<DenseView<const T>> wg, In<DenseView<const T>> wu,
                              In<DenseView<const T>> wd, ActivationSpec act, TwellLayout layout, DenseView<T> y,
                              const KernelOptions& options = {});

// y = act(x wu) wd, as: h = gemm_to_sparse(x, wu); y = spmm(h, wd).
template <Value T>
void sparse_ffn_forward(In<DenseView<const T>> x, In<DenseView<const T>> wu, In<DenseView<const T>> wd,
                        ActivationSpec act, TwellLayout layout, DenseView<T> y, const KernelOptions& options = {});

}  // namespace twell
