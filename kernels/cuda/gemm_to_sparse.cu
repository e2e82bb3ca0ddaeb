// twell::cuda::gemm_to_sparse: Y = act(X W) written as TwELL/Hybrid straight from the GEMM
// epilogue (docs/gemm_to_sparse.md). Mainloop: mma.sync m16n8k16 (bf16/fp16 in, fp32
// accumulate) fed by ldmatrix from a cp.async multi-stage shared-memory pipeline; it runs on
// every sm_80+ device, Hopper included.
#include <algorithm>
#include <cstdint>
#include <cstring>
#include <string>
#include <type_traits>
#include <vector>

#include <cuda_runtime.h>

#include <twell/converters/backends.hpp>
#include <twell/formats/dense_checks.hpp>
#include <twell/instantiate.hpp>
#include <twell/kernels/detail/checks.hpp>
#include <twell/kernels/backends.hpp>
#include <twell/kernels/gemm_to_sparse_plan.hpp>

#include "cp_async.cuh"
#include "cuda_check.hpp"
#include "cuda_launch.cuh"
#include "gemm_to_sparse.cuh"
#include "gemm_to_sparse_sm90.cuh"
#include "mma_sync.cuh"
#include "read_back.cuh"
#include "row_ballots.cuh"
#include "twell_epilogue.cuh"

namespace twell::cuda {
namespace {

constexpr int kBM = 128;    // CTA rows
constexpr int kThreads = 256;
constexpr int kPad = 8;     // halves of padding per shared row: ldmatrix rows land in distinct banks

// The cp.async pipeline of a CTA of kBM x BN outputs. BN = 256 (1 CTA per SM: 220 registers)
// takes 64 K per stage and 3 stages (157 KB), so the SM meets half as many barriers per FLOP as
// with 32; BN = 128 (2 CTAs per SM) keeps 32 x 4 (76 KB), which also fits the 99 KB of sm_86/89.
template <int BN>
struct Pipe {
  static constexpr int kBK = BN == 256 ? 64 : 32;   // K per stage
  static constexpr int kStages = BN == 256 ? 3 : 4;
  static constexpr int kALd = kBK + kPad;           // A stage: kBM x kBK, row-major, padded
  static constexpr int kBLd = BN + kPad;            // B stage: kBK x BN, row-major, padded
  static constexpr int kMinBlocks = BN == 256 ? 1 : 2;  // CTAs per SM the registers allow
};

template <int BN>
constexpr int smem_bytes() {
  using P = Pipe<BN>;
  return P::kStages * (kBM * P::kALd + P::kBK * P::kBLd) * 2;
}

struct GemmArgs {
  const std::uint16_t* x = nullptr;  // M x K (16-bit bits), rows gathered through x_rows if set
  std::int64_t ldx = 0;
  const std::int32_t* x_rows = nullptr;
  const std::uint16_t* w = nullptr;  // K x N
  std::int64_t ldw = 0;
  std::int64_t m = 0, n = 0, k = 0;
  Activation kind = Activation::relu;
  float threshold = 0.0f;
  // If set, rows at and past *m_limit are not computed: a row count known only on the device
  // (the plan's overflow recompute, launched before the host knows R).
  const unsigned long long* m_limit = nullptr;
};

using detail::cp_async16_or_zero;
using detail::cp_async_commit_group;
using detail::cp_async_wait_groups;
using detail::mma16816;
using detail::shared_address;
using detail::sparsified;
using detail::TwellOut;

__device__ __forceinline__ void ldmatrix_x4(std::uint32_t (&r)[4], const void* smem) {
  const std::uint32_t s = shared_address(smem);
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(s));
}
__device__ __forceinline__ void ldmatrix_x4_trans(std::uint32_t (&r)[4], const void* smem) {
  const std::uint32_t s = shared_address(smem);
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(s));
}

// One pipeline stage: A is kBM x kBK (row-major, padded), B is kBK x BN (row-major, padded).
// K % 8 == 0 and N % 8 == 0 make every 16-byte chunk either fully inside or fully outside;
// outside chunks are zero-filled (src-size 0), so ragged edges contribute nothing. a_rows: the
// row of X each of the CTA's rows reads (through x_rows when gathering), -1 past M.
template <int BN>
__device__ __forceinline__ void load_stage(const GemmArgs& g, const std::int64_t* a_rows, std::uint16_t* as,
                                           std::uint16_t* bs, std::int64_t n0, std::int64_t k0, int tid) {
  using P = Pipe<BN>;
  constexpr int kAChunksPerRow = P::kBK / 8;
  static_assert(kBM * kAChunksPerRow % kThreads == 0 && P::kBK * (BN / 8) % kThreads == 0,
                "every thread copies the same number of 16-byte chunks");
#pragma unroll
  for (int i = 0; i < kBM * kAChunksPerRow / kThreads; ++i) {
    const int c = tid + i * kThreads;
    const int r = c / kAChunksPerRow;
    const int kc = (c % kAChunksPerRow) * 8;
    const std::int64_t gk = k0 + kc;
    const bool inside = a_rows[r] >= 0 && gk < g.k;
    cp_async16_or_zero(shared_address(as + r * P::kALd + kc), inside ? g.x + a_rows[r] * g.ldx + gk : g.x, inside);
  }
  constexpr int kBChunksPerRow = BN / 8;
#pragma unroll
  for (int i = 0; i < P::kBK * kBChunksPerRow / kThreads; ++i) {
    const int c = tid + i * kThreads;
    const int r = c / kBChunksPerRow;
    const int nc = (c % kBChunksPerRow) * 8;
    const std::int64_t gk = k0 + r;
    const std::int64_t gn = n0 + nc;
    const bool inside = gk < g.k && gn < g.n;
    cp_async16_or_zero(shared_address(bs + r * P::kBLd + nc), inside ? g.w + gk * g.ldw + gn : g.w, inside);
  }
}

// Warps are laid out 2 (M) x 4 (N); a warp owns 64 x BN/4 of the CTA tile as 4 x BN/32
// m16n8 accumulator fragments.
template <class T, int BN>
__device__ __forceinline__ void mma_stage(const std::uint16_t* as, const std::uint16_t* bs,
                                          float (&acc)[4][BN / 32][4], int warp_m, int warp_n, int lane) {
  using P = Pipe<BN>;
  constexpr int kNi = BN / 32;
#pragma unroll
  for (int kk = 0; kk < P::kBK; kk += 16) {
    std::uint32_t a[4][4];
#pragma unroll
    for (int mi = 0; mi < 4; ++mi) {
      const int row = warp_m * 64 + mi * 16 + (lane & 15);
      ldmatrix_x4(a[mi], as + row * P::kALd + kk + (lane >> 4) * 8);
    }
    std::uint32_t b[kNi][2];
#pragma unroll
    for (int nj = 0; nj < kNi / 2; ++nj) {
      std::uint32_t r[4];
      const int col = warp_n * (BN / 4) + nj * 16 + (lane >> 4) * 8;
      ldmatrix_x4_trans(r, bs + (kk + (lane & 15)) * P::kBLd + col);
      b[2 * nj][0] = r[0];
      b[2 * nj][1] = r[1];
      b[2 * nj + 1][0] = r[2];
      b[2 * nj + 1][1] = r[3];
    }
#pragma unroll
    for (int mi = 0; mi < 4; ++mi)
#pragma unroll
      for (int ni = 0; ni < kNi; ++ni) mma16816<T>(acc[mi][ni], a[mi], b[ni][0], b[ni][1]);
  }
}

