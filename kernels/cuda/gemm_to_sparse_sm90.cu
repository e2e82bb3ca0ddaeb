// The Hopper (sm_90a) fused GEMM + TwELL epilogue of gemm_to_sparse: Y = act(X W) with X
// (M x K) and W (K x N) row-major bf16/fp16, fp32 accumulation, written as TwELL by the same
// epilogue code as the portable mma.sync kernel (twell_epilogue.cuh), so both produce the same
// bits. Mainloop: TMA (cp.async.bulk.tensor) into a ring of shared-memory stages completed on
// mbarriers, wgmma m64nBNk16 from shared-memory descriptors; a warpgroup holding the TMA producer
// and three packer warps, one or two consumer warpgroups (CTA tiles of 64 or 128 rows);
// persistent CTAs. Raw PTX, no CUTLASS
// (docs/gemm_to_sparse.md says why).
#include <algorithm>
#include <climits>
#include <cstdint>
#include <type_traits>

#include <cuda_runtime.h>

#include <twell/error.hpp>
#include <twell/instantiate.hpp>

#include "cuda_check.hpp"
#include "cuda_launch.cuh"
#include "gemm_to_sparse_sm90.cuh"
#include "mbarrier.cuh"
#include "sm90_support.cuh"

// Outside the sm_90a pass (TWELL_SM90A_DEVICE, sm90_support.cuh) the kernels compile empty; the
// host never launches them there.

