// cuda spmm, TwELL (and the TwELL part of a Hybrid) with op none: the weight-reuse path.
// spmm.cu selects it when spmm_compact_applies holds and keeps its pair-balanced kernel as the
// generic fallback. Two kernels on one stream, report path "compact_weight_reuse":
//   compact_kernel      regroups A's slot words once per call into per-(row block, tile, warp)
//                       entry lists with packed per-token counts, and the per-(row block, tile)
//                       mask of B rows the block touches;
//   compact_spmm_kernel walks those lists with B's tile staged in shared memory.
// Deterministic: each output element is summed by one thread, tiles in order, entries in column
// order within a (row, tile).
#include <algorithm>
#include <cstdint>
#include <type_traits>

#include <twell/error.hpp>
#include <twell/types.hpp>

#include "sparse_common.cuh"
#include "spmm_compact.cuh"

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
constexpr int kMaskStride = 8;                         // mask words per (row block, tile): 256 bits
constexpr unsigned kFull = 0xffffffffu;

__device__ __forceinline__ void cp_async16(void* dst, const void* src) {
  const unsigned s = static_cast<unsigned>(__cvta_generic_to_shared(dst));
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(s), "l"(src) : "memory");
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::: "memory"); }
__device__ __forceinline__ void cp_async_wait_all() { asm volatile("cp.async.wait_group 0;\n" ::: "memory"); }

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

// The pre-pass's output inside the caller's workspace, for `blocks` row blocks of 256 tokens.
// A warp-tile is (row block, tile, warp); its index is (block * tiles + t) * kWarps + warp, and
// warp w of a block owns the tokens w, w + 16, ..., w + 240 (token j: row block * 256 + w + 16 j).
struct Compact {
  uint4* counts;         // [warp-tiles]: byte j = entries of token j in the tile (0: not computed)
  std::uint32_t* masks;  // [blocks * tiles][kMaskStride]: bit r = some token of the block uses B row r
  std::uint32_t* words;  // [warp-tiles][16 * capacity]: the slot words, token after token
};

Compact carve(void* workspace, std::int64_t blocks, std::int64_t tiles) {
  auto* base = static_cast<unsigned char*>(workspace);
  const std::int64_t warp_tiles = blocks * tiles * kWarps;
  Compact out;
  out.counts = reinterpret_cast<uint4*>(base);
  out.masks = reinterpret_cast<std::uint32_t*>(base + warp_tiles * sizeof(uint4));
  out.words = out.masks + blocks * tiles * kMaskStride;
  return out;
}

