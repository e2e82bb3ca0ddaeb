// Internal to the cuda kernels: the dense transpose that transpose(DenseView) and sddmm's op(B) = B
// case share. Not installed.
#pragma once

#include <cstdint>

#include <cuda_runtime.h>

#include <twell/error.hpp>

#include "cuda_launch.cuh"
#include "sparse_common.cuh"

namespace twell::cuda::detail {

// out (cols x rows) = in (rows x cols)^T for 32-bit T. CTA: one 32 x 32 tile of in, 32 x 8
// threads, staged in shared memory (33 columns: the transposed reads hit distinct banks), so that
// both the reads and the writes are coalesced along rows (128 bytes per warp row).
template <class T>
__global__ void transpose_words_kernel(const T* in, std::int64_t rows, std::int64_t cols, std::int64_t ld_in, T* out,
                                       std::int64_t ld_out) {
  ::twell::detail::wait_for_prior_grids();
  __shared__ T tile[32][33];
  const std::int64_t c0 = std::int64_t{blockIdx.x} * 32, r0 = std::int64_t{blockIdx.y} * 32;
  for (int i = static_cast<int>(threadIdx.y); i < 32; i += 8) {
    const std::int64_t r = r0 + i, c = c0 + threadIdx.x;
    if (r < rows && c < cols) tile[i][threadIdx.x] = in[r * ld_in + c];
  }
  __syncthreads();
  for (int i = static_cast<int>(threadIdx.y); i < 32; i += 8) {
    const std::int64_t oc = c0 + i, orow_col = r0 + threadIdx.x;
    if (oc < cols && orow_col < rows) out[oc * ld_out + orow_col] = tile[threadIdx.x][i];
  }
}

// The same for 16-bit T with 64 x 64 tiles: a thread moves two neighbouring values at a time, so
// a warp row is again 128 bytes (with 32 x 32 tiles of 16-bit values it was 64 bytes: the
// paper's 2048 x 5632 bf16 weight took 27-29 us on an H100, 20-25 us with 64 x 64 tiles). `pairs`: both arrays 4-byte
// aligned with even leading dimensions, so a pair is one 32-bit access; otherwise, and at a
// ragged edge, the pair's values move one by one. The staged rows are 66 values long; a warp's
// transposed reads then fall two to a bank.
// A tile wholly inside both matrices with pairs (all but the edges of a large matrix) takes an
// unrolled path whose eight loads a thread are all issued before the first is stored: in the
// general loop, whose trip count and edge checks keep it rolled, each load waited for the one
// before (one 128-byte load in flight per warp): ~20 us for the paper's 2048 x 5632 weight on an
// H200, ~2.3 TB/s of its 4.2 TB/s copy. A training step, which runs four such transposes, got
// 31-45 us shorter with this path (docs/benchmarks/history.md, "Thirty-ninth session").
template <class T>
__global__ void transpose_pairs_kernel(const T* in, std::int64_t rows, std::int64_t cols, std::int64_t ld_in, T* out,
                                       std::int64_t ld_out, bool pairs) {
  ::twell::detail::wait_for_prior_grids();
  constexpr int kTile = 64, kStep = 8;                           // rows of threads: blockDim.y
  __shared__ __align__(4) std::uint16_t tile[kTile][kTile + 2];  // rows of 33 words: pairs are 32-bit accesses
  const auto* src = reinterpret_cast<const std::uint16_t*>(in);
  auto* dst = reinterpret_cast<std::uint16_t*>(out);
  const int p = 2 * static_cast<int>(threadIdx.x), y = static_cast<int>(threadIdx.y);
  const std::int64_t c0 = std::int64_t{blockIdx.x} * kTile, r0 = std::int64_t{blockIdx.y} * kTile;
  const bool interior = pairs && r0 + kTile <= rows && c0 + kTile <= cols;
  if (interior) {
    std::uint32_t v[kTile / kStep];
    const std::uint16_t* first = src + (r0 + y) * ld_in + c0 + p;
#pragma unroll
    for (int k = 0; k < kTile / kStep; ++k)
      v[k] = *reinterpret_cast<const std::uint32_t*>(first + static_cast<std::int64_t>(k) * kStep * ld_in);
#pragma unroll
    for (int k = 0; k < kTile / kStep; ++k) *reinterpret_cast<std::uint32_t*>(&tile[y + k * kStep][p]) = v[k];
  } else {
    for (int i = y; i < kTile; i += kStep) {
      const std::int64_t r = r0 + i, c = c0 + p;
      if (r >= rows) break;
      const std::uint16_t* row = src + r * ld_in;
      if (pairs && c + 1 < cols) {
        *reinterpret_cast<std::uint32_t*>(&tile[i][p]) = *reinterpret_cast<const std::uint32_t*>(row + c);
      } else {
        if (c < cols) tile[i][p] = row[c];
        if (c + 1 < cols) tile[i][p + 1] = row[c + 1];
      }
    }
  }
  __syncthreads();
  const auto pair_at = [&](int j) {
    return static_cast<std::uint32_t>(tile[p][j]) | static_cast<std::uint32_t>(tile[p + 1][j]) << 16;
  };
  if (interior) {
    std::uint16_t* first = dst + (c0 + y) * ld_out + r0 + p;
#pragma unroll
    for (int k = 0; k < kTile / kStep; ++k)
      *reinterpret_cast<std::uint32_t*>(first + static_cast<std::int64_t>(k) * kStep * ld_out) = pair_at(y + k * kStep);
    return;
  }
  for (int j = y; j < kTile; j += kStep) {
    const std::int64_t oc = c0 + j, orow_col = r0 + p;
    if (oc >= cols) break;
    std::uint16_t* row = dst + oc * ld_out;
    if (pairs && orow_col + 1 < rows) {
      *reinterpret_cast<std::uint32_t*>(row + orow_col) = pair_at(j);
    } else {
      if (orow_col < rows) row[orow_col] = tile[p][j];
      if (orow_col + 1 < rows) row[orow_col + 1] = tile[p + 1][j];
    }
  }
}

// Queues out = in^T (in: rows x cols, leading dimension ld_in; out: cols x rows, ld_out) on
// `stream`; `where` names the caller in errors. Values are moved, never rounded.
template <class T>
void transpose_dense(const T* in, std::int64_t rows, std::int64_t cols, std::int64_t ld_in, T* out,
                     std::int64_t ld_out, cudaStream_t stream, const char* where) {
  if (rows <= 0 || cols <= 0) return;
  constexpr int kTile = sizeof(T) == 2 ? 64 : 32;
  require((rows + kTile - 1) / kTile <= 65535 && (cols + kTile - 1) / kTile <= 0x7fffffffLL, ErrorCode::unsupported,
          where, "the matrix to transpose is ", shape(rows, cols), "; the kernel's grid takes at most ",
          65535 * kTile, " rows");
  const dim3 grid(static_cast<unsigned>((cols + kTile - 1) / kTile), static_cast<unsigned>((rows + kTile - 1) / kTile));
  if constexpr (sizeof(T) == 2) {
    const bool pairs = reinterpret_cast<std::uintptr_t>(in) % 4 == 0 && reinterpret_cast<std::uintptr_t>(out) % 4 == 0 &&
                       ld_in % 2 == 0 && ld_out % 2 == 0;
    ::twell::detail::launch_kernel(where, transpose_pairs_kernel<T>, grid, dim3(32, 8), 0, stream, in, rows, cols,
                                   ld_in, out, ld_out, pairs);
  } else {
    static_assert(sizeof(T) == 4);
    ::twell::detail::launch_kernel(where, transpose_words_kernel<T>, grid, dim3(32, 8), 0, stream, in, rows, cols,
                                   ld_in, out, ld_out);
  }
}

}  // namespace twell::cuda::detail
