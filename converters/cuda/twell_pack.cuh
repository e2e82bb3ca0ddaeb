// The kernels that write TwELL (from dense rows, or from sorted CSR / ELL rows) and the host
// steps around them: overflow read-back under error / drop, and the assembly of a hybrid
// (scan of the per-row overflow flags, maps, dense overflow block).
#pragma once

#include <cstdint>
#include <limits>
#include <type_traits>
#include <utility>

#include "common.cuh"
#include "cuda_launch.cuh"
#include "packing.cuh"
#include "rows.cuh"
#include "slot_group.cuh"

namespace twell::cuda::detail {

// Pairs a warp of dense_to_twell_kernel takes at once: their first chunks are all loaded before
// any is packed, so a lane has kDensePairsPerWarp 16-byte loads in flight instead of one.
constexpr int kDensePairsPerWarp = 4;
// Resident blocks per SM the register allocation must allow (at most 80 registers a thread):
// 24 warps with four 16-byte loads a lane in flight is 48 KB per SM (one load a lane at 40 warps,
// before, was 20 KB), which covers DRAM latency at full bandwidth.
constexpr int kDenseMinBlocks = 3;

// Lane's kPerLane consecutive candidates from columns [j0, j0 + kPerLane) of a tile of n columns
// starting at `in`: one 16-byte streaming load when kVector and the chunk is whole, else scalar
// loads with zeros past n.
template <class T, bool kVector, int kPerLane>
__device__ inline void load_candidates(const T* in, int j0, int n, T (&v)[kPerLane]) {
  if (kVector && j0 + kPerLane <= n) {
    const uint4 raw = __ldcs(reinterpret_cast<const uint4*>(in + j0));  // read once: evict first
    static_assert(sizeof raw == sizeof v);
    memcpy(&v, &raw, sizeof v);
  } else {
#pragma unroll
    for (int k = 0; k < kPerLane; ++k) v[k] = j0 + k < n ? in[j0 + k] : T{};
  }
}

template <class T, int kPerLane>
__device__ inline int pack_candidates(TileSlots<T> slots, int capacity, int count, int j0, int n,
                                      const T (&v)[kPerLane], float threshold) {
  std::uint32_t local_col[kPerLane];
  unsigned stored = 0;
#pragma unroll
  for (int k = 0; k < kPerLane; ++k) {
    local_col[k] = static_cast<std::uint32_t>(j0 + k);
    if (j0 + k < n && is_stored(v[k], threshold)) stored |= 1u << k;
  }
  return pack_chunk<T, kPerLane>(slots, capacity, count, stored, v, local_col);
}

// dense -> TwELL, the performance path. A warp owns groups of kDensePairsPerWarp consecutive
// (row, tile) pairs in row-major order, grid-stride over groups, so no two warps touch the same
// slots and nothing synchronises globally. Per chunk of 32 * kPerLane columns a lane owns kPerLane
// consecutive columns, read with one 16-byte load (kVector) or scalar loads (ragged tail, or
// kVector false), ranked by popc + warp scan in pack_chunk; the first chunk of every pair of a
// group is loaded before the group is packed (memory-level parallelism: the kernel is bound by
// the dense read). Every slot of every pair is written (entries, slot 0, zero padding), so the
// output needs no zero fill. Preconditions: device operands; kVector needs data and
// ld * sizeof(T) 16-byte aligned (tile_begin is then aligned too, as tile is a multiple of 8);
// value_plane is non-null exactly for fp32. Benchmark: bench/suites/convert.cpp.
template <class T, bool kVector>
__global__ void __launch_bounds__(kBlockThreads, kDenseMinBlocks)
    dense_to_twell_kernel(DenseView<const T> src, TwellLayout layout, std::int64_t tiles, std::uint32_t* packed,
                          T* value_plane, float threshold, OverflowTarget overflow) {
  ::twell::detail::wait_for_prior_grids();
  constexpr int kPerLane = 16 / static_cast<int>(sizeof(T));
  constexpr int kChunk = kWarpSize * kPerLane;
  constexpr int kGroup = kDensePairsPerWarp;
  const int lane = lane_id();
  const int j_lane = lane * kPerLane;
  const int slot_count = layout.slots();
  const int capacity = layout.capacity();
  const std::int64_t pairs = src.rows * tiles;
  const std::int64_t groups = (pairs + kGroup - 1) / kGroup;
  std::int64_t held = 0;
  for (std::int64_t g = global_warp(); g < groups; g += warp_count()) {
    const std::int64_t p0 = g * kGroup;
    const std::int64_t row0 = p0 / tiles;
    const std::int64_t t0 = p0 - row0 * tiles;
    T first[kGroup][kPerLane];
#pragma unroll
    for (int b = 0; b < kGroup; ++b) {
      std::int64_t row = row0;
      std::int64_t t = t0 + b;
      while (t >= tiles) {
        t -= tiles;
        ++row;
      }
      if (p0 + b < pairs)
        load_candidates<T, kVector>(src.data + row * src.ld + layout.tile_begin(t), j_lane,
                                    layout.tile_cols(t, src.cols), first[b]);
    }
#pragma unroll
    for (int b = 0; b < kGroup; ++b) {
      const std::int64_t p = p0 + b;
      if (p >= pairs) break;  // warp-uniform
      std::int64_t row = row0;
      std::int64_t t = t0 + b;
      while (t >= tiles) {
        t -= tiles;
        ++row;
      }
      const int n = layout.tile_cols(t, src.cols);
      const T* in = src.data + row * src.ld + layout.tile_begin(t);
      const std::int64_t off = layout.slot_offset(row, t, src.cols);
      const TileSlots<T> slots{packed + off, value_plane != nullptr ? value_plane + off : nullptr};
      int count = pack_candidates<T, kPerLane>(slots, capacity, 0, j_lane, n, first[b], threshold);
      for (int c0 = kChunk; c0 < n; c0 += kChunk) {
        T v[kPerLane];
        load_candidates<T, kVector>(in, c0 + j_lane, n, v);
        count = pack_candidates<T, kPerLane>(slots, capacity, count, c0 + j_lane, n, v, threshold);
      }
      held += finish_tile(slots, slot_count, capacity, count, row, p, overflow);
    }
  }
  if (overflow.counters != nullptr) add_count(&overflow.counters->nnz, held);
}

// TwellLayout's per-row quantities, computed once on the host for the tiled kernel (its
// accessors divide).
struct TwellGeometry {
  std::int64_t cols = 0;   // N
  std::int64_t width = 0;  // packed words per row
  int tiles = 0;
  int slots = 0;
  int capacity = 0;
};

inline TwellGeometry twell_geometry(TwellLayout layout, std::int64_t cols) {
  return {cols, layout.packed_width(cols), static_cast<int>(layout.tiles(cols)), layout.slots(), layout.capacity()};
}

// Resident blocks per SM of dense_to_twell_tiles_kernel (at most 64 registers a thread): its time
// goes to the loads, so it wants many warps with a little in flight each rather than few with much
// (an H100 run of an earlier, full-warp version: 4 blocks with 2 tiles in flight per warp, 2004
// GB/s, beat 3 blocks x 4 tiles, 1879, and 2 x 8, 1571).
constexpr int kTilesMinBlocks = 4;

// Lane's chunk of kPerLane (16 or 8) 16-bit values of one tile: columns col0 .. of a tile of
// `cols` columns starting at `in` (16-byte aligned); 16-byte streaming loads when the chunk is
// whole, zeros past the tile's end otherwise.
template <class T, int kPerLane>
__device__ __forceinline__ LaneChunk<kPerLane> load_chunk(const T* in, int col0, int cols) {
  LaneChunk<kPerLane> c;
  const T* p = in + col0;
  if (col0 + kPerLane <= cols) {
#pragma unroll
    for (int i = 0; i < kPerLane / 8; ++i) {
      const uint4 v = __ldcs(reinterpret_cast<const uint4*>(p) + i);  // read once: evict first
      c.w[4 * i] = v.x, c.w[4 * i + 1] = v.y, c.w[4 * i + 2] = v.z, c.w[4 * i + 3] = v.w;
    }
  } else {
#pragma unroll
    for (int k = 0; k < kPerLane / 2; ++k) {
      const std::uint32_t lo = col0 + 2 * k < cols ? ValueTraits<T>::to_bits(p[2 * k]) : 0u;
      const std::uint32_t hi = col0 + 2 * k + 1 < cols ? ValueTraits<T>::to_bits(p[2 * k + 1]) : 0u;
      c.w[k] = lo | (hi << 16);
    }
  }
  return c;
}

// A walk over (row, tile) pairs in row-major order over the rows first, first + row_step, ...
// Rows are 32-bit (the launch checks that they, ld and the packed width fit): unsigned, so that a
// walk past the last row stays above it instead of wrapping negative.
struct PairWalk {
  std::uint32_t row;
  int tile;
  __device__ void advance(int tiles, std::uint32_t row_step) {
    if (++tile == tiles) {
      tile = 0;
      row += row_step;
    }
  }
};

// dense -> TwELL, the fast path for 16-bit values and tiles of kTile = 256 or 128 columns. A warp
// owns whole rows (grid-stride) and walks their (row, tile) pairs in order, two at a time: half-warp
// h packs pairs h, h + 2, ...; a lane holds kTile / 16 consecutive columns of its half's tile (two
// or one 16-byte streaming loads) and pack_slot_groups (the same code as gemm_to_sparse's
// epilogue) writes both slot groups. The loads of the next pair are in flight while the current
// one is packed, and the loop is not unrolled, so the code stays in the instruction cache; index
// arithmetic is a few adds per pair, no division. Stored flags by the 16-bit bit rule at
// threshold 0 (kZeroThreshold), else through is_stored. Every slot of every (row, tile) is
// written. Preconditions: device operands, 16-bit T, layout.tile == kTile, rows, ld and the packed
// width at most 2^31 - 1, src.data and src.ld * sizeof(T) 16-byte aligned. Benchmark:
// bench/suites/convert.cpp.
template <class T, int kTile, bool kZeroThreshold>
__global__ void __launch_bounds__(kBlockThreads, kTilesMinBlocks)
    dense_to_twell_tiles_kernel(DenseView<const T> src, TwellGeometry geo, std::uint32_t* packed, float threshold,
                                OverflowTarget overflow) {
  ::twell::detail::wait_for_prior_grids();
  constexpr int kPerLane = kTile / 16;
  const int lane = lane_id();
  const int col0 = (lane & 15) * kPerLane;
  const bool clamp = overflow.policy == OverflowPolicy::drop;
  const auto warps = static_cast<std::uint32_t>(warp_count());
  // 32-bit index math: a row's offset is one 32 x 32 -> 64-bit multiply.
  const auto rows = static_cast<std::uint32_t>(src.rows);
  const auto ld = static_cast<std::uint32_t>(src.ld);
  const auto width = static_cast<std::uint32_t>(geo.width);
  // Only the last tile of a row can be narrower: one 32-bit compare per use instead of 64-bit math.
  const int last_width = static_cast<int>(geo.cols - static_cast<std::int64_t>(geo.tiles - 1) * kTile);
  const auto tile_width = [&](const PairWalk& p) { return p.tile == geo.tiles - 1 ? last_width : kTile; };
  const auto load = [&](const PairWalk& p) {
    return p.row < rows ? load_chunk<T, kPerLane>(src.data + static_cast<std::uint64_t>(p.row) * ld + p.tile * kTile,
                                                  col0, tile_width(p))
                        : LaneChunk<kPerLane>{};
  };
  const auto step = [&](PairWalk& p) {  // to the half's next pair: two along the warp's walk
    p.advance(geo.tiles, warps);
    p.advance(geo.tiles, warps);
  };
  PairWalk at{static_cast<std::uint32_t>(global_warp()), 0};  // the pair this half packs next
  if (lane >= 16) at.advance(geo.tiles, warps);
  PairWalk ahead = at;  // the pair this half loads next (one past `at` at each loop top)
  LaneChunk<kPerLane> chunk = load(ahead);
  step(ahead);
  std::int64_t held = 0;
#pragma unroll 1
  while (__any_sync(0xffffffffu, at.row < rows)) {
    const PairWalk loaded = ahead;  // the next `at`
    const LaneChunk<kPerLane> next = load(ahead);
    step(ahead);
    const bool live = at.row < rows;
    const int cols = tile_width(at);
    std::uint32_t flags[kPerLane / 2];
    if constexpr (kZeroThreshold) {
      nonzero_flags(chunk, flags);
    } else {
      threshold_flags<T>(chunk, threshold, flags);
    }
    if (cols < kTile) clip_flags<kPerLane>(col0, cols, flags);
    const int count = pack_slot_groups(chunk, flags, packed + static_cast<std::uint64_t>(at.row) * width + at.tile * geo.slots,
                                       live, geo.slots, geo.capacity, clamp, lane);
    if ((lane & 15) == 0 && live)
      held += account_tile(count, geo.capacity, at.row, static_cast<std::int64_t>(at.row) * geo.tiles + at.tile, overflow);
    chunk = next;
    at = loaded;
  }
  if (overflow.counters != nullptr && (lane & 15) == 0)
    atomicAdd(&overflow.counters->nnz, static_cast<unsigned long long>(held));
}

// First index in [0, n) whose column is >= col (n when none).
__device__ inline std::int64_t lower_bound(const std::int32_t* cols, std::int64_t n, std::int64_t col) {
  std::int64_t lo = 0;
  std::int64_t hi = n;
  while (lo < hi) {
    const std::int64_t mid = lo + (hi - lo) / 2;
    if (cols[mid] < col) {
      lo = mid + 1;
    } else {
      hi = mid;
    }
  }
  return lo;
}

// CSR / ELL -> TwELL. A warp owns whole (row, tile) pairs, grid-stride in row-major order; every
// lane binary-searches the row's sorted columns for the tile's range (same addresses: broadcast),
// then a lane owns one candidate entry per chunk of 32. Preconditions: device operands, columns
// strictly increasing inside a row (a valid CSR / ELL). Benchmark: bench/ conversion drivers.
template <class T, class Rows>
__global__ void __launch_bounds__(kBlockThreads) sparse_to_twell_kernel(Rows rows, std::int64_t n_rows,
                                                                        std::int64_t cols, TwellLayout layout,
                                                                        std::int64_t tiles, std::uint32_t* packed,
                                                                        T* value_plane, float threshold,
                                                                        OverflowTarget overflow) {
  ::twell::detail::wait_for_prior_grids();
  const int lane = lane_id();
  const int slot_count = layout.slots();
  const int capacity = layout.capacity();
  const std::int64_t pairs = n_rows * tiles;
  std::int64_t held = 0;
  for (std::int64_t p = global_warp(); p < pairs; p += warp_count()) {
    const std::int64_t row = p / tiles;
    const std::int64_t t = p - row * tiles;
    const RowSpan<T> s = rows.span(row);
    const std::int64_t begin = layout.tile_begin(t);
    const std::int64_t a = lower_bound(s.cols, s.size, begin);
    const std::int64_t b = lower_bound(s.cols, s.size, begin + layout.tile_cols(t, cols));
    const std::int64_t off = layout.slot_offset(row, t, cols);
    const TileSlots<T> slots{packed + off, value_plane != nullptr ? value_plane + off : nullptr};
    int count = 0;
    for (std::int64_t i0 = a; i0 < b; i0 += kWarpSize) {
      const std::int64_t i = i0 + lane;
      const bool ok = i < b;
      const T v[1] = {ok ? s.values[i] : T{}};
      const std::uint32_t local_col[1] = {ok ? static_cast<std::uint32_t>(s.cols[i] - begin) : 0u};
      const unsigned stored = ok && is_stored(v[0], threshold) ? 1u : 0u;
      count = pack_chunk<T, 1>(slots, capacity, count, stored, v, local_col);
    }
    held += finish_tile(slots, slot_count, capacity, count, row, p, overflow);
  }
  if (overflow.counters != nullptr) add_count(&overflow.counters->nnz, held);
}

// A thread owns one row: its overflow rank from the inclusive scan of the flags, both maps.
// Preconditions: ranks = inclusive scan of flags (0/1), overflow_to_row has ranks[n_rows-1] entries.
// static: a non-template kernel defined in a header gets one private copy per translation unit.
static __global__ void __launch_bounds__(kBlockThreads) map_overflow_rows_kernel(const std::int32_t* flags,
                                                                          const std::int32_t* ranks,
                                                                          std::int64_t n_rows,
                                                                          std::int32_t* row_to_overflow,
                                                                          std::int32_t* overflow_to_row) {
  ::twell::detail::wait_for_prior_grids();
  const std::int64_t stride = static_cast<std::int64_t>(gridDim.x) * blockDim.x;
  for (std::int64_t row = static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; row < n_rows;
       row += stride) {
    if (flags[row] != 0) {
      const std::int32_t r = ranks[row] - 1;
      row_to_overflow[row] = r;
      overflow_to_row[r] = static_cast<std::int32_t>(row);
    } else {
      row_to_overflow[row] = -1;
    }
  }
}

// Launches dense_to_twell_tiles_kernel (its preconditions hold): one warp per row, grid-stride.
template <class T>
void launch_dense_to_twell_tiles(DenseView<const T> src, TwellView<T> out, float threshold,
                                 const OverflowTarget& overflow, cudaStream_t stream, const char* where) {
  const unsigned blocks = blocks_for_warps(src.rows);
  const TwellGeometry geo = twell_geometry(out.layout, src.cols);
  if (blocks == 0 || geo.tiles == 0) return;
  const auto launch = [&](auto kernel) {
    ::twell::detail::launch_kernel(where, kernel, blocks, kBlockThreads, 0, stream, src, geo, out.packed, threshold,
                                   overflow);
  };
  const bool zero = threshold == 0.0f;
  if (out.layout.tile == 256) {
    zero ? launch(dense_to_twell_tiles_kernel<T, 256, true>) : launch(dense_to_twell_tiles_kernel<T, 256, false>);
  } else {
    zero ? launch(dense_to_twell_tiles_kernel<T, 128, true>) : launch(dense_to_twell_tiles_kernel<T, 128, false>);
  }
}

// Launches dense -> TwELL into out (on the device, src's shape), vectorised when alignment allows.
template <class T>
void launch_dense_to_twell(DenseView<const T> src, TwellView<T> out, float threshold, const OverflowTarget& overflow,
                           cudaStream_t stream, const char* where) {
  const TwellLayout layout = out.layout;
  const std::int64_t tiles = layout.tiles(src.cols);
  const unsigned blocks = blocks_for_warps((src.rows * tiles + kDensePairsPerWarp - 1) / kDensePairsPerWarp);
  if (blocks == 0) return;
  const bool aligned = reinterpret_cast<std::uintptr_t>(src.data) % 16 == 0 &&
                       (static_cast<std::uint64_t>(src.ld) * sizeof(T)) % 16 == 0;
  constexpr std::int64_t kMax32 = std::numeric_limits<std::int32_t>::max();
  const bool indices_32bit = src.rows <= kMax32 && src.ld <= kMax32 && layout.packed_width(src.cols) <= kMax32;
  if constexpr (ValueTraits<T>::packs_in_slot) {
    if (aligned && indices_32bit && (layout.tile == 256 || layout.tile == 128)) {
      launch_dense_to_twell_tiles(src, out, threshold, overflow, stream, where);
      return;
    }
  }
  ::twell::detail::launch_kernel(where, aligned ? dense_to_twell_kernel<T, true> : dense_to_twell_kernel<T, false>,
                                 blocks, kBlockThreads, 0, stream, src, layout, tiles, out.packed, out.value_plane,
                                 threshold, overflow);
}

template <class T, class Rows>
void launch_sparse_to_twell(Rows rows, std::int64_t n_rows, std::int64_t cols, TwellView<T> out, float threshold,
                            const OverflowTarget& overflow, cudaStream_t stream, const char* where) {
  const TwellLayout layout = out.layout;
  const std::int64_t tiles = layout.tiles(cols);
  const unsigned blocks = blocks_for_warps(n_rows * tiles);
  if (blocks == 0) return;
  ::twell::detail::launch_kernel(where, sparse_to_twell_kernel<T, Rows>, blocks, kBlockThreads, 0, stream, rows, n_rows,
                                 cols, layout, tiles, out.packed, out.value_plane, threshold, overflow);
}

// Into TwELL, options.overflow is error or drop; the hybrid policy belongs to *_to_hybrid.
inline void require_twell_policy(const ConvertOptions& options, const char* where) {
  require(options.overflow != OverflowPolicy::hybrid, ErrorCode::invalid_argument, where,
          "options.overflow = hybrid cannot produce a plain TwELL matrix; convert to Hybrid instead "
          "(twell::to_hybrid / *_to_hybrid), which routes overflowed rows to a dense block");
}

// After a packing kernel under error / drop whose counters must come back (error policy, or a
// report): one read of the counters, then throws on the first overflowed (row, tile) (one more
// read, for its count) or fills the report. Before it throws, `out` is cleared (and the stream
// waited for), as the reference backend leaves it: never half written (all zeros is a TwELL
// without entries).
template <class T>
void conclude_twell(const DeviceCounters& counters, TwellView<T> out, const ConvertOptions& options,
                    const char* where) {
  const Counters c = counters.read();
  if (c.first_overflow != kNoOverflow) {
    const TwellLayout layout = out.layout;
    const std::int64_t tiles = layout.tiles(out.cols);
    const auto key = static_cast<std::int64_t>(c.first_overflow);
    const std::int64_t row = key / tiles;
    const std::int64_t tile = key % tiles;
    const cudaStream_t stream = stream_of(options);
    // Under the error policy slot 0 keeps the true count.
    const std::uint32_t count = read_value(out.packed + layout.slot_offset(row, tile, out.cols), stream);
    const auto words = static_cast<std::size_t>(out.rows * out.packed_width());
    ::twell::detail::fill_bytes_async(out.packed, 0, words * sizeof(std::uint32_t), stream, where);
    if constexpr (!ValueTraits<T>::packs_in_slot) {
      ::twell::detail::fill_bytes_async(out.value_plane, 0, words * sizeof(T), stream, where);
    }
    // The error path may wait: the caller gets the exception with dst already cleared.
    check_cuda(cudaStreamSynchronize(stream), where);
    fail(ErrorCode::overflow, where, "row ", row, ", tile ", tile, " (columns ", layout.tile_begin(tile), "..",
         layout.tile_begin(tile) + layout.tile_cols(tile, out.cols) - 1, ") holds ", count,
         " nonzeros but layout (tile ", layout.tile, ", C ", layout.compression, ") has capacity S-1 = ",
         layout.capacity(), "; convert to Hybrid (nothing lost), pick a smaller C, or use OverflowPolicy::drop");
  }
  if (options.report != nullptr)
    *options.report = ConvertReport{static_cast<std::int64_t>(c.nnz), static_cast<std::int64_t>(c.dropped), 0};
}

// The rest of a Hybrid once its R overflow rows are known (out.overflow has R rows): both maps
// from the per-row flags and their inclusive scan, and the overflow rows copied from `rows`.
template <class T, class Rows>
void write_hybrid_rows(const std::int32_t* flags, const std::int32_t* ranks, HybridView<T> out, Rows rows,
                       float threshold, cudaStream_t stream, const char* where) {
  const std::int64_t n_rows = out.rows();
  if (n_rows > 0) {
    const auto blocks = static_cast<unsigned>(std::min<std::int64_t>((n_rows + kBlockThreads - 1) / kBlockThreads,
                                                                     kMaxBlocks));
    ::twell::detail::launch_kernel(where, map_overflow_rows_kernel, blocks, kBlockThreads, 0, stream, flags, ranks,
                                   n_rows, out.row_to_overflow, out.overflow_to_row);
  }
  const std::int64_t r = out.overflow.rows;
  if (r == 0 || out.cols() == 0) return;
  if constexpr (std::is_same_v<Rows, DenseRows<T>>) {
    const dim3 grid(static_cast<unsigned>(std::min<std::int64_t>((out.cols() + kBlockThreads - 1) / kBlockThreads,
                                                                 kMaxBlocks)),
                    static_cast<unsigned>(std::min<std::int64_t>(r, 65535)));
    ::twell::detail::launch_kernel(where, gather_dense_rows_kernel<T>, grid, kBlockThreads, 0, stream, rows, r,
                                   out.overflow_to_row, threshold, out.overflow.data);
  } else {
    ::twell::detail::launch_kernel(where, to_dense_kernel<T, Rows>, blocks_for_warps(r), kBlockThreads, 0, stream, rows,
                                   r, out.overflow_to_row, threshold, out.overflow.data, out.cols(), nullptr);
  }
}

// The packing kernel has written `twell` (true counts: shadows) and flagged the rows with an
// overflowed tile; scans the flags into the row maps (increasing row order, no atomics), copies
// those rows whole from `rows` into the dense block and returns the hybrid.
template <class T, class Rows>
HybridMatrix<T> assemble_hybrid(TwellMatrix<T>&& twell, const std::int32_t* flags, Rows rows,
                                const DeviceCounters& counters, const ConvertOptions& options, const char* where) {
  const cudaStream_t stream = stream_of(options);
  const std::int64_t n_rows = twell.rows();
  const std::int64_t cols = twell.cols();
  DeviceTemp<std::int32_t> ranks(static_cast<std::size_t>(n_rows), stream);
  inclusive_sum(flags, ranks.get(), n_rows, stream);
  const std::int64_t overflow_rows = n_rows == 0 ? 0 : read_value(ranks.get() + (n_rows - 1), stream);

  HybridMatrix<T> out;
  out.twell() = std::move(twell);
  out.overflow() = DenseMatrix<T>(overflow_rows, cols, MemorySpace::device);
  out.row_to_overflow() = Buffer<std::int32_t>(static_cast<std::size_t>(n_rows), MemorySpace::device);
  out.overflow_to_row() = Buffer<std::int32_t>(static_cast<std::size_t>(overflow_rows), MemorySpace::device);
  order_after_allocations(stream);
  write_hybrid_rows<T>(flags, ranks.get(), out.view(), rows, options.threshold, stream, where);
  if (options.report != nullptr) {
    const Counters c = counters.read();
    *options.report = ConvertReport{static_cast<std::int64_t>(c.nnz), 0, overflow_rows};
  }
  return out;
}

inline void check_hybrid_rows(std::int64_t rows, const char* where) {
  require(rows <= std::numeric_limits<std::int32_t>::max(), ErrorCode::invalid_argument, where, "rows = ", rows,
          " does not fit the 32-bit row maps of a Hybrid");
}

// The whole of a conversion into a caller-owned TwELL `out` (error / drop; threshold, layout and
// policy already checked); `launch` runs the packing kernel for (out, overflow target). Counters
// (a stream-ordered temporary) exist only when something comes back: under drop without a
// report nothing is read back and the host never waits.
template <class T, class Launch>
void pack_twell_into(TwellView<T> out, const ConvertOptions& options, const char* where, Launch&& launch) {
  if (options.overflow != OverflowPolicy::error && options.report == nullptr) {
    launch(out, OverflowTarget{options.overflow, nullptr, nullptr});
    return;
  }
  DeviceCounters counters(stream_of(options));
  launch(out, OverflowTarget{options.overflow, counters.get(), nullptr});
  conclude_twell<T>(counters, out, options, where);
}

// The same into a new TwELL; the packing kernels write every slot, so it is not zero-filled.
template <class T, class Launch>
TwellMatrix<T> pack_twell(std::int64_t rows, std::int64_t cols, TwellLayout layout, const ConvertOptions& options,
                          const char* where, Launch&& launch) {
  check_convert_options(options, where);
  check_layout(layout, where);
  require_twell_policy(options, where);
  TwellMatrix<T> out(rows, cols, layout, MemorySpace::device, Uninitialized{});
  pack_twell_into<T>(out.view(), options, where, launch);
  return out;
}

// The whole of a conversion into Hybrid: packing with per-row flags, then assemble_hybrid with
// `rows` as the source of the dense block.
template <class T, class Rows, class Launch>
HybridMatrix<T> pack_hybrid(std::int64_t n_rows, std::int64_t cols, TwellLayout layout, Rows rows,
                            const ConvertOptions& options, const char* where, Launch&& launch) {
  check_convert_options(options, where);
  check_layout(layout, where);
  check_hybrid_rows(n_rows, where);
  const cudaStream_t stream = stream_of(options);
  // The packing kernels write every slot of the TwELL part (shadow rows included).
  TwellMatrix<T> twell(n_rows, cols, layout, MemorySpace::device, Uninitialized{});
  DeviceTemp<std::int32_t> flags(static_cast<std::size_t>(n_rows), stream);
  if (n_rows != 0)
    ::twell::detail::fill_bytes_async(flags.get(), 0, static_cast<std::size_t>(n_rows) * sizeof(std::int32_t), stream,
                                      where);
  DeviceCounters counters(stream);
  launch(twell.view(), OverflowTarget{OverflowPolicy::hybrid, counters.get(), flags.get()});
  return assemble_hybrid(std::move(twell), flags.get(), rows, counters, options, where);
}

template <class T>
TwellMatrix<T> csr_to_twell_as(CsrView<const T> src, TwellLayout layout, const ConvertOptions& options,
                               const char* where) {
  check_device_operand(src, where, "src");
  return pack_twell<T>(src.rows, src.cols, layout, options, where, [&](TwellView<T> out, OverflowTarget target) {
    launch_sparse_to_twell(CsrRows<T>(src), src.rows, src.cols, out, options.threshold, target, stream_of(options),
                           where);
  });
}

template <class T>
HybridMatrix<T> dense_to_hybrid_as(DenseView<const T> src, TwellLayout layout, const ConvertOptions& options,
                                   const char* where) {
  check_device_operand(src, where, "src");
  return pack_hybrid<T>(src.rows, src.cols, layout, DenseRows<T>(src), options, where,
                        [&](TwellView<T> out, OverflowTarget target) {
                          launch_dense_to_twell(src, out, options.threshold, target, stream_of(options), where);
                        });
}

template <class T>
HybridMatrix<T> csr_to_hybrid_as(CsrView<const T> src, TwellLayout layout, const ConvertOptions& options,
                                 const char* where) {
  check_device_operand(src, where, "src");
  return pack_hybrid<T>(src.rows, src.cols, layout, CsrRows<T>(src), options, where,
                        [&](TwellView<T> out, OverflowTarget target) {
                          launch_sparse_to_twell(CsrRows<T>(src), src.rows, src.cols, out, options.threshold, target,
                                                 stream_of(options), where);
                        });
}

}  // namespace twell::cuda::detail