// Pre-pass. A CTA (16 warps) owns one (row block, tile); warp w its warp-tile, lane j < 16 token
// j's count (clipped to capacity; 0 for rows >= M and Hybrid shadow rows, which the overflow path
// computes). The warp writes the counts as 16 bytes, copies each token's slot words verbatim
// (value and tile-local column) to consecutive positions of its list (lanes over a token's
// entries, tokens in order), and ORs every in-tile column into the block's shared mask. A word
// whose column lies outside the tile (only a malformed A has one) becomes value 0, column kTile:
// the product kernel's always-zero row, so the walk needs no bounds check.
// Cost: reads each (row, tile)'s count sector and its entries, writes nnz words and 20 bytes per
// warp-tile: 0.026 ms measured at the paper shape (H200), bound by its 16 dependent entry loads
// per warp. Preconditions: those of compact_spmm_kernel.
template <int kTile>
__global__ void __launch_bounds__(kThreads)
    compact_kernel(std::int64_t rows, std::int64_t k_cols, TwellLayout layout, const std::uint32_t* __restrict__ packed,
                   const std::int32_t* __restrict__ shadow, Compact out) {
  constexpr int kMaskWords = kTile / 32;
  __shared__ std::uint32_t mask[kMaskWords];
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int t = blockIdx.x;
  const std::int64_t tiles = gridDim.x;
  const std::int64_t block = blockIdx.y;
  if (tid < kMaskWords) mask[tid] = 0;
  __syncthreads();

  const int slots = layout.slots();
  const std::uint32_t cap = static_cast<std::uint32_t>(layout.capacity());
  const std::int64_t pw = layout.packed_width(k_cols);
  const std::uint32_t tile_cols = static_cast<std::uint32_t>(layout.tile_cols(t, k_cols));
  const std::int64_t warp_tile = (block * tiles + t) * kWarps + warp;
  const std::int64_t row0 = block * kBlockTokens + warp;

  const std::int64_t my_row = row0 + kWarps * (lane & 15);
  const bool live = lane < 16 && my_row < rows && (shadow == nullptr || shadow[my_row] < 0);
  const std::uint32_t n = live ? min(__ldg(packed + my_row * pw + static_cast<std::int64_t>(t) * slots), cap) : 0u;
  std::uint32_t incl = n;
#pragma unroll
  for (int d = 1; d < 16; d <<= 1) {
    const std::uint32_t x = __shfl_up_sync(kFull, incl, d);
    if (lane >= d) incl += x;
  }
  const std::uint32_t excl = incl - n;
  std::uint32_t packed_counts = n << (8 * (lane & 3));
  packed_counts |= __shfl_xor_sync(kFull, packed_counts, 1);
  packed_counts |= __shfl_xor_sync(kFull, packed_counts, 2);
  const std::uint32_t c0 = __shfl_sync(kFull, packed_counts, 0), c1 = __shfl_sync(kFull, packed_counts, 4);
  const std::uint32_t c2 = __shfl_sync(kFull, packed_counts, 8), c3 = __shfl_sync(kFull, packed_counts, 12);
  if (lane == 0) out.counts[warp_tile] = make_uint4(c0, c1, c2, c3);

  std::uint32_t* dst = out.words + warp_tile * (kTokensPerWarp * static_cast<std::int64_t>(cap));
  for (int j = 0; j < kTokensPerWarp; ++j) {
    const std::uint32_t nj = __shfl_sync(kFull, n, j);
    const std::uint32_t ej = __shfl_sync(kFull, excl, j);
    const std::uint32_t* src = packed + (row0 + kWarps * j) * pw + static_cast<std::int64_t>(t) * slots + 1;
    for (std::uint32_t e = lane; e < nj; e += 32) {
      const std::uint32_t word = __ldg(src + e);
      const std::uint32_t col = TwellLayout::slot_column(word);
      if (col < tile_cols) {
        dst[ej + e] = word;
        atomicOr(mask + (col >> 5), 1u << (col & 31));
      } else {
        dst[ej + e] = kTile;  // a column outside the tile (malformed A) adds 0 * the zero row
      }
    }
  }
  __syncthreads();
  if (tid < kMaskWords) out.masks[(block * tiles + t) * kMaskStride + tid] = mask[tid];
}

