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
// Value planes: up to kMaxTransposePlanes matrices of one slot structure (the training backward's
// h, dg and du, all in the gate's slots) transpose together: one walk marks the entries of any
// plane, so every plane's A^T gets the same groups and dense rows, and one placement writes every
// plane's values. Plane 0's words are built in shared memory, the other planes' values beside
// them, and each plane's groups are written out from those.
#include "transpose_twell.cuh"

#include <cstdint>
#include <span>
#include <type_traits>

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
constexpr int kMaskBytes = kMaxTile * kMaskPitch * 4;

// The groups kernel's shared memory for `planes` planes of `slots` slots: the column masks, plane
// 0's group words, the other planes' values (16 bits a slot).
std::size_t groups_shared_bytes(int planes, int slots) {
  return kMaskBytes + static_cast<std::size_t>(kMaxTile * slots) * (4 + 2 * (planes - 1));
}

// The planes of one launch (kernel parameters): plane 0 gives the structure.
template <class T, int P>
struct PlaneRows {
  TwellRows<T> plane[P];
};
template <class T, int P>
struct PlaneOut {
  TwellView<T> plane[P];
};
template <class T, int P>
struct PlaneDense {
  HybridView<T> plane[P];
};

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

// Whether any plane's value bits are an entry (+-0 is none).
template <int P>
__device__ __forceinline__ bool any_entry(const std::uint16_t (&v)[P]) {
  bool any = false;
#pragma unroll
  for (int p = 0; p < P; ++p) any = any || (v[p] & 0x7fffu) != 0;
  return any;
}

// Calls f(column in the tile, value bits of each plane) for each slot of the planes' row groups
// `heads` in tile t where some plane holds an entry (columns past the tile are ignored; plane 0's
// count and columns): entries past the heads are loaded here. Returns whether another plane's
// count or columns differ from plane 0's.
template <class T, int P, class F>
__device__ __forceinline__ bool for_each_slot_entry(const PlaneRows<T, P>& a, const GroupHead (&heads)[P], int t,
                                                    F&& f) {
  const TwellLayout layout = a.plane[0].twell.layout;
  const int width = layout.tile_cols(t, a.plane[0].twell.cols);
  const std::uint32_t n = min(heads[0].words[0], static_cast<std::uint32_t>(layout.capacity()));
  bool differs = false;
#pragma unroll
  for (int p = 1; p < P; ++p) differs = differs || heads[p].words[0] != heads[0].words[0];
  const auto visit = [&](const std::uint32_t(&words)[P]) {
    std::uint16_t v[P];
    const auto c = static_cast<int>(TwellLayout::slot_column(words[0]));
#pragma unroll
    for (int p = 0; p < P; ++p) {
      v[p] = TwellLayout::slot_value_bits(words[p]);
      differs = differs || static_cast<int>(TwellLayout::slot_column(words[p])) != c;
    }
    if (any_entry(v) && c < width) f(c, v);
  };
#pragma unroll
  for (std::uint32_t s = 1; s < kHeadWords; ++s) {
    if (s > n) break;
    std::uint32_t words[P];
#pragma unroll
    for (int p = 0; p < P; ++p) words[p] = heads[p].words[s];
    visit(words);
  }
  for (std::uint32_t s = kHeadWords; s <= n; ++s) {
    std::uint32_t words[P];
#pragma unroll
    for (int p = 0; p < P; ++p) words[p] = heads[p].group[s];
    visit(words);
  }
  return differs;
}