// acc = X(m0 .. m0+127, :) W(:, n0 .. n0+BN-1). Ends with every cp.async retired and a barrier,
// so the caller may reuse the shared memory.
template <class T, int BN>
__device__ __forceinline__ void mainloop(const GemmArgs& g, std::uint16_t* smem, std::int64_t m0, std::int64_t n0,
                                         float (&acc)[4][BN / 32][4]) {
  using P = Pipe<BN>;
  const int tid = static_cast<int>(threadIdx.x);
  const int lane = tid & 31;
  const int warp = tid >> 5;
  constexpr int kAStage = kBM * P::kALd;
  constexpr int kBStage = P::kBK * P::kBLd;
  std::uint16_t* a_base = smem;
  std::uint16_t* b_base = smem + P::kStages * kAStage;

#pragma unroll
  for (int mi = 0; mi < 4; ++mi)
#pragma unroll
    for (int ni = 0; ni < BN / 32; ++ni)
#pragma unroll
      for (int e = 0; e < 4; ++e) acc[mi][ni][e] = 0.0f;

  // The CTA's rows of X, looked up once: a gathered row's index read from x_rows in every stage
  // put a dependent L2 load in front of each stage's copies (the plan's overflow recompute, 384
  // gathered rows of the paper's shape, took ~57 us on an H100 that way).
  __shared__ std::int64_t a_rows[kBM];
  for (int r = tid; r < kBM; r += kThreads) {
    const std::int64_t gm = m0 + r;
    a_rows[r] = gm >= g.m ? -1 : g.x_rows != nullptr ? std::int64_t{g.x_rows[gm]} : gm;
  }
  __syncthreads();

  const int ktiles = static_cast<int>((g.k + P::kBK - 1) / P::kBK);
#pragma unroll
  for (int s = 0; s < P::kStages - 1; ++s) {
    if (s < ktiles) load_stage<BN>(g, a_rows, a_base + s * kAStage, b_base + s * kBStage, n0, std::int64_t{s} * P::kBK, tid);
    cp_async_commit_group();
  }
  for (int kt = 0; kt < ktiles; ++kt) {
    cp_async_wait_groups<P::kStages - 2>();
    __syncthreads();  // stage kt landed for all threads; stage kt-1 is no longer read by anyone
    const int next = kt + P::kStages - 1;
    if (next < ktiles) {
      const int s = next % P::kStages;
      load_stage<BN>(g, a_rows, a_base + s * kAStage, b_base + s * kBStage, n0, std::int64_t{next} * P::kBK, tid);
    }
    cp_async_commit_group();
    const int s = kt % P::kStages;
    mma_stage<T, BN>(a_base + s * kAStage, b_base + s * kBStage, acc, warp >> 2, warp & 3, lane);
  }
  cp_async_wait_groups<0>();
  __syncthreads();
}

// The CTA's accumulators, activated and rounded, into the kBM x BN staged tile (row stride ld
// 16-bit words): each fragment pair becomes one 32-bit store. Sets `nan` as activated_pair does.
template <class T, int BN, bool kRelu>
__device__ __forceinline__ void stage_tile(std::uint16_t* vals, int ld, const float (&acc)[4][BN / 32][4], int warp_m,
                                           int warp_n, int lane, const GemmArgs& g, bool& nan) {
#pragma unroll
  for (int mi = 0; mi < 4; ++mi)
#pragma unroll
    for (int ni = 0; ni < BN / 32; ++ni)
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const int r = warp_m * 64 + mi * 16 + (lane >> 2) + h * 8;
        const int c = warp_n * (BN / 4) + ni * 8 + (lane & 3) * 2;
        *reinterpret_cast<std::uint32_t*>(vals + r * ld + c) = detail::activated_pair<T, kRelu>(
            acc[mi][ni][2 * h], acc[mi][ni][2 * h + 1], g.kind, g.threshold, nan);
      }
}

// Fused GEMM + activation + TwELL packing. CTA: a 128-row block (blockIdx.y) times one TwELL
// tile of BN columns (blockIdx.x), so the (row, tile) slot groups it writes are its own and no
// CTA waits for another. 8 warps run the mainloop (2 x 4 warp grid); in the epilogue the CTA
// stages the activated tile in shared memory and each warp packs 16 of its rows
// (pack_twell_rows: a half-warp per row, a lane owns BN / 16 consecutive columns, a 16-lane
// prefix sum, or one ballot when no lane holds two entries, gives its slots, so slots come out in
// column order). Every slot of every (row, tile) is written (unused ones zero), so the output
// needs no initialisation. Preconditions: T 16-bit, layout.tile == BN, K % 8 == 0, N % 8 == 0,
// 16-byte aligned x, w and leading dimensions; row_flags zeroed (the plan's ranking kernel clears
// them after each run).
// Benchmark: bench/suites/gemm_to_sparse.cpp.
template <class T, int BN>
__global__ void __launch_bounds__(kThreads, Pipe<BN>::kMinBlocks) gemm_twell_kernel(GemmArgs g, TwellOut o) {
  ::twell::detail::wait_for_prior_grids();
  extern __shared__ __align__(16) unsigned char smem_raw[];
  auto* smem = reinterpret_cast<std::uint16_t*>(smem_raw);
  const int tid = static_cast<int>(threadIdx.x);
  const int lane = tid & 31;
  const int warp = tid >> 5;
  const int warp_m = warp >> 2;
  const int warp_n = warp & 3;
  const std::int64_t tile = blockIdx.x;
  const std::int64_t n0 = tile * BN;
  const std::int64_t m0 = std::int64_t{blockIdx.y} * kBM;

  float acc[4][BN / 32][4];
  mainloop<T, BN>(g, smem, m0, n0, acc);

  constexpr int kLd = BN + kPad;  // 16-bit words; 4-byte stores of a fragment hit 32 distinct banks
  std::uint16_t* vals = smem;
  bool nan = false;
  if (g.kind == Activation::relu) stage_tile<T, BN, true>(vals, kLd, acc, warp_m, warp_n, lane, g, nan);
  // Other activations, and ReLU tiles with a NaN (see relu_pair), by the portable rounding.
  if (__syncthreads_or(nan) || g.kind != Activation::relu)
    stage_tile<T, BN, false>(vals, kLd, acc, warp_m, warp_n, lane, g, nan);
  __syncthreads();

  const int tile_cols = static_cast<int>(min(std::int64_t{BN}, g.n - n0));
  const detail::TwellRows geo = detail::twell_rows(o, g.n);
  std::uint32_t* groups = o.packed + o.layout.slot_offset(m0, tile, g.n);  // row m0's; rows are geo.width apart
  unsigned long long stored = 0, excess = 0;
  constexpr int kWarps = kThreads / 32;  // warp w packs rows w, w + 8, ...
  detail::pack_twell_rows<BN>(vals + warp * kLd, kWarps * kLd, kBM / kWarps, groups + warp * geo.width,
                              kWarps * geo.width, m0 + warp, kWarps, g.m, tile, tile_cols, geo, o, lane, stored,
                              excess);
  detail::flush_twell_totals(o, lane, stored, excess);
}

// Same mainloop, dense epilogue: out(i, j) = sparsified act of the product, for i < m, j < n
// (m capped by *g.m_limit when set). CTA: 128 (gathered) rows x BN columns. Preconditions as
// gemm_twell_kernel except the tile.
template <class T, int BN>
__global__ void __launch_bounds__(kThreads, Pipe<BN>::kMinBlocks) gemm_dense_kernel(GemmArgs g, T* out, std::int64_t ldo) {
  ::twell::detail::wait_for_prior_grids();
  extern __shared__ __align__(16) unsigned char smem_raw[];
  auto* smem = reinterpret_cast<std::uint16_t*>(smem_raw);
  const int lane = static_cast<int>(threadIdx.x) & 31;
  const int warp = static_cast<int>(threadIdx.x) >> 5;
  const std::int64_t n0 = std::int64_t{blockIdx.x} * BN;
  const std::int64_t m0 = std::int64_t{blockIdx.y} * kBM;
  if (g.m_limit != nullptr) g.m = min(g.m, static_cast<std::int64_t>(*g.m_limit));
  if (m0 >= g.m) return;
  float acc[4][BN / 32][4];
  mainloop<T, BN>(g, smem, m0, n0, acc);
#pragma unroll
  for (int mi = 0; mi < 4; ++mi)
#pragma unroll
    for (int ni = 0; ni < BN / 32; ++ni)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const std::int64_t r = m0 + (warp >> 2) * 64 + mi * 16 + (lane >> 2) + (e >> 1) * 8;
        const std::int64_t c = n0 + (warp & 3) * (BN / 4) + ni * 8 + (lane & 3) * 2 + (e & 1);
        if (r < g.m && c < g.n) out[r * ldo + c] = sparsified<T>(acc[mi][ni][e], g.kind, g.threshold);
      }
}

