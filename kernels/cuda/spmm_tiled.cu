// cuda spmm, TwELL (and the TwELL part of a Hybrid) with op none: the weight-reuse path.
// spmm.cu selects it when spmm_tiled_applies holds and keeps its pair-balanced kernel as the
// generic fallback. Two kernels, one report path ("tiled_weight_reuse"), bit-identical results:
// tiled_spmm_staged_kernel (slot words staged in shared memory; S from 4 to 32, the paper's
// layouts) and tiled_spmm_kernel (slot words read from global memory; any S, e.g. C = 1).
// Deterministic: each output element is summed by one thread in a fixed order.
#include <algorithm>
#include <cstdint>

#include <twell/error.hpp>
#include <twell/types.hpp>

#include "sparse_common.cuh"
#include "spmm_tiled.cuh"

namespace twell::cuda::detail {
namespace {

constexpr const char* kWhere = "twell::cuda::spmm";
constexpr int kWarps = 16;
constexpr int kThreads = kWarps * 32;
constexpr int kTokensPerWarp = 16;
constexpr int kBlockTokens = kWarps * kTokensPerWarp;  // 256
constexpr int kSlice = 128;                            // output columns of a CTA: 4 per lane
constexpr int kRowBytes = kSlice * 2;                  // one staged B row (16-bit T)
constexpr int kChunks = kRowBytes / 16;                // 16-byte cp.async chunks per staged row
constexpr int kRowsPerPass = kThreads / kChunks;
constexpr unsigned kFull = 0xffffffffu;

__device__ __forceinline__ void cp_async16(void* dst, const void* src) {
  const unsigned s = static_cast<unsigned>(__cvta_generic_to_shared(dst));
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(s), "l"(src) : "memory");
}
// Copies 16 bytes, or writes 16 zero bytes when `bytes` is 0 (src is then not read).
__device__ __forceinline__ void cp_async16_zfill(void* dst, const void* src, unsigned bytes) {
  const unsigned s = static_cast<unsigned>(__cvta_generic_to_shared(dst));
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(s), "l"(src), "r"(bytes) : "memory");
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::: "memory"); }
__device__ __forceinline__ void cp_async_wait_all() { asm volatile("cp.async.wait_group 0;\n" ::: "memory"); }
// All but the most recently committed group complete.
__device__ __forceinline__ void cp_async_wait_prior() { asm volatile("cp.async.wait_group 1;\n" ::: "memory"); }

// Value of a 16-bit slot word (bits in the high half).
template <class T>
__device__ __forceinline__ float slot_value(std::uint32_t word) {
  if constexpr (std::is_same_v<T, bf16>) {
    return __uint_as_float(word & 0xffff0000u);
  } else {
    return bits_to_f<T>(word >> 16);
  }
}

// Four consecutive 16-bit values (two words, low half first) to fp32.
template <class T>
__device__ __forceinline__ void unpack4(uint2 v, float (&out)[4]) {
  if constexpr (std::is_same_v<T, bf16>) {
    out[0] = __uint_as_float(v.x << 16);
    out[1] = __uint_as_float(v.x & 0xffff0000u);
    out[2] = __uint_as_float(v.y << 16);
    out[3] = __uint_as_float(v.y & 0xffff0000u);
  } else {
    out[0] = bits_to_f<T>(v.x & 0xffffu);
    out[1] = bits_to_f<T>(v.x >> 16);
    out[2] = bits_to_f<T>(v.y & 0xffffu);
    out[3] = bits_to_f<T>(v.y >> 16);
  }
}

// acc += value(word) * B row col(word) of the staged tile, this lane's 4 columns. Columns outside
// the tile (only a malformed matrix has them) are skipped: their rows were never staged.
template <class T>
__device__ __forceinline__ void add_entry(std::uint32_t word, std::uint32_t tile_cols, const unsigned char* buf,
                                          int lane, float (&acc)[4]) {
  const std::uint32_t col = TwellLayout::slot_column(word);
  if (col < tile_cols) {
    const float a = slot_value<T>(word);
    float bv[4];
    unpack4<T>(*reinterpret_cast<const uint2*>(buf + col * kRowBytes + lane * 8), bv);
#pragma unroll
    for (int u = 0; u < 4; ++u) acc[u] = fmaf(a, bv[u], acc[u]);
  }
}

