// cuda transpose of a 16-bit TwELL or Hybrid A (M x K) into a Hybrid A^T (K x M), directly.
//
// A CTA takes one tile of A's columns (at most 256: rows of A^T) and one block of A's rows as wide
// as the output's tile (at most 256: one (row, tile) group of A^T per column). Each thread walks
// one row's entries of the tile (its slots; a Hybrid's dense rows take a warp each, its lanes
// over the columns) and sets the row's bit in a 256-bit mask per column in shared memory
// (atomicOr: the result does not depend on the order).
// A column's count is its mask's popcount and an entry's slot in A^T's group is the number of
// rows before it in the mask, so each group comes out in increasing row order, as the reference
// writes it, with no sort and no atomics on values. The CTA builds its groups in shared memory
// (output layouts of at most 32 slots) and writes them out whole: written from each thread, a
// group's words 4 KB apart from the next thread's, that fill alone took 111 us at M = 16384 on an
// H100, against 46 us for this whole pass.
// Groups past capacity keep the true count and the first entries (a Hybrid's shadow rows); one CTA
// then gives the rows of A^T with such a group their dense-block indices (R), and a second, light
// pass writes those rows whole once the caller has allocated the block: from A^T's groups where
// they fit, walking A again only in CTAs that hold a group past capacity.
#include "transpose_twell.cuh"

#include <cstdint>

#include <cub/block/block_scan.cuh>

#include <twell/error.hpp>
#include <twell/instantiate.hpp>

#include "cuda_launch.cuh"
#include "sparse_common.cuh"