// CUDA-core GEMM for what the tensor-core path cannot take: fp32 operands, and 16-bit operands
// that are not 16-byte aligned. CTA: 64 x 64 outputs, a thread 4 x 4 of them; any shape.
template <class T>
__global__ void __launch_bounds__(256) gemm_simt_kernel(const T* x, std::int64_t ldx, const std::int32_t* x_rows,
                                                        const T* w, std::int64_t ldw, std::int64_t m, std::int64_t n,
                                                        std::int64_t k, Activation kind, float threshold, T* out,
                                                        std::int64_t ldo) {
  ::twell::detail::wait_for_prior_grids();
  constexpr int kTile = 64, kDepth = 16;
  __shared__ float as[kDepth][kTile + 1];
  __shared__ float bs[kDepth][kTile];
  const int tid = static_cast<int>(threadIdx.x);
  const int tx = tid % 16, ty = tid / 16;
  const std::int64_t m0 = std::int64_t{blockIdx.y} * kTile;
  const std::int64_t n0 = std::int64_t{blockIdx.x} * kTile;
  float acc[4][4] = {};
  for (std::int64_t k0 = 0; k0 < k; k0 += kDepth) {
    for (int i = tid; i < kTile * kDepth; i += 256) {
      const int r = i / kDepth, kk = i % kDepth;
      const std::int64_t gm = m0 + r, gk = k0 + kk;
      float v = 0.0f;
      if (gm < m && gk < k) v = to_float(x[(x_rows != nullptr ? x_rows[gm] : gm) * ldx + gk]);
      as[kk][r] = v;
    }
    for (int i = tid; i < kTile * kDepth; i += 256) {
      const int kk = i / kTile, c = i % kTile;
      const std::int64_t gk = k0 + kk, gn = n0 + c;
      bs[kk][c] = (gk < k && gn < n) ? to_float(w[gk * ldw + gn]) : 0.0f;
    }
    __syncthreads();
#pragma unroll
    for (int kk = 0; kk < kDepth; ++kk) {
      float a[4], b[4];
#pragma unroll
      for (int i = 0; i < 4; ++i) a[i] = as[kk][ty * 4 + i];
#pragma unroll
      for (int j = 0; j < 4; ++j) b[j] = bs[kk][tx * 4 + j];
#pragma unroll
      for (int i = 0; i < 4; ++i)
#pragma unroll
        for (int j = 0; j < 4; ++j) acc[i][j] = fmaf(a[i], b[j], acc[i][j]);
    }
    __syncthreads();
  }
#pragma unroll
  for (int i = 0; i < 4; ++i)
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      const std::int64_t r = m0 + ty * 4 + i, c = n0 + tx * 4 + j;
      if (r < m && c < n) out[r * ldo + c] = sparsified<T>(acc[i][j], kind, threshold);
    }
}

// Words of the plan's device status. The fused epilogue adds into the accumulators; the ranking
// kernel moves them into the totals and zeroes them, so no memset precedes a run.
enum StatusWord : int {
  kStoredAcc = 0,
  kExcessAcc = 1,
  kFlaggedRows = 2,    // R (rows with an overflowed tile)
  kFirstRowPlus1 = 3,  // first flagged row + 1, 0 if none
  kStored = 4,
  kExcess = 5,
  kFillRows = 6,       // block rows filled from the TwELL slots and spilled segments (0: none);
                       // the host reads kFlaggedRows .. kFillRows back, the words after are the device's
  kRecomputeRows = 7,  // rows the overflow recompute covers (R where nothing is filled, else 0)
  kSpilled = 8,        // segments the packers spilled (where the block is filled)
  kSpillAcc = 9,       // the packers' spill counter (TwellOut::spill_count)
  kOwnRowsSink = 10,   // run_own_rows's totals: added to, never read
  kStatusWords = 11
};

// The fused paths' overflow block, after the ranking (grid-stride loops either way).
// - Where the packers spilled every overflowed (row, tile) (status kFillRows > 0): block rows
//   r < kFillRows are filled, a warp per item: a (row, tile) of the block that did not overflow
//   from its TwELL slots (zeros where no entry is), and a spilled segment copied to its row's
//   place where that row is in the block (an overflowed tile's slots hold only its first S - 1
//   entries). Both are the values the fused epilogue staged, bit for bit: what the recompute
//   would write.
// - Else, on Hopper (gathered set), rows r < min(rows, kRecomputeRows) of x are gathered for the
//   recompute (a thread per 16-byte vector: gathered[r] = x[overflow_to_row[r]]), so that its TMA
//   reads them as one matrix; the mma.sync recompute reads x's rows through overflow_to_row.
struct OverflowRows {
  const uint4* x = nullptr;        // x and gathered: leading dimensions in 16-byte vectors
  std::int64_t ldx = 0, vecs = 0;  // vecs: K / 8
  uint4* gathered = nullptr;
  std::int64_t ldg = 0;
  const std::int32_t* overflow_to_row = nullptr;
  const std::int32_t* row_to_overflow = nullptr;
  const unsigned long long* status = nullptr;
  std::int64_t rows = 0;  // of the block
  const std::uint32_t* packed = nullptr;
  TwellLayout layout{};
  std::int64_t n = 0;
  std::uint16_t* block = nullptr;  // the overflow block's values, leading dimension ldb
  std::int64_t ldb = 0;
  const std::uint16_t* spill_values = nullptr;  // as TwellOut's
  const int2* spill_where = nullptr;
};

constexpr int kOverflowThreads = 256;
constexpr std::int64_t kOverflowMaxBlocks = 1024;  // the grid-stride loops' grid, at most

// Columns 8 lane .. 8 lane + 7 of a (row, tile) that did not overflow, from its group's count
// and slot words (lane e loads word e of each 32, every lane sees each by a shuffle): the value
// bits in column order, two to a word, low half first, zeros where no entry is.
__device__ __forceinline__ uint4 tile_chunk_from_slots(const std::uint32_t* group, int lane) {
  const auto count = static_cast<int>(group[0]);
  std::uint32_t w[4] = {0u, 0u, 0u, 0u};
  for (int e0 = 0; e0 < count; e0 += 32) {
    const std::uint32_t mine = e0 + lane < count ? group[1 + e0 + lane] : 0u;
    const int batch = min(32, count - e0);
    for (int e = 0; e < batch; ++e) {
      const std::uint32_t word = __shfl_sync(0xffffffffu, mine, e);
      const auto col = static_cast<int>(TwellLayout::slot_column(word));
      if ((col >> 3) != lane) continue;
      const std::uint32_t bits = static_cast<std::uint32_t>(TwellLayout::slot_value_bits(word)) << (16 * (col & 1));
#pragma unroll
      for (int k = 0; k < 4; ++k) w[k] |= ((col & 7) >> 1) == k ? bits : 0u;
    }
  }
  return make_uint4(w[0], w[1], w[2], w[3]);
}