namespace twell::cuda::detail {
namespace {

// CTA rows BM: 128 (two consumer warpgroups of 64 rows) or, where 128-row tiles would leave
// most SMs idle (decode-sized M), 64 (one consumer warpgroup). A warpgroup of producer and
// packer warps comes first.
constexpr int kBK = 64;  // K per stage: one 128-byte swizzle row of 16-bit values
template <int BM>
constexpr int kThreadsOf = 128 * (1 + BM / 64);
// CTAs per cluster: the two CTAs of a cluster compute the same TwELL tile of two adjacent row
// blocks and each loads half of every stage's W boxes into both by TMA multicast.
constexpr int kCluster = 2;
// CTAs per cluster of the split-K decode kernel (gemm_twell_sm90_split_kernel): each sums one of
// kSplit contiguous K ranges of the same TwELL tile. Part of that kernel's bits: the ranges, and
// so the fp32 sums, depend on it.
constexpr int kSplit = 4;

// Output tile pairs of an M x N product in CTA tiles of bm x bn: one per cluster-sized group of
// row blocks and TwELL tile (the persistent loop's range, and the most clusters a launch can use).
__host__ __device__ constexpr std::int64_t tile_pairs(std::int64_t m, std::int64_t n, int bn, int bm) {
  return ((n + bn - 1) / bn) * (((m + bm - 1) / bm + kCluster - 1) / kCluster);
}

// Shared memory of a CTA of BM x BN outputs, from a 1024-byte aligned base (what the 128-byte
// swizzle of TMA and wgmma needs): kStages x (A: BM rows x 128 B, B: BN / 64 boxes of 64 K-rows x
// 128 B), then the staged tile (all BM rows of kLd 16-bit values: the consumers write it and go
// on with the next tile's wgmmas while the packer warps read it), then the mbarriers (full and
// empty per stage, then the staged tile's full and empty). A stage is released one K step after
// its wgmmas were issued, so kStages - 2 stages are in flight while the tensor cores work: what
// fits next to the staged tile in 227 KB, 3 x 48 KB (BM 128, BN 256), 5 x 32 KB (128, 128),
// 4 x 40 KB (64, 256) and 8 x 24 KB (64, 128).
template <int BN, int BM = 128>
struct Sm90Tile {
  static constexpr int kStages = BM == 128 ? (BN == 256 ? 3 : 5) : (BN == 256 ? 4 : 8);
  static constexpr int kABytes = BM * kBK * 2;
  static constexpr int kBBoxBytes = kBK * 64 * 2;
  static constexpr int kBBytes = (BN / 64) * kBBoxBytes;
  static constexpr int kStageBytes = kABytes + kBBytes;
  static constexpr int kLd = BN + 8;  // 16-bit words; fragment stores hit 32 distinct banks
  static constexpr int kStagedBytes = BM * kLd * 2;
  static constexpr int kBarrierOffset = kStages * kStageBytes + kStagedBytes;
  static constexpr int kBarriers = 2 * kStages + 2;
  static constexpr int kSmem = 1024 + kBarrierOffset + kBarriers * 8;
  static_assert(kSmem <= 227 * 1024, "beyond the shared memory of an sm_90 block");
};

#if TWELL_SM90A_DEVICE

constexpr int kPackerWarps = 3;  // warps 1 .. 3 of warpgroup 0 (warp 0 issues the TMA copies)
// Registers per thread after setmaxnreg, with two consumer warpgroups (BM = 128): the pool of 384
// x 168 split between the consumers' accumulators and the packers (256 x 200 + 128 x 104 =
// 64,512). With one (BM = 64) the 256 threads may each hold 255 registers, so nothing is moved.
constexpr int kConsumerRegisters = 200;
constexpr int kProducerRegisters = 104;

// The same into this CTA and its cluster peer at the same shared offsets, completing on each one's
// `bar` at that offset.
__device__ __forceinline__ void tma_load_2d_both(void* dst, const CUtensorMap* map, std::uint64_t* bar, int inner,
                                                 int outer) {
  constexpr std::uint16_t kBoth = (1u << kCluster) - 1u;
  asm volatile(
      "cp.async.bulk.tensor.2d.shared::cluster.global.tile.mbarrier::complete_tx::bytes.multicast::cluster [%0], "
      "[%1, {%3, %4}], [%2], %5;\n" ::"r"(shared_address(dst)),
      "l"(reinterpret_cast<std::uint64_t>(map)), "r"(shared_address(bar)), "r"(inner), "r"(outer), "h"(kBoth)
      : "memory");
}

// Arrives on the mbarrier at `bar`'s offset in cluster CTA `cta` (this one included). Default
// (.release.cta) semantics, as the stage hand-back needs: with .release.cluster ptxas puts a
// MEMBAR.ALL.GPU before every arrive, which made the multicast kernel twice as slow as without.
__device__ __forceinline__ void mbar_arrive_in(std::uint64_t* bar, std::uint32_t cta) {
  asm volatile(
      "{\n.reg .b32 remote;\nmapa.shared::cluster.u32 remote, %0, %1;\nmbarrier.arrive.shared::cluster.b64 _, "
      "[remote];\n}\n" ::"r"(shared_address(bar)),
      "r"(cta)
      : "memory");
}

__device__ __forceinline__ void cluster_sync() {
  asm volatile("barrier.cluster.arrive.release.aligned;\nbarrier.cluster.wait.acquire.aligned;\n" ::: "memory");
}

__device__ __forceinline__ std::uint32_t cluster_rank() {
  std::uint32_t r;
  asm volatile("mov.u32 %0, %%cluster_ctarank;\n" : "=r"(r));
  return r;
}

// The generic address of this CTA's shared `p` in cluster CTA `cta`: ordinary loads through it
// read that CTA's shared memory. Ordinary loads, not ld.shared::cluster in asm volatile, so that
// the compiler may interleave them with the arithmetic within its register budget (volatile
// loads stay in program order, and ptxas held all of them in registers at once: a spill).
template <class U>
__device__ __forceinline__ const U* map_shared_rank(const U* p, std::uint32_t cta) {
  std::uint64_t remote;
  asm volatile("mapa.u64 %0, %1, %2;\n" : "=l"(remote) : "l"(reinterpret_cast<std::uint64_t>(p)), "r"(cta));
  return reinterpret_cast<const U*>(remote);
}

// wgmma shared-memory matrix descriptor: start address, leading and stride byte offsets (all
// >> 4, 14 bits each at bits 0, 16 and 32), base offset 0 (every swizzle atom is 1024-byte
// aligned), swizzle mode 1 = 128 B at bits 62-63.
__device__ __forceinline__ std::uint64_t smem_desc(std::uint32_t addr, std::uint32_t lbo, std::uint32_t sbo) {
  return static_cast<std::uint64_t>((addr & 0x3FFFFu) >> 4) | (static_cast<std::uint64_t>((lbo & 0x3FFFFu) >> 4) << 16) |
         (static_cast<std::uint64_t>((sbo & 0x3FFFFu) >> 4) << 32) | (1ull << 62);
}

__device__ __forceinline__ void wgmma_fence() { asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory"); }
__device__ __forceinline__ void wgmma_commit() { asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory"); }
template <int N>
__device__ __forceinline__ void wgmma_wait() {
  asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(N) : "memory");
}

// Pins the accumulators at this point of the instruction stream: the compiler may not move their
// reads or writes across it (wgmma writes them asynchronously, behind its back).
template <int N>
__device__ __forceinline__ void fence_accumulators(float (&d)[N]) {
#pragma unroll
  for (int i = 0; i < N; ++i) asm volatile("" : "+f"(d[i])::"memory");
}

// The accumulator operands of one wgmma: "%0, ..., %N-1" in the instruction, "+f"(d[i]) in the
// operand list; the descriptors and the scale-d flag follow as %N, %N+1 and %N+2.
#define TWELL_WGMMA_REGS_64 \
  "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, " \
  "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, " \
  "%32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, " \
  "%48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63"
#define TWELL_WGMMA_REGS_128 \
  TWELL_WGMMA_REGS_64 ", " \
  "%64, %65, %66, %67, %68, %69, %70, %71, %72, %73, %74, %75, %76, %77, %78, %79, " \
  "%80, %81, %82, %83, %84, %85, %86, %87, %88, %89, %90, %91, %92, %93, %94, %95, " \
  "%96, %97, %98, %99, %100, %101, %102, %103, %104, %105, %106, %107, %108, %109, %110, %111, " \
  "%112, %113, %114, %115, %116, %117, %118, %119, %120, %121, %122, %123, %124, %125, %126, %127"
#define TWELL_WGMMA_ACC_8(i) \
  "+f"(d[i]), "+f"(d[i + 1]), "+f"(d[i + 2]), "+f"(d[i + 3]), "+f"(d[i + 4]), "+f"(d[i + 5]), "+f"(d[i + 6]), \
      "+f"(d[i + 7])
#define TWELL_WGMMA_ACC_64 \
  TWELL_WGMMA_ACC_8(0), TWELL_WGMMA_ACC_8(8), TWELL_WGMMA_ACC_8(16), TWELL_WGMMA_ACC_8(24), TWELL_WGMMA_ACC_8(32), \
      TWELL_WGMMA_ACC_8(40), TWELL_WGMMA_ACC_8(48), TWELL_WGMMA_ACC_8(56)
#define TWELL_WGMMA_ACC_128 \
  TWELL_WGMMA_ACC_64, TWELL_WGMMA_ACC_8(64), TWELL_WGMMA_ACC_8(72), TWELL_WGMMA_ACC_8(80), TWELL_WGMMA_ACC_8(88), \
      TWELL_WGMMA_ACC_8(96), TWELL_WGMMA_ACC_8(104), TWELL_WGMMA_ACC_8(112), TWELL_WGMMA_ACC_8(120)
// One wgmma instruction; scale-d is the predicate (accumulate != 0; 0: D = A B, the old
// accumulators are not read).
#define TWELL_WGMMA(shape, type, regs, a, b, flag, accumulators)                                      \
  asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %" flag ", 0;\n"                                    \
               "wgmma.mma_async.sync.aligned." shape ".f32." type "." type " {" regs "}, %" a ", %" b \
               ", p, 1, 1, 0, 1;\n}\n"                                                                \
               : accumulators                                                                        \
               : "l"(desc_a), "l"(desc_b), "r"(accumulate))

// D(64 x BN, fp32) (+)= A(64 x 16, K-major) B(16 x BN, MN-major: imm-trans-b = 1), both from shared
// memory.
template <class T, int BN>
__device__ __forceinline__ void wgmma_tile(float (&d)[BN / 2], std::uint64_t desc_a, std::uint64_t desc_b,
                                           std::uint32_t accumulate) {
  constexpr bool kBf16 = std::is_same_v<T, bf16>;
  if constexpr (BN == 256 && kBf16) {
    TWELL_WGMMA("m64n256k16", "bf16", TWELL_WGMMA_REGS_128, "128", "129", "130", TWELL_WGMMA_ACC_128);
  } else if constexpr (BN == 256) {
    TWELL_WGMMA("m64n256k16", "f16", TWELL_WGMMA_REGS_128, "128", "129", "130", TWELL_WGMMA_ACC_128);
  } else if constexpr (kBf16) {
    TWELL_WGMMA("m64n128k16", "bf16", TWELL_WGMMA_REGS_64, "64", "65", "66", TWELL_WGMMA_ACC_64);
  } else {
    TWELL_WGMMA("m64n128k16", "f16", TWELL_WGMMA_REGS_64, "64", "65", "66", TWELL_WGMMA_ACC_64);
  }
}

#undef TWELL_WGMMA
#undef TWELL_WGMMA_ACC_128
#undef TWELL_WGMMA_ACC_64
#undef TWELL_WGMMA_ACC_8
#undef TWELL_WGMMA_REGS_128
#undef TWELL_WGMMA_REGS_64

// One stage's four k16 wgmmas into `acc`, committed as one group: A at shared address `a` (K-major,
// 64 rows), B at `b` (MN-major, BN / 64 boxes). `step` is the stage's K step within the sum:
// step 0 starts it (D = A B), so no zero fill of acc is read.
template <class T, int BN>
__device__ __forceinline__ void wgmma_stage(float (&acc)[BN / 2], std::uint32_t a, std::uint32_t b,
                                            std::uint32_t step) {
  fence_accumulators(acc);
  wgmma_fence();
#pragma unroll
  for (int kk = 0; kk < kBK / 16; ++kk)
    wgmma_tile<T, BN>(acc, smem_desc(a + kk * 32, 16, 1024), smem_desc(b + kk * 2048, Sm90Tile<BN>::kBBoxBytes, 1024),
                      (step | kk) != 0 ? 1u : 0u);
  wgmma_commit();
  fence_accumulators(acc);
}

// Four 8 x 8 matrices of 16-bit pairs from the fragment layout (thread t holds row t / 4,
// columns 2 (t % 4) and +1 of each) into shared memory; lanes 8j .. 8j+7 give the row addresses
// of matrix j.
__device__ __forceinline__ void stmatrix_x4(void* row, std::uint32_t r0, std::uint32_t r1, std::uint32_t r2,
                                            std::uint32_t r3) {
  asm volatile("stmatrix.sync.aligned.m8n8.x4.shared.b16 [%0], {%1, %2, %3, %4};\n" ::"r"(shared_address(row)),
               "r"(r0), "r"(r1), "r"(r2), "r"(r3)
               : "memory");
}

// The warp's 8 fragment rows 8h .. 8h+7 (h = 0, 1), activated and rounded, into its staging rows
// (ld Sm90Tile<BN>::kLd) by stmatrix, 4 chunks of 8 columns per instruction; `my_row` is the
// lane's stmatrix row address. Sets `nan` as activated_pair does.
template <class T, int BN, bool kRelu>
__device__ __forceinline__ void stage_half(const float (&acc)[BN / 2], int h, std::uint16_t* my_row, const Sm90Gemm& g,
                                           bool& nan) {
#pragma unroll
  for (int i = 0; i < BN / 8; i += 4) {
    std::uint32_t w[4];
#pragma unroll
    for (int j = 0; j < 4; ++j)
      w[j] = activated_pair<T, kRelu>(acc[4 * (i + j) + 2 * h], acc[4 * (i + j) + 2 * h + 1], g.kind, g.threshold, nan);
    stmatrix_x4(my_row + 8 * i, w[0], w[1], w[2], w[3]);
  }
}

// A consumer warp's 16 fragment rows (16q .. 16q+15 of its m64nBN accumulator), activated and
// rounded, into `rows` (their place in the staged tile, ld Sm90Tile<BN>::kLd), 8 rows at a time
// by stage_half: ReLU by relu_pair, and again by the portable rounding if a NaN showed up.
template <class T, int BN>
__device__ __forceinline__ void stage_warp_rows(const float (&acc)[BN / 2], std::uint16_t* rows, const Sm90Gemm& g,
                                                int lane) {
  constexpr int kLd = Sm90Tile<BN>::kLd;
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    std::uint16_t* my_row = rows + (8 * h + (lane & 7)) * kLd + 8 * (lane >> 3);
    bool nan = false;
    if (g.kind == Activation::relu) stage_half<T, BN, true>(acc, h, my_row, g, nan);
    if (__any_sync(0xffffffffu, nan) || g.kind != Activation::relu) stage_half<T, BN, false>(acc, h, my_row, g, nan);
  }
}

// Staged rows first .. first+count-1 of the tile whose row 0 is matrix row m0 packed into their
// TwELL slot groups of `tile` by one packer warp (pack_twell_rows_by_lane).
template <int BN>
__device__ __forceinline__ void pack_staged_rows(const std::uint16_t* staged, int first, int count, std::int64_t m0,
                                                 std::int64_t tile, int tile_cols, const Sm90Gemm& g, const TwellOut& o,
                                                 int lane, unsigned long long& stored, unsigned long long& excess) {
  constexpr int kLd = Sm90Tile<BN>::kLd;
  const TwellRows geo = twell_rows(o, g.n);
  std::uint32_t* groups = o.packed + o.layout.slot_offset(m0, tile, g.n) + first * geo.width;
  pack_twell_rows_by_lane<BN>(staged + first * kLd, kLd, count, groups, geo.width, m0 + first, g.m, tile, tile_cols,
                              geo, o, lane, stored, excess);
}

// This CTA's output tiles: cluster c of the grid's C takes tile pairs c, c + C, ...; pair p is
// TwELL tile p % tiles_n of row blocks 2 (p / tiles_n) + 0 and + 1 (BM rows each), one per CTA of
// the cluster. With an odd number of row blocks the last pairs' second row block lies past M: its
// CTA loads zeros (TMA fills out-of-bounds boxes), supplies its half of W to its peer, and packs
// no row.
template <int BN, int BM>
struct TileWalk {
  std::int64_t tiles_n, pairs, first, step;
  int rank;
  __device__ TileWalk(const Sm90Gemm& g, std::int64_t rows)
      : tiles_n((g.n + BN - 1) / BN),
        pairs(tile_pairs(rows, g.n, BN, BM)),
        first(blockIdx.x / kCluster),
        step(gridDim.x / kCluster),
        rank(static_cast<int>(cluster_rank())) {}
  __device__ std::int64_t tile(std::int64_t p) const { return p % tiles_n; }
  __device__ std::int64_t row0(std::int64_t p) const { return ((p / tiles_n) * kCluster + rank) * BM; }
};

#endif  // TWELL_SM90A_DEVICE

// Fused GEMM + activation + TwELL packing, persistent, in clusters of 2 CTAs (TileWalk: the two
// CTAs of a cluster take the same TwELL tile of adjacent row blocks, the clusters of a wave share
// row blocks and walk all of W, which stays in L2). Three roles:
// - warp 0 (one thread) produces: per K step, the TMA box of X (BM rows x 64 K) into its own
//   stage and half of the BN / 64 boxes of W (64 K x 64 columns) into the stage of both CTAs
//   (multicast), waiting on its "empty" mbarrier (released by the consumers of both CTAs, since
//   the peer writes into it too) and arming its "full" one with the stage's bytes. Sharing W
//   halves the W traffic from L2 (BM 128, BN 256: 32 instead of 48 KB per CTA and K step), which
//   L2 bandwidth, not the tensor cores, had set the pace by;
// - warpgroups 1 and 2 (BM = 128) or 1 (BM = 64) consume: consumer c owns rows 64c .. 64c+63 of
//   the tile as the m64nBN fp32
//   accumulator of wgmma (warp q of it rows 16q .. 16q+15: per 8-column chunk i, d[4i + 2h + e]
//   is row lane/4 + 8h, column 8i + 2 (lane % 4) + e), issues 4 wgmma k16 steps per stage and
//   releases a stage, in both CTAs, once the next stage's wgmmas are issued and the older group
//   has retired.
//   At the end of a tile each warp sparsifies its 16 rows into the staged tile (stage_warp_rows,
//   stmatrix) and goes straight on to the next tile's wgmmas;
// - warps 1 .. 3 pack: each takes a third of the staged tile's rows, a lane per row
//   (pack_twell_rows_by_lane: slots, counts, flags, totals), hidden behind the consumers' next
//   mainloop.
// The staged tile is handed over by two mbarriers ("staged": a consumer thread's arrival each;
// "packed": 96 packer arrivals), so the consumers run at most one tile ahead of the packing. A cluster barrier
// after the mbarrier set-up and another before exit keep each CTA's barriers and stages alive
// while its peer may signal or write them.
// Shared-memory layouts: A K-major, 128-byte swizzle (TMA SWIZZLE_128B), descriptor SBO 1024 (8
// rows of 128 B), k16 step +32 B; B MN-major, 128-byte swizzle, descriptor LBO 8192 (from one
// 64-column box to the next), SBO 1024 (8 K-rows), k16 step +2048 B (16 K-rows). Preconditions:
// gemm_twell_sm90_applies, o.layout.tile == BN, row_flags zeroed. Benchmark:
// bench/suites/gemm_to_sparse.cpp.
// kDense (the plan's overflow recompute): the packer warps copy the staged rows below
// min(M, *d.m_limit) to d.out instead of packing them (the walk covers only those row blocks);
// o is not used.
template <class T, int BN, int BM, bool kDense>
__global__ void __launch_bounds__(kThreadsOf<BM>, 1)
    gemm_twell_sm90_kernel(const __grid_constant__ CUtensorMap map_x, const __grid_constant__ CUtensorMap map_w,
                           Sm90Gemm g, TwellOut o, Sm90Dense d) {
  ::twell::detail::wait_for_prior_grids();
#if TWELL_SM90A_DEVICE
  using P = Sm90Tile<BN, BM>;
  constexpr int kConsumerWarps = BM / 16;  // 4 per consumer warpgroup
  extern __shared__ __align__(1024) unsigned char smem_raw[];
  unsigned char* smem = smem_raw + ((1024u - (shared_address(smem_raw) & 1023u)) & 1023u);
  auto* full = reinterpret_cast<std::uint64_t*>(smem + P::kBarrierOffset);
  std::uint64_t* empty = full + P::kStages;
  std::uint64_t* staged_full = empty + P::kStages;
  std::uint64_t* staged_empty = staged_full + 1;
  auto* staged = reinterpret_cast<std::uint16_t*>(smem + P::kStages * P::kStageBytes);
  const int tid = static_cast<int>(threadIdx.x);
  const int warp = tid >> 5;
  const int lane = tid & 31;
  std::int64_t rows = g.m;
  if (kDense && d.m_limit != nullptr) rows = min(rows, static_cast<std::int64_t>(*d.m_limit));
  const TileWalk<BN, BM> walk(g, rows);
  const int ktiles = static_cast<int>((g.k + kBK - 1) / kBK);
  // A recompute with no overflow row (the common case) leaves before any set-up: every CTA reads
  // the same limit, so none waits at a cluster barrier for a peer that left.
  if (kDense && walk.pairs == 0) return;

  if (tid == 0) {
    for (int s = 0; s < P::kStages; ++s) {
      mbar_init(&full[s], 1);                // the producer's arrive, plus the TMA bytes
      mbar_init(&empty[s], kCluster * kConsumerWarps);  // lane 0 of every consumer warp of both CTAs
    }
    mbar_init(staged_full, kConsumerWarps * 32);
    mbar_init(staged_empty, kPackerWarps * 32);
    mbar_init_fence();
  }
  cluster_sync();  // the peer's barriers are initialised before any TMA or arrive reaches them

  if (warp < 4) {
    // One setmaxnreg for the whole warpgroup: PTX requires every warp of it to execute the same one.
    if constexpr (BM == 128) asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(kProducerRegisters));
    if (warp == 0) {
      if (tid == 0) {
        asm volatile("prefetch.tensormap [%0];\n" ::"l"(reinterpret_cast<std::uint64_t>(&map_x)) : "memory");
        asm volatile("prefetch.tensormap [%0];\n" ::"l"(reinterpret_cast<std::uint64_t>(&map_w)) : "memory");
        std::uint32_t it = 0;
        for (std::int64_t t = walk.first; t < walk.pairs; t += walk.step) {
          const int n0 = static_cast<int>(walk.tile(t) * BN);
          const int m0 = static_cast<int>(walk.row0(t));
          for (int kt = 0; kt < ktiles; ++kt, ++it) {
            const std::uint32_t s = it % P::kStages;
            mbar_wait(&empty[s], ((it / P::kStages) & 1u) ^ 1u);  // a fresh barrier passes parity 1
            unsigned char* a = smem + s * P::kStageBytes;
            unsigned char* b = a + P::kABytes;
            mbar_expect_tx(&full[s], P::kStageBytes);
            tma_load_2d(a, &map_x, &full[s], kt * kBK, m0);
#pragma unroll
            for (int h = 0; h < BN / 64 / kCluster; ++h) {
              const int j = walk.rank * (BN / 64 / kCluster) + h;
              tma_load_2d_both(b + j * P::kBBoxBytes, &map_w, &full[s], n0 + 64 * j, kt * kBK);
            }
          }
        }
      }
    } else {
      // Rows BM * p / kPackerWarps .. of the tile: 42, 43 and 43 rows at BM = 128.
      const int p = warp - 1;
      const int first = BM * p / kPackerWarps;
      const int count = BM * (p + 1) / kPackerWarps - first;
      unsigned long long stored = 0, excess = 0;
      std::uint32_t phase = 0;
      for (std::int64_t t = walk.first; t < walk.pairs; t += walk.step, phase ^= 1u) {
        const std::int64_t tile = walk.tile(t);
        const std::int64_t m0 = walk.row0(t);
        const int tile_cols = static_cast<int>(min(std::int64_t{BN}, g.n - tile * BN));
        mbar_wait(staged_full, phase);
        if constexpr (kDense) {
          // A row per step, 16 bytes per lane: the staged values are already the stored ones.
          auto* out = static_cast<std::uint16_t*>(d.out) + tile * BN;
          for (int r = first; r < first + count && m0 + r < rows; ++r)
            for (int c = 8 * lane; c < tile_cols; c += 256)
              *reinterpret_cast<uint4*>(out + (m0 + r) * d.ldo + c) =
                  *reinterpret_cast<const uint4*>(staged + r * P::kLd + c);
        } else {
          pack_staged_rows<BN>(staged, first, count, m0, tile, tile_cols, g, o, lane, stored, excess);
        }
        mbar_arrive(staged_empty);  // this thread's reads of the staged tile are done
      }
      if constexpr (!kDense) flush_lane_totals(o, lane, stored, excess);
    }
  } else {
    if constexpr (BM == 128) asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(kConsumerRegisters));
    const int c = (warp >> 2) - 1;  // consumer warpgroup: rows 64c .. 64c+63 of the tile
    const int q = warp & 3;         // warp in the warpgroup: rows 16q .. 16q+15 of those
    std::uint16_t* my_rows = staged + (c * 64 + q * 16) * P::kLd;
    constexpr int kAccumulators = BN / 2;  // 64 x BN fp32 over the 128 threads of the warpgroup
    float acc[kAccumulators];
#pragma unroll
    for (int i = 0; i < kAccumulators; ++i) acc[i] = 0.0f;
    std::uint32_t it = 0, phase = 0;
    // A stage goes back to the producers of both CTAs (both write into it).
    auto release = [&](std::uint32_t stage) {
      if (lane == 0)
        for (std::uint32_t cta = 0; cta < kCluster; ++cta) mbar_arrive_in(&empty[stage], cta);
    };
    for (std::int64_t t = walk.first; t < walk.pairs; t += walk.step, phase ^= 1u) {
      for (int kt = 0; kt < ktiles; ++kt, ++it) {
        const std::uint32_t s = it % P::kStages;
        mbar_wait(&full[s], (it / P::kStages) & 1u);
        const std::uint32_t a = shared_address(smem + s * P::kStageBytes) + c * (64 * 128);
        const std::uint32_t b = shared_address(smem + s * P::kStageBytes + P::kABytes);
        wgmma_stage<T, BN>(acc, a, b, static_cast<std::uint32_t>(kt));
        if (kt > 0) {
          wgmma_wait<1>();  // the previous stage's group has retired: its buffers are free
          release((it - 1) % P::kStages);
        }
      }
      wgmma_wait<0>();
      fence_accumulators(acc);
      release((it - 1) % P::kStages);
      mbar_wait(staged_empty, phase ^ 1u);  // the packers are done with the previous tile
      stage_warp_rows<T, BN>(acc, my_rows, g, lane);
      mbar_arrive(staged_full);
    }
  }
  cluster_sync();  // the peer may still multicast into this CTA's stages or arrive on its barriers
