// Internal to the cuda kernels: one CTA of 1024 threads walking a per-row predicate over M rows
// in row order (the overflow ranking of gemm_to_sparse, the FFN's block order). Each warp owns a
// contiguous range of rows and reads it 32 rows per ballot, kBallotSteps ballots at a time:
// coalesced loads, all of a batch in flight, so a warp pays one memory latency per
// 32 x kBallotSteps rows (a thread-per-row-range walk with strided accesses, or a per-chunk
// dependent chain, took 17-25 us at M = 16384 on the H100). Not installed.
#pragma once

#include <cstdint>

#include <cub/block/block_scan.cuh>
#include <cuda_runtime.h>

namespace twell::cuda::detail {

constexpr int kBallotSteps = 16;

// Warp w's rows [begin, end): ceil(M / 1024) x 32 rows per warp (a multiple of 32 and of every
// block size dividing 32), clipped to M.
struct WarpRows {
  std::int64_t begin = 0, end = 0;
};

__device__ __forceinline__ WarpRows warp_rows(std::int64_t m, int warp) {
  const std::int64_t per = (m + 1023) / 1024 * 32;
  const std::int64_t begin = min(m, warp * per);
  return {begin, min(m, begin + per)};
}

// Ballot s of the warp: bit l = pred(first + 32 s + l), false past `end`. The predicates (and
// their loads) are evaluated before any ballot, so the compiler issues the loads together.
template <class Pred>
__device__ __forceinline__ void row_ballots(std::int64_t first, std::int64_t end, int lane, Pred pred,
                                            std::uint32_t (&ballots)[kBallotSteps]) {
  bool p[kBallotSteps];
#pragma unroll
  for (int s = 0; s < kBallotSteps; ++s) {
    const std::int64_t i = first + 32 * s + lane;
    p[s] = i < end && pred(i);
  }
#pragma unroll
  for (int s = 0; s < kBallotSteps; ++s) ballots[s] = __ballot_sync(0xffffffffu, p[s]);
}

// f(first, ballots) for each batch of the warp's rows: ballots of rows first .. first + 32
// kBallotSteps - 1 (row_ballots). Called by the whole warp.
template <class Pred, class F>
__device__ __forceinline__ void for_each_ballot_batch(const WarpRows& rows, int lane, Pred pred, F f) {
  std::uint32_t ballots[kBallotSteps];
  for (std::int64_t first = rows.begin; first < rows.end; first += 32 * kBallotSteps) {
    row_ballots(first, rows.end, lane, pred, ballots);
    f(first, ballots);
  }
}

// The sum of the counts of the warps before this one (each warp's lane-0 value counts), for
// every lane; `total`: the CTA's sum. Called once per kernel by all 1024 threads.
__device__ __forceinline__ std::int32_t count_of_warps_before(std::int32_t count, int lane, std::int32_t& total) {
  using Scan = cub::BlockScan<std::int32_t, 1024>;
  __shared__ typename Scan::TempStorage scan;
  std::int32_t before = 0;
  Scan(scan).ExclusiveSum(lane == 0 ? count : 0, before, total);
  return __shfl_sync(0xffffffffu, before, 0);
}

}  // namespace twell::cuda::detail