__global__ void __launch_bounds__(kOverflowThreads) overflow_rows_kernel(OverflowRows a) {
  ::twell::detail::wait_for_prior_grids();
  const auto fill = static_cast<std::int64_t>(a.status[kFillRows]);
  const std::int64_t threads = std::int64_t{gridDim.x} * blockDim.x;
  const std::int64_t first = std::int64_t{blockIdx.x} * blockDim.x + threadIdx.x;
  if (fill == 0) {
    if (a.gathered == nullptr) return;
    const std::int64_t used = min(a.rows, static_cast<std::int64_t>(a.status[kRecomputeRows]));
    for (std::int64_t i = first; i < used * a.vecs; i += threads) {
      const std::int64_t r = i / a.vecs, v = i - r * a.vecs;
      a.gathered[r * a.ldg + v] = a.x[std::int64_t{a.overflow_to_row[r]} * a.ldx + v];
    }
    return;
  }
  const int lane = static_cast<int>(threadIdx.x) & 31;
  const std::int64_t tiles = a.layout.tiles(a.n);
  const std::int64_t tile_items = fill * tiles;
  const std::int64_t items = tile_items + static_cast<std::int64_t>(a.status[kSpilled]);
  for (std::int64_t w = first >> 5; w < items; w += threads >> 5) {  // a warp per item
    std::int64_t r = 0, t = 0;
    uint4 v{};
    if (w < tile_items) {
      r = w / tiles;
      t = w - r * tiles;
      const std::uint32_t* group = a.packed + a.layout.slot_offset(a.overflow_to_row[r], t, a.n);
      if (a.layout.overflows(group[0])) continue;  // its spilled segment is copied instead
      v = tile_chunk_from_slots(group, lane);
    } else {
      const std::int64_t s = w - tile_items;
      const int2 at = a.spill_where[s];
      r = a.row_to_overflow[at.x];
      t = at.y;
      if (r < 0 || r >= fill) continue;  // a row past the block
      if (8 * lane < a.layout.tile_cols(t, a.n))  // a 128-column segment ends at lane 16
        v = reinterpret_cast<const uint4*>(a.spill_values + s * a.layout.tile)[lane];
    }
    if (8 * lane < a.layout.tile_cols(t, a.n))
      *reinterpret_cast<uint4*>(a.block + r * a.ldb + t * a.layout.tile + 8 * lane) = v;
  }
}

// One CTA of 1024 threads ranks the flagged rows in increasing row order: row_to_overflow[i] =
// the rank of flagged row i (-1 for the others, and for every row when !route), overflow_to_row[
// rank] = i for ranks below `capacity`, and each flag is cleared for the next run. Then it fills
// the status words (see StatusWord). Each warp counts the flags of its rows (row_ballots), one
// block scan of the warp counts gives its first rank, and a second walk over the same rows writes
// the maps, coalesced. Deterministic; one CTA because M is at most a few hundred thousand.
// With spill_capacity > 0 (the packers spilled) it also chooses how the block's rows are
// made: filled by overflow_rows_kernel where every spill found a slot, else recomputed.
// When no tile overflowed (the excess accumulator is 0) and the previous pass found no flagged
// row either, the maps already hold -1 everywhere and no flag is set: only the totals move (a
// few microseconds less per run). A new plan's maps hold -1 and its words 0, so that holds from
// its first run.
__global__ void __launch_bounds__(1024)
    rank_overflow_rows_kernel(std::int32_t* flags, std::int64_t m, bool route, std::int64_t capacity,
                              std::int64_t spill_capacity, std::int32_t* row_to_overflow, std::int32_t* overflow_to_row,
                              unsigned long long* status) {
  ::twell::detail::wait_for_prior_grids();
  using Ballots = std::uint32_t[detail::kBallotSteps];
  const int tid = static_cast<int>(threadIdx.x);
  const int lane = tid & 31;
  if (status[kExcessAcc] == 0 && status[kFlaggedRows] == 0) {
    if (tid == 0) {
      status[kStored] = status[kStoredAcc];
      status[kExcess] = 0;
      status[kStoredAcc] = 0;
    }
    return;
  }
  const detail::WarpRows rows = detail::warp_rows(m, tid >> 5);
  const auto flagged = [&](std::int64_t i) { return flags[i] != 0; };
  std::int32_t count = 0;
  detail::for_each_ballot_batch(rows, lane, flagged, [&](std::int64_t, const Ballots& ballots) {
#pragma unroll
    for (int s = 0; s < detail::kBallotSteps; ++s) count += __popc(ballots[s]);
  });
  std::int32_t total = 0;
  std::int32_t rank = detail::count_of_warps_before(count, lane, total);
  if (tid == 0) {
    status[kFlaggedRows] = static_cast<unsigned long long>(total);
    if (total == 0) status[kFirstRowPlus1] = 0;  // else written by the row of rank 0
  }
  detail::for_each_ballot_batch(rows, lane, flagged, [&](std::int64_t first, const Ballots& ballots) {
#pragma unroll
    for (int s = 0; s < detail::kBallotSteps; ++s) {
      const std::int64_t i = first + 32 * s + lane;
      const bool mine = (ballots[s] >> lane) & 1u;
      const std::int32_t r = rank + __popc(ballots[s] & ((1u << lane) - 1u));
      if (i < rows.end) row_to_overflow[i] = (route && mine) ? r : -1;
      if (mine) {
        flags[i] = 0;
        if (route && r < capacity) overflow_to_row[r] = static_cast<std::int32_t>(i);
        if (r == 0) status[kFirstRowPlus1] = static_cast<unsigned long long>(i) + 1ull;
      }
      rank += __popc(ballots[s]);
    }
  });
  if (tid == 0) {
    status[kStored] = status[kStoredAcc];
    status[kExcess] = status[kExcessAcc];
    status[kStoredAcc] = 0;
    status[kExcessAcc] = 0;
    // R = 0 leaves both counts 0, which the fast path above relies on (it keeps them).
    const unsigned long long spills = status[kSpillAcc];
    const bool fill = spill_capacity > 0 && spills <= static_cast<unsigned long long>(spill_capacity);
    const auto rows = static_cast<unsigned long long>(total);
    status[kFillRows] = fill ? min(rows, static_cast<unsigned long long>(capacity)) : 0ull;
    status[kRecomputeRows] = fill ? 0ull : rows;
    status[kSpilled] = fill ? spills : 0ull;
    status[kSpillAcc] = 0;
  }
}

// Thread per row: overflow_to_row[row_to_overflow[i]] = i.
__global__ void invert_overflow_map_kernel(const std::int32_t* row_to_overflow, std::int64_t m,
                                           std::int32_t* overflow_to_row) {
  ::twell::detail::wait_for_prior_grids();
  const std::int64_t i = std::int64_t{blockIdx.x} * blockDim.x + threadIdx.x;
  if (i < m && row_to_overflow[i] >= 0) overflow_to_row[row_to_overflow[i]] = static_cast<std::int32_t>(i);
}

bool aligned16(const void* p) { return reinterpret_cast<std::uintptr_t>(p) % 16 == 0; }

template <class T>
bool tensor_core_ok(DenseView<const T> x, DenseView<const T> w) {
  if constexpr (!ValueTraits<T>::packs_in_slot) {
    return false;
  } else {
    return x.cols % 8 == 0 && w.cols % 8 == 0 && x.ld % 8 == 0 && w.ld % 8 == 0 && aligned16(x.data) &&
           aligned16(w.data);
  }
}

template <class T>
GemmArgs make_args(DenseView<const T> x, const std::int32_t* rows, std::int64_t m, DenseView<const T> w,
                   ActivationSpec act) {
  GemmArgs g;
  g.x = reinterpret_cast<const std::uint16_t*>(x.data);
  g.ldx = x.ld;
  g.x_rows = rows;
  g.w = reinterpret_cast<const std::uint16_t*>(w.data);
  g.ldw = w.ld;
  g.m = m;
  g.n = w.cols;
  g.k = x.cols;
  g.kind = act.kind;
  g.threshold = act.threshold;
  return g;
}