// C = alpha * acc + beta * C for a warp's tokens (rows row0 + 16 j; rows >= `rows` and shadow rows
// skipped; beta == 0 never reads C), 8 bytes per lane, 256 per warp and row.
template <class T>
__device__ __forceinline__ void store_tokens(const float (&acc)[kTokensPerWarp][4], std::int64_t rows,
                                             std::int64_t row0, const std::int32_t* __restrict__ shadow,
                                             T* __restrict__ c, std::int64_t ldc, std::int64_t c0, int lane,
                                             float alpha, float beta) {
#pragma unroll
  for (int j = 0; j < kTokensPerWarp; ++j) {
    const std::int64_t row = row0 + kWarps * j;
    if (row >= rows || (shadow != nullptr && shadow[row] >= 0)) continue;
    uint2* p = reinterpret_cast<uint2*>(c + row * ldc + c0 + lane * 4);
    float v[4];
#pragma unroll
    for (int u = 0; u < 4; ++u) v[u] = alpha * acc[j][u];
    if (beta != 0.0f) {
      float old[4];
      unpack4<T>(*p, old);
#pragma unroll
      for (int u = 0; u < 4; ++u) v[u] = fmaf(beta, old[u], v[u]);
    }
    uint2 o;
    o.x = static_cast<std::uint32_t>(bits_of<T>(v[0])) | (static_cast<std::uint32_t>(bits_of<T>(v[1])) << 16);
    o.y = static_cast<std::uint32_t>(bits_of<T>(v[2])) | (static_cast<std::uint32_t>(bits_of<T>(v[3])) << 16);
    *p = o;
  }
}