// Calls f(row in the block, column in the tile, value bits of each plane) for each column of the
// dense rows among A's rows row0 + [0, rows) in tile t where some plane holds an entry (plane 0's
// dense rows; each plane's row through its own shadow): a warp per dense row, its lanes over the
// columns, the CTA's dense rows dealt to its warps in turn. A thread per dense row, walking it
// whole, set the CTA's length (H100, token-skewed training step, M = 16384: the groups kernel took
// 114-117 us against 50 on uniform rows; 73 us with the warps, 2026-11-27), and so does a warp
// whose 32 rows hold more dense rows than the others'. A lane reads its 8 columns of a row with
// one 16-byte load where every plane's dense block allows it (rows 16-byte aligned, tiles in 8s;
// in a tile of fewer than 256 columns the lanes past it idle): with a 2-byte load per column, each
// dense row of a 256-column tile cost its warp 8 loads in two dependent batches, and at M = 4096,
// token-skewed, 91 % of the groups and dense-rows kernels' warps walked dense rows, their stall
// samples on those loads (H200, Nsight Compute, 2026-11-30). Every thread of the CTA calls it (it
// synchronises the CTA); the order of the calls is not fixed (the callers' results do not depend
// on it).
template <class T, int P, class F>
__device__ __forceinline__ void for_each_dense_entry(const PlaneRows<T, P>& a, std::int64_t row0, int rows, int t,
                                                     F&& f) {
  const TwellRows<T>& first_plane = a.plane[0];
  if (first_plane.shadow == nullptr) return;
  constexpr int kWarps = kThreads / 32;
  static_assert(kThreads <= 256, "a row in the block fits in a byte");
  __shared__ std::uint8_t dense[kMaxTile];  // the CTA's dense rows, rows in the block
  __shared__ int warp_dense[kWarps];
  const int r = static_cast<int>(threadIdx.x), lane = r % 32, warp = r / 32;
  const std::int64_t m = row0 + r;
  const bool mine = r < rows && m < first_plane.twell.rows && first_plane.shadow[m] >= 0;
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
  const TwellLayout layout = first_plane.twell.layout;
  const int width = layout.tile_cols(t, first_plane.twell.cols);
  const std::int64_t c0 = layout.tile_begin(t);
  bool quads = layout.tile % 8 == 0;
#pragma unroll
  for (int p = 0; p < P; ++p)
    quads = quads && a.plane[p].dense.ld % 8 == 0 && reinterpret_cast<std::uintptr_t>(a.plane[p].dense.data) % 16 == 0;
  const int first = 8 * lane;  // the lane's columns with 16-byte loads
  for (int i = warp; i < count; i += kWarps) {
    const int rr = dense[i];
    // Each plane's row, null where the row is not dense in that plane (a structure the groups
    // kernel refuses; read as zeros meanwhile).
    const std::uint16_t* values[P];
#pragma unroll
    for (int p = 0; p < P; ++p) {
      const std::int32_t at = p == 0 || a.plane[p].shadow != nullptr ? a.plane[p].shadow[row0 + rr] : -1;
      values[p] = at >= 0 ? reinterpret_cast<const std::uint16_t*>(a.plane[p].dense.data) +
                                std::int64_t{at} * a.plane[p].dense.ld + c0
                          : nullptr;
    }
    const auto visit = [&](int c, const std::uint16_t(&v)[P]) {
      if (any_entry(v)) f(rr, c, v);
    };
    const auto visit_column = [&](int c) {
      std::uint16_t v[P];
#pragma unroll
      for (int p = 0; p < P; ++p) v[p] = values[p] != nullptr ? values[p][c] : std::uint16_t{0};
      visit(c, v);
    };
    if (quads && first + 8 <= width) {
      uint4 q[P];
#pragma unroll
      for (int p = 0; p < P; ++p)
        q[p] = values[p] != nullptr ? *reinterpret_cast<const uint4*>(values[p] + first) : make_uint4(0, 0, 0, 0);
#pragma unroll
      for (int j = 0; j < 8; ++j) {
        std::uint16_t v[P];
#pragma unroll
        for (int p = 0; p < P; ++p) {
          const std::uint32_t words[4] = {q[p].x, q[p].y, q[p].z, q[p].w};
          v[p] = static_cast<std::uint16_t>(words[j / 2] >> (16 * (j % 2)));
        }
        visit(first + j, v);
      }
    } else if (quads) {  // the lane's part of a ragged last tile (nothing for lanes past the tile)
      for (int c = first; c < width; ++c) visit_column(c);
    } else {
      for (int c = lane; c < width; c += 32) visit_column(c);
    }
  }
}