#endif
}

// Staged rows first .. first + 15 of `tile` (16-bit values, ld Sm90Tile<BN, 64>::kLd), those below
// M, stored into the dense rows of `own` by one warp in 16-byte chunks: a warp store covers one
// row of 256 columns or two rows of 128. N % 8 == 0 on this path, so the tile's last column ends
// a chunk.
template <int BN>
__device__ __forceinline__ void store_own_rows(const std::uint16_t* staged, int first, std::int64_t tile,
                                               const Sm90Gemm& g, const Sm90Dense& own, int lane) {
  constexpr int kLd = Sm90Tile<BN, 64>::kLd;
  constexpr int kChunks = BN / 8;
  constexpr int kRowsPerStore = 32 / kChunks;
  const int chunk = lane % kChunks;
  const std::int64_t col = tile * BN + 8 * chunk;
  if (col >= g.n) return;
  auto* out = static_cast<std::uint16_t*>(own.out);
#pragma unroll
  for (int r = lane / kChunks; r < 16; r += kRowsPerStore) {
    const std::int64_t row = first + r;
    if (row >= g.m) break;
    *reinterpret_cast<uint4*>(out + row * own.ldo + col) =
        *reinterpret_cast<const uint4*>(staged + r * kLd + 8 * chunk);
  }
}