// Benchmark: bench/suites/spmm.cpp (the down projection: A 16384 x 5632 TwELL(256, 8) at 0.5 %,
// B 5632 x 2048, C 16384 x 2048).
// A CTA (16 warps) owns 256 rows (tokens) of A and one 128-column slice of B and C. Warp w owns
// the tokens w, w + 16, ..., w + 240 of the block (interleaved, so a run of heavy neighbouring
// tokens spreads over warps); a lane owns 4 consecutive columns of the slice for all 16 of its
// warp's tokens: acc[16][4] fp32 in registers. The CTA walks A's tiles in order; B's kTile x 128
// slice of tile t is staged in shared memory by cp.async (double-buffered, one __syncthreads per
// tile), loading only the rows some token of the block touches (a 3-deep ring of kTile-bit
// masks, built two tiles ahead from the prefetched slot words), so each weight row is read from
// L2 once per block instead of once per (token, nonzero) pair. A warp then walks its tokens'
// entries of the tile: lane (j, h) = (lane & 15, lane >> 4) prefetched token j's count and entry
// h, entries past the second come from one warp-wide load, and each entry costs a shuffle, one
// conflict-free 8-byte shared load per lane (a warp reads one contiguous 256-byte row), 4
// unpacks and 4 FMAs (about 14 instructions per warp and entry).
// Cost at the paper shape: B traffic = (M / 256) * (Nb / 128) * 22 tiles * 64 KB = 1.5 GB
// before row skipping; at 0.5 % uniform density a block touches about 72 % of the rows
// (1 - e^(-256 * 28 / 5632)), neuron-skewed activations far fewer, so about 1 GB, against 1.9 GB
// for the pair-balanced kernel; 7.3 M warp-entries at ~14 instructions are ~0.1 ms of issue on
// 132 SMs. Expected ~0.1 to 0.15 ms. Balance: the per-tile barrier waits for the warp with the
// most entries in that tile; interleaving spreads heavy tokens, but one very heavy token still
// serialises on its warp within each tile (bounded by the tile capacity S - 1 entries).
// Taken when the staged kernel below is not (S above 32 or not a power of two, or its shared
// memory does not fit the device).
// Preconditions (spmm_tiled_applies): 16-bit T, layout.tile == kTile, B and C 16-byte aligned
// with ld multiples of 8, Nb a multiple of 128. Counts above capacity are clipped; `shadow`
// (Hybrid row_to_overflow, or null) marks rows left untouched, as do rows >= M.
template <class T, int kTile>
__global__ void __launch_bounds__(kThreads, 1)
    tiled_spmm_kernel(std::int64_t rows, std::int64_t k_cols, TwellLayout layout,
                      const std::uint32_t* __restrict__ packed, const std::int32_t* __restrict__ shadow,
                      const T* __restrict__ b, std::int64_t ldb, T* __restrict__ c, std::int64_t ldc, float alpha,
                      float beta) {
  constexpr int kMaskWords = kTile / 32;
  extern __shared__ __align__(16) unsigned char smem[];
  unsigned char* stage = smem;                                                           // [2][kTile][kRowBytes]
  std::uint32_t* mask = reinterpret_cast<std::uint32_t*>(smem + 2 * kTile * kRowBytes);  // [3][kMaskWords]

  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int tiles = static_cast<int>(layout.tiles(k_cols));
  const int slots = layout.slots();
  const std::uint32_t cap = static_cast<std::uint32_t>(layout.capacity());
  const std::int64_t pw = layout.packed_width(k_cols);
  const std::int64_t c0 = static_cast<std::int64_t>(blockIdx.x) * kSlice;
  const std::int64_t row0 = static_cast<std::int64_t>(blockIdx.y) * kBlockTokens + warp;  // token j: row0 + 16 j

  // The slot words this lane prefetches: token j = lane & 15, entry h = lane >> 4.
  const int h_mine = lane >> 4;
  const std::int64_t my_row = row0 + kWarps * (lane & 15);
  const bool my_live = my_row < rows && (shadow == nullptr || shadow[my_row] < 0);
  const bool my_slot = 1 + h_mine < slots;
  const std::uint32_t* my_slots = packed + (my_live ? my_row * pw : 0);

  // Count (unclipped: clipping would wait on the load) and entry h of tile t, or zeros.
  auto fetch = [&](int t, std::uint32_t& cnt, std::uint32_t& word) {
    cnt = 0;
    word = 0;
    if (my_live && t < tiles) {
      const std::uint32_t* s = my_slots + static_cast<std::int64_t>(t) * slots;
      cnt = __ldg(s);
      if (my_slot) word = __ldg(s + 1 + h_mine);
    }
  };

  // Marks the rows of tile t that the warp's tokens use.
  auto mark = [&](int t, std::uint32_t cnt, std::uint32_t word) {
    if (t >= tiles) return;
    std::uint32_t* m = mask + (t % 3) * kMaskWords;
    const std::uint32_t tile_cols = static_cast<std::uint32_t>(layout.tile_cols(t, k_cols));
    cnt = min(cnt, cap);
    if (h_mine < static_cast<int>(cnt)) {
      const std::uint32_t col = TwellLayout::slot_column(word);
      if (col < tile_cols) atomicOr(m + (col >> 5), 1u << (col & 31));
    }
    unsigned heavy = __ballot_sync(kFull, lane < 16 && cnt > 2);
    while (heavy != 0) {
      const int j = __ffs(heavy) - 1;
      heavy &= heavy - 1;
      const std::uint32_t n = __shfl_sync(kFull, cnt, j);
      const std::uint32_t* s = packed + (row0 + kWarps * j) * pw + static_cast<std::int64_t>(t) * slots + 1;
      for (std::uint32_t e = 2 + lane; e < n; e += 32) {
        const std::uint32_t col = TwellLayout::slot_column(__ldg(s + e));
        if (col < tile_cols) atomicOr(m + (col >> 5), 1u << (col & 31));
      }
    }
  };

  // Stages the marked rows of B's slice of tile u into buffer u & 1.
  auto stage_tile = [&](int u) {
    unsigned char* dst = stage + (u & 1) * (kTile * kRowBytes);
    const std::uint32_t* m = mask + (u % 3) * kMaskWords;
    const int chunk = tid % kChunks;
    const T* src = b + layout.tile_begin(u) * ldb + c0 + chunk * (16 / sizeof(T));
#pragma unroll
    for (int r = tid / kChunks; r < kTile; r += kRowsPerPass) {
      if ((m[r >> 5] >> (r & 31)) & 1u) cp_async16(dst + r * kRowBytes + chunk * 16, src + r * ldb);
    }
  };

  float acc[kTokensPerWarp][4];
#pragma unroll
  for (int j = 0; j < kTokensPerWarp; ++j)
#pragma unroll
    for (int u = 0; u < 4; ++u) acc[j][u] = 0.0f;

  for (int i = tid; i < 3 * kMaskWords; i += kThreads) mask[i] = 0;
  std::uint32_t cnt0, word0, cnt1, word1, cnt2, word2;
  fetch(0, cnt0, word0);
  fetch(1, cnt1, word1);
  __syncthreads();
  mark(0, cnt0, word0);
  mark(1, cnt1, word1);
  __syncthreads();
  stage_tile(0);
  cp_async_commit();

  for (int t = 0; t < tiles; ++t) {
    // After the barrier: tile t is staged, the mask of tile t + 1 is complete, and every warp is
    // done with tile t - 1, whose buffer and mask slot are reused.
    cp_async_wait_all();
    __syncthreads();
    if (tid < kMaskWords) mask[(t % 3) * kMaskWords + tid] = 0;  // next built for tile t + 3
    if (t + 1 < tiles) stage_tile(t + 1);
    cp_async_commit();
    fetch(t + 2, cnt2, word2);  // in flight during the walk, used by mark

    const unsigned char* buf = stage + (t & 1) * (kTile * kRowBytes);
    const std::uint32_t tile_cols = static_cast<std::uint32_t>(layout.tile_cols(t, k_cols));
    const std::uint32_t cnt = min(cnt0, cap);
#pragma unroll
    for (int j = 0; j < kTokensPerWarp; ++j) {
      const std::uint32_t n = __shfl_sync(kFull, cnt, j);
      if (n == 0) continue;
      const std::uint32_t e0 = __shfl_sync(kFull, word0, j);
      const std::uint32_t e1 = __shfl_sync(kFull, word0, j + 16);
      add_entry<T>(e0, tile_cols, buf, lane, acc[j]);
      if (n > 1) add_entry<T>(e1, tile_cols, buf, lane, acc[j]);
      // Entries past the second: 32 at a time, one warp-wide load each.
      const std::uint32_t* s = packed + (row0 + kWarps * j) * pw + static_cast<std::int64_t>(t) * slots + 1;
      for (std::uint32_t first = 2; first < n; first += 32) {
        const std::uint32_t e_lane = first + static_cast<std::uint32_t>(lane);
        const std::uint32_t extra = e_lane < n ? __ldg(s + e_lane) : 0xffffu;  // 0xffff: outside every tile
        const std::uint32_t batch = min(32u, n - first);
        for (std::uint32_t e = 0; e < batch; ++e)
          add_entry<T>(__shfl_sync(kFull, extra, e), tile_cols, buf, lane, acc[j]);
      }
    }

    mark(t + 2, cnt2, word2);
    cnt0 = cnt1;
    word0 = word1;
    cnt1 = cnt2;
    word1 = word2;
  }

  store_tokens<T>(acc, rows, row0, shadow, c, ldc, c0, lane, alpha, beta);
}