// Thread r's row row0 + r of A in tile t in each plane, if it is among A's rows row0 + [0, rows)
// and not a dense row of plane 0 (empty heads otherwise).
template <class T, int P>
__device__ __forceinline__ void load_block_heads(const PlaneRows<T, P>& a, std::int64_t row0, int rows, int t,
                                                 GroupHead (&heads)[P]) {
  const int r = static_cast<int>(threadIdx.x);
  const std::int64_t m = row0 + r;
  const bool live = r < rows && m < a.plane[0].twell.rows && !is_dense_row(a.plane[0], m);
#pragma unroll
  for (int p = 0; p < P; ++p) heads[p] = live ? load_group_head(a.plane[p], m, t) : GroupHead{};
}

// Whether thread r's row of the block is a dense row in some plane but not in all.
template <class T, int P>
__device__ __forceinline__ bool dense_rows_differ(const PlaneRows<T, P>& a, std::int64_t row0, int rows) {
  const int r = static_cast<int>(threadIdx.x);
  const std::int64_t m = row0 + r;
  bool differs = false;
  if (r < rows && m < a.plane[0].twell.rows) {
#pragma unroll
    for (int p = 1; p < P; ++p) differs = differs || is_dense_row(a.plane[p], m) != is_dense_row(a.plane[0], m);
  }
  return differs;
}

// Calls f(row in the block, column in the tile, value bits of each plane) for each entry of A's
// rows row0 + [0, rows) in tile t (a slot or dense-row column where some plane holds an entry):
// thread r walks row r's slots from its heads (load_block_heads), the dense rows take a warp each
// (for_each_dense_entry). Every thread of the CTA calls it. Returns whether thread r's row has
// another slot structure in some plane than in plane 0.
template <class T, int P, class F>
__device__ __forceinline__ bool for_each_block_entry(const PlaneRows<T, P>& a, const GroupHead (&heads)[P],
                                                     std::int64_t row0, int rows, int t, F&& f) {
  const int r = static_cast<int>(threadIdx.x);
  const bool differs = for_each_slot_entry(a, heads, t, [&](int c, const std::uint16_t(&v)[P]) { f(r, c, v); });
  for_each_dense_entry(a, row0, rows, t, f);
  return differs;
}

__device__ __forceinline__ std::uint32_t mask_count(const std::uint32_t* mask) {
  std::uint32_t n = 0;
#pragma unroll
  for (int w = 0; w < kWords; ++w) n += __popc(mask[w]);
  return n;
}