// The decode variant of the kernel above (FusedMainloop::best_decode_split, M <= 64): a cluster
// of kSplit CTAs per TwELL tile, one 64-row block, each CTA the tile's fp32 partial sum over one
// of kSplit contiguous K ranges (K steps ktiles * r / kSplit .. ktiles * (r + 1) / kSplit for
// cluster rank r), so that twice the SMs of the 64-row kernel stream W, each for a quarter of
// the K steps. No persistent walk (the host takes it only where all clusters fit at once), no
// multicast: every CTA loads its own X box and W boxes into its own ring (Sm90Tile<BN, 64>).
// After the mainloop the peers (ranks 1 .. kSplit-1) write the partial rows below M into their
// own ring, now free; after a cluster barrier the leader (rank 0) adds them to its accumulators
// in rank order over distributed shared memory, ((P0 + P1) + P2) + P3 for every output; after a
// second one (the leader has read the peers, which may then exit) the leader runs the epilogue
// of the kernel above. Each output's value is thus a function of its row of X, its column of W
// and (K, kSplit) only: not of M, the other rows, the placement or the scheduling. It differs
// from the unsplit sum in the last bits. Preconditions: those of the kernel above, M <= 64, and
// ktiles >= 2 kSplit (so that every CTA has K steps to overlap and a nonempty range).
// kOwnRows (the FFN decode path's gate, GemmToSparsePlan::run_own_rows): the leader's consumer
// warps also store their staged rows below M, zeros included, into row i of `own` (M x N), so
// that a consumer can read any row densely without the ranking and fill kernels.
template <class T, int BN, bool kOwnRows>
__global__ void __launch_bounds__(kThreadsOf<64>, 1)
    gemm_twell_sm90_split_kernel(const __grid_constant__ CUtensorMap map_x, const __grid_constant__ CUtensorMap map_w,
                                 Sm90Gemm g, TwellOut o, Sm90Dense own) {
  ::twell::detail::wait_for_prior_grids();
#if TWELL_SM90A_DEVICE
  using P = Sm90Tile<BN, 64>;
  constexpr int kConsumerWarps = 4;
  extern __shared__ __align__(1024) unsigned char smem_raw[];
  unsigned char* smem = smem_raw + ((1024u - (shared_address(smem_raw) & 1023u)) & 1023u);
  auto* full = reinterpret_cast<std::uint64_t*>(smem + P::kBarrierOffset);
  std::uint64_t* empty = full + P::kStages;
  std::uint64_t* staged_full = empty + P::kStages;
  auto* staged = reinterpret_cast<std::uint16_t*>(smem + P::kStages * P::kStageBytes);
  const int tid = static_cast<int>(threadIdx.x);
  const int warp = tid >> 5;
  const int lane = tid & 31;
  const std::int64_t tile = blockIdx.x / kSplit;
  const std::uint32_t rank = cluster_rank();
  const int ktiles = static_cast<int>((g.k + kBK - 1) / kBK);
  const int kb = ktiles * static_cast<int>(rank) / kSplit;
  const int ke = ktiles * static_cast<int>(rank + 1) / kSplit;

  if (tid == 0) {
    for (int s = 0; s < P::kStages; ++s) {
      mbar_init(&full[s], 1);                // the producer's arrive, plus the TMA bytes
      mbar_init(&empty[s], kConsumerWarps);  // lane 0 of this CTA's consumer warps
    }
    mbar_init(staged_full, kConsumerWarps * 32);
    mbar_init_fence();
  }
  // Only this CTA touches its barriers; the first access from another CTA follows the cluster
  // barrier after the mainloop, which also tells that every CTA of the cluster has started.
  __syncthreads();

  // Consumer thread t = tid - 128 of warp q holds fragment rows r0 = 16q + lane / 4 and r0 + 8
  // (h = 0, 1): d[4c + 2h + e] is row r0 + 8h, column 8c + 2 (lane % 4) + e. A peer's partial goes
  // to its ring as float2 pairs, thread-major (a warp's lanes touch 256 contiguous bytes), and
  // only rows below M: the X rows past M arrive as zeros and are never packed.
  constexpr int kAccumulators = BN / 2;
  float acc[kAccumulators];
#pragma unroll
  for (int i = 0; i < kAccumulators; ++i) acc[i] = 0.0f;
  const int t = tid - 128;
  const int r0 = 16 * (warp & 3) + (lane >> 2);
  const bool live0 = warp >= 4 && r0 < g.m, live1 = warp >= 4 && r0 + 8 < g.m;
  auto* part = reinterpret_cast<float2*>(smem);
  auto slot = [&](int c, int h) { return (2 * c + h) * 128 + t; };

  if (warp == 0) {
    if (tid == 0) {
      asm volatile("prefetch.tensormap [%0];\n" ::"l"(reinterpret_cast<std::uint64_t>(&map_x)) : "memory");
      asm volatile("prefetch.tensormap [%0];\n" ::"l"(reinterpret_cast<std::uint64_t>(&map_w)) : "memory");
      const int n0 = static_cast<int>(tile * BN);
      for (int kt = kb, i = 0; kt < ke; ++kt, ++i) {
        const std::uint32_t s = static_cast<std::uint32_t>(i) % P::kStages;
        mbar_wait(&empty[s], ((static_cast<std::uint32_t>(i) / P::kStages) & 1u) ^ 1u);  // fresh: parity 1 passes
        unsigned char* a = smem + s * P::kStageBytes;
        unsigned char* b = a + P::kABytes;
        mbar_expect_tx(&full[s], P::kStageBytes);
        tma_load_2d(a, &map_x, &full[s], kt * kBK, 0);  // rows past M arrive as zeros
#pragma unroll
        for (int j = 0; j < BN / 64; ++j) tma_load_2d(b + j * P::kBBoxBytes, &map_w, &full[s], n0 + 64 * j, kt * kBK);
      }
    }
  } else if (warp >= 4) {
    // The range's wgmma sequence is the unsplit one restarted from zero at kb; every CTA runs it
    // (ke > kb), so no wgmma sits in a divergent path.
    for (int kt = kb, i = 0; kt < ke; ++kt, ++i) {
      const std::uint32_t s = static_cast<std::uint32_t>(i) % P::kStages;
      mbar_wait(&full[s], (static_cast<std::uint32_t>(i) / P::kStages) & 1u);
      const std::uint32_t a = shared_address(smem + s * P::kStageBytes);
      wgmma_stage<T, BN>(acc, a, a + P::kABytes, static_cast<std::uint32_t>(i));
      if (i > 0) {
        wgmma_wait<1>();  // the previous stage's group has retired: its buffers are free
        if (lane == 0) mbar_arrive(&empty[(static_cast<std::uint32_t>(i) - 1) % P::kStages]);
      }
    }
    wgmma_wait<0>();
    fence_accumulators(acc);
    if (rank != 0) {
      // Every load of the range was waited for and every wgmma of the warpgroup has retired once
      // all four warps pass here: the ring is free for the partial.
      asm volatile("bar.sync 1, 128;\n" ::: "memory");
      if (live0) {
#pragma unroll
        for (int c = 0; c < BN / 8; ++c) {
          part[slot(c, 0)] = make_float2(acc[4 * c + 0], acc[4 * c + 1]);
          if (live1) part[slot(c, 1)] = make_float2(acc[4 * c + 2], acc[4 * c + 3]);
        }
      }
    }
  }
  __syncwarp();
  cluster_sync();  // the peers' partials are visible to the cluster; every CTA has started
  if (rank == 0 && live0) {
    const float2* peer[kSplit];
#pragma unroll
    for (int p = 1; p < kSplit; ++p) peer[p] = map_shared_rank<float2>(part, static_cast<std::uint32_t>(p));
#pragma unroll
    for (int c = 0; c < BN / 8; ++c)
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        if (h == 1 && !live1) continue;  // a row past M: never packed
#pragma unroll
        for (int p = 1; p < kSplit; ++p) {  // in rank order
          const float2 v = peer[p][slot(c, h)];
          acc[4 * c + 2 * h] += v.x;
          acc[4 * c + 2 * h + 1] += v.y;
        }
      }
  }
  __syncwarp();    // the reduction's lanes diverge on live0 / live1: reconverge for the aligned barrier
  cluster_sync();  // the leader has read every peer: their shared memory may go
  if (rank != 0) return;

  if (warp >= 4) {
    std::uint16_t* my_rows = staged + 16 * (warp & 3) * P::kLd;
    stage_warp_rows<T, BN>(acc, my_rows, g, lane);
    mbar_arrive(staged_full);
    if constexpr (kOwnRows) {
      __syncwarp();  // the warp's stmatrix stores are visible to its lanes
      store_own_rows<BN>(my_rows, 16 * (warp & 3), tile, g, own, lane);
    }
  } else if (warp >= 1) {
    // Rows 64 p / kPackerWarps ..: 21, 21 and 22.
    const int p = warp - 1;
    const int first = 64 * p / kPackerWarps;
    const int count = 64 * (p + 1) / kPackerWarps - first;
    unsigned long long stored = 0, excess = 0;
    mbar_wait(staged_full, 0);
    pack_staged_rows<BN>(staged, first, count, 0, tile, static_cast<int>(min(std::int64_t{BN}, g.n - tile * BN)), g, o,
                         lane, stored, excess);
    flush_lane_totals(o, lane, stored, excess);
  }