// Largest S (slots per tile) whose slot words the staged kernel keeps in shared memory.
constexpr int kMaxStagedSlots = 32;

// Position of slot w of token j in a warp's staged slot words of one tile (16 tokens x S words):
// the 16-byte chunks of a token are XOR-swizzled by token so that the 16 lanes reading slot 0 or 1
// of 16 tokens spread over the banks (unswizzled, a stride of 32 words puts them in one bank).
__device__ __forceinline__ int staged_slot(int j, int w, int slots) {
  const int chunks = slots >> 2;
  return j * slots + ((((w >> 2) ^ j) & (chunks - 1)) << 2) + (w & 3);
}

// The weight-reuse kernel above with the block's slot words staged in shared memory, the path
// taken whenever S is a power of two from 4 to 32 and the shared memory fits (H100/H200: 224 KB
// at S = 32, tile 256).
// Why: measured on an H200, the kernel above spends ~0.9 ns per (token, nonzero) pair, ~10 k
// cycles per tile and CTA at 0.5 %. Its walk has no long chains except for tokens with more than
// two entries in a tile (Poisson(1.28) at 0.5 %: ~14 % of tokens, ~2 per warp and tile; all of
// them at 5 %): each such token costs two dependent global loads of slot words (one in mark, one
// in the walk), ~1 k cycles each from L2 or DRAM, serialised within the warp, and the per-tile
// barrier waits for the warp with the most of them. That matches the time growing with nnz at
// ~4x the issue cost.
// What changes: warp w copies its 16 tokens' slot words of tile t + 2 (swizzled 16-byte chunks,
// only those up to each token's count, which a lane loaded from global memory one iteration
// earlier; zeros for rows it must not touch) into a 3-deep per-warp ring with cp.async at the top
// of iteration t, in its own commit group ahead of B's tile t + 1; before mark(t + 2) at the end
// of the walk it waits for all but the newest group (B) and syncs the warp. Counts, the first two
// entries and the entries past the second are then all read from shared memory (~30 cycles), so
// no chain in the walk or in mark touches global memory. Everything else (ownership, mask ring,
// B staging, entry order, arithmetic) is the kernel above, so C is bit-identical to it.
// Estimate: the walk becomes shuffle -> shared load -> 4 FMA chains (~70 cycles each, 4 warps per
// scheduler to overlap them): about 20 entries per warp and tile at 0.5 % gives ~350 cycles per
// warp-tile per scheduler, ~0.12 ms at M = 16384 plus barriers and B staging (~1 k cycles per
// tile of L2 traffic, overlapped): expected 0.15 to 0.25 ms (was 0.9 ms), and at 5 % ~1 ms
// instead of 4.7 ms. Not measured yet. The next floor is B's staging traffic from L2 (~1 GB at
// 0.5 %, ~0.15 ms): beyond that, more tokens per CTA (more reuse per staged row) is what pays.
// Shared memory: 2 x kTile x 256 B (B) + 16 warps x 3 x 16 x S x 4 B (slot words) + masks.
// Preconditions: those of the kernel above, plus S in {4, 8, 16, 32} and `packed` 16-byte aligned
// (then every (row, tile) run of slot words is).
template <class T, int kTile>
__global__ void __launch_bounds__(kThreads, 1)
    tiled_spmm_staged_kernel(std::int64_t rows, std::int64_t k_cols, TwellLayout layout,
                             const std::uint32_t* __restrict__ packed, const std::int32_t* __restrict__ shadow,
                             const T* __restrict__ b, std::int64_t ldb, T* __restrict__ c, std::int64_t ldc,
                             float alpha, float beta) {
  constexpr int kMaskWords = kTile / 32;
  extern __shared__ __align__(16) unsigned char smem[];
  const int slots = layout.slots();
  const int ring = kTokensPerWarp * slots;  // words of one tile in a warp's ring
  unsigned char* stage = smem;              // [2][kTile][kRowBytes]
  std::uint32_t* words = reinterpret_cast<std::uint32_t*>(smem + 2 * kTile * kRowBytes);  // [kWarps][3][ring]
  std::uint32_t* mask = words + kWarps * 3 * ring;                                        // [3][kMaskWords]

  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int tiles = static_cast<int>(layout.tiles(k_cols));
  const std::uint32_t cap = static_cast<std::uint32_t>(layout.capacity());
  const std::int64_t pw = layout.packed_width(k_cols);
  const std::int64_t c0 = static_cast<std::int64_t>(blockIdx.x) * kSlice;
  const std::int64_t row0 = static_cast<std::int64_t>(blockIdx.y) * kBlockTokens + warp;  // token j: row0 + 16 j
  std::uint32_t* my_words = words + warp * 3 * ring;

  // Lane (j, h) = (lane & 15, lane >> 4) reads token j's count and entry h in mark and the walk.
  const int j_mine = lane & 15;
  const int h_mine = lane >> 4;
  const std::int64_t my_row = row0 + kWarps * j_mine;
  const unsigned live = __ballot_sync(kFull, lane < 16 && my_row < rows && (shadow == nullptr || shadow[my_row] < 0));

  // Count of token j_mine in tile u, read from global memory one iteration before its words are
  // staged (0 for rows the kernel must not touch).
  const bool on_mine = (live >> j_mine) & 1u;
  const std::uint32_t* my_counts = packed + (on_mine ? my_row * pw : 0);
  auto load_count = [&](int u) -> std::uint32_t {
    return on_mine && u < tiles ? min(__ldg(my_counts + static_cast<std::int64_t>(u) * slots), cap) : 0u;
  };

  // Copies the warp's slot words of tile u into ring slot u % 3, given lane j's count `count`:
  // lane copies chunks lane, lane + 32, ... of the 16 x S / 4 chunks, but only those holding slot
  // 0 or one of the token's entries (chunk k holds slots 4k..4k+3), so a light token costs one
  // 32-byte sector as before; rows the kernel must not touch read as zero counts. Chunks left
  // uncopied are stale and never read: every reader stops at the count.
  const int chunk_shift = __ffs(slots >> 2) - 1;  // log2 of the chunks per token
  const int chunks = kTokensPerWarp << chunk_shift;
  auto stage_words = [&](int u, std::uint32_t count) {
    if (u >= tiles) return;
    std::uint32_t* dst = my_words + (u % 3) * ring;
    for (int q0 = 0; q0 < chunks; q0 += 32) {
      const int q = q0 + lane;
      const int j = min(q, chunks - 1) >> chunk_shift;
      const std::uint32_t n = __shfl_sync(kFull, count, j);
      const int k = q - (j << chunk_shift);
      if (q < chunks && (k == 0 || static_cast<std::uint32_t>(4 * k) <= n)) {
        const bool on = (live >> j) & 1u;
        const std::uint32_t* src =
            on ? packed + (row0 + kWarps * j) * pw + static_cast<std::int64_t>(u) * slots + 4 * k : packed;
        cp_async16_zfill(dst + staged_slot(j, 4 * k, slots), src, on ? 16u : 0u);
      }
    }
  };

  // Marks the rows of tile t that the warp's tokens use (its slot words staged and visible).
  auto mark = [&](int t) {
    if (t >= tiles) return;
    const std::uint32_t* w = my_words + (t % 3) * ring;
    std::uint32_t* m = mask + (t % 3) * kMaskWords;
    const std::uint32_t tile_cols = static_cast<std::uint32_t>(layout.tile_cols(t, k_cols));
    const std::uint32_t cnt = min(w[staged_slot(j_mine, 0, slots)], cap);
    if (h_mine < static_cast<int>(cnt)) {
      const std::uint32_t col = TwellLayout::slot_column(w[staged_slot(j_mine, 1 + h_mine, slots)]);
      if (col < tile_cols) atomicOr(m + (col >> 5), 1u << (col & 31));
    }
    unsigned heavy = __ballot_sync(kFull, lane < 16 && cnt > 2);
    while (heavy != 0) {
      const int j = __ffs(heavy) - 1;
      heavy &= heavy - 1;
      const std::uint32_t n = __shfl_sync(kFull, cnt, j);
      const std::uint32_t e = 2 + static_cast<std::uint32_t>(lane);  // n <= S - 1 <= 31: one pass
      if (e < n) {
        const std::uint32_t col = TwellLayout::slot_column(w[staged_slot(j, 1 + static_cast<int>(e), slots)]);
        if (col < tile_cols) atomicOr(m + (col >> 5), 1u << (col & 31));
      }
    }
  };

  // Stages the marked rows of B's slice of tile u into buffer u & 1.
  auto stage_tile = [&](int u) {
    unsigned char* dst = stage + (u & 1) * (kTile * kRowBytes);
    const std::uint32_t* m = mask + (u % 3) * kMaskWords;
    const int chunk = tid % kChunks;
    const T* src = b + layout.tile_begin(u) * ldb + c0 + chunk * (16 / sizeof(T));
#pragma unroll
    for (int r = tid / kChunks; r < kTile; r += kRowsPerPass) {
      if ((m[r >> 5] >> (r & 31)) & 1u) cp_async16(dst + r * kRowBytes + chunk * 16, src + r * ldb);
    }
  };

  float acc[kTokensPerWarp][4];
#pragma unroll
  for (int j = 0; j < kTokensPerWarp; ++j)
#pragma unroll
    for (int u = 0; u < 4; ++u) acc[j][u] = 0.0f;

  for (int i = tid; i < 3 * kMaskWords; i += kThreads) mask[i] = 0;
  stage_words(0, load_count(0));
  stage_words(1, load_count(1));
  std::uint32_t count_next = load_count(2);  // tile t + 2's, staged at the top of iteration t
  cp_async_commit();
  cp_async_wait_all();
  __syncthreads();  // masks zeroed, slot words of tiles 0 and 1 visible
  mark(0);
  mark(1);
  __syncthreads();
  stage_tile(0);
  cp_async_commit();

  for (int t = 0; t < tiles; ++t) {
    // After the barrier: tile t's B rows and slot words are staged, the mask of tile t + 1 is
    // complete, and every warp is done with tile t - 1, whose buffers and ring slots are reused.
    cp_async_wait_all();
    __syncthreads();
    if (tid < kMaskWords) mask[(t % 3) * kMaskWords + tid] = 0;  // next built for tile t + 3
    stage_words(t + 2, count_next);                              // ring slot of tile t - 1
    cp_async_commit();
    count_next = load_count(t + 3);  // in flight during the walk
    if (t + 1 < tiles) stage_tile(t + 1);
    cp_async_commit();

    const unsigned char* buf = stage + (t & 1) * (kTile * kRowBytes);
    const std::uint32_t* w = my_words + (t % 3) * ring;
    const std::uint32_t tile_cols = static_cast<std::uint32_t>(layout.tile_cols(t, k_cols));
    const std::uint32_t cnt = min(w[staged_slot(j_mine, 0, slots)], cap);
    const std::uint32_t word = w[staged_slot(j_mine, 1 + h_mine, slots)];
#pragma unroll
    for (int j = 0; j < kTokensPerWarp; ++j) {
      const std::uint32_t n = __shfl_sync(kFull, cnt, j);
      if (n == 0) continue;
      const std::uint32_t e0 = __shfl_sync(kFull, word, j);
      const std::uint32_t e1 = __shfl_sync(kFull, word, j + 16);
      add_entry<T>(e0, tile_cols, buf, lane, acc[j]);
      if (n > 1) add_entry<T>(e1, tile_cols, buf, lane, acc[j]);
      if (n > 2) {  // entries past the second: n - 2 <= 29, one per lane
        const std::uint32_t e_lane = 2 + static_cast<std::uint32_t>(lane);
        const std::uint32_t extra = e_lane < n ? w[staged_slot(j, 1 + static_cast<int>(e_lane), slots)] : 0xffffu;
        for (std::uint32_t e = 0; e < n - 2; ++e) add_entry<T>(__shfl_sync(kFull, extra, e), tile_cols, buf, lane, acc[j]);
      }
    }

    cp_async_wait_prior();  // this warp's slot words of tile t + 2
    __syncwarp();
    mark(t + 2);
  }

  store_tokens<T>(acc, rows, row0, shadow, c, ldc, c0, lane, alpha, beta);
}

