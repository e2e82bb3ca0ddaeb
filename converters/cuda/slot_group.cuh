// The packing of (row, tile)s of 16-bit values into their TwELL slot groups, two at a time per
// warp (a half-warp each), shared by the dense -> TwELL converter (values from global memory) and
// gemm_to_sparse's epilogues (values staged in shared memory): lane l holds kPerLane consecutive
// columns, from (l % 16) * kPerLane, of its half's tile as 32-bit words of two values, the lower
// column in the low half. Self-contained (no converter plumbing), so kernels/cuda includes it too.
// Not installed.
#pragma once

#include <cstdint>

#include <twell/formats/layout.hpp>
#include <twell/types.hpp>

#include "warp_scan.cuh"

namespace twell::cuda::detail {

// A lane's kPerLane consecutive 16-bit values (16 or 8: two or one 16-byte loads).
template <int kPerLane>
struct LaneChunk {
  static_assert(kPerLane == 16 || kPerLane == 8, "a lane holds 16 or 8 values of a tile");
  static constexpr int kWords = kPerLane / 2;
  std::uint32_t w[kWords];
};

// Stored flags of a chunk: bit 15 of flags[k] set iff the low value of word k is stored, bit 31
// iff the high one is. This is the threshold-0 rule for 16-bit values: stored iff the magnitude
// bits are not all zero (-0 is not stored, NaN is): (h & 0x7fff) + 0x7fff reaches bit 15 exactly
// when h & 0x7fff != 0, and the halves cannot carry into each other.
template <int kPerLane>
__device__ __forceinline__ void nonzero_flags(const LaneChunk<kPerLane>& c, std::uint32_t (&flags)[kPerLane / 2]) {
#pragma unroll
  for (int k = 0; k < kPerLane / 2; ++k) flags[k] = ((c.w[k] & 0x7fff7fffu) + 0x7fff7fffu) & 0x80008000u;
}

// The same for a threshold t > 0: stored iff !(|v| <= t) in fp32 (is_stored).
template <class T, int kPerLane>
__device__ __forceinline__ void threshold_flags(const LaneChunk<kPerLane>& c, float threshold,
                                                std::uint32_t (&flags)[kPerLane / 2]) {
#pragma unroll
  for (int k = 0; k < kPerLane / 2; ++k) {
    const bool lo = is_stored(ValueTraits<T>::from_bits(static_cast<std::uint16_t>(c.w[k] & 0xffffu)), threshold);
    const bool hi = is_stored(ValueTraits<T>::from_bits(static_cast<std::uint16_t>(c.w[k] >> 16)), threshold);
    flags[k] = (lo ? 0x8000u : 0u) | (hi ? 0x80000000u : 0u);
  }
}

// Clears the flags of columns at or past `cols` (the tile's width, for a ragged last tile); col0
// is the lane's first column in the tile.
template <int kPerLane>
__device__ __forceinline__ void clip_flags(int col0, int cols, std::uint32_t (&flags)[kPerLane / 2]) {
#pragma unroll
  for (int k = 0; k < kPerLane / 2; ++k) {
    if (col0 + 2 * k >= cols) flags[k] &= ~0x00008000u;
    if (col0 + 2 * k + 1 >= cols) flags[k] &= ~0x80000000u;
  }
}

// Each half-warp writes the whole slot group of its (row, tile), `group` = its slot 0, from its
// lanes' chunks and stored flags; a half with `live` false (no tile: its flags must be zero) writes
// nothing. A lane ranks its entries by an exclusive prefix sum of the lanes' counts over its half
// (a 16-wide shuffle scan: 4 steps; the ballot per bit of the count before it, 4 or 5 ballots,
// took 76 instructions a warp for 16 values a lane by Nsight Compute's counts), or, when no lane
// of the warp holds two entries (most trips at low density), by one ballot; lane order
// is column order and a lane walks its own columns upward, so slots come out in column order. The
// first `capacity` entries are written, then slot 0 (the true count, or min(count, capacity) when
// `clamp`) and zeros in the slots past the entries: every word of the group is written, so the
// output needs no initialisation. Returns the true count of the lane's half. Called by the whole
// warp.
template <int kPerLane>
__device__ __forceinline__ int pack_slot_groups(const LaneChunk<kPerLane>& chunk,
                                                const std::uint32_t (&flags)[kPerLane / 2], std::uint32_t* group,
                                                bool live, int slots, int capacity, bool clamp, int lane) {
  constexpr int kWords = kPerLane / 2;
  std::uint32_t merged = 0;  // the flags at distinct bits: 15 - k and 31 - k
#pragma unroll
  for (int k = 0; k < kWords; ++k) merged |= flags[k] >> k;
  const int mine = __popc(merged);
  // Warp-uniform, so both halves take the same branch and the shuffles stay converged.
  const bool single = __all_sync(0xffffffffu, mine <= 1);
  int pos, count;
  if (single) {
    const unsigned holding = __ballot_sync(0xffffffffu, mine != 0) & ((lane & 16) != 0 ? 0xffff0000u : 0x0000ffffu);
    pos = __popc(holding & ((1u << lane) - 1u));
    count = __popc(holding);
  } else {
    const int inclusive = warp_inclusive_sum<int, 16>(mine, lane);
    count = __shfl_sync(0xffffffffu, inclusive, 15, 16);
    pos = inclusive - mine;
  }
  const auto col0 = static_cast<std::uint32_t>((lane & 15) * kPerLane);
  if (single) {
    if (mine != 0 && pos < capacity) {  // its one entry from merged's one bit
      const int b = 31 - __clz(merged);
      const bool high = b >= 16;
      const int k = (high ? 31 : 15) - b;
      std::uint32_t w = chunk.w[0];
#pragma unroll
      for (int i = 1; i < kWords; ++i) w = k == i ? chunk.w[i] : w;
      group[1 + pos] = TwellLayout::pack(static_cast<std::uint16_t>(high ? w >> 16 : w & 0xffffu),
                                         col0 + 2 * k + (high ? 1 : 0));
    }
  } else if (mine != 0) {  // a lane walks its words in column order
#pragma unroll
    for (int k = 0; k < kWords; ++k) {
      if (flags[k] == 0u) continue;
      if ((flags[k] & 0x8000u) != 0u) {
        if (pos < capacity)
          group[1 + pos] = TwellLayout::pack(static_cast<std::uint16_t>(chunk.w[k] & 0xffffu), col0 + 2 * k);
        ++pos;
      }
      if ((flags[k] & 0x80000000u) != 0u) {
        if (pos < capacity)
          group[1 + pos] = TwellLayout::pack(static_cast<std::uint16_t>(chunk.w[k] >> 16), col0 + 2 * k + 1);
        ++pos;
      }
    }
  }
  if (live) {  // lane s of the half writes slots s, s + 16, ...: slot 0 and the padding
    const int written = min(count, capacity);
    const int s0 = lane & 15;
    if (s0 == 0) {
      group[0] = static_cast<std::uint32_t>(clamp ? written : count);
    } else if (s0 < slots && s0 > written) {
      group[s0] = 0u;
    }
#pragma unroll 1
    for (int s = s0 + 16; s < slots; s += 16)
      if (s > written) group[s] = 0u;
  }
  return count;
}

}  // namespace twell::cuda::detail