// The Hopper kernels' arguments for act(x w).
template <class T>
detail::Sm90Gemm sm90_args(DenseView<const T> x, DenseView<const T> w, ActivationSpec act) {
  return {.x = x.data,
          .ldx = x.ld,
          .w = w.data,
          .ldw = w.ld,
          .m = x.rows,
          .n = w.cols,
          .k = x.cols,
          .kind = act.kind,
          .threshold = act.threshold};
}

// The fused path's name: mainloop, tile, and the Hopper kernel's tiling where it ran.
std::string fused_path(bool wgmma, int tile, detail::Sm90Tiling tiling) {
  return std::string(wgmma ? "fused_wgmma_tma_tile" : "fused_mma_sync_tile") + (tile == 128 ? "128" : "256") +
         (tiling.rows == 64 ? "_rows64" : "") + (tiling.k_parts > 1 ? "_ksplit" + std::to_string(tiling.k_parts) : "");
}

dim3 grid_for(std::int64_t m, std::int64_t n, int bm, int bn, const char* where) {
  const std::int64_t gx = (n + bn - 1) / bn, gy = (m + bm - 1) / bm;
  require(gy <= 65535, ErrorCode::unsupported, where, "M = ", m, " needs ", gy, " row blocks; at most 65535");
  return dim3(static_cast<unsigned>(gx), static_cast<unsigned>(gy));
}

template <class T>
void check_operands(DenseView<const T> x, DenseView<const T> w, ActivationSpec act, const char* where) {
  require(x.space == MemorySpace::device && w.space == MemorySpace::device, ErrorCode::space_mismatch, where,
          "x and w must live in device memory (x: ", to_string(x.space), ", w: ", to_string(w.space), ")");
  require(x.rows >= 0 && x.cols >= 0 && w.rows >= 0 && w.cols >= 0, ErrorCode::invalid_argument, where,
          "negative shape: x ", x.rows, " x ", x.cols, ", w ", w.rows, " x ", w.cols);
  require(x.cols == w.rows, ErrorCode::shape_mismatch, where, "x is ", x.rows, " x ", x.cols, " but w is ", w.rows,
          " x ", w.cols, " (x.cols must equal w.rows)");
  twell::detail::check_dense_geometry(x, where, "x");
  twell::detail::check_dense_geometry(w, where, "w");
  ::twell::detail::check_activation(act, where);
  require(x.rows <= INT32_MAX, ErrorCode::unsupported, where, "M = ", x.rows, " exceeds the 32-bit row maps");
}

// Any layout: a dense activated product into a temporary, then the cuda dense -> TwELL/Hybrid
// converter (which allocates the result and synchronises).
template <class T>
HybridMatrix<T> generic_path(DenseView<const T> x, DenseView<const T> w, ActivationSpec act, TwellLayout layout,
                             OverflowPolicy policy, ConvertReport* report, Stream stream, std::string& path,
                             const char* where) {
  const auto cu_stream = static_cast<cudaStream_t>(stream.handle);
  DenseMatrix<T> dense(x.rows, w.cols, MemorySpace::device);
  path = "generic:" + detail::gemm_activate_dense<T>(x, nullptr, x.rows, w, act, dense.view(), cu_stream);
  ConvertOptions c;
  c.overflow = policy;
  c.threshold = 0.0f;  // the threshold was applied in fp32 by the GEMM's epilogue
  c.stream = stream;
  c.report = report;
  HybridMatrix<T> result;
  if (policy == OverflowPolicy::hybrid) {
    result = dense_to_hybrid<T>(DenseView<const T>(dense.view()), layout, c);
    path += "+dense_to_hybrid";
  } else {
    TwellMatrix<T> t = detail::dense_to_twell_as<T>(DenseView<const T>(dense.view()), layout, c, where);
    result = HybridMatrix<T>(x.rows, w.cols, layout, 0, MemorySpace::device);
    result.twell() = std::move(t);
    path += "+dense_to_twell";
  }
  return result;
}

template <class T, int BN>
void launch_twell(const GemmArgs& g, const TwellOut& o, cudaStream_t stream, const char* where) {
  constexpr int kSmem = smem_bytes<BN>();
  static_assert(kBM * (BN + kPad) * 2 <= kSmem, "the epilogue tile must fit in the pipeline's shared memory");
  ::twell::detail::allow_dynamic_shared(gemm_twell_kernel<T, BN>, std::size_t{kSmem}, where);
  ::twell::detail::launch_kernel(where, gemm_twell_kernel<T, BN>, grid_for(g.m, g.n, kBM, BN, where), kThreads, kSmem,
                                 stream, g, o);
}

// The tensor-core dense GEMM (128 x 128 CTAs) over g.m rows (fewer if g.m_limit says so).
template <class T>
void launch_dense(const GemmArgs& g, T* out, std::int64_t ldo, cudaStream_t stream, const char* where) {
  constexpr int kSmem = smem_bytes<128>();
  ::twell::detail::allow_dynamic_shared(gemm_dense_kernel<T, 128>, std::size_t{kSmem}, where);
  ::twell::detail::launch_kernel(where, gemm_dense_kernel<T, 128>, grid_for(g.m, g.n, kBM, 128, where), kThreads, kSmem,
                                 stream, g, out, ldo);
}

// The fused kernel serves this plan's shape (operand alignment is checked per run).
template <class T>
bool fused_shape_ok(std::int64_t k, std::int64_t n, TwellLayout layout, const char* where) {
  if constexpr (!ValueTraits<T>::packs_in_slot) {
    return false;
  } else {
    if (layout.tile != 128 && layout.tile != 256) return false;
    if (k % 8 != 0 || n % 8 != 0) return false;
    // The device's opt-in limit less the kernel's static shared memory (99 KB on sm_86/89, more
    // on sm_80/90).
    return layout.tile == 128
               ? smem_bytes<128>() <= ::twell::detail::dynamic_shared_limit(gemm_twell_kernel<T, 128>, where)
               : smem_bytes<256>() <= ::twell::detail::dynamic_shared_limit(gemm_twell_kernel<T, 256>, where);
  }
}

}  // namespace

namespace detail {

template <class T>
std::string gemm_activate_dense(DenseView<const T> x, const std::int32_t* rows, std::int64_t m, DenseView<const T> w,
                                ActivationSpec act, DenseView<T> out, cudaStream_t stream) {
  constexpr const char* kWhere = "twell::cuda::gemm_to_sparse (dense GEMM)";
  if (m == 0 || w.cols == 0) return "empty";
  if constexpr (ValueTraits<T>::packs_in_slot) {
    if (tensor_core_ok<T>(x, w) &&
        smem_bytes<128>() <= ::twell::detail::dynamic_shared_limit(gemm_dense_kernel<T, 128>, kWhere)) {
      launch_dense<T>(make_args<T>(x, rows, m, w, act), out.data, out.ld, stream, kWhere);
      return "mma_sync_dense";
    }
  }
  ::twell::detail::launch_kernel(kWhere, gemm_simt_kernel<T>, grid_for(m, w.cols, 64, 64, kWhere), 256, 0, stream,
                                 x.data, x.ld, rows, w.data, w.ld, m, w.cols, x.cols, act.kind, act.threshold, out.data,
                                 out.ld);
  return "simt_dense";
}

}  // namespace detail

