// Internal to the cuda kernels: the TwELL-writing epilogue shared by gemm_to_sparse's mainloops
// (mma.sync in gemm_to_sparse.cu, wgmma in gemm_to_sparse_sm90.cu), so that both write the same
// bits: the activation and rounding rule, and the packing of a staged tile's rows into TwELL
// slots, row flags and totals: a half-warp per row on the dense -> TwELL converter's slot groups
// (pack_twell_rows, converters/cuda/slot_group.cuh; the mma.sync kernel) or a lane per row
// (pack_twell_rows_by_lane; the wgmma kernel's packer warps), which write the same words. Not
// installed.
#pragma once

#include <cstdint>
#include <type_traits>

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <twell/formats/layout.hpp>
#include <twell/kernels/options.hpp>
#include <twell/types.hpp>

// The slot-group packing is the dense -> TwELL converter's, so both write the same bits.
#include "../../converters/cuda/slot_group.cuh"

namespace twell::cuda::detail {

// Where a fused GEMM epilogue writes: the TwELL part and the overflow bookkeeping.
struct TwellOut {
  std::uint32_t* packed = nullptr;
  TwellLayout layout{};
  std::int32_t* row_flags = nullptr;              // set to 1 for a row with an overflowed tile
  unsigned long long* stored_total = nullptr;     // sum of true counts
  unsigned long long* excess_total = nullptr;     // sum of count - capacity over overflowed tiles
  bool clamp_count = false;                       // drop policy: slot 0 = min(count, capacity)
  // Hybrid overflow without a recompute (both fused kernels' packers; spill_values == nullptr: none):
  // an overflowed (row, tile)'s whole segment of stored values goes to spill_values[slot * tile]
  // and (row, tile) to spill_where[slot], the slot taken from *spill_count; a slot at or past
  // spill_capacity is not written (the plan then recomputes its block's rows as before).
  std::uint16_t* spill_values = nullptr;
  int2* spill_where = nullptr;
  unsigned long long* spill_count = nullptr;
  std::int64_t spill_capacity = 0;
};

__device__ __forceinline__ float activate(Activation kind, float v) {
  switch (kind) {
    case Activation::relu: return v < 0.0f ? 0.0f : v;
    case Activation::silu: return v / (1.0f + expf(-v));
    case Activation::gelu: return 0.5f * v * (1.0f + erff(v * 0.70710678118654752f));
  }
  return v;
}

// The activated value with the threshold applied in fp32 (|a| <= threshold becomes 0), rounded
// once to T; a result that rounds to -0 comes out +0, so "stored" is simply "bits != 0". This is
// the reference's order: threshold in fp32, round, then keep what did not round to zero.
template <class T>
__device__ __forceinline__ T sparsified(float acc, Activation kind, float threshold) {
  float a = activate(kind, acc);
  if (fabsf(a) <= threshold) a = 0.0f;
  const T v = from_float<T>(a);
  return is_stored(v) ? v : from_float<T>(0.0f);
}

// Two horizontally adjacent accumulators (an m16n8 / wgmma fragment pair) sparsified into one
// 32-bit word, the first in the low half.
template <class T>
__device__ __forceinline__ std::uint32_t sparsified_pair(float a0, float a1, Activation kind, float threshold) {
  const std::uint32_t lo = ValueTraits<T>::to_bits(sparsified<T>(a0, kind, threshold));
  const std::uint32_t hi = ValueTraits<T>::to_bits(sparsified<T>(a1, kind, threshold));
  return lo | (hi << 16);
}

// The same for Activation::relu, fast: with threshold t >= 0 (checked by every entry point),
// "ReLU, then |a| <= t becomes 0" keeps exactly the values with !(v <= t), NaN included, and a
// kept value is positive or NaN, so it never rounds to -0; one paired hardware rounding replaces
// two software ones. The hardware rounds NaN to a canonical NaN where the portable rule keeps
// sign and payload, so `nan` is set when the pair holds one: the caller then stages the
// fragment again through sparsified_pair (NaN never appears in practice; exactness still holds).
template <class T>
__device__ __forceinline__ std::uint32_t relu_pair(float a0, float a1, float threshold, bool& nan) {
  const float r0 = a0 <= threshold ? 0.0f : a0;
  const float r1 = a1 <= threshold ? 0.0f : a1;
  nan |= isnan(r0) || isnan(r1);
  if constexpr (std::is_same_v<T, bf16>) {
    const __nv_bfloat162 p = __floats2bfloat162_rn(r0, r1);
    return *reinterpret_cast<const std::uint32_t*>(&p);
  } else {
    const __half2 p = __floats2half2_rn(r0, r1);
    return *reinterpret_cast<const std::uint32_t*>(&p);
  }
}

// A fragment pair by the rule of kRelu (relu_pair) or of `kind` (sparsified_pair).
template <class T, bool kRelu>
__device__ __forceinline__ std::uint32_t activated_pair(float a0, float a1, Activation kind, float threshold,
                                                        bool& nan) {
  if constexpr (kRelu) {
    return relu_pair<T>(a0, a1, threshold, nan);
  } else {
    return sparsified_pair<T>(a0, a1, kind, threshold);
  }
}

// TwellLayout's quantities that every packed row needs, computed once per kernel: its accessors
// divide, and a division per row costs as much as packing a sparse row.
struct TwellRows {
  std::int64_t width = 0;  // packed_width(N): the leading dimension of the packed array
  int slots = 0;           // S
  int capacity = 0;        // S - 1
};

__device__ __forceinline__ TwellRows twell_rows(const TwellOut& o, std::int64_t n) {
  return {o.layout.packed_width(n), o.layout.slots(), o.layout.capacity()};
}

// A lane's share of one staged row of BN sparsified 16-bit values: BN / 16 consecutive columns
// of the row of its half-warp (16 for BN 256: two 16-byte loads; 8 for BN 128: one). Staged rows
// must be 16-byte aligned.
template <int BN>
using StagedChunk = LaneChunk<BN / 16>;

template <int BN>
__device__ __forceinline__ StagedChunk<BN> load_staged(const std::uint16_t* vals_row, int lane) {
  StagedChunk<BN> c;
  const uint4* p = reinterpret_cast<const uint4*>(vals_row) + (lane & 15) * (BN / 128);
#pragma unroll
  for (int i = 0; i < BN / 128; ++i) {
    const uint4 v = p[i];
    c.w[4 * i] = v.x, c.w[4 * i + 1] = v.y, c.w[4 * i + 2] = v.z, c.w[4 * i + 3] = v.w;
  }
  return c;
}

// A slot of the spill pool (TwellOut::spill_values) for each calling lane; the lanes that call
// together take theirs with one atomic (token-skewed data overflows many tiles at once). Past the
// pool the answer is o.spill_capacity or more (no slot), and no atomic once the counter is past
// it: the plan then recomputes, and the counter need only say so (a lane that reads it at the
// capacity still adds, so that it goes past).
__device__ __forceinline__ unsigned long long take_spill_slot(const TwellOut& o) {
  const auto capacity = static_cast<unsigned long long>(o.spill_capacity);
  if (*static_cast<volatile unsigned long long*>(o.spill_count) > capacity) return capacity;
  const unsigned together = __activemask();
  const int lane = static_cast<int>(threadIdx.x) & 31;
  const int leader = __ffs(together) - 1;
  unsigned long long first = 0;
  if (lane == leader) first = atomicAdd(o.spill_count, static_cast<unsigned long long>(__popc(together)));
  return __shfl_sync(together, first, leader) + static_cast<unsigned>(__popc(together & ((1u << lane) - 1u)));
}

// An overflowed (row, tile)'s staged row, as the 16 lanes of its half-warp hold it (load_staged),
// into the next spill slot with its (row, tile). Called by the whole warp; `overflowed` is the
// same over each half. Kept out of line: inlined, its body in pack_twell_rows' loop cost the
// portable kernel ~1 % on uniform rows, where it never runs; as a call it costs nothing there (the
// same time as the spill compiled out) and no more on token-skewed rows (sixty-first session).
template <int BN>
__device__ __noinline__ void spill_half_segment(const StagedChunk<BN>& chunk, bool overflowed, std::int64_t row,
                                                std::int64_t tile, const TwellOut& o, int lane) {
  unsigned long long slot = 0;
  if (overflowed && (lane & 15) == 0) slot = take_spill_slot(o);
  slot = __shfl_sync(0xffffffffu, slot, lane & 16);
  if (!overflowed || slot >= static_cast<unsigned long long>(o.spill_capacity)) return;
  auto* to = reinterpret_cast<uint4*>(o.spill_values + slot * BN) + (lane & 15) * (BN / 128);
#pragma unroll
  for (int i = 0; i < BN / 128; ++i)
    to[i] = make_uint4(chunk.w[4 * i], chunk.w[4 * i + 1], chunk.w[4 * i + 2], chunk.w[4 * i + 3]);
  if ((lane & 15) == 0) o.spill_where[slot] = make_int2(static_cast<int>(row), static_cast<int>(tile));
}

// Each half-warp writes the TwELL slots of its (row, tile) from its staged row (+0 = not stored;
// columns >= tile_cols are ignored) with pack_slot_groups; `group` is the row's slot group,
// o.packed + layout.slot_offset(row, tile, N); a half that is not `live` writes nothing. An
// overflowed tile sets the row's flag, and its staged row is spilled where o asks for it. Lanes 0
// and 16 add their half's count, and the excess over the capacity, to their running totals.
template <int BN>
__device__ __forceinline__ void pack_twell_half_rows(const StagedChunk<BN>& chunk, std::uint32_t* group,
                                                     std::int64_t row, std::int64_t tile, bool live, int tile_cols,
                                                     const TwellRows& geo, const TwellOut& o, int lane,
                                                     unsigned long long& stored, unsigned long long& excess) {
  constexpr int kPerLane = BN / 16;
  std::uint32_t flags[kPerLane / 2];
  nonzero_flags(chunk, flags);  // staging writes +0 for "not stored" and never -0
  if (!live) {
#pragma unroll
    for (int k = 0; k < kPerLane / 2; ++k) flags[k] = 0u;
  }
  if (tile_cols < BN) clip_flags<kPerLane>((lane & 15) * kPerLane, tile_cols, flags);
  const int count = pack_slot_groups(chunk, flags, group, live, geo.slots, geo.capacity, o.clamp_count, lane);
  if ((lane & 15) == 0 && live) {
    if (count > geo.capacity) {
      o.row_flags[row] = 1;
      excess += static_cast<unsigned long long>(count - geo.capacity);
    }
    stored += static_cast<unsigned long long>(count);
  }
  // The vote keeps the common pair (neither half overflowed) off the spill's shuffle: 1-2 % of
  // the portable kernel on uniform rows (fifty-ninth session).
  const bool overflowed = live && count > geo.capacity;
  if (o.spill_values != nullptr && __any_sync(0xffffffffu, overflowed))
    spill_half_segment<BN>(chunk, overflowed, row, tile, o, lane);
}

// `rows` (even) staged rows packed by one warp, two at a time (half-warp h takes rows 2i + h): row
// r is staged at first_staged + r * staged_step, its slot group is first_group + r * group_step
// and its matrix row first_row + r * row_step, all in TwELL tile `tile`; rows at or past m are
// skipped. The loop is not unrolled, so the epilogue's code stays small enough for the
// instruction cache (an unrolled version spent most of its time on instruction fetch); the next
// pair's loads are issued before the current pair is packed.
template <int BN>
__device__ __forceinline__ void pack_twell_rows(const std::uint16_t* first_staged, int staged_step, int rows,
                                                std::uint32_t* first_group, std::int64_t group_step,
                                                std::int64_t first_row, int row_step, std::int64_t m, std::int64_t tile,
                                                int tile_cols, const TwellRows& geo, const TwellOut& o, int lane,
                                                unsigned long long& stored, unsigned long long& excess) {
  const int half = lane >> 4;
  StagedChunk<BN> next = load_staged<BN>(first_staged + half * staged_step, lane);
#pragma unroll 1
  for (int i = 0; i < rows; i += 2) {
    const StagedChunk<BN> chunk = next;
    if (i + 2 < rows) next = load_staged<BN>(first_staged + (i + 2 + half) * staged_step, lane);
    const int r = i + half;
    const std::int64_t row = first_row + static_cast<std::int64_t>(r) * row_step;
    pack_twell_half_rows<BN>(chunk, first_group + r * group_step, row, tile, row < m, tile_cols, geo, o, lane, stored,
                             excess);
  }
}

// An overflowed (row, tile)'s staged segment (BN values as BN / 8 16-byte chunks, those past the
// tile's columns left out) into the next spill slot (take_spill_slot), with its (row, tile).
template <int BN>
__device__ __forceinline__ void spill_segment(const uint4* chunk, std::uint32_t live_chunks, std::int64_t row,
                                              std::int64_t tile, const TwellOut& o) {
  const unsigned long long slot = take_spill_slot(o);
  if (slot >= static_cast<unsigned long long>(o.spill_capacity)) return;
  auto* to = reinterpret_cast<uint4*>(o.spill_values + slot * BN);
#pragma unroll 1  // a rare path: no registers for it beside the packer's own
  for (int c = 0; c < BN / 8; ++c)
    if ((live_chunks >> c & 1u) != 0u) to[c] = chunk[c];
  o.spill_where[slot] = make_int2(static_cast<int>(row), static_cast<int>(tile));
}

// `rows` staged rows packed by one warp, a lane per row (32 rows at a time), writing the same words
// as pack_twell_rows: row r is staged at first_staged + r * staged_step (16-byte aligned, +0 for
// "not stored", never -0), its slot group is first_group + r * group_step and its matrix row
// first_row + r, all in TwELL tile `tile`; rows at or past m are skipped; tile_cols must be a
// multiple of 8. An overflowed row's segment is spilled where o asks for it. A lane first
// marks which 16-byte chunks of its row hold a stored value (one OR over the chunk's words), then
// zeroes its row's group (16-byte stores where the layout allows), then walks the marked chunks
// upward and writes the first `capacity` entries over the zeros, then slot 0: this thread's stores
// to one word land in program order. Where rows are sparse this issues a fraction of the
// instructions of the half-warp packer (which ranks every row's entries by a shuffle scan or a
// ballot), and no lane waits for another. Each lane keeps its own totals (flush_lane_totals).
template <int BN>
__device__ __forceinline__ void pack_twell_rows_by_lane(const std::uint16_t* first_staged, int staged_step, int rows,
                                                        std::uint32_t* first_group, std::int64_t group_step,
                                                        std::int64_t first_row, std::int64_t m, std::int64_t tile,
                                                        int tile_cols, const TwellRows& geo, const TwellOut& o,
                                                        int lane, unsigned long long& stored,
                                                        unsigned long long& excess) {
  constexpr int kChunks = BN / 8;  // 16-byte chunks of a staged row
  static_assert(kChunks <= 32, "a lane marks its row's chunks in one word");
  const std::uint32_t live_chunks = tile_cols >= BN ? ~0u >> (32 - kChunks) : (1u << (tile_cols / 8)) - 1u;
  const bool vector_zeros = geo.slots % 4 == 0 && (reinterpret_cast<std::uintptr_t>(first_group) |
                                                   static_cast<std::uintptr_t>(group_step * 4)) % 16 == 0;
#pragma unroll 1
  for (int r = lane; r < rows; r += 32) {
    const std::int64_t row = first_row + r;
    if (row >= m) break;
    const auto* chunk = reinterpret_cast<const uint4*>(first_staged + r * staged_step);
    std::uint32_t marked = 0;
#pragma unroll
    for (int c = 0; c < kChunks; ++c) {
      const uint4 v = chunk[c];
      marked |= ((v.x | v.y | v.z | v.w) & 0x7fff7fffu) != 0u ? 1u << c : 0u;
    }
    marked &= live_chunks;
    std::uint32_t* group = first_group + r * group_step;
    if (vector_zeros) {
      for (int s = 0; s < geo.slots; s += 4) *reinterpret_cast<uint4*>(group + s) = make_uint4(0u, 0u, 0u, 0u);
    } else {
      for (int s = 0; s < geo.slots; ++s) group[s] = 0u;
    }
    int count = 0;
    while (marked != 0u) {
      const int c = __ffs(marked) - 1;
      marked &= marked - 1u;
      const uint4 v = chunk[c];
      const std::uint32_t words[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
      for (int k = 0; k < 8; ++k) {
        const auto bits = static_cast<std::uint16_t>(words[k / 2] >> (16 * (k % 2)));
        if ((bits & 0x7fffu) == 0u) continue;
        if (count < geo.capacity) group[1 + count] = TwellLayout::pack(bits, static_cast<std::uint32_t>(8 * c + k));
        ++count;
      }
    }
    group[0] = static_cast<std::uint32_t>(o.clamp_count ? min(count, geo.capacity) : count);
    if (count > geo.capacity) {
      o.row_flags[row] = 1;
      excess += static_cast<unsigned long long>(count - geo.capacity);
      if (o.spill_values != nullptr) spill_segment<BN>(chunk, live_chunks, row, tile, o);
    }
    stored += static_cast<unsigned long long>(count);
  }
}

// The totals of every lane of the warp into the device accumulators (pack_twell_rows_by_lane).
__device__ __forceinline__ void flush_lane_totals(const TwellOut& o, int lane, unsigned long long stored,
                                                  unsigned long long excess) {
#pragma unroll
  for (int d = 16; d > 0; d >>= 1) {
    stored += __shfl_xor_sync(0xffffffffu, stored, d);
    excess += __shfl_xor_sync(0xffffffffu, excess, d);
  }
  if (lane == 0 && stored != 0) atomicAdd(o.stored_total, stored);
  if (lane == 0 && excess != 0) atomicAdd(o.excess_total, excess);
}

// The totals of lanes 0 and 16 into the device accumulators: 64-bit integer atomics, so the sums
// do not depend on the order.
__device__ __forceinline__ void flush_twell_totals(const TwellOut& o, int lane, unsigned long long stored,
                                                   unsigned long long excess) {
  if ((lane & 15) == 0 && stored != 0) atomicAdd(o.stored_total, stored);
  if ((lane & 15) == 0 && excess != 0) atomicAdd(o.excess_total, excess);
}

}  // namespace twell::cuda::detail