namespace twell::cuda::detail {
namespace {

constexpr const char* kWhere = "twell::cuda::transpose";
constexpr int kMaxTile = 256;           // columns of A per CTA, and rows of A per CTA (the output tile)
constexpr int kThreads = kMaxTile;      // a thread per row (a warp per dense row), then a thread per column
constexpr int kWords = kMaxTile / 32;   // words of a column's row mask
constexpr int kMaskPitch = kWords + 1;  // a column's mask in shared memory: thread c reads column c conflict-free
constexpr int kMaxSlots = 32;  // slots of an output group: a CTA's groups fit in shared memory, a lane per slot
constexpr int kMapThreads = 1024;

template <class T>
__device__ __forceinline__ bool is_dense_row(const TwellRows<T>& a, std::int64_t m) {
  return a.shadow != nullptr && a.shadow[m] >= 0;
}

// The first words of a thread's TwELL row group in one tile (its count, then its first entries),
// loaded once: the groups kernel walks a row's entries twice (marking, then placing), and a second
// walk through global memory found the first's words in L1 3 % of the time (H200, training step,
// M = 16384: the loads of the two walks held 49 % of the groups kernel's stall samples). A group
// of 0.5 % density and 256 columns holds 1.3 entries on average; 8 words cover a warp's longest
// row nearly always.
constexpr int kHeadWords = 8;
struct GroupHead {
  const std::uint32_t* group = nullptr;
  std::uint32_t words[kHeadWords] = {};  // words[0] 0: nothing to walk (no row, or a dense row)
};

// Row m's group in tile t, its first words loaded together (none past the group).
template <class T>
__device__ __forceinline__ GroupHead load_group_head(const TwellRows<T>& a, std::int64_t m, int t) {
  GroupHead head;
  const TwellLayout layout = a.twell.layout;
  head.group = a.twell.packed + layout.slot_offset(m, t, a.twell.cols);
  const int slots = layout.slots();
#pragma unroll
  for (int i = 0; i < kHeadWords; ++i)
    if (i < slots) head.words[i] = head.group[i];
  return head;
}

// Calls f(column in the tile, value bits) for each entry of the row group `head` of A in tile t
// (16-bit values; +-0 is not an entry; columns past the tile are ignored): entries past the head
// are loaded here.
template <class T, class F>
__device__ __forceinline__ void for_each_slot_entry(const TwellRows<T>& a, const GroupHead& head, int t, F&& f) {
  const TwellLayout layout = a.twell.layout;
  const int width = layout.tile_cols(t, a.twell.cols);
  const std::uint32_t n = min(head.words[0], static_cast<std::uint32_t>(layout.capacity()));
  const auto visit = [&](std::uint32_t word) {
    const std::uint16_t v = TwellLayout::slot_value_bits(word);
    const auto c = static_cast<int>(TwellLayout::slot_column(word));
    if ((v & 0x7fffu) != 0 && c < width) f(c, v);
  };
#pragma unroll
  for (std::uint32_t s = 1; s < kHeadWords; ++s)
    if (s <= n) visit(head.words[s]);
  for (std::uint32_t s = kHeadWords; s <= n; ++s) visit(head.group[s]);
}

// Calls f(row in the block, column in the tile, value bits) for each entry of the dense rows
// among A's rows row0 + [0, rows) in tile t: a warp per dense row, its lanes over the columns,
// the CTA's dense rows dealt to its warps in turn. A thread per dense row, walking it whole, set
// the CTA's length (H100, token-skewed training step, M = 16384: the groups kernel took 114-117 us
// against 50 on uniform rows; 73 us with the warps, 2026-11-27), and so does a warp whose 32
// rows hold more dense rows than the others'. A lane reads its 8 columns of a row with one
// 16-byte load where the dense block allows it (rows 16-byte aligned, tiles in 8s; in a tile of
// fewer than 256 columns the lanes past it idle): with a 2-byte load per column, each dense row of
// a 256-column tile cost its warp 8 loads in two dependent batches, and at M = 4096,
// token-skewed, 91 % of the groups and dense-rows kernels' warps walked dense rows, their stall
// samples on those loads (H200, Nsight Compute, 2026-11-30). Every thread of the CTA calls it
// (it synchronises the CTA); the order of the calls is not fixed (the callers' results do not
// depend on it).
template <class T, class F>
__device__ __forceinline__ void for_each_dense_entry(const TwellRows<T>& a, std::int64_t row0, int rows, int t, F&& f) {
  if (a.shadow == nullptr) return;
  constexpr int kWarps = kThreads / 32;
  static_assert(kThreads <= 256, "a row in the block fits in a byte");
  __shared__ std::uint8_t dense[kMaxTile];  // the CTA's dense rows, rows in the block
  __shared__ int warp_dense[kWarps];
  const int r = static_cast<int>(threadIdx.x), lane = r % 32, warp = r / 32;
  const std::int64_t m = row0 + r;
  const bool mine = r < rows && m < a.twell.rows && a.shadow[m] >= 0;
  const unsigned ballot = __ballot_sync(0xffffffffu, mine);
  if (lane == 0) warp_dense[warp] = __popc(ballot);
  __syncthreads();
  int before = 0, count = 0;
#pragma unroll
  for (int w = 0; w < kWarps; ++w) {
    before += w < warp ? warp_dense[w] : 0;
    count += warp_dense[w];
  }
  if (mine) dense[before + __popc(ballot & ((1u << lane) - 1u))] = static_cast<std::uint8_t>(r);
  __syncthreads();
  const TwellLayout layout = a.twell.layout;
  const int width = layout.tile_cols(t, a.twell.cols);
  const std::int64_t c0 = layout.tile_begin(t);
  const bool quads =
      a.dense.ld % 8 == 0 && layout.tile % 8 == 0 && reinterpret_cast<std::uintptr_t>(a.dense.data) % 16 == 0;
  const int first = 8 * lane;  // the lane's columns with 16-byte loads
  for (int i = warp; i < count; i += kWarps) {
    const int rr = dense[i];
    const auto* values =
        reinterpret_cast<const std::uint16_t*>(a.dense.data + std::int64_t{a.shadow[row0 + rr]} * a.dense.ld + c0);
    const auto visit = [&](int c, std::uint16_t v) {
      if ((v & 0x7fffu) != 0) f(rr, c, v);
    };
    if (quads && first + 8 <= width) {
      const uint4 q = *reinterpret_cast<const uint4*>(values + first);
      const std::uint32_t words[4] = {q.x, q.y, q.z, q.w};
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        visit(first + 2 * i, static_cast<std::uint16_t>(words[i] & 0xffffu));
        visit(first + 2 * i + 1, static_cast<std::uint16_t>(words[i] >> 16));
      }
    } else if (quads) {  // the lane's part of a ragged last tile (nothing for lanes past the tile)
      for (int c = first; c < width; ++c) visit(c, values[c]);
    } else {
      for (int c = lane; c < width; c += 32) visit(c, values[c]);
    }
  }
}

// Thread r's row row0 + r of A in tile t, if it is among A's rows row0 + [0, rows) and not a dense
// row (an empty head otherwise).
template <class T>
__device__ __forceinline__ GroupHead load_block_head(const TwellRows<T>& a, std::int64_t row0, int rows, int t) {
  const int r = static_cast<int>(threadIdx.x);
  const std::int64_t m = row0 + r;
  return r < rows && m < a.twell.rows && !is_dense_row(a, m) ? load_group_head(a, m, t) : GroupHead{};
}

// Calls f(row in the block, column in the tile, value bits) for each entry of A's rows
// row0 + [0, rows) in tile t: thread r walks row r's slots from its head (load_block_head), the
// dense rows take a warp each (for_each_dense_entry). Every thread of the CTA calls it.
template <class T, class F>
__device__ __forceinline__ void for_each_block_entry(const TwellRows<T>& a, const GroupHead& head, std::int64_t row0,
                                                     int rows, int t, F&& f) {
  const int r = static_cast<int>(threadIdx.x);
  for_each_slot_entry(a, head, t, [&](int c, std::uint16_t v) { f(r, c, v); });
  for_each_dense_entry(a, row0, rows, t, f);
}

__device__ __forceinline__ std::uint32_t mask_count(const std::uint32_t (&mask)[kMaskPitch]) {
  std::uint32_t n = 0;
#pragma unroll
  for (int w = 0; w < kWords; ++w) n += __popc(mask[w]);
  return n;
}

// Writes the CTA's groups (groups[c * slots + s], columns [0, width) of A, built by the kernel
// below) into A^T's rows k0 + c, its column tile blockIdx.x: slot 0 the count, slots
// 1..min(count, cap) the entries, zeros past them (written here rather than zeroed in shared
// memory first). Where a group is whole 16-byte quads (slots a multiple of 4, A^T's words 16-byte
// aligned), a lane writes a quad and a warp 32 / quads columns at once: with a lane per slot, the
// 16 slots of the training step's layout left half of each warp's lanes idle, and the write-out
// kept ~6 M of the kernel's 14.5 M instructions (ncu, H200, 2026-11-29: the other phases took
// 8.3 M in an earlier profile). Otherwise a warp per column, a lane per slot. Branch-free either
// way: a first form that chose each word through nested conditions compiled to branches (11.4 M
// instructions in the write-out).
template <class T>
__device__ __forceinline__ void write_groups(const TwellView<T>& out, const std::uint32_t* groups, std::int64_t k0,
                                             int width, std::uint32_t cap) {
  const int slots = out.layout.slots(), lane = static_cast<int>(threadIdx.x) % 32;
  const int warp = static_cast<int>(threadIdx.x) / 32, warps = kThreads / 32;
  const std::int64_t pw = out.layout.packed_width(out.cols);
  std::uint32_t* dst = out.packed + k0 * pw + static_cast<std::int64_t>(blockIdx.x) * slots;
  if (slots % 4 == 0 && reinterpret_cast<std::uintptr_t>(out.packed) % 16 == 0) {
    const int quads = slots / 4, per_warp = 32 / quads, q = lane % quads, sub = lane / quads;
    if (sub >= per_warp) return;
    for (int c = warp * per_warp + sub; c < width; c += warps * per_warp) {
      const std::uint32_t used = min(groups[c * slots], cap);  // slot 0 is the count: always "used"
      uint4 v = reinterpret_cast<const uint4*>(groups + c * slots)[q];
      const auto first = static_cast<std::uint32_t>(4 * q);
      v.x = first <= used ? v.x : 0u;
      v.y = first + 1 <= used ? v.y : 0u;
      v.z = first + 2 <= used ? v.z : 0u;
      v.w = first + 3 <= used ? v.w : 0u;
      reinterpret_cast<uint4*>(dst + c * pw)[q] = v;
    }
    return;
  }
  const auto slot = static_cast<std::uint32_t>(lane);
  for (int c = warp; c < width; c += warps) {
    const std::uint32_t used = min(groups[c * slots], cap);
    const std::uint32_t word = groups[c * slots + static_cast<int>(min(slot, used))];  // a written slot
    if (lane < slots) dst[c * pw + lane] = slot <= used ? word : 0u;
  }
}

// Pass 1: the slot groups of A^T for A's column tile blockIdx.y and row block blockIdx.x (A^T's
// column tile), built in shared memory and written out whole, so that a warp's stores are
// contiguous; max_count[k] = the largest group of A^T's row k.
template <class T>
__global__ void __launch_bounds__(kThreads)
    transpose_groups_kernel(TwellRows<T> a, TwellView<T> out, std::uint32_t* max_count) {
  ::twell::detail::wait_for_prior_grids();
  // masks[c][w] bit i: row 32 w + i of the CTA's block has an entry in column c.
  __shared__ std::uint32_t masks[kMaxTile][kMaskPitch];
  // groups[c * slots + s]: slot s of column c's group (a count, then the entries that fit).
  __shared__ alignas(16) std::uint32_t groups[kMaxTile * kMaxSlots];
  const TwellLayout layout = out.layout;
  const int slots = layout.slots(), t = static_cast<int>(blockIdx.y), r = static_cast<int>(threadIdx.x);
  const auto cap = static_cast<std::uint32_t>(layout.capacity());
  const int width = a.twell.layout.tile_cols(t, a.twell.cols);
  const std::int64_t k0 = a.twell.layout.tile_begin(t), row0 = static_cast<std::int64_t>(blockIdx.x) * layout.tile;
  // In flight while the masks are zeroed.
  const GroupHead head = load_block_head(a, row0, layout.tile, t);
  for (int i = r; i < kMaxTile * kMaskPitch; i += kThreads) (&masks[0][0])[i] = 0;
  __syncthreads();
  for_each_block_entry(a, head, row0, layout.tile, t,
                       [&](int row, int c, std::uint16_t) { atomicOr(&masks[c][row / 32], 1u << (row % 32)); });
  __syncthreads();
  if (r < width) {  // column r's count
    const std::uint32_t n = mask_count(masks[r]);
    groups[r * slots] = n;
    if (n > 0) atomicMax(&max_count[k0 + r], n);
  }
  // An entry's slot: the rows of its column marked before its own. Every rank below a column's
  // count is placed once, so slots 1..min(count, cap) are all written.
  const auto place = [&](int row, int c, std::uint16_t v) {
    std::uint32_t rank = __popc(masks[c][row / 32] & ((1u << (row % 32)) - 1u));
    for (int w = 0; w < row / 32; ++w) rank += __popc(masks[c][w]);
    if (rank < cap)
      groups[c * slots + 1 + static_cast<int>(rank)] = TwellLayout::pack(v, static_cast<std::uint32_t>(row));
  };
  for_each_block_entry(a, head, row0, layout.tile, t, place);
  __syncthreads();
  write_groups(out, groups, k0, width, cap);
}

// One CTA: the rows of A^T past capacity get dense-block indices in increasing order; *r_out = R.
__global__ void __launch_bounds__(kMapThreads)
    transpose_map_kernel(std::int64_t k, const std::uint32_t* max_count, std::uint32_t capacity,
                         std::int32_t* row_to_overflow, std::int32_t* overflow_to_row, std::int64_t* r_out) {
  ::twell::detail::wait_for_prior_grids();
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

// Pass 2: the entries of A^T's dense rows in the CTA's block into the dense block. A dense row's
// groups within capacity are whole in A^T's slots (pass 1), so a thread per column copies them;
// only a CTA holding a group past capacity walks its rows of A again (a thread per row, a warp per
// dense row), as every CTA did before: a row of A^T is dense for its fullest group, and most of
// its groups fit (H200, training step, M = 4096, token-skewed, 2026-11-29: this pass took 22.7 us
// a product, the groups pass 32; the step's A/B did not separate the change from its noise).
template <class T>
__global__ void __launch_bounds__(kThreads) transpose_dense_kernel(TwellRows<T> a, HybridView<T> out) {
  ::twell::detail::wait_for_prior_grids();
  const int t = static_cast<int>(blockIdx.y), tile = out.twell.layout.tile, c = static_cast<int>(threadIdx.x);
  const std::int64_t k0 = a.twell.layout.tile_begin(t), row0 = static_cast<std::int64_t>(blockIdx.x) * tile;
  // Entry (A's row row0 + row) of A^T's dense row at_row.
  const auto store = [&, dense = reinterpret_cast<std::uint16_t*>(out.overflow.data)](std::int32_t at_row, int row,
                                                                                      std::uint16_t v) {
    dense[at_row * out.overflow.ld + row0 + row] = v;
  };
  const std::int32_t my_row = c < a.twell.layout.tile_cols(t, a.twell.cols) ? out.row_to_overflow[k0 + c] : -1;
  const std::uint32_t* group =
      my_row >= 0 ? out.twell.packed +
                        out.twell.layout.slot_offset(k0 + c, static_cast<std::int64_t>(blockIdx.x), out.twell.cols)
                  : nullptr;
  const std::uint32_t n = group != nullptr ? group[0] : 0u,
                      cap = static_cast<std::uint32_t>(out.twell.layout.capacity());
  if (__syncthreads_or(n > cap) == 0) {
    for (std::uint32_t s = 1; s <= n; ++s) {
      const std::uint32_t word = group[s];
      store(my_row, static_cast<int>(TwellLayout::slot_column(word)), TwellLayout::slot_value_bits(word));
    }
    return;
  }
  const auto put = [&](int row, int col, std::uint16_t v) {
    const std::int32_t at_row = out.row_to_overflow[k0 + col];
    if (at_row >= 0) store(at_row, row, v);
  };
  for_each_block_entry(a, load_block_head(a, row0, tile, t), row0, tile, t, put);
}

}  // namespace

template <class T>
bool twell_transpose_applies(TwellLayout a_layout, std::int64_t m, std::int64_t k, TwellLayout out_layout) {
  if (sizeof(T) != 2 || a_layout.tile > kMaxTile || out_layout.tile > kMaxTile || out_layout.slots() > kMaxSlots)
    return false;
  const std::int64_t blocks = (m + out_layout.tile - 1) / out_layout.tile;
  return blocks <= 0x7fffffffLL && a_layout.tiles(k) <= 65535 && k <= 0x7fffffffLL;
}

template <class T>
void twell_transpose_groups(TwellRows<T> a, TwellView<T> out, std::int32_t* row_to_overflow,
                            std::int32_t* overflow_to_row, std::uint32_t* max_count, std::int64_t* r_device,
                            cudaStream_t stream) {
  const std::int64_t m = a.twell.rows, k = a.twell.cols;
  require(twell_transpose_applies<T>(a.twell.layout, m, k, out.layout), ErrorCode::invalid_argument, kWhere,
          "the direct TwELL transpose was called on operands it does not take (A is ", shape(m, k), ")");
  const std::int64_t blocks = (m + out.layout.tile - 1) / out.layout.tile, tiles = a.twell.layout.tiles(k);
  ::twell::detail::fill_bytes_async(max_count, 0, static_cast<std::size_t>(k) * sizeof(std::uint32_t), stream,
                                    "twell::cuda::transpose (fill)");
  if constexpr (sizeof(T) == 2) {
    if (m > 0 && k > 0) {
      ::twell::detail::launch_kernel("twell::cuda::transpose (groups kernel)", transpose_groups_kernel<T>,
                                     dim3(static_cast<unsigned>(blocks), static_cast<unsigned>(tiles)), kThreads, 0,
                                     stream, a, out, max_count);
    }
  }
  ::twell::detail::launch_kernel("twell::cuda::transpose (map kernel)", transpose_map_kernel, 1, kMapThreads, 0, stream,
                                 k, max_count, static_cast<std::uint32_t>(out.layout.capacity()), row_to_overflow,
                                 overflow_to_row, r_device);
}

template <class T>
void twell_transpose_dense_rows(TwellRows<T> a, HybridView<T> out, cudaStream_t stream) {
  const std::int64_t m = a.twell.rows, k = a.twell.cols;
  if (out.overflow.rows == 0 || m == 0) return;
  ::twell::detail::fill_bytes_async(out.overflow.data, 0,
                                    static_cast<std::size_t>(out.overflow.rows * out.overflow.ld) * sizeof(T), stream,
                                    "twell::cuda::transpose (fill)");
  if constexpr (sizeof(T) == 2) {
    const std::int64_t blocks = (m + out.twell.layout.tile - 1) / out.twell.layout.tile;
    ::twell::detail::launch_kernel("twell::cuda::transpose (dense rows kernel)", transpose_dense_kernel<T>,
                                   dim3(static_cast<unsigned>(blocks), static_cast<unsigned>(a.twell.layout.tiles(k))),
                                   kThreads, 0, stream, a, out);
  }
}

#define TWELL_INSTANTIATE(T)                                                                                        \
  template bool twell_transpose_applies<T>(TwellLayout, std::int64_t, std::int64_t, TwellLayout);                   \
  template void twell_transpose_groups<T>(TwellRows<T>, TwellView<T>, std::int32_t*, std::int32_t*, std::uint32_t*, \
                                          std::int64_t*, cudaStream_t);                                             \
  template void twell_transpose_dense_rows<T>(TwellRows<T>, HybridView<T>, cudaStream_t);
TWELL_FOR_EACH_VALUE_TYPE(TWELL_INSTANTIATE)
#undef TWELL_INSTANTIATE

}  // namespace twell::cuda::detail