template <Value T>
GemmToSparsePlan<T>::GemmToSparsePlan(std::int64_t m, std::int64_t k, std::int64_t n, ActivationSpec act,
                                      TwellLayout layout, std::int64_t overflow_capacity, OverflowPolicy policy,
                                      Stream stream, FusedMainloop mainloop)
    : m_(m), k_(k), n_(n), act_(act), layout_(layout), policy_(policy), stream_(stream) {
  constexpr const char* kWhere = "twell::cuda::GemmToSparsePlan";
  require(m >= 0 && k >= 0 && n >= 0, ErrorCode::invalid_argument, kWhere, "negative shape: M = ", m, ", K = ", k,
          ", N = ", n);
  require(m <= INT32_MAX, ErrorCode::unsupported, kWhere, "M = ", m, " exceeds the 32-bit row maps");
  check_layout(layout, kWhere);
  ::twell::detail::check_activation(act, kWhere);
  check_overflow_policy(policy, kWhere);
  require(overflow_capacity >= 0 || overflow_capacity == kDefaultCapacity, ErrorCode::invalid_argument, kWhere,
          "overflow_capacity ", overflow_capacity, " must be >= 0 (or kDefaultCapacity)");
  require(mainloop == FusedMainloop::best || mainloop == FusedMainloop::portable ||
              mainloop == FusedMainloop::best_decode_split,
          ErrorCode::invalid_argument, kWhere, "fused mainloop ", static_cast<int>(mainloop), " is unknown");
  fused_ = fused_shape_ok<T>(k, n, layout, kWhere);
  if (!fused_) return;  // the generic path allocates its result per run
  hopper_ = mainloop != FusedMainloop::portable && detail::gemm_twell_sm90_available<T>(layout.tile, kWhere);
  const std::int64_t capacity =
      policy != OverflowPolicy::hybrid
          ? 0
          : std::min(m, overflow_capacity == kDefaultCapacity ? default_capacity(m) : overflow_capacity);
  // Decided here, once, so that a plan's bits do not change between runs (but for operands a run
  // passes that the wgmma kernel cannot take, not 16-byte aligned or with leading dimensions not
  // multiples of 8: that run falls back to the unsplit portable kernel). Under hybrid only with a
  // block of every row: the spill pool then holds every spilled segment, so the block is filled
  // from this kernel's own values, never by the unsplit recompute or second pass (whose other
  // sums would disagree with the TwELL slots' in the last bits).
  split_ = hopper_ && mainloop == FusedMainloop::best_decode_split &&
           (policy != OverflowPolicy::hybrid || capacity >= m) &&
           detail::gemm_twell_sm90_split_applies<T>(m, k, n, layout.tile, false, kWhere);
  // Under hybrid, split_ implies a block of all M rows.
  own_rows_ = split_ && policy == OverflowPolicy::hybrid &&
              detail::gemm_twell_sm90_split_applies<T>(m, k, n, layout.tile, true, kWhere);
  twell_ = TwellMatrix<T>(m, n, layout, MemorySpace::device, Uninitialized{});  // the epilogue writes every slot
  overflow_ = DenseMatrix<T>(capacity, n, MemorySpace::device);
  // -1 everywhere, as the ranking kernel's fast path (no flagged row) leaves the map: then a first
  // run without an overflowed tile may take that path too. Set synchronously (fill_bytes), so that
  // no copy is in flight when a run is queued on a non-blocking stream.
  row_to_overflow_ = Buffer<std::int32_t>(static_cast<std::size_t>(m), MemorySpace::device, Uninitialized{});
  ::twell::detail::fill_bytes(row_to_overflow_.data(), MemorySpace::device, 0xff, row_to_overflow_.bytes());
  overflow_to_row_ = Buffer<std::int32_t>(static_cast<std::size_t>(capacity), MemorySpace::device);
  flags_ = Buffer<std::int32_t>(static_cast<std::size_t>(m), MemorySpace::device);
  if (own_rows_) own_flags_ = Buffer<std::int32_t>(static_cast<std::size_t>(m), MemorySpace::device);
  status_ = Buffer<std::uint64_t>(kStatusWords, MemorySpace::device);
  if (capacity > 0) size_overflow_buffers(capacity);
}

template <Value T>
void GemmToSparsePlan<T>::size_overflow_buffers(std::int64_t capacity) {
  // A segment for every (row, tile) of the block: enough whenever R <= capacity.
  const std::int64_t segments = capacity * layout_.tiles(n_);
  // All allocated before any is assigned: a failure leaves every buffer as it was.
  Buffer<std::uint16_t> values(static_cast<std::size_t>(segments * layout_.tile), MemorySpace::device, Uninitialized{});
  Buffer<std::int32_t> where(static_cast<std::size_t>(2 * segments), MemorySpace::device, Uninitialized{});
  DenseMatrix<T> gathered;
  if (hopper_) gathered = DenseMatrix<T>(capacity, k_, MemorySpace::device);
  spill_values_ = std::move(values);
  spill_where_ = std::move(where);
  if (hopper_) gathered_x_ = std::move(gathered);
}

template <Value T>
void GemmToSparsePlan<T>::run_generic(const char* where) {
  ConvertReport report;
  generic_ = generic_path<T>(x_, w_, act_, layout_, policy_, &report, stream_, path_, where);
  count_.rows = generic_.overflow_rows();
  count_.nnz = report.nnz;
  count_.dropped = report.dropped;
}

template <Value T>
void GemmToSparsePlan<T>::run(DenseView<const T> x, DenseView<const T> w) {
  run(x, w, "twell::cuda::GemmToSparsePlan::run");
}

template <Value T>
void GemmToSparsePlan<T>::check_run(DenseView<const T> x, DenseView<const T> w, const char* where) const {
  require(state_ != State::taken, ErrorCode::invalid_argument, where, kSpentPlan);
  twell::detail::require_plan_device(device_, where);
  check_operands<T>(x, w, act_, where);
  require(x.rows == m_ && x.cols == k_ && w.cols == n_, ErrorCode::shape_mismatch, where, "the plan is for x ", m_,
          " x ", k_, " and w ", k_, " x ", n_, "; got x ", x.rows, " x ", x.cols, " and w ", w.rows, " x ", w.cols);
}

