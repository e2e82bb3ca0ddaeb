// Internal to kernels/cuda: the direct transpose of a 16-bit TwELL, or of a Hybrid (its TwELL rows
// and its dense rows), into a Hybrid, with no CSR in between (transpose_twell.cu). Used by
// cuda::transpose and by spmm with op(A) = A^T. Not installed.
#pragma once

#include <cstdint>
#include <span>

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

template <class T>
TwellRows<T> twell_rows(TwellView<const T> a) {
  return {a};
}
template <class T>
TwellRows<T> twell_rows(HybridView<const T> a) {
  return {a.twell, a.overflow.rows > 0 ? a.row_to_overflow : nullptr, a.overflow};
}

// Whether the direct transpose takes an M x K A of `a_layout` into `out_layout`: 16-bit values,
// tiles of at most 256 columns on both sides, at most 32 slots per output group, and a grid that
// fits (at most 65535 column tiles of A, 2^31 - 1 blocks of A's rows in the output's tile, K at
// most 2^31 - 1).
// Where it does not, the callers take the CSR route.
template <class T>
bool twell_transpose_applies(TwellLayout a_layout, std::int64_t m, std::int64_t k, TwellLayout out_layout);

// The most value planes one transpose takes.
inline constexpr int kMaxTransposePlanes = 3;

// Pass 1 of A^T (K x M) into `out` (K x M in its layout): every slot group in full (the true count,
// the first entries in increasing row of A, zeros); which rows of A^T have a group past capacity
// (row_to_overflow: K entries, -1 or the row's index in the dense block; the first R entries of
// overflow_to_row, room for K); R into *r_device. `max_count`: K + 1 words of workspace.
// Asynchronous.
// With several value planes a[p] (A's of one shape and layout, out[p] each plane's A^T), plane 0
// gives the structure (its counts and columns, its dense rows) and the others must share it: an
// entry of every plane's A^T is a slot or dense-row column where any plane holds one (a value
// other than +-0), so a plane's A^T may hold +-0 values; all planes' A^T share the counts and
// row_to_overflow. Where a plane's counts, columns or dense rows differ from plane 0's, R is -1
// (the groups are then plane 0's structure with each plane's values at its slots).
template <class T>
void twell_transpose_groups(std::span<const TwellRows<T>> a, std::span<const TwellView<T>> out,
                            std::int32_t* row_to_overflow, std::int32_t* overflow_to_row, std::uint32_t* max_count,
                            std::int64_t* r_device, cudaStream_t stream);

// Pass 2: the rows of A^T past capacity, whole, into out's R x M dense block (zeroed here), with
// the maps of pass 1 and the groups it wrote into out.twell (read as pass 1 left them: their
// counts say which groups fit). Together the two passes give the reference transpose. Planes
// transposed together go in one call (a[p] and out[p]: each plane's A and A^T, their dense blocks
// of one shape, the maps shared): a plane's dense rows then hold its value wherever some plane
// holds an entry, +-0 included, as its slots do. Asynchronous.
template <class T>
void twell_transpose_dense_rows(std::span<const TwellRows<T>> a, std::span<const HybridView<T>> out,
                                cudaStream_t stream);

}  // namespace twell::cuda::detail
