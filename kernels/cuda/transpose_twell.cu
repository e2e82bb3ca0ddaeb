// cuda transpose of a 16-bit TwELL or Hybrid A (M x K) into a Hybrid A^T (K x M), directly.
//
// A CTA takes one tile of A's columns (at most 256: rows of A^T) and one block of A's rows as wide
// as the output's tile (at most 256: one (row, tile) group of A^T per column). Each thread walks
// one row's entries of the tile (its slots, or its dense row in a Hybrid) and sets the row's bit in
// a 256-bit mask per column in shared memory (atomicOr: the result does not depend on the order).
// A column's count is its mask's popcount and an entry's slot in A^T's group is the number of
// rows before it in the mask, so each group comes out in increasing row order, as the reference
// writes it, with no sort and no atomics on values. Two passes: the first finds the rows of A^T
// with a group past capacity (their largest count, one CTA's scan for their dense-block indices,
// R read back), the second fills slots and dense rows. A^T's dense rows are written whole: their
// groups keep the true count and the first entries (a Hybrid's shadow rows).
#include "transpose_twell.cuh"

#include <cub/block/block_scan.cuh>

#include <twell/error.hpp>
#include <twell/instantiate.hpp>

#include "sparse_common.cuh"

namespace twell::cuda::detail {
namespace {

constexpr const char* kWhere = "twell::cuda::transpose";
constexpr int kMaxTile = 256;          // columns of A per CTA, and rows of A per CTA (the output tile)
constexpr int kThreads = kMaxTile;     // a thread per row, then a thread per column
constexpr int kWords = kMaxTile / 32;  // words of a column's row mask
constexpr int kMapThreads = 1024;

// Calls f(column in the tile, value bits) for each entry of row m of A in tile t (16-bit values;
// +-0 is not an entry; columns past the tile are ignored).
template <class T, class F>
__device__ __forceinline__ void for_each_entry(const TwellRows<T>& a, std::int64_t m, int t, F&& f) {
  const TwellLayout layout = a.twell.layout;
  const int width = layout.tile_cols(t, a.twell.cols);
  const std::int32_t dense_row = a.shadow != nullptr ? a.shadow[m] : -1;
  if (dense_row >= 0) {
    const auto* values =
        reinterpret_cast<const std::uint16_t*>(a.dense.data + dense_row * a.dense.ld + layout.tile_begin(t));
    for (int c = 0; c < width; ++c) {
      const std::uint16_t v = values[c];
      if ((v & 0x7fffu) != 0) f(c, v);
    }
    return;
  }
  const std::uint32_t* group = a.twell.packed + layout.slot_offset(m, t, a.twell.cols);
  const std::uint32_t n = min(group[0], static_cast<std::uint32_t>(layout.capacity()));
  for (std::uint32_t s = 1; s <= n; ++s) {
    const std::uint32_t word = group[s];
    const std::uint16_t v = TwellLayout::slot_value_bits(word);
    const auto c = static_cast<int>(TwellLayout::slot_column(word));
    if ((v & 0x7fffu) != 0 && c < width) f(c, v);
  }
}

// masks[c][w] bit r: row (block row 32 w + r) of the CTA's block has an entry in column c.
template <class T>
__device__ __forceinline__ void mark_rows(const TwellRows<T>& a, int out_tile,
                                          std::uint32_t (&masks)[kMaxTile][kWords]) {
  for (int i = threadIdx.x; i < kMaxTile * kWords; i += kThreads) (&masks[0][0])[i] = 0;
  __syncthreads();
  const int r = static_cast<int>(threadIdx.x);
  const std::int64_t m = static_cast<std::int64_t>(blockIdx.x) * out_tile + r;
  if (r < out_tile && m < a.twell.rows)
    for_each_entry(a, m, static_cast<int>(blockIdx.y),
                   [&](int c, std::uint16_t) { atomicOr(&masks[c][r / 32], 1u << (r % 32)); });
  __syncthreads();
}

__device__ __forceinline__ std::uint32_t mask_count(const std::uint32_t (&mask)[kWords]) {
  std::uint32_t n = 0;
#pragma unroll
  for (int w = 0; w < kWords; ++w) n += __popc(mask[w]);
  return n;
}

// Pass 1: max_count[k] = the largest group of A^T row k (A's column k) over the row blocks.
template <class T>
__global__ void __launch_bounds__(kThreads)
    transpose_count_kernel(TwellRows<T> a, int out_tile, std::uint32_t* max_count) {
  __shared__ std::uint32_t masks[kMaxTile][kWords];
  mark_rows(a, out_tile, masks);
  const int t = static_cast<int>(blockIdx.y), c = static_cast<int>(threadIdx.x);
  if (c >= a.twell.layout.tile_cols(t, a.twell.cols)) return;
  const std::uint32_t n = mask_count(masks[c]);
  if (n > 0) atomicMax(&max_count[a.twell.layout.tile_begin(t) + c], n);
}

// One CTA: the rows of A^T past capacity get dense-block indices in increasing order; *r_out = R.
__global__ void __launch_bounds__(kMapThreads)
    transpose_map_kernel(std::int64_t k, const std::uint32_t* max_count, std::uint32_t capacity,
                         std::int32_t* row_to_overflow, std::int32_t* overflow_to_row, std::int64_t* r_out) {
  using Scan = cub::BlockScan<std::int64_t, kMapThreads>;
  __shared__ typename Scan::TempStorage scan;
  const std::int64_t per = (k + kMapThreads - 1) / kMapThreads;
  const std::int64_t begin = min(k, threadIdx.x * per), end = min(k, begin + per);
  std::int64_t mine = 0;
  for (std::int64_t j = begin; j < end; ++j) mine += max_count[j] > capacity ? 1 : 0;
  std::int64_t next = 0, total = 0;
  Scan(scan).ExclusiveSum(mine, next, total);
  for (std::int64_t j = begin; j < end; ++j) {
    const bool over = max_count[j] > capacity;
    row_to_overflow[j] = over ? static_cast<std::int32_t>(next) : -1;
    if (over) overflow_to_row[next++] = static_cast<std::int32_t>(j);
  }
  if (threadIdx.x == 0) *r_out = total;
}

// Pass 2: the slot groups of A^T for A's tile blockIdx.y and row block blockIdx.x (A^T's tile),
// and the entries of A^T's dense rows.
template <class T>
__global__ void __launch_bounds__(kThreads) transpose_fill_kernel(TwellRows<T> a, HybridView<T> out) {
  __shared__ std::uint32_t masks[kMaxTile][kWords];
  const TwellLayout layout = out.twell.layout;
  mark_rows(a, layout.tile, masks);
  const int t = static_cast<int>(blockIdx.y), r = static_cast<int>(threadIdx.x);
  const std::int64_t k0 = a.twell.layout.tile_begin(t), m = static_cast<std::int64_t>(blockIdx.x) * layout.tile + r;
  const auto cap = static_cast<std::uint32_t>(layout.capacity());
  const auto group_of = [&](int c) {
    return out.twell.packed + layout.slot_offset(k0 + c, blockIdx.x, out.twell.cols);
  };
  if (r < layout.tile && m < a.twell.rows) {
    const std::uint32_t below = (1u << (r % 32)) - 1u;
    for_each_entry(a, m, t, [&](int c, std::uint16_t v) {
      std::uint32_t rank = __popc(masks[c][r / 32] & below);
      for (int w = 0; w < r / 32; ++w) rank += __popc(masks[c][w]);
      if (rank < cap) group_of(c)[1 + rank] = TwellLayout::pack(v, static_cast<std::uint32_t>(r));
      const std::int32_t dense_row = out.row_to_overflow[k0 + c];
      if (dense_row >= 0) reinterpret_cast<std::uint16_t*>(out.overflow.data)[dense_row * out.overflow.ld + m] = v;
    });
  }
  const int c = r;
  if (c >= a.twell.layout.tile_cols(t, a.twell.cols)) return;
  std::uint32_t* group = group_of(c);
  const std::uint32_t n = mask_count(masks[c]);
  group[0] = n;
  for (int s = static_cast<int>(min(n, cap)) + 1; s < layout.slots(); ++s) group[s] = 0;
}

}  // namespace

template <class T>
bool twell_transpose_applies(TwellLayout a_layout, TwellLayout out_layout) {
  return sizeof(T) == 2 && a_layout.tile <= kMaxTile && out_layout.tile <= kMaxTile;
}

template <class T>
std::int64_t twell_transpose_count(TwellRows<T> a, TwellLayout layout, std::int32_t* row_to_overflow,
                                   std::int32_t* overflow_to_row, std::uint32_t* max_count, cudaStream_t stream) {
  require(twell_transpose_applies<T>(a.twell.layout, layout), ErrorCode::invalid_argument, kWhere,
          "the direct TwELL transpose was called on layouts it does not take");
  const std::int64_t m = a.twell.rows, k = a.twell.cols;
  const std::int64_t blocks = (m + layout.tile - 1) / layout.tile, tiles = a.twell.layout.tiles(k);
  require(blocks <= 0x7fffffffLL && tiles <= 65535 && k <= 0x7fffffffLL, ErrorCode::unsupported, kWhere, "A is ",
          shape(m, k), "; the direct transpose takes at most 2^31 - 1 row blocks and 65535 column tiles");
  if (k == 0) return 0;
  check_cuda(cudaMemsetAsync(max_count, 0, static_cast<std::size_t>(k) * sizeof(std::uint32_t), stream),
             "twell::cuda::transpose (memset)");
  if constexpr (sizeof(T) == 2) {
    if (m > 0) {
      transpose_count_kernel<T>
          <<<dim3(static_cast<unsigned>(blocks), static_cast<unsigned>(tiles)), kThreads, 0, stream>>>(a, layout.tile,
                                                                                                       max_count);
      check_launch("twell::cuda::transpose (count kernel)");
    }
  }
  Scratch r_dev(sizeof(std::int64_t), stream, kWhere);
  transpose_map_kernel<<<1, kMapThreads, 0, stream>>>(k, max_count, static_cast<std::uint32_t>(layout.capacity()),
                                                      row_to_overflow, overflow_to_row, r_dev.as<std::int64_t>());
  check_launch("twell::cuda::transpose (map kernel)");
  std::int64_t r = 0;
  check_cuda(cudaMemcpyAsync(&r, r_dev.as<std::int64_t>(), sizeof(r), cudaMemcpyDeviceToHost, stream),
             "twell::cuda::transpose (read back)");
  check_cuda(cudaStreamSynchronize(stream), "twell::cuda::transpose (synchronize)");
  return r;
}

template <class T>
void twell_transpose_fill(TwellRows<T> a, HybridView<T> out, cudaStream_t stream) {
  require(twell_transpose_applies<T>(a.twell.layout, out.twell.layout), ErrorCode::invalid_argument, kWhere,
          "the direct TwELL transpose was called on layouts it does not take");
  const std::int64_t m = a.twell.rows, k = a.twell.cols;
  if (k == 0 || m == 0) return;
  if (out.overflow.rows > 0)
    check_cuda(cudaMemsetAsync(out.overflow.data, 0,
                               static_cast<std::size_t>(out.overflow.rows * out.overflow.ld) * sizeof(T), stream),
               "twell::cuda::transpose (memset)");
  const std::int64_t blocks = (m + out.twell.layout.tile - 1) / out.twell.layout.tile;
  if constexpr (sizeof(T) == 2) {
    transpose_fill_kernel<T>
        <<<dim3(static_cast<unsigned>(blocks), static_cast<unsigned>(a.twell.layout.tiles(k))), kThreads, 0, stream>>>(
            a, out);
    check_launch("twell::cuda::transpose (fill kernel)");
  }
}

#define TWELL_INSTANTIATE(T)                                                                              \
  template bool twell_transpose_applies<T>(TwellLayout, TwellLayout);                                     \
  template std::int64_t twell_transpose_count<T>(TwellRows<T>, TwellLayout, std::int32_t*, std::int32_t*, \
                                                 std::uint32_t*, cudaStream_t);                           \
  template void twell_transpose_fill<T>(TwellRows<T>, HybridView<T>, cudaStream_t);
TWELL_FOR_EACH_VALUE_TYPE(TWELL_INSTANTIATE)
#undef TWELL_INSTANTIATE

}  // namespace twell::cuda::detail
