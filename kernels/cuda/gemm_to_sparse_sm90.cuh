// Internal to the cuda kernels: the Hopper (sm_90a) fused GEMM + TwELL epilogue of
// gemm_to_sparse (wgmma fed by TMA; docs/gemm_to_sparse.md, "The Hopper path"). Implemented in
// gemm_to_sparse_sm90.cu, launched by GemmToSparsePlan::run. Not installed.
#pragma once

#include <cstdint>

#include <cuda_runtime.h>

#include "twell_epilogue.cuh"

namespace twell::cuda::detail {

// The operands of one fused run: X (M x K) and W (K x N), row-major 16-bit, device pointers.
struct Sm90Gemm {
  const void* x = nullptr;
  std::int64_t ldx = 0;
  const void* w = nullptr;
  std::int64_t ldw = 0;
  std::int64_t m = 0, n = 0, k = 0;
  Activation kind = Activation::relu;
  float threshold = 0.0f;
};

// Whether the wgmma kernel for T (bf16 or fp16) and this tile (128 or 256) can run on the
// current device: compute capability 9.0, the sm_90a image of the kernel is the one the runtime
// loaded (a build without 90a code reports another binary version), the shared memory fits, and
// the driver provides cuTensorMapEncodeTiled. Host-side, a few attribute queries.
template <class T>
bool gemm_twell_sm90_available(int tile, const char* where);

// Whether one run's operands fit the kernel's preconditions (given gemm_twell_sm90_available):
// M, N, K > 0, K and N multiples of 8, leading dimensions multiples of 8 and below 2^39, and
// 16-byte aligned base pointers (TMA's global strides: multiples of 16 bytes, below 2^40 bytes;
// its 16-byte aligned addresses). The portable kernel takes what this refuses.
bool gemm_twell_sm90_applies(const Sm90Gemm& g);

// Whether the split-K decode kernel (GemmToSparsePlan with FusedMainloop::best_decode_split)
// serves an M x K x N product in TwELL tiles of `tile` on the current device, given
// gemm_twell_sm90_available<T>(tile): M <= 64, K > 448 (two K steps of 64 or more for each of
// the 4 CTAs of a tile's cluster), and all ceil(N / tile) clusters resident at once. The last is
// cudaOccupancyMaxActiveClusters, cached per device and kernel: a property of the kind of GPU
// (and its partition, under MPS or green contexts), never of its load. `own_rows`: for the
// variant that also stores its rows densely (launch_gemm_twell_sm90's own_rows). Host-side.
template <class T>
bool gemm_twell_sm90_split_applies(std::int64_t m, std::int64_t k, std::int64_t n, int tile, bool own_rows,
                                   const char* where);

// A dense 16-bit output of the kernels below: the overflow recompute's (launch_gemm_dense_sm90:
// out(i, j) = the value the TwELL epilogue would store for act(X W)(i, j), 0 where it stores
// nothing, for rows i < min(M, *m_limit); m_limit on the device, read when the kernel starts;
// null: all M rows), or the split kernel's own rows.
struct Sm90Dense {
  void* out = nullptr;  // 16-bit, 16-byte aligned, ldo a multiple of 8
  std::int64_t ldo = 0;
  const unsigned long long* m_limit = nullptr;
};

// How launch_gemm_twell_sm90 tiled the product: CTA rows, and the K parts summed per output
// (1, or 4 for the split kernel).
struct Sm90Tiling {
  int rows = 0;
  int k_parts = 1;
};

// Queues the fused kernel on `stream`: every (row, tile) slot group of o.packed is written, rows
// with an overflowed tile flagged in o.row_flags, totals added to o's accumulators, exactly as
// gemm_twell_kernel does. CTA tiles of 64 rows where tiles of 128 rows would leave most SMs idle
// (decode-sized M), else 128; the bits do not depend on that choice. With `split` (only where
// gemm_twell_sm90_split_applies), the split-K decode kernel instead: 64 rows, each output summed
// as 4 K parts added in K order, whose bits differ from the unsplit sum's in the last places.
// own_rows.out set (only with `split`, where gemm_twell_sm90_split_applies(..., true)): the split
// kernel also stores every row i < M, as the epilogue stages it (zeros included), into row i of
// own_rows (M x N; m_limit unused). Preconditions: gemm_twell_sm90_available and
// gemm_twell_sm90_applies; o.layout.tile 128 or 256.
template <class T>
Sm90Tiling launch_gemm_twell_sm90(const Sm90Gemm& g, const TwellOut& o, bool split, const Sm90Dense& own_rows,
                                  cudaStream_t stream, const char* where);

// Queues the kernel above with a dense output instead (GemmToSparsePlan's overflow recompute:
// Sm90Dense) on `stream`. Preconditions: gemm_twell_sm90_available<T>(tile) and
// gemm_twell_sm90_applies(g); tile 128 or 256, the gate's layout tile: a CTA's output is that
// wide, or 128 columns when M is small enough that 256-column tiles would leave most SMs idle.
template <class T>
void launch_gemm_dense_sm90(const Sm90Gemm& g, const Sm90Dense& d, int tile, cudaStream_t stream, const char* where);

}  // namespace twell::cuda::detail
