// Internal to kernels/cuda/spmm*.cu: the slice-reuse TwELL spmm (op none) of spmm_slices.cu, a
// pre-pass that turns A into register-sized row chunks and copies B slice-major, followed by the
// product. Not installed.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>

#include <cuda_runtime.h>

#include <twell/formats/dense.hpp>
#include <twell/formats/twell_matrix.hpp>

namespace twell::cuda::detail {

// Whether spmm_twell_slices takes these operands: 16-bit T, a non-empty product, A with at most
// 2^25 rows and 65534 columns, tiles of at most 256 columns and at most 128 tiles, at most 2048
// entries per row (capacity x tiles), B and C 16-byte aligned with leading dimensions multiples
// of 8, a device that stages two 8-column (else 4-column) slices of B in shared memory
// (2 x (K + 2) x 16 bytes, else x 8, plus 12 KB), B's columns a multiple of that slice width, and
// fewer than 2^31 work items (row groups the shape allows x slices).
template <class T>
bool spmm_slices_applies(TwellView<const T> a, DenseView<const T> b, DenseView<T> c);

// Bytes of device workspace the pre-pass writes for a rows x cols TwELL of this layout (16-byte
// aligned base required): per row, room for the lanes its capacity allows (ceil(capacity x tiles
// / 32) lanes of 32 entry words and 8 bytes of descriptor; about A's packed size) plus tiles + 4
// bytes. Depends on the shape and layout only, so a plan can size it once.
std::size_t spmm_slices_workspace_bytes(std::int64_t rows, std::int64_t cols, TwellLayout layout);

// Bytes of the slice-major copy of B (cols rows of A's columns, b_cols columns of B) the pre-pass
// writes: b_cols x (cols + 2) x 2, 16-byte aligned base required.
std::size_t spmm_slices_staged_b_bytes(std::int64_t cols, std::int64_t b_cols);

// C = alpha * A B + beta * C for the rows of A whose `shadow` entry is negative (every row when
// shadow is null); other rows of C are left untouched. Requires spmm_slices_applies, `workspace`
// of spmm_slices_workspace_bytes(a.rows, a.cols, a.layout) bytes and `staged_b` of
// spmm_slices_staged_b_bytes(a.cols, b.cols) bytes, which the three kernels (queued on `stream`)
// use as scratch: neither may be in use by other queued work. `before_product`, when set, is
// called once between queuing the pre-pass and the product (e.g. to make the product wait for
// work on another stream that ran beside the pre-pass). With `b_staged`, `staged_b` holds this
// B's slice-major copy already, from an earlier pre-pass on the same B and A's column count that
// the product is ordered after: the pre-pass does not copy B, and only reads of it are allowed.
template <class T>
void spmm_twell_slices(TwellView<const T> a, const std::int32_t* shadow, DenseView<const T> b, DenseView<T> c,
                       float alpha, float beta, void* workspace, void* staged_b, cudaStream_t stream,
                       const std::function<void()>& before_product = {}, bool b_staged = false);

}  // namespace twell::cuda::detail