bool aligned16(const void* p) { return reinterpret_cast<std::uintptr_t>(p) % 16 == 0; }

constexpr int shared_bytes(int tile, int staged_slots) {
  return 2 * tile * kRowBytes + 3 * (tile / 32) * static_cast<int>(sizeof(std::uint32_t)) +
         kWarps * 3 * kTokensPerWarp * staged_slots * static_cast<int>(sizeof(std::uint32_t));
}

// Whether the staged kernel takes A (given spmm_tiled_applies) on the current device.
template <class T>
bool staged_applies(TwellView<const T> a) {
  const int s = a.layout.slots();
  if (s < 4 || s > kMaxStagedSlots || (s & (s - 1)) != 0 || !aligned16(a.packed)) return false;
  int device = 0;
  int limit = 0;
  check_cuda(cudaGetDevice(&device), "twell::cuda::spmm (cudaGetDevice)");
  check_cuda(cudaDeviceGetAttribute(&limit, cudaDevAttrMaxSharedMemoryPerBlockOptin, device),
             "twell::cuda::spmm (cudaDeviceGetAttribute, shared memory per block)");
  return shared_bytes(a.layout.tile, s) <= limit;
}

template <class T, int kTile>
void launch(TwellView<const T> a, const std::int32_t* shadow, DenseView<const T> b, DenseView<T> c, float alpha,
            float beta, cudaStream_t stream) {
  const std::int64_t row_blocks = (a.rows + kBlockTokens - 1) / kBlockTokens;
  const std::int64_t slices = b.cols / kSlice;
  require(row_blocks <= 65535, ErrorCode::unsupported, kWhere, "A has ", a.rows,
          " rows; the tiled TwELL kernel takes at most ", 65535LL * kBlockTokens, " per call");
  require(slices <= 0x7fffffffLL, ErrorCode::unsupported, kWhere, "B has too many columns: ", b.cols);
  require(a.layout.tiles(a.cols) <= 0x7fffffffLL, ErrorCode::unsupported, kWhere,
          "A has too many tiles: ", a.layout.tiles(a.cols));
  const bool staged = staged_applies(a);
  const int shared = shared_bytes(kTile, staged ? a.layout.slots() : 0);
  auto kernel = staged ? tiled_spmm_staged_kernel<T, kTile> : tiled_spmm_kernel<T, kTile>;
  check_cuda(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, shared),
             "twell::cuda::spmm (cudaFuncSetAttribute, tiled TwELL kernel)");
  const dim3 grid(static_cast<unsigned>(slices), static_cast<unsigned>(row_blocks));
  kernel<<<grid, kThreads, shared, stream>>>(a.rows, a.cols, a.layout, a.packed, shadow, b.data, b.ld, c.data, c.ld,
                                             alpha, beta);
  check_launch("twell::cuda::spmm (tiled TwELL kernel)");
}

}  // namespace