#endif
}

// A row-major rows x cols 16-bit matrix with leading dimension ld, read in boxes of box_rows x
// 64 columns (128 bytes: one swizzle row), 128-byte swizzled, zeros outside.
template <class T>
CUtensorMap tensor_map(const void* base, std::int64_t rows, std::int64_t cols, std::int64_t ld, int box_rows,
                       const char* where) {
  return tensor_map_2d(tensor_map_type<T>(), base, rows, cols, ld * 2, 64, box_rows, CU_TENSOR_MAP_SWIZZLE_128B, where);
}

template <class T, int BN>
bool available(const char* where) {
  int device = 0, major = 0, minor = 0, optin = 0;
  ::twell::detail::check_cuda(cudaGetDevice(&device), where);
  ::twell::detail::check_cuda(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device), where);
  ::twell::detail::check_cuda(cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, device), where);
  ::twell::detail::check_cuda(cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, device), where);
  int clusters = 0;
  ::twell::detail::check_cuda(cudaDeviceGetAttribute(&clusters, cudaDevAttrClusterLaunch, device), where);
  const int smem = std::max(Sm90Tile<BN, 128>::kSmem, Sm90Tile<BN, 64>::kSmem);  // either tiling may run
  if (major != 9 || minor != 0 || optin < smem || clusters == 0) return false;
  cudaFuncAttributes attr{};
  ::twell::detail::check_cuda(cudaFuncGetAttributes(&attr, gemm_twell_sm90_kernel<T, BN, 128, false>), where);
  return attr.binaryVersion == 90 && device_runs_sm90a_code(device, where) && tensor_map_encoder() != nullptr;
}