// Writes the CTA's groups (words[c * slots + s], columns [0, width) of A, built by the kernel
// below, with `values` in place of the words' value bits for slots 1 and on, unless null) into
// A^T's rows k0 + c, its column tile blockIdx.x: slot 0 the count, slots 1..min(count, cap) the
// entries, zeros past them (written here rather than zeroed in shared memory first). Where a group
// is whole 16-byte quads (slots a multiple of 4, A^T's words 16-byte aligned), a lane writes a
// quad and a warp 32 / quads columns at once: with a lane per slot, the 16 slots of the training
// step's layout left half of each warp's lanes idle, and the write-out kept ~6 M of the kernel's
// 14.5 M instructions (ncu, H200, 2026-11-29: the other phases took 8.3 M in an earlier profile).
// Otherwise a warp per column, a lane per slot. Branch-free either way: a first form that chose
// each word through nested conditions compiled to branches (11.4 M instructions in the write-out).
template <class T>
__device__ __forceinline__ void write_groups(const TwellView<T>& out, const std::uint32_t* words,
                                             const std::uint16_t* values, std::int64_t k0, int width,
                                             std::uint32_t cap) {
  const int slots = out.layout.slots(), lane = static_cast<int>(threadIdx.x) % 32;
  const int warp = static_cast<int>(threadIdx.x) / 32, warps = kThreads / 32;
  const std::int64_t pw = out.layout.packed_width(out.cols);
  std::uint32_t* dst = out.packed + k0 * pw + static_cast<std::int64_t>(blockIdx.x) * slots;
  // Slot s's word (s in 1..used): its row from `words`, its value from `values` where given.
  const auto entry = [&](std::uint32_t word, int at) {
    return values == nullptr ? word : TwellLayout::pack(values[at], TwellLayout::slot_column(word));
  };
  if (slots % 4 == 0 && reinterpret_cast<std::uintptr_t>(out.packed) % 16 == 0) {
    const int quads = slots / 4, per_warp = 32 / quads, q = lane % quads, sub = lane / quads;
    if (sub >= per_warp) return;
    for (int c = warp * per_warp + sub; c < width; c += warps * per_warp) {
      const std::uint32_t used = min(words[c * slots], cap);  // slot 0 is the count: always "used"
      const int at = c * slots + 4 * q;
      uint4 v = reinterpret_cast<const uint4*>(words + c * slots)[q];
      const auto first = static_cast<std::uint32_t>(4 * q);
      v.x = first == 0 ? v.x : first <= used ? entry(v.x, at) : 0u;
      v.y = first + 1 <= used ? entry(v.y, at + 1) : 0u;
      v.z = first + 2 <= used ? entry(v.z, at + 2) : 0u;
      v.w = first + 3 <= used ? entry(v.w, at + 3) : 0u;
      reinterpret_cast<uint4*>(dst + c * pw)[q] = v;
    }
    return;
  }
  const auto slot = static_cast<std::uint32_t>(lane);
  for (int c = warp; c < width; c += warps) {
    const std::uint32_t used = min(words[c * slots], cap);
    const int at = c * slots + static_cast<int>(min(slot, used));  // a written slot
    const std::uint32_t word = slot == 0 ? words[at] : entry(words[at], at);
    if (lane < slots) dst[c * pw + lane] = slot <= used ? word : 0u;
  }
}