template <class T>
bool spmm_tiled_applies(TwellView<const T> a, DenseView<const T> b, DenseView<T> c) {
  if constexpr (sizeof(T) != 2) {
    return false;
  } else {
    return a.rows > 0 && a.cols > 0 && b.cols > 0 && (a.layout.tile == 256 || a.layout.tile == 128) &&
           b.cols % kSlice == 0 && aligned16(b.data) && aligned16(c.data) && b.ld % 8 == 0 && c.ld % 8 == 0;
  }
}

template <class T>
void spmm_twell_tiled(TwellView<const T> a, const std::int32_t* shadow, DenseView<const T> b, DenseView<T> c,
                      float alpha, float beta, cudaStream_t stream) {
  require(spmm_tiled_applies(a, b, c), ErrorCode::invalid_argument, kWhere,
          "the tiled TwELL kernel was called on operands it does not take");
  if constexpr (sizeof(T) == 2) {
    if (a.layout.tile == 256) {
      launch<T, 256>(a, shadow, b, c, alpha, beta, stream);
    } else {
      launch<T, 128>(a, shadow, b, c, alpha, beta, stream);
    }
  }
}

#define TWELL_INSTANTIATE(T)                                                                                          \
  template bool spmm_tiled_applies<T>(TwellView<const T>, DenseView<const T>, DenseView<T>);                          \
  template void spmm_twell_tiled<T>(TwellView<const T>, const std::int32_t*, DenseView<const T>, DenseView<T>, float, \
                                    float, cudaStream_t);
TWELL_INSTANTIATE(bf16)
TWELL_INSTANTIATE(fp16)
TWELL_INSTANTIATE(float)
#undef TWELL_INSTANTIATE

}  // namespace twell::cuda::detail