// Benchmark: bench/suites/spmm.cpp (the down projection: A 16384 x 5632 Hybrid(256, 16) at 0.5 %,
// B 5632 x 2048, C 16384 x 2048).
// A CTA (16 warps) owns a row block of 256 tokens and one 128-column slice of B and C; warp w owns
// the tokens w, w + 16, ..., w + 240 (interleaved, so a run of heavy neighbours spreads over
// warps) and a lane 4 consecutive columns of the slice for all 16: acc[16][4] fp32 in registers.
// The CTA walks A's tiles in order. B's kTile x 128 slice of tile t + 1 is staged by cp.async
// (double-buffered, one barrier per tile), only the rows in the block's mask, plus one zero row
// per buffer that sentinel entries point at. A warp's work on tile t is its compact list: one
// 16-byte load of the 16 token counts and one coalesced load of the first 32 words, both issued a
// tile ahead (no dependent global loads on the walk); each entry then costs a shuffle, one
// conflict-free 8-byte shared load per lane (the warp reads one contiguous 256-byte row), 4
// unpacks and 4 FMAs, pipelined one entry ahead, with no branch per entry. Warp-tiles with more
// than 32 entries (dense tiles) read their words from L1/L2 instead of the shuffle.
// Cost model at the paper shape, 0.5 % uniform (462 k entries, ~20 per warp-tile): B from L2 =
// 64 row blocks x 16 slices x 22 tiles x 64 KB x 72 % rows touched (1 - e^(-256 * 28 / 5632)) =
// ~1.05 GB (~0.19 ms at ~5.5 TB/s of L2: the floor of this blocking; 512-row blocks would halve
// it but need a 64-column slice, i.e. twice the per-entry instructions); compact lists 16 x
// 1.9 MB = 30 MB; C 67 MB written once. Issue: ~24 instructions per entry and slice plus ~8 per
// (token, tile), ~0.25 G warp instructions: ~0.25 ms on 132 SMs at one per cycle and scheduler,
// but with 4 warps per scheduler (128 registers, 1 CTA of 16 warps per SM) the per-entry latency
// chain (shuffle -> shared load -> FMA) limits issue to ~0.6 per cycle, and the per-tile barrier
// waits for the warp with the most entries. Measured (H200, 2026-11-22, 0.5 % uniform,
// Hybrid(256, 16), M = 16384): this kernel 0.50 ms at 0.68 issues per cycle and scheduler, the
// pre-pass 0.026 ms, SpmmPlan::run 0.53 ms (the tiled kernel it replaced: 0.84 ms); cuSPARSE CSR
// 0.48 ms. The gap to the model is issue: ~0.36 G warp instructions were issued, ~1.4x the
// count above, and B's staging from L2 is the next floor; the way on is more rows per block
// (B traffic) with fewer instructions per entry (tensor cores on gathered B rows).
// Balance: a heavy token (p99 ~11, max ~37 entries per tile) adds its entries to one warp's walk
// of that tile, bounded by the capacity per tile.
// Preconditions (spmm_compact_applies): 16-bit T, layout.tile == kTile, B and C 16-byte aligned
// with ld multiples of 8, Nb a multiple of 128; `lists` written by compact_kernel for this A and
// shadow. Rows >= M and shadow rows are left untouched.
template <class T, int kTile>
__global__ void __launch_bounds__(kThreads, 1)
    compact_spmm_kernel(std::int64_t rows, std::int64_t k_cols, TwellLayout layout, Compact lists,
                        const std::int32_t* __restrict__ shadow, const T* __restrict__ b, std::int64_t ldb,
                        T* __restrict__ c, std::int64_t ldc, float alpha, float beta) {
  constexpr int kRowsPerGroup = kTile / 32;  // B rows a 16-thread group stages: one mask byte or nibble
  constexpr int kBufBytes = (kTile + 1) * kRowBytes;      // B rows of a tile, then one zero row
  extern __shared__ __align__(16) unsigned char stage[];  // [2][kTile + 1][kRowBytes]

  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int tiles = static_cast<int>(layout.tiles(k_cols));
  const std::int64_t block = blockIdx.y;
  const std::int64_t c0 = static_cast<std::int64_t>(blockIdx.x) * kSlice;
  const std::int64_t row0 = block * kBlockTokens + warp;  // token j: row0 + 16 j
  const std::int64_t list_words = kTokensPerWarp * static_cast<std::int64_t>(layout.capacity());
  const std::int64_t first_warp_tile = block * tiles * kWarps + warp;
  const std::uint32_t* block_masks = lists.masks + block * tiles * kMaskStride;

  // Staging: 16-thread group g copies 16-byte chunk `chunk` of B rows g * kRowsPerGroup + i.
  const int group = tid / kChunks, chunk = tid % kChunks;
  const int mask_word = group * kRowsPerGroup / 32, mask_shift = group * kRowsPerGroup % 32;
  auto load_mask = [&](int u) -> std::uint32_t {
    return u < tiles ? __ldg(block_masks + static_cast<std::int64_t>(u) * kMaskStride + mask_word) : 0u;
  };
  auto stage_tile = [&](int u, std::uint32_t mask) {
    unsigned char* dst = stage + (u & 1) * kBufBytes + chunk * 16;
    const int r0 = group * kRowsPerGroup;
    const T* src = b + (layout.tile_begin(u) + r0) * ldb + c0 + chunk * (16 / sizeof(T));
    const std::uint32_t bits = mask >> mask_shift;
#pragma unroll
    for (int i = 0; i < kRowsPerGroup; ++i)
      if ((bits >> i) & 1u) cp_async16(dst + (r0 + i) * kRowBytes, src + i * ldb);
  };
  // The warp's counts and first 32 list words of tile u (words past the list are never used).
  auto load_list = [&](int u, uint4& counts, std::uint32_t& words) {
    counts = make_uint4(0, 0, 0, 0);
    words = 0;
    if (u < tiles) {
      const std::int64_t wt = first_warp_tile + static_cast<std::int64_t>(u) * kWarps;
      counts = __ldg(lists.counts + wt);
      if (lane < list_words) words = __ldg(lists.words + wt * list_words + lane);
    }
  };

  float acc[kTokensPerWarp][4];
#pragma unroll
  for (int j = 0; j < kTokensPerWarp; ++j)
#pragma unroll
    for (int u = 0; u < 4; ++u) acc[j][u] = 0.0f;

  for (int i = tid; i < 2 * kRowBytes / 16; i += kThreads)
    *reinterpret_cast<uint4*>(stage + (i / kChunks) * kBufBytes + kTile * kRowBytes + (i % kChunks) * 16) =
        make_uint4(0, 0, 0, 0);
  stage_tile(0, load_mask(0));
  cp_async_commit();
  std::uint32_t mask_next = load_mask(1);
  uint4 counts;
  std::uint32_t words;
  load_list(0, counts, words);

  for (int t = 0; t < tiles; ++t) {
    uint4 counts_next;
    std::uint32_t words_next;
    load_list(t + 1, counts_next, words_next);           // in flight during the walk
    const std::uint32_t mask_after = load_mask(t + 2);  // staged at the top of the next iteration
    // After the barrier: tile t is staged and every warp is done with tile t - 1, whose buffer
    // the copy of tile t + 1 reuses.
    cp_async_wait_all();
    __syncthreads();
    if (t + 1 < tiles) stage_tile(t + 1, mask_next);
    cp_async_commit();

    const unsigned char* buf = stage + (t & 1) * kBufBytes + lane * 8;
    const std::uint32_t* list = lists.words + (first_warp_tile + static_cast<std::int64_t>(t) * kWarps) * list_words;
    const std::uint32_t count_words[4] = {counts.x, counts.y, counts.z, counts.w};
    const std::uint32_t total = __dp4a(counts.x, 0x01010101u, __dp4a(counts.y, 0x01010101u,
                                      __dp4a(counts.z, 0x01010101u, __dp4a(counts.w, 0x01010101u, 0u))));
    // Walks the tile's entries, software-pipelined across token boundaries: entry p + 1's shared
    // load and entry p + 2's word are in flight while entry p's FMAs run, so the load's address
    // is ready when it issues. Entry p's word comes from the lane-held first 32 (a shuffle) or,
    // for dense tiles, from the list in L1/L2; past the list it is value 0 at the zero row.
    auto walk = [&](auto dense) {
      auto fetch = [&](std::uint32_t p) -> std::uint32_t {
        if constexpr (decltype(dense)::value) {
          return p < total ? __ldg(list + p) : static_cast<std::uint32_t>(kTile);
        } else {
          const std::uint32_t w = __shfl_sync(kFull, words, p & 31u);
          return p < total ? w : static_cast<std::uint32_t>(kTile);
        }
      };
      auto load_b = [&](std::uint32_t w) {
        return *reinterpret_cast<const uint2*>(buf + TwellLayout::slot_column(w) * kRowBytes);
      };
      std::uint32_t pos = 0, word = fetch(0);
      uint2 bv = load_b(word);
      std::uint32_t word_next = fetch(1);
#pragma unroll
      for (int j = 0; j < kTokensPerWarp; ++j) {
        const std::uint32_t end = pos + ((count_words[j / 4] >> (8 * (j % 4))) & 0xffu);
#pragma unroll 1
        for (; pos < end; ++pos) {
          const float a = slot_value<T>(word);
          float b4[4];
          unpack4<T>(bv, b4);
          bv = load_b(word_next);
          word = word_next;
          word_next = fetch(pos + 2);
#pragma unroll
          for (int u = 0; u < 4; ++u) acc[j][u] = fmaf(a, b4[u], acc[j][u]);
        }
      }
    };
    if (total <= 32) {
      walk(std::false_type{});
    } else {
      walk(std::true_type{});
    }
    counts = counts_next;
    words = words_next;
    mask_next = mask_after;
  }

  store_tokens<T>(acc, rows, row0, shadow, c, ldc, c0, lane, alpha, beta);
}