// Pass 1: the slot groups of every plane's A^T for A's column tile blockIdx.y and row block
// blockIdx.x (A^T's column tile), built in shared memory (groups_shared_bytes) and written out
// whole, so that a warp's stores are contiguous; max_count[k] = the largest group of A^T's row k;
// max_count[K] nonzero where a plane's slot structure differs from plane 0's.
template <class T, int P>
__global__ void __launch_bounds__(kThreads)
    transpose_groups_kernel(PlaneRows<T, P> a, PlaneOut<T, P> out, std::uint32_t* max_count) {
  ::twell::detail::wait_for_prior_grids();
  extern __shared__ __align__(16) unsigned char smem[];
  // masks[c * kMaskPitch + w] bit i: row 32 w + i of the CTA's block has an entry in column c.
  auto* masks = reinterpret_cast<std::uint32_t*>(smem);
  const TwellLayout layout = out.plane[0].layout;
  const int slots = layout.slots(), t = static_cast<int>(blockIdx.y), r = static_cast<int>(threadIdx.x);
  // words[c * slots + s]: slot s of column c's group in plane 0 (a count, then the entries that
  // fit); values[(p - 1) * kMaxTile * slots + c * slots + s]: plane p's value there.
  auto* words = reinterpret_cast<std::uint32_t*>(smem + kMaskBytes);
  auto* values = reinterpret_cast<std::uint16_t*>(words + kMaxTile * slots);
  const auto cap = static_cast<std::uint32_t>(layout.capacity());
  const TwellRows<T>& first_plane = a.plane[0];
  const int width = first_plane.twell.layout.tile_cols(t, first_plane.twell.cols);
  const std::int64_t k0 = first_plane.twell.layout.tile_begin(t),
                     row0 = static_cast<std::int64_t>(blockIdx.x) * layout.tile;
  // In flight while the masks are zeroed.
  GroupHead heads[P];
  load_block_heads(a, row0, layout.tile, t, heads);
  for (int i = r; i < kMaxTile * kMaskPitch; i += kThreads) masks[i] = 0;
  __syncthreads();
  bool differs = for_each_block_entry(a, heads, row0, layout.tile, t, [&](int row, int c, const std::uint16_t(&)[P]) {
    atomicOr(&masks[c * kMaskPitch + row / 32], 1u << (row % 32));
  });
  if constexpr (P > 1) differs = differs || dense_rows_differ(a, row0, layout.tile);
  if (__syncthreads_or(differs) != 0 && r == 0) max_count[first_plane.twell.cols] = 1u;
  if (r < width) {  // column r's count
    const std::uint32_t n = mask_count(masks + r * kMaskPitch);
    words[r * slots] = n;
    if (n > 0) atomicMax(&max_count[k0 + r], n);
  }
  // An entry's slot: the rows of its column marked before its own. Every rank below a column's
  // count is placed once, so slots 1..min(count, cap) are all written.
  const auto place = [&](int row, int c, const std::uint16_t(&v)[P]) {
    const std::uint32_t* mask = masks + c * kMaskPitch;
    std::uint32_t rank = __popc(mask[row / 32] & ((1u << (row % 32)) - 1u));
    for (int w = 0; w < row / 32; ++w) rank += __popc(mask[w]);
    if (rank < cap) {
      const int at = c * slots + 1 + static_cast<int>(rank);
      words[at] = TwellLayout::pack(v[0], static_cast<std::uint32_t>(row));
#pragma unroll
      for (int p = 1; p < P; ++p) values[(p - 1) * kMaxTile * slots + at] = v[p];
    }
  };
  for_each_block_entry(a, heads, row0, layout.tile, t, place);
  __syncthreads();
#pragma unroll
  for (int p = 0; p < P; ++p)
    write_groups(out.plane[p], words, p == 0 ? nullptr : values + (p - 1) * kMaxTile * slots, k0, width, cap);
}

// One CTA: the rows of A^T past capacity get dense-block indices in increasing order; *r_out = R,
// or -1 where the groups kernel found planes of different slot structures (max_count[k] nonzero).
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
  if (threadIdx.x == 0) *r_out = max_count[k] != 0 ? -1 : total;
}

