// The per-(row, tile) TwELL packing every cuda converter into TwELL shares: a warp walks the
// candidates of one (row, tile) in column order, chunk by chunk, ranks the stored ones with a
// warp prefix sum, writes them to their slots, then writes slot 0 and the zero padding, and
// applies the overflow policy. Kernels differ only in where the candidates come from.
#pragma once

#include <cstdint>

#include <twell/converters/options.hpp>
#include <twell/formats/layout.hpp>
#include <twell/types.hpp>

#include "common.cuh"
#include "warp_scan.cuh"

namespace twell::cuda::detail {

// Where an overflowed (row, tile) goes: its key into first_overflow (error), its surplus into
// dropped (drop), or a flag on its row (hybrid). counters is null under drop when nothing is read
// back (no report): kernels then skip every counter update, and the host never waits.
struct OverflowTarget {
  OverflowPolicy policy = OverflowPolicy::error;
  Counters* counters = nullptr;
  std::int32_t* row_flags = nullptr;  // hybrid: one flag per row, zeroed before the kernel
};

// One (row, tile)'s slots: packed words, and for fp32 the value plane at the same offset.
template <class T>
struct TileSlots {
  std::uint32_t* packed;
  T* values;  // null for 16-bit types
};

template <class T>
__device__ inline void write_entry(TileSlots<T> slots, int slot, std::uint32_t local_col, T v) {
  if constexpr (ValueTraits<T>::packs_in_slot) {
    slots.packed[slot] = TwellLayout::pack(ValueTraits<T>::to_bits(v), local_col);
  } else {
    slots.packed[slot] = local_col;
    slots.values[slot] = v;
  }
}

// One chunk of candidates: lane l holds kPerLane of them, all of lane l's columns before lane
// l+1's, with bit k of `stored` set when candidate k is kept. `count` is the number of stored
// entries of the (row, tile) before this chunk (warp-uniform); returns it after the chunk.
// Entries past the capacity are counted but not written. Must be called by the whole warp.
template <class T, int kPerLane>
__device__ inline int pack_chunk(TileSlots<T> slots, int capacity, int count, unsigned stored,
                                 const T (&v)[kPerLane], const std::uint32_t (&local_col)[kPerLane]) {
  const int lane = lane_id();
  const int mine = __popc(stored);
  const int inclusive = warp_inclusive_sum(mine, lane);
  int rank = count + inclusive - mine;
#pragma unroll
  for (int k = 0; k < kPerLane; ++k) {
    if (stored & (1u << k)) {
      if (rank < capacity) write_entry(slots, 1 + rank, local_col[k], v[k]);
      ++rank;
    }
  }
  return count + __shfl_sync(kFullMask, inclusive, kWarpSize - 1);
}

// The values a (row, tile) of `count` candidates holds: all of them (a hybrid's shadow row is whole
// in its dense block), or under drop at most the capacity.
__device__ inline int held_count(int count, int capacity, OverflowPolicy policy) {
  return policy == OverflowPolicy::drop && count > capacity ? capacity : count;
}

// Lane 0's bookkeeping for a (row, tile) whose slots are written, with its true count: an
// overflowed tile goes to the policy's target. `key` is row * tiles + tile, so the smallest key is
// the first (row, tile) in row-major order. Returns held_count.
__device__ inline int account_tile(int count, int capacity, std::int64_t row, std::int64_t key,
                                   const OverflowTarget& overflow) {
  if (count > capacity) {
    switch (overflow.policy) {
      case OverflowPolicy::error:
        atomicMin(&overflow.counters->first_overflow, static_cast<unsigned long long>(key));
        break;
      case OverflowPolicy::drop:
        if (overflow.counters != nullptr)
          atomicAdd(&overflow.counters->dropped, static_cast<unsigned long long>(count - capacity));
        break;
      case OverflowPolicy::hybrid:
        overflow.row_flags[row] = 1;
        break;
    }
  }
  return held_count(count, capacity, overflow.policy);
}

// Closes a (row, tile) once all its candidates went through pack_chunk: slot 0, the zero padding
// after the written entries, the fp32 value plane's slot 0, and the overflow policy
// (account_tile). Slot 0 keeps the true count except under drop, where the surplus is gone and
// slot 0 counts what is left. Returns held_count in every lane. Must be called by the whole warp.
template <class T>
__device__ inline int finish_tile(TileSlots<T> slots, int slot_count, int capacity, int count, std::int64_t row,
                                  std::int64_t key, const OverflowTarget& overflow) {
  const int lane = lane_id();
  const int kept = count < capacity ? count : capacity;
  for (int s = 1 + kept + lane; s < slot_count; s += kWarpSize) {
    slots.packed[s] = 0u;
    if constexpr (!ValueTraits<T>::packs_in_slot) slots.values[s] = T{};
  }
  const int held = held_count(count, capacity, overflow.policy);
  if (lane == 0) {
    slots.packed[0] = static_cast<std::uint32_t>(held);
    if constexpr (!ValueTraits<T>::packs_in_slot) slots.values[0] = T{};
    account_tile(count, capacity, row, key, overflow);
  }
  return held;
}

}  // namespace twell::cuda::detail