// Sets `config` up for a launch of `kernel` in clusters of `cluster` CTAs of `threads` with
// `smem` bytes of dynamic shared memory, its grid still to be set, and the early-launch
// attribute where allowed (the kernels begin with wait_for_prior_grids()). Returns the clusters
// that fit on the device at once (0: none).
int cluster_launch_config(const void* kernel, int cluster, int threads, int smem, cudaStream_t stream,
                          cudaLaunchAttribute (&attributes)[2], cudaLaunchConfig_t& config, const char* where) {
  ::twell::detail::allow_dynamic_shared(kernel, smem, where);
  attributes[0].id = cudaLaunchAttributeClusterDimension;
  attributes[0].val.clusterDim.x = static_cast<unsigned>(cluster);
  attributes[0].val.clusterDim.y = 1;
  attributes[0].val.clusterDim.z = 1;
  attributes[1].id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attributes[1].val.programmaticStreamSerializationAllowed = 1;
  config.blockDim = dim3(static_cast<unsigned>(threads));
  config.dynamicSmemBytes = static_cast<std::size_t>(smem);
  config.stream = stream;
  config.attrs = attributes;
  config.numAttrs = 1;
  config.gridDim = dim3(static_cast<unsigned>(cluster));
  const int resident = ::twell::detail::resident_clusters(kernel, config, where);
  if (::twell::detail::early_launch_allowed()) config.numAttrs = 2;
  return resident;
}

