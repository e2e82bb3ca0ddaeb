// Internal to the cuda kernels: the TwELL-writing epilogue shared by gemm_to_sparse's mainloops
// (mma.sync in gemm_to_sparse.cu, wgmma in gemm_to_sparse_sm90.cu), so that both write the same
// bits: the activation and rounding rule, and the per-row ballot packing of a staged tile into
// TwELL slots, row flags and totals. Not installed.
#pragma once

#include <cstdint>

#include <cuda_runtime.h>

#include <twell/formats/layout.hpp>
#include <twell/kernels/options.hpp>
#include <twell/types.hpp>

namespace twell::cuda::detail {

// Where a fused GEMM epilogue writes: the TwELL part and the overflow bookkeeping.
struct TwellOut {
  std::uint32_t* packed = nullptr;
  TwellLayout layout{};
  std::int32_t* row_flags = nullptr;              // set to 1 for a row with an overflowed tile
  unsigned long long* stored_total = nullptr;     // sum of true counts
  unsigned long long* excess_total = nullptr;     // sum of count - capacity over overflowed tiles
  bool clamp_count = false;                       // drop policy: slot 0 = min(count, capacity)
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

// Two horizontally adjacent accumulators (an m16n8 / wgmma fragment pair) sparsified and stored
// as one 32-bit word at vals[c] (c even) of a staged row.
template <class T>
__device__ __forceinline__ void stage_pair(std::uint16_t* vals_row, int c, float a0, float a1, Activation kind,
                                           float threshold) {
  const std::uint32_t lo = ValueTraits<T>::to_bits(sparsified<T>(a0, kind, threshold));
  const std::uint32_t hi = ValueTraits<T>::to_bits(sparsified<T>(a1, kind, threshold));
  *reinterpret_cast<std::uint32_t*>(vals_row + c) = lo | (hi << 16);
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

// One warp writes the TwELL slots of (row, tile) from a staged row of BN sparsified 16-bit
// values (+0 = not stored; columns >= tile_cols are ignored). `group` is the row's slot group,
// o.packed + layout.slot_offset(row, tile, N). Per 32-column chunk one ballot marks the stored
// lanes and a popc prefix gives each its slot, so slots come out in column order and lanes write
// consecutive words; slots past the count are zeroed and slot 0 gets the count (clamped under
// drop), so every word of the slot group is written. An overflowed tile sets the row's flag.
// Lane 0 adds the count, and the excess over the capacity, to its running totals.
template <int BN>
__device__ __forceinline__ void pack_twell_row(const std::uint16_t* vals_row, std::uint32_t* group, std::int64_t row,
                                               int tile_cols, const TwellRows& geo, const TwellOut& o, int lane,
                                               unsigned long long& stored, unsigned long long& excess) {
  const std::uint32_t lanes_below = (1u << lane) - 1u;
  std::uint16_t bits[BN / 32];
#pragma unroll
  for (int i = 0; i < BN / 32; ++i) bits[i] = vals_row[32 * i + lane];  // all loads in flight at once
  int count = 0;
#pragma unroll
  for (int i = 0; i < BN / 32; ++i) {
    const int col = 32 * i + lane;
    const bool here = bits[i] != 0 && col < tile_cols;
    const std::uint32_t mask = __ballot_sync(0xffffffffu, here);
    const int pos = count + __popc(mask & lanes_below);
    if (here && pos < geo.capacity) group[1 + pos] = TwellLayout::pack(bits[i], static_cast<std::uint32_t>(col));
    count += __popc(mask);
  }
  const int written = min(count, geo.capacity);
  for (int s = 1 + written + lane; s < geo.slots; s += 32) group[s] = 0u;
  if (lane == 0) {
    group[0] = static_cast<std::uint32_t>(o.clamp_count ? written : count);
    if (count > geo.capacity) {
      o.row_flags[row] = 1;
      excess += static_cast<unsigned long long>(count - geo.capacity);
    }
    stored += static_cast<unsigned long long>(count);
  }
}

// A warp's totals into the device accumulators: 64-bit integer atomics, so the sums do not
// depend on the order.
__device__ __forceinline__ void flush_twell_totals(const TwellOut& o, int lane, unsigned long long stored,
                                                   unsigned long long excess) {
  if (lane == 0 && stored != 0) atomicAdd(o.stored_total, stored);
  if (lane == 0 && excess != 0) atomicAdd(o.excess_total, excess);
}

}  // namespace twell::cuda::detail
