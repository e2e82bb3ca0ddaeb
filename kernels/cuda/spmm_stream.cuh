// Internal to kernels/cuda/spmm*.cu: the tile-streaming TwELL spmm (op none, 16-bit values) of
// spmm_stream.cu: a CTA keeps a block of C in registers and streams the tiles of A's columns and
// the matching rows of B through shared memory. Not installed.
#pragma once

#include <cstdint>
#include <span>

#include <cuda_runtime.h>

#include <twell/formats/dense.hpp>
#include <twell/formats/twell_matrix.hpp>

namespace twell::cuda::detail {

// Whether spmm_twell_stream takes these operands: 16-bit T, a non-empty product, A of at most
// INT_MAX rows, columns and slot words a row, tiles of at most 256 columns whose slot groups hold
// at least 8 slots and start 16-byte aligned (S a multiple of 4, the packed array 16-byte
// aligned), B and C 16-byte aligned with leading dimensions and B's columns multiples of 8, B's
// leading dimension below 2^39 (an sm_90a build stages B by TMA, whose strides stay below 2^40
// bytes; refused on every build and device alike, so that a forced kernel's answer does not
// depend on them), B of at most spmm_stream_max_b_cols() columns (the grid's slices), and a
// device with the shared memory for the kernel's three stages.
template <class T>
bool spmm_stream_applies(TwellView<const T> a, DenseView<const T> b, DenseView<T> c);

// The dynamic shared memory of the kernel's CTA, in bytes (for messages: spmm_stream_applies checks
// it against the device).
int spmm_stream_shared_bytes();

// The most columns of B the kernel takes: 65535 grid slices of 128 (for messages and the check).
std::int64_t spmm_stream_max_b_cols();

// The CTAs spmm_twell_stream launches for one product of `rows` rows of A and `b_cols` columns
// of B, unpaired (one per 256 x 128 block of C, all resident at once only up to one per SM).
std::int64_t spmm_stream_ctas(std::int64_t rows, std::int64_t b_cols);

// One product of spmm_twell_stream: C = alpha * A B + beta * C for the rows of A whose `shadow`
// entry is negative (every row when shadow is null); other rows of C are left untouched.
// uneven_rows: A's rows hold very unequal numbers of entries, as where A, or the matrix A was
// transposed from, is a Hybrid with overflow rows; where it stages by TMA the kernel then deals
// the rows of every product of the launch to warps by entries (deal_rows in spmm_stream.cu).
template <class T>
struct StreamProduct {
  TwellView<const T> a;
  const std::int32_t* shadow;
  DenseView<const T> b;
  DenseView<T> c;
  bool uneven_rows = false;
};

// The most products one launch of spmm_twell_stream takes.
inline constexpr int kMaxStreamBatch = 3;

// The products (1 to kMaxStreamBatch, each taken by spmm_stream_applies; A of one shape and
// layout, B of one column count) in one kernel on `stream`, no workspace. Each product's bits are
// those it gets alone; batching only fills the waves: a product's last wave of CTAs leaves SMs
// idle that the next one's CTAs take.
// pair_last_two: three products whose last two share B and shadow and whose A share one slot
// structure (counts and columns: SlotStructure::shared) run those two as one product of two value
// planes, whose CTAs own half the rows and load each entry's B row once for both planes. Each C
// has the bits it gets without the pairing.
template <class T>
void spmm_twell_stream(std::span<const StreamProduct<T>> products, float alpha, float beta, cudaStream_t stream,
                       bool pair_last_two = false);

}  // namespace twell::cuda::detail
