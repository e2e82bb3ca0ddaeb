// Internal to kernels/cuda/spmm*.cu: the weight-reuse TwELL spmm (op none) of spmm_compact.cu,
// a compaction pre-pass followed by the product. Not installed.
#pragma once

#include <cstddef>
#include <cstdint>

#include <cuda_runtime.h>

#include <twell/formats/dense.hpp>
#include <twell/formats/twell_matrix.hpp>

namespace twell::cuda::detail {

// Whether spmm_twell_compact takes these operands: 16-bit T, a non-empty product, tile 128 or
// 256, B and C 16-byte aligned with leading dimensions multiples of 8, B's columns a multiple of
// 128 (the column slice of a CTA), at most 65535 row blocks of 256 rows, and a device that grants
// 2 x (tile + 1) x 256 bytes of shared memory per block.
template <class T>
bool spmm_compact_applies(TwellView<const T> a, DenseView<const T> b, DenseView<T> c);

// Bytes of device workspace the pre-pass needs for a rows x cols TwELL of this layout (16-byte
// aligned base required). Depends on the shape and layout only, so a plan can size it once.
std::size_t spmm_compact_workspace_bytes(std::int64_t rows, std::int64_t cols, TwellLayout layout);

// C = alpha * A B + beta * C for the rows of A whose `shadow` entry is negative (every row when
// shadow is null); other rows of C are left untouched. Requires spmm_compact_applies and
// `workspace` of spmm_compact_workspace_bytes(a.rows, a.cols, a.layout) bytes, which the two
// kernels (queued on `stream`) use as scratch: it must not be in use by other queued work.
template <class T>
void spmm_twell_compact(TwellView<const T> a, const std::int32_t* shadow, DenseView<const T> b, DenseView<T> c,
                        float alpha, float beta, void* workspace, cudaStream_t stream);

}  // namespace twell::cuda::detail
