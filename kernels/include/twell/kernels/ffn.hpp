// Dense reference FFN (CPU): the oracle for the sparse FFN client and for the fused GPU kernels.
// Storage is T at the boundary; every product, activation and sum inside is fp32, rounded once.
//
// Shapes: x is M x K; wg and wu are K x N; wd is N x K; y and dy are M x K.
// The activation includes its threshold: a = act(g), and |a| <= act.threshold counts as zero,
// exactly as gemm_to_sparse stores it. The pattern P is the set of entries where a is stored.
#pragma once

#include <cstdint>
#include <vector>

#include <twell/formats/dense.hpp>
#include <twell/kernels/options.hpp>

namespace twell {

// What a sparse FFN forward found in its gate, when the caller asks (it costs a host sync).
struct FfnStats {
  std::int64_t tokens = 0;
  std::int64_t nnz = 0;                // gate nonzeros the up/down projection consumed
  std::int32_t max_row_nnz = 0;
  std::vector<std::int32_t> row_nnz;   // per token
  std::int64_t overflow_rows = 0;      // R: tokens with an overflowed (row, tile), gated densely
  std::int64_t overflow_capacity = 0;  // rows of the overflow block the run had
  // Overflow rows past that capacity, max(0, R - capacity): their gate rows were recomputed
  // densely inside the FFN kernel (exact, but slow); the plan's block has now grown to hold them.
  std::int64_t fallback_rows = 0;
  // Tokens whose up/down work the GPU's block kernel split into parts run by several CTAs (more
  // than 64 gate entries, more than a resident CTA's share of the batch's entries and more than
  // twice the batch's mean or 256; docs/gemm_to_sparse.md, "Heavy tokens"); 0 elsewhere.
  std::int64_t split_rows = 0;
};

template <Value T>
struct GatedFfnGradients {
  DenseMatrix<T> dx;     // M x K
  DenseMatrix<T> dwg;    // K x N
  DenseMatrix<T> dwu;    // K x N
  DenseMatrix<T> dwd;    // N x K
  double l1_term = 0.0;  // lambda * sum(|h|) / Z, the L1 part of the loss
  double z = 0.0;        // the normalisation Z used: M (per_token) or M * N (per_entry)
};

}  // namespace twell

namespace twell::reference {

// Gated: y = (act(x wg) * (x wu)) wd.
template <Value T>
void gated_ffn_forward(DenseView<const T> x, DenseView<const T> wg, DenseView<const T> wu, DenseView<const T> wd,
                       ActivationSpec act, DenseView<T> y, const KernelOptions& options = {});

// Non-gated: y = act(x wu) wd.
template <Value T>
void ffn_forward(DenseView<const T> x, DenseView<const T> wu, DenseView<const T> wd, ActivationSpec act, DenseView<T> y,
                 const KernelOptions& options = {});

// Backward of the gated block for the loss L = <y, dy> + lambda * sum(|h|) / Z, with g = x wg,
// u = x wu, a = act(g) (thresholded), h = a * u:
//   dh  = (dy wd^T) on P + lambda / Z * sign(h)      (sign(0) = 0)
//   dwd = h^T dy
//   dg  = dh * u * act'(g) on P,  du = dh * a on P    (zero outside P)
//   dx  = dg wg^T + du wu^T,  dwg = x^T dg,  dwu = x^T du
// For ReLU, act' = 1 on P, which gives DESIGN.md's dg = dh * u and du = dh * g. At g exactly 0
// ReLU gives a = 0, which is outside P, so no gradient flows there (the subgradient taken is 0);
// the threshold likewise acts as a hard mask. lambda must be finite and >= 0.
template <Value T>
GatedFfnGradients<T> gated_ffn_backward(DenseView<const T> x, DenseView<const T> wg, DenseView<const T> wu,
                                        DenseView<const T> wd, DenseView<const T> dy, ActivationSpec act, float lambda,
                                        L1Normalization norm, const KernelOptions& options = {});

}  // namespace twell::reference