// Pass 2: the entries of A^T's dense rows in the CTA's block into the dense blocks of every
// plane. A dense row's groups within capacity are whole in A^T's slots (pass 1), so a thread per
// column copies them from each plane's slots; only a CTA holding a group past capacity walks its
// rows of A again (a thread per row, a warp per dense row), as every CTA did before: a row of A^T
// is dense for its fullest group, and most of its groups fit (H200, training step, M = 4096,
// token-skewed, 2026-11-29: this pass took 22.7 us a product, the groups pass 32; the step's A/B
// did not separate the change from its noise). The walk visits an entry of any plane and writes
// each plane's value there, +-0 included, as the planes' slots hold them. One launch for the
// planes: a launch a plane took ~10 us each in the token-skewed training step at M = 4096 (~36 us at 16384),
// latency more than work; one for three made the step 0.7-0.9 % faster at M = 4096 and 0.2 % at
// 16384 (H200, 2026-11-30, docs/benchmarks/diagnostics/h200-2026-11-30p-dense-rows-planes.md).
template <class T, int P>
__global__ void __launch_bounds__(kThreads) transpose_dense_kernel(PlaneRows<T, P> a, PlaneDense<T, P> out) {
  ::twell::detail::wait_for_prior_grids();
  const TwellRows<T>& rows = a.plane[0];
  const HybridView<T>& first = out.plane[0];
  const int t = static_cast<int>(blockIdx.y), tile = first.twell.layout.tile, c = static_cast<int>(threadIdx.x);
  const std::int64_t k0 = rows.twell.layout.tile_begin(t), row0 = static_cast<std::int64_t>(blockIdx.x) * tile;
  // Plane p's entry (A's row row0 + row) of A^T's dense row at_row.
  const auto store = [&](int p, std::int32_t at_row, int row, std::uint16_t v) {
    const DenseView<T>& dense = out.plane[p].overflow;
    reinterpret_cast<std::uint16_t*>(dense.data)[at_row * dense.ld + row0 + row] = v;
  };
  const std::int32_t my_row = c < rows.twell.layout.tile_cols(t, rows.twell.cols) ? first.row_to_overflow[k0 + c] : -1;
  // The planes' groups share the offset (one layout and shape).
  const std::int64_t group =
      my_row >= 0 ? first.twell.layout.slot_offset(k0 + c, static_cast<std::int64_t>(blockIdx.x), first.twell.cols)
                  : -1;
  const std::uint32_t n = group >= 0 ? first.twell.packed[group] : 0u,
                      cap = static_cast<std::uint32_t>(first.twell.layout.capacity());
  if (__syncthreads_or(n > cap) == 0) {
    for (std::uint32_t s = 1; s <= n; ++s) {
#pragma unroll
      for (int p = 0; p < P; ++p) {
        const std::uint32_t word = out.plane[p].twell.packed[group + s];
        store(p, my_row, static_cast<int>(TwellLayout::slot_column(word)), TwellLayout::slot_value_bits(word));
      }
    }
    return;
  }
  const auto put = [&](int row, int col, const std::uint16_t(&v)[P]) {
    const std::int32_t at_row = first.row_to_overflow[k0 + col];
    if (at_row < 0) return;
#pragma unroll
    for (int p = 0; p < P; ++p) store(p, at_row, row, v[p]);
  };
  GroupHead heads[P];
  load_block_heads(a, row0, tile, t, heads);
  for_each_block_entry(a, heads, row0, tile, t, put);
}

// Calls f(std::integral_constant<int, P>{}) with P = planes, 1 to kMaxTransposePlanes.
template <class F>
void with_plane_count(std::size_t planes, F&& f) {
  static_assert(kMaxTransposePlanes == 3);
  require(planes >= 1 && planes <= 3, ErrorCode::invalid_argument, kWhere, "1 to 3 planes, not ", planes);
  if (planes == 1) f(std::integral_constant<int, 1>{});
  if (planes == 2) f(std::integral_constant<int, 2>{});
  if (planes == 3) f(std::integral_constant<int, 3>{});
}