// A launch of the kernel for T, BN, BM and kDense, its grid still to be set: the launch
// configuration and the clusters that fit on the device at once.
template <class T, int BN, int BM, bool kDense>
struct Sm90Launch {
  static constexpr auto kernel = gemm_twell_sm90_kernel<T, BN, BM, kDense>;
  cudaLaunchAttribute attributes[2]{};
  cudaLaunchConfig_t config{};
  int resident = 0;

  Sm90Launch(cudaStream_t stream, const char* where);
  Sm90Launch(const Sm90Launch&) = delete;  // config.attrs points into the object
  Sm90Launch& operator=(const Sm90Launch&) = delete;
};

template <class T, int BN, int BM, bool kDense>
Sm90Launch<T, BN, BM, kDense>::Sm90Launch(cudaStream_t stream, const char* where) {
  using P = Sm90Tile<BN, BM>;
  // Persistent: the grid (set by launch()) is as many clusters as the device holds at once (66
  // of 2 CTAs on an H100), at most one per tile pair.
  resident = cluster_launch_config(reinterpret_cast<const void*>(kernel), kCluster, kThreadsOf<BM>, P::kSmem, stream,
                                   attributes, config, where);
  require(resident > 0, ErrorCode::cuda, where, "no cluster of ", kCluster, " CTAs with ", P::kSmem,
          " bytes of shared memory fits on this device");
}

// A launch of the split kernel for T, BN and kOwnRows, its grid still to be set; `resident` may
// be 0 (the host then does not split).
template <class T, int BN, bool kOwnRows>
struct Sm90SplitLaunch {
  static constexpr auto kernel = gemm_twell_sm90_split_kernel<T, BN, kOwnRows>;
  cudaLaunchAttribute attributes[2]{};
  cudaLaunchConfig_t config{};
  int resident = 0;

  Sm90SplitLaunch(cudaStream_t stream, const char* where)
      : resident(cluster_launch_config(reinterpret_cast<const void*>(kernel), kSplit, kThreadsOf<64>,
                                       Sm90Tile<BN, 64>::kSmem, stream, attributes, config, where)) {}
  Sm90SplitLaunch(const Sm90SplitLaunch&) = delete;  // config.attrs points into the object
  Sm90SplitLaunch& operator=(const Sm90SplitLaunch&) = delete;
};

// Whether the split kernel serves M x K x N in TwELL tiles of BN: one 64-row block, two K steps
// or more per CTA, and every tile's cluster resident at once (there is no persistent walk).
template <class T, int BN, bool kOwnRows>
bool split_applies(std::int64_t m, std::int64_t k, std::int64_t n, const char* where) {
  if (m <= 0 || m > 64 || n <= 0 || (k + kBK - 1) / kBK < 2 * kSplit) return false;
  // An optional variant: where the device cannot answer the occupancy query (or set the shared
  // memory), the plan runs unsplit rather than fail to build.
  try {
    const Sm90SplitLaunch<T, BN, kOwnRows> l(nullptr, where);
    return (n + BN - 1) / BN <= l.resident;
  } catch (const Error&) {
    (void)cudaGetLastError();
    return false;
  }
}

// Queues the split kernel for T, BN and kOwnRows: one cluster per TwELL tile.
template <class T, int BN, bool kOwnRows>
void launch_split(const Sm90Gemm& g, const TwellOut& o, const Sm90Dense& own, cudaStream_t stream, const char* where) {
  Sm90SplitLaunch<T, BN, kOwnRows> l(stream, where);
  const CUtensorMap map_x = tensor_map<T>(g.x, g.m, g.k, g.ldx, 64, where);
  const CUtensorMap map_w = tensor_map<T>(g.w, g.k, g.n, g.ldw, kBK, where);
  l.config.gridDim = dim3(static_cast<unsigned>((g.n + BN - 1) / BN * kSplit));
  ::twell::detail::check_cuda(cudaLaunchKernelEx(&l.config, l.kernel, map_x, map_w, g, o, own), where);
}