template <Value T>
void GemmToSparsePlan<T>::run(DenseView<const T> x, DenseView<const T> w, const char* where) {
  check_run(x, w, where);
  state_ = State::idle;  // until the work is queued, there is no result to claim
  x_ = x;
  w_ = w;
  count_ = {};
  ran_fused_ = fused_ && tensor_core_ok<T>(x, w);
  if (!ran_fused_) {
    run_generic(where);  // synchronous; its count is reported by sync_overflow_count() as on the fused path
    state_ = State::queued;
    return;
  }
  if constexpr (ValueTraits<T>::packs_in_slot) {
    const auto stream = static_cast<cudaStream_t>(stream_.handle);
    auto* status = reinterpret_cast<unsigned long long*>(status_.data());
    static_assert(sizeof(std::uint64_t) == sizeof(unsigned long long));
    const GemmArgs g = make_args<T>(x, nullptr, m_, w, act_);
    TwellOut o{.packed = twell_.packed().data(),
               .layout = layout_,
               .row_flags = flags_.data(),
               .stored_total = status + kStoredAcc,
               .excess_total = status + kExcessAcc,
               .clamp_count = policy_ == OverflowPolicy::drop};
    const bool route = policy_ == OverflowPolicy::hybrid;
    const detail::Sm90Gemm h = sm90_args<T>(x, w, act_);
    const bool wgmma = hopper_ && detail::gemm_twell_sm90_applies(h);
    const bool spill = route && overflow_.rows() > 0;
    if (spill) {
      o.spill_values = spill_values_.data();
      o.spill_where = reinterpret_cast<int2*>(spill_where_.data());
      o.spill_count = status + kSpillAcc;
      o.spill_capacity = static_cast<std::int64_t>(spill_where_.size() / 2);
    }
    detail::Sm90Tiling tiling;
    if (wgmma) {
      tiling = detail::launch_gemm_twell_sm90<T>(h, o, split_, detail::Sm90Dense{}, stream, where);
    } else if (m_ > 0 && n_ > 0) {
      if (layout_.tile == 128) {
        launch_twell<T, 128>(g, o, stream, where);
      } else {
        launch_twell<T, 256>(g, o, stream, where);
      }
    }
    ::twell::detail::launch_kernel(where, rank_overflow_rows_kernel, 1, 1024, 0, stream, flags_.data(), m_, route,
                                   overflow_.rows(), o.spill_capacity, row_to_overflow_.data(), overflow_to_row_.data(),
                                   status);
    path_ = fused_path(wgmma, layout_.tile, tiling);
    if (route && overflow_.rows() > 0 && n_ > 0) {
      // The overflow rows' dense values, for the whole block; the kernels read the device-side
      // counts and do nothing past them. The block is filled from the TwELL slots and the
      // packers' spilled segments; where a spill found no slot (more spills than the pool holds,
      // which takes R > capacity) the rows are recomputed instead. On Hopper their rows of x are
      // gathered first, so that the wgmma kernel's TMA reads them as one matrix: the mma.sync
      // recompute of 257 rows of the paper's shape took ~51 us on an H100 (docs/gemm_to_sparse.md,
      // "Seventh session"), the wgmma one ~22 us at M = 4096 on an H200.
      const auto* recompute = status + kRecomputeRows;
      OverflowRows f;
      f.x = reinterpret_cast<const uint4*>(x.data);
      f.ldx = x.ld / 8;
      f.vecs = wgmma ? k_ / 8 : 0;
      f.gathered = wgmma ? reinterpret_cast<uint4*>(gathered_x_.view().data) : nullptr;
      f.ldg = wgmma ? gathered_x_.view().ld / 8 : 0;
      f.overflow_to_row = overflow_to_row_.data();
      f.row_to_overflow = row_to_overflow_.data();
      f.status = status;
      f.rows = overflow_.rows();
      f.packed = twell_.packed().data();
      f.layout = layout_;
      f.n = n_;
      f.block = reinterpret_cast<std::uint16_t*>(overflow_.view().data);
      f.ldb = overflow_.view().ld;
      f.spill_values = spill_values_.data();
      f.spill_where = reinterpret_cast<const int2*>(spill_where_.data());
      const std::int64_t work = std::max(f.rows * f.vecs, 2 * f.rows * layout_.tiles(n_) * 32);
      const auto blocks = std::min(kOverflowMaxBlocks, (work + kOverflowThreads - 1) / kOverflowThreads);
      ::twell::detail::launch_kernel(where, overflow_rows_kernel, static_cast<unsigned>(blocks), kOverflowThreads, 0,
                                     stream, f);
      // A pool of a segment for every (row, tile) of M holds every spill, so the ranking kernel
      // always fills and the recompute would find no row: not queued (a launch, ~1.5 us of a
      // decode step, where the block holds all M rows: the default at M <= 64, the FFN decode
      // path's gate up to 256).
      const bool always_filled = o.spill_capacity >= m_ * layout_.tiles(n_);
      if (!always_filled && wgmma) {  // the gathered copy is plan-owned, aligned, ld = K: it meets what h met
        detail::Sm90Gemm hr = h;
        hr.x = gathered_x_.view().data;
        hr.ldx = gathered_x_.view().ld;
        hr.m = overflow_.rows();
        detail::launch_gemm_dense_sm90<T>(hr, {overflow_.view().data, overflow_.view().ld, recompute}, layout_.tile,
                                          stream, where);
      } else if (!always_filled) {
        GemmArgs r = make_args<T>(x, overflow_to_row_.data(), overflow_.rows(), w, act_);
        r.m_limit = recompute;
        launch_dense<T>(r, overflow_.view().data, n_, stream, where);
      }
    }
  }
  state_ = State::queued;
}

template <Value T>
bool GemmToSparsePlan<T>::run_own_rows(DenseView<const T> x, DenseView<const T> w, const char* where) {
  check_run(x, w, where);
  if constexpr (ValueTraits<T>::packs_in_slot) {
    const detail::Sm90Gemm h = sm90_args<T>(x, w, act_);
    if (own_rows_ && tensor_core_ok<T>(x, w) && detail::gemm_twell_sm90_applies(h)) {
      state_ = State::idle;
      x_ = x;
      w_ = w;
      count_ = {};
      ran_fused_ = true;
      auto* status = reinterpret_cast<unsigned long long*>(status_.data());
      // Sinks: flags_ and the accumulators keep the ranking kernel's premise (cleared) for the
      // next run(); nothing spills, since every row is stored densely.
      const TwellOut o{.packed = twell_.packed().data(),
                       .layout = layout_,
                       .row_flags = own_flags_.data(),
                       .stored_total = status + kOwnRowsSink,
                       .excess_total = status + kOwnRowsSink};
      const detail::Sm90Tiling tiling =
          detail::launch_gemm_twell_sm90<T>(h, o, true, detail::Sm90Dense{overflow_.view().data, overflow_.view().ld},
                                            static_cast<cudaStream_t>(stream_.handle), where);
      path_ = fused_path(true, layout_.tile, tiling) + "_own_rows";
      state_ = State::own_rows;
      return true;
    }
  }
  run(x, w, where);
  return false;
}

template <Value T>
HybridView<const T> GemmToSparsePlan<T>::own_rows_view() const {
  require(state_ == State::own_rows, ErrorCode::invalid_argument, "twell::cuda::GemmToSparsePlan::own_rows_view",
          "the latest run was not run_own_rows()'s");
  return plan_view();
}

template <Value T>
OverflowCount GemmToSparsePlan<T>::sync_overflow_count(const std::function<void()>& meanwhile) {
  return sync_overflow_count("twell::cuda::GemmToSparsePlan::sync_overflow_count", meanwhile);
}