// The first P views as a launch's planes (PlaneRows, PlaneOut or PlaneDense).
template <class Planes, int P, class View>
Planes first_planes(std::span<const View> views) {
  Planes planes{};
  for (int p = 0; p < P; ++p) planes.plane[p] = views[static_cast<std::size_t>(p)];
  return planes;
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
void twell_transpose_groups(std::span<const TwellRows<T>> a, std::span<const TwellView<T>> out,
                            std::int32_t* row_to_overflow, std::int32_t* overflow_to_row, std::uint32_t* max_count,
                            std::int64_t* r_device, cudaStream_t stream) {
  require(!a.empty() && a.size() <= kMaxTransposePlanes && out.size() == a.size(), ErrorCode::invalid_argument, kWhere,
          "the direct TwELL transpose takes 1 to ", kMaxTransposePlanes, " planes, each with its output; given ",
          a.size(), " and ", out.size());
  const TwellRows<T>& first = a.front();
  const std::int64_t m = first.twell.rows, k = first.twell.cols;
  const TwellLayout layout = out.front().layout;
  for (std::size_t p = 0; p < a.size(); ++p)
    require(twell_transpose_applies<T>(a[p].twell.layout, m, k, layout) && a[p].twell.rows == m &&
                a[p].twell.cols == k && a[p].twell.layout == first.twell.layout && out[p].layout == layout &&
                out[p].rows == k && out[p].cols == m,
            ErrorCode::invalid_argument, kWhere,
            "the direct TwELL transpose was called on operands it does not take (A is ", shape(m, k), ", plane ", p,
            " ", shape(a[p].twell.rows, a[p].twell.cols), ")");
  const std::int64_t blocks = (m + layout.tile - 1) / layout.tile, tiles = first.twell.layout.tiles(k);
  ::twell::detail::fill_bytes_async(max_count, 0, static_cast<std::size_t>(k + 1) * sizeof(std::uint32_t), stream,
                                    "twell::cuda::transpose (fill)");
  if constexpr (sizeof(T) == 2) {
    if (m > 0 && k > 0)
      with_plane_count(a.size(), [&]<int P>(std::integral_constant<int, P>) {
        auto kernel = transpose_groups_kernel<T, P>;
        const std::size_t shared = groups_shared_bytes(P, layout.slots());
        // Past the default 48 KB only with two or three planes of 32 slots.
        if (shared > 48 * 1024)
          ::twell::detail::allow_dynamic_shared(kernel, shared, "twell::cuda::transpose (cudaFuncSetAttribute)");
        ::twell::detail::launch_kernel("twell::cuda::transpose (groups kernel)", kernel,
                                       dim3(static_cast<unsigned>(blocks), static_cast<unsigned>(tiles)), kThreads,
                                       shared, stream, first_planes<PlaneRows<T, P>, P>(a),
                                       first_planes<PlaneOut<T, P>, P>(out), max_count);
      });
  }
  ::twell::detail::launch_kernel("twell::cuda::transpose (map kernel)", transpose_map_kernel, 1, kMapThreads, 0, stream,
                                 k, max_count, static_cast<std::uint32_t>(layout.capacity()), row_to_overflow,
                                 overflow_to_row, r_device);
}

template <class T>
void twell_transpose_dense_rows(std::span<const TwellRows<T>> a, std::span<const HybridView<T>> out,
                                cudaStream_t stream) {
  require(!a.empty() && a.size() <= kMaxTransposePlanes && out.size() == a.size(), ErrorCode::invalid_argument, kWhere,
          "the dense rows of 1 to ", kMaxTransposePlanes, " planes, each with its output; given ", a.size(), " and ",
          out.size());
  const std::int64_t m = a.front().twell.rows, k = a.front().twell.cols;
  if (out.front().overflow.rows == 0 || m == 0) return;
  for (const HybridView<T>& plane : out)
    ::twell::detail::fill_bytes_async(plane.overflow.data, 0,
                                      static_cast<std::size_t>(plane.overflow.rows * plane.overflow.ld) * sizeof(T),
                                      stream, "twell::cuda::transpose (fill)");
  if constexpr (sizeof(T) == 2) {
    const std::int64_t blocks = (m + out.front().twell.layout.tile - 1) / out.front().twell.layout.tile;
    with_plane_count(a.size(), [&]<int P>(std::integral_constant<int, P>) {
      ::twell::detail::launch_kernel(
          "twell::cuda::transpose (dense rows kernel)", transpose_dense_kernel<T, P>,
          dim3(static_cast<unsigned>(blocks), static_cast<unsigned>(a.front().twell.layout.tiles(k))), kThreads, 0,
          stream, first_planes<PlaneRows<T, P>, P>(a), first_planes<PlaneDense<T, P>, P>(out));
    });
  }
}

#define TWELL_INSTANTIATE(T)                                                                                           \
  template bool twell_transpose_applies<T>(TwellLayout, std::int64_t, std::int64_t, TwellLayout);                      \
  template void twell_transpose_groups<T>(std::span<const TwellRows<T>>, std::span<const TwellView<T>>, std::int32_t*, \
                                          std::int32_t*, std::uint32_t*, std::int64_t*, cudaStream_t);                 \
  template void twell_transpose_dense_rows<T>(std::span<const TwellRows<T>>, std::span<const HybridView<T>>,           \
                                              cudaStream_t);
TWELL_FOR_EACH_VALUE_TYPE(TWELL_INSTANTIATE)
#undef TWELL_INSTANTIATE

}  // namespace twell::cuda::detail
