// Internal to kernels/cuda/spmm*.cu: the weight-reuse TwELL spmm (op none) of spmm_tiled.cu.
// Not installed.
#pragma once

#include <cstdint>

#include <cuda_runtime.h>

#include <twell/formats/dense.hpp>
#include <twell/formats/twell_matrix.hpp>

namespace twell::cuda::detail {

// Whether spmm_twell_tiled takes these operands: 16-bit T, a non-empty product, tile 128 or 256,
// B and C 16-byte aligned with leading dimensions multiples of 8, and B's columns a multiple of
// 128 (the column slice of a CTA).
template <class T>
bool spmm_tiled_applies(TwellView<const T> a, DenseView<const T> b, DenseView<T> c);

// C = alpha * A B + beta * C for the rows of A whose `shadow` entry is negative (every row when
// shadow is null); other rows of C are left untouched. Requires spmm_tiled_applies.
template <class T>
void spmm_twell_tiled(TwellView<const T> a, const std::int32_t* shadow, DenseView<const T> b, DenseView<T> c,
                      float alpha, float beta, cudaStream_t stream);

}  // namespace twell::cuda::detail