template <Value T>
OverflowCount GemmToSparsePlan<T>::sync_overflow_count(const char* where, const std::function<void()>& meanwhile,
                                                       bool for_later_runs) {
  require(state_ == State::queued || state_ == State::synced, ErrorCode::invalid_argument, where,
          state_ == State::taken      ? kSpentPlan
          : state_ == State::own_rows ? kOwnRowsRun
                                      : "nothing to count: call run() first");
  twell::detail::require_plan_device(device_, where);
  if (state_ == State::synced || !ran_fused_) {
    if (meanwhile) meanwhile();
    state_ = State::synced;
    return count_;
  }
  const auto stream = static_cast<cudaStream_t>(stream_.handle);
  std::uint64_t words[kFillRows + 1 - kFlaggedRows] = {};  // the words the host needs (ReadBack: 64 bytes at most)
  {
    const detail::ReadBack status(status_.data() + kFlaggedRows, sizeof words, stream, where);
    if (meanwhile) meanwhile();
    std::memcpy(words, status.wait(), sizeof words);
  }
  const auto flagged = static_cast<std::int64_t>(words[kFlaggedRows - kFlaggedRows]);
  const auto first_row = static_cast<std::int64_t>(words[kFirstRowPlus1 - kFlaggedRows]) - 1;
  const auto stored = static_cast<std::int64_t>(words[kStored - kFlaggedRows]);
  const auto excess = static_cast<std::int64_t>(words[kExcess - kFlaggedRows]);
  const bool filled = words[kFillRows - kFlaggedRows] > 0;

  if (policy_ == OverflowPolicy::error && flagged > 0) {
    state_ = State::idle;
    const std::int64_t width = twell_.packed_width();
    std::vector<std::uint32_t> packed(static_cast<std::size_t>(width));
    ::twell::detail::check_cuda(cudaMemcpy(packed.data(), twell_.packed().data() + first_row * width,
                                           packed.size() * sizeof(std::uint32_t), cudaMemcpyDeviceToHost),
                                where);
    std::int64_t t = 0;
    while (t + 1 < layout_.tiles(n_) && !layout_.overflows(packed[static_cast<std::size_t>(t * layout_.slots())])) ++t;
    fail(ErrorCode::overflow, where, "row ", first_row, ", tile ", t, " has ",
         packed[static_cast<std::size_t>(t * layout_.slots())], " nonzeros but TwELL(tile ", layout_.tile, ", C ",
         layout_.compression, ") holds ", layout_.capacity(), " per (row, tile); ", flagged,
         " rows overflow (use OverflowPolicy::hybrid or drop)");
  }
  // The plan changes only once everything below has succeeded: a failed allocation while the
  // block grows (out_of_memory, which the caller may answer by freeing memory and calling again)
  // leaves the block, the map and the buffers sized for it as they were, the count and the path.
  const bool drop = policy_ == OverflowPolicy::drop;
  OverflowCount count = count_;
  count.nnz = drop ? stored - excess : stored;
  count.dropped = drop ? excess : 0;
  std::string path = path_;
  if (policy_ == OverflowPolicy::hybrid) {
    count.rows = flagged;
    const std::int64_t capacity = overflow_.rows();
    // The block's rows were made in run(): filled, or recomputed by the mainloop's kind.
    if (flagged > 0 && capacity > 0)
      path += filled                              ? "+overflow:spilled"
              : path.rfind("fused_wgmma", 0) == 0 ? "+overflow:wgmma_dense"
                                                  : "+overflow:mma_sync_dense";
    if (flagged > capacity) {
      count.exceeded_capacity = true;
      count.second_pass = true;
      const std::int64_t grown = std::min(m_, std::max(flagged, 2 * capacity));
      DenseMatrix<T> block(grown, n_, MemorySpace::device);
      Buffer<std::int32_t> map(static_cast<std::size_t>(grown), MemorySpace::device);
      if (capacity > 0) {
        ::twell::detail::check_cuda(cudaMemcpyAsync(block.view().data, overflow_.view().data,
                                                    static_cast<std::size_t>(capacity * n_) * sizeof(T),
                                                    cudaMemcpyDeviceToDevice, stream),
                                    where);
        // The old block is freed below; its copy must have landed first.
        ::twell::detail::check_cuda(cudaStreamSynchronize(stream), where);
      }
      ::twell::detail::launch_kernel(where, invert_overflow_map_kernel, static_cast<unsigned>((m_ + 255) / 256), 256, 0,
                                     stream, row_to_overflow_.data(), m_, map.data());
      const DenseView<T> rest{block.view().data + capacity * n_, flagged - capacity, n_, n_, MemorySpace::device};
      path += "+second_pass:" +
              detail::gemm_activate_dense<T>(x_, map.data() + capacity, flagged - capacity, w_, act_, rest, stream);
      // Buffers sized for the grown block before the block itself: larger ones serve the old one.
      if (for_later_runs) size_overflow_buffers(grown);
      overflow_ = std::move(block);
      overflow_to_row_ = std::move(map);
    }
  }
  path_ = std::move(path);
  count_ = count;
  state_ = State::synced;
  return count_;
}

template <Value T>
HybridView<const T> GemmToSparsePlan<T>::result() const {
  require(state_ == State::synced, ErrorCode::invalid_argument, "twell::cuda::GemmToSparsePlan::result",
          state_ == State::taken ? kSpentPlan : "the result is valid from sync_overflow_count() until the next run()");
  if (!ran_fused_) return generic_.view();
  HybridView<const T> v = plan_view();
  v.overflow.rows = count_.rows;
  return v;
}

template <Value T>
HybridMatrix<T> GemmToSparsePlan<T>::take_result() && {
  constexpr const char* kWhere = "twell::cuda::GemmToSparsePlan::take_result";
  require(state_ == State::synced, ErrorCode::invalid_argument, kWhere,
          state_ == State::taken ? kSpentPlan : "the result is valid from sync_overflow_count() until the next run()");
  twell::detail::require_plan_device(device_, kWhere);
  if (!ran_fused_) {
    state_ = State::taken;
    return std::move(generic_);
  }
  // A block larger than R is copied into an exact one first: an allocation that fails there
  // leaves the plan and its result as they were.
  const std::int64_t r = count_.rows;
  DenseMatrix<T> block;
  Buffer<std::int32_t> map;
  if (overflow_.rows() == r) {
    block = std::move(overflow_);
    map = std::move(overflow_to_row_);
  } else {
    const auto stream = static_cast<cudaStream_t>(stream_.handle);
    block = DenseMatrix<T>(r, n_, MemorySpace::device);
    map = Buffer<std::int32_t>(static_cast<std::size_t>(r), MemorySpace::device);
    if (r > 0) {
      ::twell::detail::check_cuda(
          cudaMemcpyAsync(block.view().data, overflow_.view().data, static_cast<std::size_t>(r * n_) * sizeof(T),
                          cudaMemcpyDeviceToDevice, stream),
          kWhere);
      ::twell::detail::check_cuda(
          cudaMemcpyAsync(map.data(), overflow_to_row_.data(), map.bytes(), cudaMemcpyDeviceToDevice, stream), kWhere);
      ::twell::detail::check_cuda(cudaStreamSynchronize(stream), kWhere);
    }
  }
  state_ = State::taken;
  HybridMatrix<T> out;
  out.twell() = std::move(twell_);
  out.row_to_overflow() = std::move(row_to_overflow_);
  out.overflow() = std::move(block);
  out.overflow_to_row() = std::move(map);
  return out;
}

template <Value T>
const std::uint64_t* GemmToSparsePlan<T>::device_overflow_count() const {
  return ran_fused_ && state_ != State::own_rows && status_.data() != nullptr ? status_.data() + kFlaggedRows : nullptr;
}

// The allocating form: a plan with an empty overflow block, so that the block is allocated once
// R is known and with exactly R rows (the plan's second pass computes them).
template <Value T>
HybridMatrix<T> gemm_to_sparse(DenseView<const T> x, DenseView<const T> w, ActivationSpec act, TwellLayout layout,
                               const ConvertOptions& convert, const KernelOptions& options) {
  constexpr const char* kWhere = "twell::cuda::gemm_to_sparse";
  check_operands<T>(x, w, act, kWhere);
  check_layout(layout, kWhere);
  twell::detail::check_gemm_convert_options(convert, kWhere);
  GemmToSparsePlan<T> plan(x.rows, x.cols, w.cols, act, layout, 0, convert.overflow, options.stream);
  plan.run(x, w, kWhere);
  const OverflowCount count = plan.sync_overflow_count(kWhere, {}, /*for_later_runs=*/false);
  if (convert.report != nullptr) {
    convert.report->nnz = count.nnz;
    convert.report->dropped = count.dropped;
    convert.report->overflow_rows = count.rows;
  }
  if (options.report != nullptr) options.report->path = plan.path();
  return std::move(plan).take_result();
}

#define TWELL_INSTANTIATE(T)                                                                                       \
  template class GemmToSparsePlan<T>;                                                                              \
  template HybridMatrix<T> gemm_to_sparse<T>(DenseView<const T>, DenseView<const T>, ActivationSpec, TwellLayout,  \
                                             const ConvertOptions&, const KernelOptions&);                         \
  template std::string detail::gemm_activate_dense<T>(DenseView<const T>, const std::int32_t*, std::int64_t,       \
                                                      DenseView<const T>, ActivationSpec, DenseView<T>, cudaStream_t);
TWELL_FOR_EACH_VALUE_TYPE(TWELL_INSTANTIATE)
#undef TWELL_INSTANTIATE

}  // namespace twell::cuda