// Queues the kernel of `l`: one cluster per tile pair, at most the resident ones (persistent).
template <class T, int BN, int BM, bool kDense>
void launch(Sm90Launch<T, BN, BM, kDense>& l, const Sm90Gemm& g, const TwellOut& o, const Sm90Dense& d,
            const char* where) {
  const CUtensorMap map_x = tensor_map<T>(g.x, g.m, g.k, g.ldx, BM, where);
  const CUtensorMap map_w = tensor_map<T>(g.w, g.k, g.n, g.ldw, kBK, where);
  l.config.gridDim =
      dim3(static_cast<unsigned>(std::min<std::int64_t>(tile_pairs(g.m, g.n, BN, BM), l.resident) * kCluster));
  ::twell::detail::check_cuda(cudaLaunchKernelEx(&l.config, l.kernel, map_x, map_w, g, o, d), where);
}

// The TwELL kernel in 64-row CTA tiles where their tile pairs take one wave of resident clusters
// (on 132 SMs at the paper's N = 5632: M <= 384 with 256-column tiles, M <= 128 with 128-column
// ones), else in 128-row ones. Each output's sum over K
// runs in the same order either way, so the choice changes the speed, never the bits.
// With `split` (the plan's decision, split_applies) the split kernel runs instead, storing its
// rows densely into `own` too where own.out is set.
template <class T, int BN>
Sm90Tiling launch_twell(const Sm90Gemm& g, const TwellOut& o, bool split, const Sm90Dense& own, cudaStream_t stream,
                        const char* where) {
  if (split) {
    if (own.out != nullptr) {
      launch_split<T, BN, true>(g, o, own, stream, where);
    } else {
      launch_split<T, BN, false>(g, o, own, stream, where);
    }
    return {64, kSplit};
  }
  Sm90Launch<T, BN, 64, false> short_tiles(stream, where);
  if (tile_pairs(g.m, g.n, BN, 64) <= short_tiles.resident) {
    launch(short_tiles, g, o, Sm90Dense{}, where);
    return {64, 1};
  }
  Sm90Launch<T, BN, 128, false> tall_tiles(stream, where);
  launch(tall_tiles, g, o, Sm90Dense{}, where);
  return {128, 1};
}

bool aligned16(const void* p) { return reinterpret_cast<std::uintptr_t>(p) % 16 == 0; }

}  // namespace

template <class T>
bool gemm_twell_sm90_available(int tile, const char* where) {
  if constexpr (!std::is_same_v<T, bf16> && !std::is_same_v<T, fp16>) {
    return false;
  } else {
    if (tile == 256) return available<T, 256>(where);
    if (tile == 128) return available<T, 128>(where);
    return false;
  }
}

bool gemm_twell_sm90_applies(const Sm90Gemm& g) {
  return g.m > 0 && g.n > 0 && g.k > 0 && g.m <= INT32_MAX && g.n <= INT32_MAX && g.k <= INT32_MAX && g.k % 8 == 0 &&
         g.n % 8 == 0 && g.ldx % 8 == 0 && g.ldw % 8 == 0 && aligned16(g.x) && aligned16(g.w) &&
         tma_row_stride_ok(g.ldx, 2) && tma_row_stride_ok(g.ldw, 2);
}

template <class T>
bool gemm_twell_sm90_split_applies(std::int64_t m, std::int64_t k, std::int64_t n, int tile, bool own_rows,
                                   const char* where) {
  if constexpr (std::is_same_v<T, bf16> || std::is_same_v<T, fp16>) {
    if (own_rows)
      return tile == 256 ? split_applies<T, 256, true>(m, k, n, where) : split_applies<T, 128, true>(m, k, n, where);
    return tile == 256 ? split_applies<T, 256, false>(m, k, n, where) : split_applies<T, 128, false>(m, k, n, where);
  }
  return false;
}

template <class T>
Sm90Tiling launch_gemm_twell_sm90(const Sm90Gemm& g, const TwellOut& o, bool split, const Sm90Dense& own_rows,
                                  cudaStream_t stream, const char* where) {
  if constexpr (std::is_same_v<T, bf16> || std::is_same_v<T, fp16>) {
    return o.layout.tile == 256 ? launch_twell<T, 256>(g, o, split, own_rows, stream, where)
                                : launch_twell<T, 128>(g, o, split, own_rows, stream, where);
  }
  return {};
}

template <class T>
void launch_gemm_dense_sm90(const Sm90Gemm& g, const Sm90Dense& d, int tile, cudaStream_t stream, const char* where) {
  if constexpr (std::is_same_v<T, bf16> || std::is_same_v<T, fp16>) {
    // The dense output does not depend on the TwELL tile, and each output's sum over K runs in
    // the same order at either width. A few rows (the usual overflow block) give 256-column tiles
    // to fewer than half of the SMs: 128-column ones then use twice as many, each with half the
    // work (docs/gemm_to_sparse.md, "Eighth session"). The 128-column kernel is available
    // wherever the 256-column one is (same image and device checks, less shared memory), so the
    // precondition covers it without another query on this per-run path.
    static_assert(Sm90Tile<128>::kSmem <= Sm90Tile<256>::kSmem);
    int device = 0, sms = 0;
    ::twell::detail::check_cuda(cudaGetDevice(&device), where);
    ::twell::detail::check_cuda(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device), where);
    const bool narrow = tile == 128 || 2 * tile_pairs(g.m, g.n, 256, 128) * kCluster <= sms;
    if (narrow) {
      Sm90Launch<T, 128, 128, true> l(stream, where);
      launch(l, g, TwellOut{}, d, where);
    } else {
      Sm90Launch<T, 256, 128, true> l(stream, where);
      launch(l, g, TwellOut{}, d, where);
    }
  }
}

#define TWELL_INSTANTIATE(T)                                                                                        \
  template bool gemm_twell_sm90_available<T>(int, const char*);                                                     \
  template bool gemm_twell_sm90_split_applies<T>(std::int64_t, std::int64_t, std::int64_t, int, bool, const char*); \
  template Sm90Tiling launch_gemm_twell_sm90<T>(const Sm90Gemm&, const TwellOut&, bool, const Sm90Dense&,           \
                                                cudaStream_t, const char*);                                         \
  template void launch_gemm_dense_sm90<T>(const Sm90Gemm&, const Sm90Dense&, int, cudaStream_t, const char*);
TWELL_FOR_EACH_VALUE_TYPE(TWELL_INSTANTIATE)
#undef TWELL_INSTANTIATE

}  // namespace twell::cuda::detail