bool aligned16(const void* p) { return reinterpret_cast<std::uintptr_t>(p) % 16 == 0; }

std::int64_t row_blocks(std::int64_t rows) { return (rows + kBlockTokens - 1) / kBlockTokens; }

constexpr int shared_bytes(int tile) { return 2 * (tile + 1) * kRowBytes; }

// Whether the current device grants the product kernel's shared memory (not every sm_80+ part
// has 128 KB per block).
bool shared_fits(int tile) {
  int device = 0, limit = 0;
  check_cuda(cudaGetDevice(&device), "twell::cuda::spmm (cudaGetDevice)");
  check_cuda(cudaDeviceGetAttribute(&limit, cudaDevAttrMaxSharedMemoryPerBlockOptin, device),
             "twell::cuda::spmm (cudaDeviceGetAttribute, shared memory per block)");
  return shared_bytes(tile) <= limit;
}

template <class T, int kTile>
void launch(TwellView<const T> a, const std::int32_t* shadow, DenseView<const T> b, DenseView<T> c, float alpha,
            float beta, void* workspace, cudaStream_t stream) {
  const std::int64_t blocks = row_blocks(a.rows);
  const std::int64_t tiles = a.layout.tiles(a.cols);
  const Compact lists = carve(workspace, blocks, tiles);
  compact_kernel<kTile><<<dim3(static_cast<unsigned>(tiles), static_cast<unsigned>(blocks)), kThreads, 0, stream>>>(
      a.rows, a.cols, a.layout, a.packed, shadow, lists);
  check_launch("twell::cuda::spmm (TwELL compaction pre-pass)");
  const int shared = shared_bytes(kTile);
  auto kernel = compact_spmm_kernel<T, kTile>;
  check_cuda(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, shared),
             "twell::cuda::spmm (cudaFuncSetAttribute, compact TwELL kernel)");
  const dim3 grid(static_cast<unsigned>(b.cols / kSlice), static_cast<unsigned>(blocks));
  kernel<<<grid, kThreads, shared, stream>>>(a.rows, a.cols, a.layout, lists, shadow, b.data, b.ld, c.data, c.ld,
                                             alpha, beta);
  check_launch("twell::cuda::spmm (compact TwELL kernel)");
}

}  // namespace

