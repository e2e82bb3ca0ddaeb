// Fused FFN inference forward on the GPU (twell::cuda), the twin of the dense reference in
// <twell/kernels/ffn.hpp>: same signatures, device operands. The gate goes through
// gemm_to_sparse into a Hybrid; one kernel then computes, per token, the up projection only at
// the gate's nonzeros, h = gate * u, and y = h Wd, with h kept on chip (docs/gemm_to_sparse.md).
// Shapes: x is M x K; wg and wu are K x N; wd is N x K; y is M x K. Available when TWELL_HAS_CUDA.
#pragma once

#include <cstdint>

#include <twell/formats/dense.hpp>
#include <twell/formats/layout.hpp>
#include <twell/kernels/options.hpp>
#include <twell/memory.hpp>

namespace twell::cuda {

// Bound to one set of gated-FFN weights (device views that must outlive the plan) and one gate
// layout; owns Wu^T (N x K), made once here, so that the up projection at a nonzero reads a
// contiguous row instead of a strided column. forward() allocates only the gate's Hybrid.
template <Value T>
class GatedFfnPlan {
 public:
  GatedFfnPlan(DenseView<const T> wg, DenseView<const T> wu, DenseView<const T> wd, TwellLayout layout = {},
               const KernelOptions& options = {});

  // y = (act(x wg) * (x wu)) wd; x is M x K, y is M x K, both device-resident.
  void forward(DenseView<const T> x, ActivationSpec act, DenseView<T> y, const KernelOptions& options = {}) const;

  const TwellLayout& layout() const { return layout_; }

 private:
  DenseView<const T> wg_, wu_, wd_;
  TwellLayout layout_;
  DenseMatrix<T> wu_t_;  // N x K
};

// y = (act(x wg) * (x wu)) wd: builds a GatedFfnPlan (transposing Wu) and runs it once; reuse a
// plan when the weights are reused.
template <Value T>
void gated_ffn_forward(DenseView<const T> x, DenseView<const T> wg, DenseView<const T> wu, DenseView<const T> wd,
                       ActivationSpec act, DenseView<T> y, const KernelOptions& options = {});

// y = act(x wu) wd: h = gemm_to_sparse(x, wu), then the fused kernel without the up projection.
template <Value T>
void ffn_forward(DenseView<const T> x, DenseView<const T> wu, DenseView<const T> wd, ActivationSpec act,
                 DenseView<T> y, const KernelOptions& options = {});

}  // namespace twell::cuda
