// Internal to kernels/cuda: the direct transpose of a 16-bit TwELL, or of a Hybrid (its TwELL rows
// and its dense rows), into a Hybrid, with no CSR in between (transpose_twell.cu). Used by
// cuda::transpose and by spmm with op(A) = A^T. Not installed.
#pragma once

#include <cstdint>

#include <cuda_runtime.h>

#include <twell/formats/dense.hpp>
#include <twell/formats/hybrid.hpp>
#include <twell/formats/twell_matrix.hpp>

namespace twell::cuda::detail {

// A (M x K): a TwELL whose rows with a shadow entry >= 0 are read from `dense` instead (a Hybrid's
// overflow block); shadow null: none.
template <class T>
struct TwellRows {
  TwellView<const T> twell;
  const std::int32_t* shadow = nullptr;
  DenseView<const T> dense{};
};

// Whether the direct transpose takes A's layout and the output's: 16-bit values, tiles of at most
// 256 columns on both sides.
template <class T>
bool twell_transpose_applies(TwellLayout a_layout, TwellLayout out_layout);

// Pass 1 of A^T (K x M) in `layout`: marks the rows of A^T (A's columns) with a (row, tile) group
// past capacity. Writes row_to_overflow (K entries: -1 or the row's index in the dense block) and
// the first R entries of overflow_to_row (room for K), using `max_count` (K words) as workspace,
// and returns R. Synchronises `stream`: R is read back.
template <class T>
std::int64_t twell_transpose_count(TwellRows<T> a, TwellLayout layout, std::int32_t* row_to_overflow,
                                   std::int32_t* overflow_to_row, std::uint32_t* max_count, cudaStream_t stream);

// Pass 2: writes `out` (K x M, the layout and maps of pass 1, an R x M dense block): every slot
// group in full (count, entries in increasing row of A, zeros), the rows of A^T past capacity also
// whole into the dense block. The result is that of the reference's transpose. Asynchronous.
template <class T>
void twell_transpose_fill(TwellRows<T> a, HybridView<T> out, cudaStream_t stream);

}  // namespace twell::cuda::detail