template <class T>
bool spmm_compact_applies(TwellView<const T> a, DenseView<const T> b, DenseView<T> c) {
  if constexpr (sizeof(T) != 2) {
    return false;
  } else {
    return a.rows > 0 && a.cols > 0 && b.cols > 0 && (a.layout.tile == 256 || a.layout.tile == 128) &&
           b.cols % kSlice == 0 && b.cols / kSlice <= 0x7fffffffLL && row_blocks(a.rows) <= 65535 &&
           aligned16(b.data) && aligned16(c.data) && b.ld % 8 == 0 && c.ld % 8 == 0 && shared_fits(a.layout.tile);
  }
}

std::size_t spmm_compact_workspace_bytes(std::int64_t rows, std::int64_t cols, TwellLayout layout) {
  const std::int64_t blocks = row_blocks(rows), tiles = layout.tiles(cols);
  const std::int64_t warp_tiles = blocks * tiles * kWarps;
  return static_cast<std::size_t>(warp_tiles) * sizeof(uint4) +
         static_cast<std::size_t>(blocks * tiles * kMaskStride) * sizeof(std::uint32_t) +
         static_cast<std::size_t>(warp_tiles * kTokensPerWarp * layout.capacity()) * sizeof(std::uint32_t);
}

template <class T>
void spmm_twell_compact(TwellView<const T> a, const std::int32_t* shadow, DenseView<const T> b, DenseView<T> c,
                        float alpha, float beta, void* workspace, cudaStream_t stream) {
  require(spmm_compact_applies(a, b, c), ErrorCode::invalid_argument, kWhere,
          "the compact TwELL kernel was called on operands it does not take");
  require(workspace != nullptr && aligned16(workspace), ErrorCode::invalid_argument, kWhere,
          "the compact TwELL kernel needs a 16-byte aligned workspace");
  if constexpr (sizeof(T) == 2) {
    if (a.layout.tile == 256) {
      launch<T, 256>(a, shadow, b, c, alpha, beta, workspace, stream);
    } else {
      launch<T, 128>(a, shadow, b, c, alpha, beta, workspace, stream);
    }
  }
}

#define TWELL_INSTANTIATE(T)                                                                              \
  template bool spmm_compact_applies<T>(TwellView<const T>, DenseView<const T>, DenseView<T>);            \
  template void spmm_twell_compact<T>(TwellView<const T>, const std::int32_t*, DenseView<const T>,        \
                                      DenseView<T>, float, float, void*, cudaStream_t);
TWELL_INSTANTIATE(bf16)
TWELL_INSTANTIATE(fp16)
TWELL_INSTANTIATE(float)
#undef TWELL_INSTANTIATE

}  // namespace twell::cuda::detail
