// cuda spmm, TwELL (and the TwELL part of a Hybrid) with op none and 16-bit values: the
// tile-streaming path, report path "tile_stream". spmm.cu chooses it for mid-sized products
// (choose_twell_path) or when SpmmAlgorithm::tile_stream asks for it, and for products on A^T
// (up to three in one launch; two value planes of one structure times one B as one product of
// 128-row CTAs, below "Two planes").
//
// Why this shape. At 0.5 % density a row of A has ~28 entries spread over all of K, so rows share
// few B rows and gathering a B row per entry moves nnz x Nb x 2 bytes (1.9 GB at the paper's down
// projection) through L2. Here a CTA owns a block of kRows = 256 rows and kCols = 128 columns of C,
// held in fp32 registers (a warp owns 16 rows, dealt by entries where rows are uneven: deal_rows; a
// lane 4 columns of each), and walks A's column tiles in order: for tile t it stages B(tile t's
// rows, its columns), every row of the tile whether used or not, and the first 32 bytes of each of
// its rows' (row, t) slot groups, three stages deep (by TMA where this build's sm_90a code runs, by
// cp.async otherwise; stream_cta). B then crosses L2 once per row block, (M / 256) x K x Nb x 2
// bytes, and A's slot heads once per column slice; there is no pre-pass and no workspace. An entry
// costs its warp one conflict-free shared load of 256 bytes (all lanes read one B row) and 4 FMAs
// per lane. A row's entries of a tile past the first 3 (TMA staging) or 7 (cp.async) are read from
// global memory (stream_cta says why).
//
// Where it stands. Its time is the instructions per entry (~14 per warp, for 4 FMAs per lane),
// per (row, tile) visit and per staged copy, not bytes: Nsight Compute at M = 4096 (H100,
// 2026-11-25, the cp.async form before the TMA form existed): 105 us, 62.6 M warp
// instructions, issue 62 % busy (115 us and 69.6 M before the staging loop was unrolled with
// fixed strides); L2 ~30 % busy. The slice-reuse kernel spends fewer instructions per entry
// but pays a pre-pass of ~70 us, so this path takes the smaller products (choose_twell_path in
// spmm.cu). A tensor-core product (mma.sync over entries dealt into groups of 8) was tried and
// lost to latency: docs/benchmarks/history.md, "Why each miss".
//
// Two planes. Where two products have A of one slot structure (SlotStructure::shared) and one B,
// a CTA owns 128 rows and both planes' accumulators (a warp 8 rows x 2 planes), staging each
// row's heads of both planes and loading each entry's B row once for the two; each plane's sums
// run in the one-plane order, so each C has the bits of the unpaired launch.
//
// Determinism: each output element is summed by one lane, tiles in order and a tile's entries in
// slot order; no atomics. The result does not depend on the grid.
#include <algorithm>
#include <array>
#include <climits>
#include <cstdint>

#include <twell/error.hpp>
#include <twell/types.hpp>

#include "cp_async.cuh"
#include "cuda_check.hpp"
#include "cuda_launch.cuh"
#include "mbarrier.cuh"
#include "sm90_support.cuh"
#include "sparse_common.cuh"
#include "spmm_stream.cuh"
#include "vec16.cuh"

namespace twell::cuda::detail {
namespace {

constexpr const char* kWhere = "twell::cuda::spmm";
constexpr unsigned kFull = 0xffffffffu;

constexpr int kWarps = 16;
constexpr int kThreads = 32 * kWarps;
constexpr int kStages = 3;
constexpr int kMaxTile = 256;                  // B rows of a stage: one tile of A's columns
constexpr int kZeroRow = kMaxTile;             // a zero row that columns outside the tile read
constexpr int kHeadSlots = 8;                  // staged slots of a (row, tile) group: the count and 7 entries
constexpr std::uint32_t kZeroWord = kZeroRow;  // an entry of value 0 in the zero row: adds nothing

// The CTA's block of C: kRowsPerWarp rows per warp, kColsPerLane columns per lane. Measured on an
// H100 (2026-11-25, paper shape, 0.5 %, M = 4096, before the staging change below): 115 us at
// 16 x 4 against 188 us at 32 x 2, whose
// B traffic is half but whose warps pay the per-entry instructions for half the columns.
// With two value planes of one structure (dual products: two A of one slot structure times one
// B) a warp owns half the rows, each with two sets of accumulators.
constexpr int kRowValues = 16;  // rows x planes per warp
constexpr int kColsPerLane = 4;
constexpr int kRowHeads = kWarps * kRowValues;  // staged slot heads per CTA (rows x planes)
constexpr int kCols = 32 * kColsPerLane;        // columns of B and C per CTA
constexpr int kRowBytes = 2 * kCols;            // one staged row of B
constexpr int kChunksPerRow = kRowBytes / 16;
constexpr int kBBytes = (kMaxTile + 1) * kRowBytes;
constexpr int kHeadBytes = kRowHeads * kHeadSlots * 4;  // a stage's slot heads
constexpr int kHeadChunks = kHeadBytes / 16;            // their 16-byte copies
constexpr int kStageBytes = kBBytes + kHeadBytes;
// On sm_90a each stage also has an mbarrier its TMA copies complete on and a count of the warps
// done with it.
constexpr int kStageAlign = 128;  // what TMA copies into shared memory need
// After the stages and their mbarriers and counts: each of the CTA's rows' entries and the order
// in which the warps walk them (deal_rows), for kRowHeads rows at most.
constexpr int kDealOffset = kStages * kStageBytes + (kStages * (8 + 4) + 15) / 16 * 16;
constexpr int kSmemBytes = kStageAlign + kDealOffset + kRowHeads * (4 + 2);
static_assert(kDealOffset % 16 == 0, "deal_rows reads the entries as 16-byte vectors");
static_assert(kHeadChunks % kThreads == 0 && kThreads % kChunksPerRow == 0 && kBBytes % kStageAlign == 0 &&
              kStageBytes % kStageAlign == 0 && kColsPerLane == 4);
template <int kPlanes>
constexpr int kRowsPerWarp = kRowValues / kPlanes;
template <int kPlanes>
constexpr int kRows = kWarps* kRowsPerWarp<kPlanes>;  // rows of A and C per CTA

template <class T>
__device__ __forceinline__ float2 unpack_pair(std::uint32_t w) {
  return make_float2(bits_to_f<T>(w & 0xffffu), bits_to_f<T>(w >> 16));
}
template <class T>
__device__ __forceinline__ std::uint32_t pack_pair(float lo, float hi) {
  return static_cast<std::uint32_t>(bits_of<T>(lo)) | static_cast<std::uint32_t>(bits_of<T>(hi)) << 16;
}

// acc[p] += value(words[p]) x the lane's 4 columns of B row column(words[0]) of the stage at
// b_lane (the lane's first column of staged row 0), for each plane p: the planes share the
// column, so one load of B serves all. Columns past the tile read the zero row.
template <class T, int kPlanes>
__device__ __forceinline__ void add_entry(const std::array<std::uint32_t, kPlanes>& words, const unsigned char* b_lane,
                                          float (&acc)[kPlanes][kColsPerLane]) {
  const std::uint32_t k = min(TwellLayout::slot_column(words[0]), static_cast<std::uint32_t>(kZeroRow));
  const uint2 w = *reinterpret_cast<const uint2*>(b_lane + k * kRowBytes);
  const float2 lo = unpack_pair<T>(w.x), hi = unpack_pair<T>(w.y);
#pragma unroll
  for (int p = 0; p < kPlanes; ++p) {
    const float a = twell_value<T>(words[p], static_cast<const T*>(nullptr), 0);
    acc[p][0] = fmaf(a, lo.x, acc[p][0]);
    acc[p][1] = fmaf(a, lo.y, acc[p][1]);
    acc[p][2] = fmaf(a, hi.x, acc[p][2]);
    acc[p][3] = fmaf(a, hi.y, acc[p][3]);
  }
}

// The products of one launch of spmm_twell_stream, product blockIdx.z; they share A's shape
// and layout and B's columns. A CTA of kPlanes planes reads entries first_plane + [0, kPlanes),
// which share entry first_plane's shadow and B (stream_cta).
template <class T>
struct StreamBatch {
  const std::uint32_t* packed[kMaxStreamBatch];
  const std::int32_t* shadow[kMaxStreamBatch];
  const T* b[kMaxStreamBatch];
  std::int64_t ldb[kMaxStreamBatch];
  T* c[kMaxStreamBatch];
  std::int64_t ldc[kMaxStreamBatch];
};

// The TMA copies' tensor maps of each batch entry (sm_90a): B in boxes of the
// tile's rows x kCols columns, and A's packed words in boxes of kRows<planes> rows x the 8 head
// slots. Unused (and not encoded) where the launch stages by cp.async.
struct StreamMaps {
  CUtensorMap b[kMaxStreamBatch];
  CUtensorMap heads[kMaxStreamBatch];
};

// Rows to warps. A warp walks kWarpRows rows of the CTA's block, and a stage is refilled only
// once every warp is done with it, so warps run at most kStages - 1 tiles apart and a warp whose
// rows hold more entries than its peers' holds them all back. On token-skewed rows (a few tokens
// with 10-30x the mean entries) a warp of consecutive rows drew such a share all through A: the
// stage waits took 26 % of the warps' stall samples, against 5 % on uniform rows (Nsight
// Compute, H200, docs/benchmarks/history.md, "Fifty-third session"). So the CTA counts each row's
// entries first (row_entries(row, part, parts): part `part` of `parts` of local row `row`'s
// count), ranks the rows by them (more first, ties in row order) and deals them to the warps
// in snake order: round j gives warp w the row of rank j kWarps + (j even ? w : kWarps - 1 - w).
// Returns the local row that this lane walks (lanes past kWarpRows: the warp's last one). Every
// thread of the CTA calls it. A row's sums keep their order (one lane, tiles and slots in
// order), so C's bits do not depend on the deal.
// Measured (H200, diagnostics/h200-2026-11-30zp-stream-deal.md): token-skewed products on A^T at
// M = 16384 0.84x the time, forced op-none products 0.90-0.93x, the training step 0.97x; but
// uniform rows lost 8-23 %, and 6-12 % even where a CTA found its warps even and kept the order
// (the counting pass, once per CTA at one CTA per SM, is not hidden). So only products whose rows
// are uneven (StreamProduct::uneven_rows: A, or the matrix it was transposed from, has overflow
// rows) take it, and only with TMA staging (kDealHere).
template <int kCtaRows, int kWarpRows, class RowEntries>
__device__ __forceinline__ int deal_rows(unsigned char* scratch, RowEntries row_entries) {
  constexpr int kParts = kThreads / kCtaRows;  // threads per row
  static_assert(kParts * kCtaRows == kThreads && kWarpRows * kWarps == kCtaRows && 32 % kParts == 0 &&
                kCtaRows <= kRowHeads);  // the scratch after kDealOffset holds kRowHeads rows
  auto* const entries = reinterpret_cast<unsigned*>(scratch);
  auto* const order = reinterpret_cast<std::uint16_t*>(scratch + kCtaRows * 4);
  const int tid = threadIdx.x, row = tid / kParts, part = tid % kParts;
  unsigned mine = row_entries(row, part, kParts);
#pragma unroll
  for (int o = 1; o < kParts; o <<= 1) mine += __shfl_xor_sync(kFull, mine, o);
  if (part == 0) entries[row] = mine;
  __syncthreads();
  // The row's rank, each of its threads counting the rows ahead of it in every kParts-th chunk
  // of 4 (adjacent chunks for adjacent threads: no bank conflict).
  const auto ahead = [&](unsigned e, int j) { return static_cast<unsigned>(e > mine || (e == mine && j < row)); };
  unsigned rank = 0;
  for (int q = part; q < kCtaRows / 4; q += kParts) {
    const uint4 e = reinterpret_cast<const uint4*>(entries)[q];
    rank += ahead(e.x, 4 * q) + ahead(e.y, 4 * q + 1) + ahead(e.z, 4 * q + 2) + ahead(e.w, 4 * q + 3);
  }
#pragma unroll
  for (int o = 1; o < kParts; o <<= 1) rank += __shfl_xor_sync(kFull, rank, o);
  if (part == 0) {
    const int round = static_cast<int>(rank) / kWarps, pos = static_cast<int>(rank) % kWarps;
    order[(round % 2 == 0 ? pos : kWarps - 1 - pos) * kWarpRows + round] = static_cast<std::uint16_t>(row);
  }
  __syncthreads();
  return order[(tid >> 5) * kWarpRows + min(tid & 31, kWarpRows - 1)];
}

// Preconditions (spmm_stream_applies): 16-bit T; A of at most INT_MAX rows, columns and slot words
// a row (TMA coordinates are 32-bit); layout.tile <= 256, slots() a multiple of 4 and at least 8,
// packed 16-byte aligned; B 16-byte aligned, ldb and nb multiples of 8; C 16-byte
// aligned, ldc a multiple of 8; dynamic shared memory of kSmemBytes; with two planes, both of one
// slot structure (counts and columns; plane 0's are read). Counts above capacity are clipped to
// capacity; a column outside the tile reads the zero row, so it adds nothing (NaN if its value is
// Inf or NaN: valid TwELL has no such entry); rows >= M and shadow rows (>= 0) are left untouched.
// A CTA of product z does what the same CTA of a launch of that product alone does, and a plane
// of a two-plane CTA sums its entries in the order a one-plane CTA does (same bits).
// The CTA (blockIdx.x, blockIdx.y) of the product whose planes are batch entries first_plane +
// [0, kPlanes); nothing for a row block past A.
//
// A stage holds the tile's B rows (kMaxTile + 1 of them, the last the zero row) and the CTA's slot
// heads, plane-major: plane p's rows, 32 bytes each. Two ways to fill the stages:
// - cp.async (kTma false): every thread copies its share, and a barrier per tile publishes them;
//   all warps then wait for the slowest each tile (14.6 % of the warps' stall samples in the
//   paired launch at M = 16384, H200, Nsight Compute).
// - TMA (kTma, sm_90a): one TMA box of B and one of heads per plane, completing on the stage's
//   mbarrier; the last warp done with a stage (a count in shared memory) issues its next tile's
//   boxes, so warps run up to kStages - 1 tiles apart and a tile's unequal work per warp evens
//   out over tiles.
// Warps that far apart run different parts of the unrolled walk over their rows, and the
// instruction cache did not hold them all: with TMA staging and 7 entries a row taken inline, a
// product of token-skewed rows took 1.26-1.40x as long as with cp.async, no-instruction stalls
// from 13 % to 45 % of the samples (docs/benchmarks/history.md, "Fiftieth session"). So the TMA
// walk takes 3 entries a row inline (75 -> 59 KB of sm_90a code in stream_kernel, 136 -> 105 KB
// in stream_pair_kernel) and the rest through the rolled loop: products then took 0.87-0.88 of
// the cp.async form's time on uniform rows and 0.98-1.01 on token-skewed ones, the training step
// 0.98-0.99 (H200, diagnostics/h200-2026-11-30zj-stream-short-walk.md). The cp.async form keeps
// 7: with 3 it took 1.11-1.14x as long.
template <class T, int kPlanes, bool kTma, bool kDeal>
__device__ __forceinline__ void stream_cta(std::int64_t rows, std::int64_t k_cols, TwellLayout layout,
                                           const StreamBatch<T>& batch, [[maybe_unused]] const StreamMaps& maps,
                                           unsigned first_plane, std::int64_t nb, float alpha, float beta) {
  extern __shared__ __align__(16) unsigned char smem_raw[];
  constexpr int kWarpRows = kRowsPerWarp<kPlanes>;
  constexpr int kCtaRows = kRows<kPlanes>;
  if (static_cast<std::int64_t>(blockIdx.x) * kCtaRows >= rows) return;
  // [kStages][B rows | slot heads], then (sm_90a) each stage's mbarrier and count of warps done.
  unsigned char* const smem = smem_raw + (kStageAlign - shared_address(smem_raw) % kStageAlign) % kStageAlign;
  const std::uint32_t* packed[kPlanes];
  T* c[kPlanes];
  std::int64_t ldc[kPlanes];
#pragma unroll
  for (int p = 0; p < kPlanes; ++p) {
    packed[p] = batch.packed[first_plane + p];
    c[p] = batch.c[first_plane + p];
    ldc[p] = batch.ldc[first_plane + p];
  }
  const std::int32_t* __restrict__ shadow = batch.shadow[first_plane];
  // A row whose C is this kernel's to write: inside A and not a shadow row.
  const auto row_is_live = [&](std::int64_t row) { return row < rows && (shadow == nullptr || shadow[row] < 0); };
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const std::int64_t row0 = static_cast<std::int64_t>(blockIdx.x) * kCtaRows;
  const std::int64_t col0 = static_cast<std::int64_t>(blockIdx.y) * kCols;
  const int tile = layout.tile, slots = layout.slots();
  const int tiles = static_cast<int>(layout.tiles(k_cols));
  const std::int64_t pw = layout.packed_width(k_cols);
  const auto cap = static_cast<std::uint32_t>(layout.capacity());

  // Staged rows at and past the tile width never receive a copy: zero them once in every stage.
  for (int s = 0; s < kStages; ++s) {
    auto* zero = reinterpret_cast<std::uint32_t*>(smem + s * kStageBytes + tile * kRowBytes);
    for (int i = tid; i < (kMaxTile + 1 - tile) * kRowBytes / 4; i += kThreads) zero[i] = 0;
  }

  auto* const full = reinterpret_cast<std::uint64_t*>(smem + kStages * kStageBytes);  // kTma only
  auto* const done = reinterpret_cast<unsigned*>(full + kStages);  // warps done with each stage, ever
  // cp.async: the slot heads this thread stages, fixed over the tiles: null for rows past M and
  // shadow rows, whose heads are zero-filled (count 0), so that the walk needs no mask (masked,
  // op-none products took 2-5 % longer: docs/benchmarks/history.md, "Fifty-first session"). Copy q
  // is plane q / (2 kCtaRows)'s row q / 2 % kCtaRows, half q % 2.
  constexpr int kHeadsPerThread = kHeadChunks / kThreads;
  const std::uint32_t* head_src[kHeadsPerThread];
#pragma unroll
  for (int j = 0; j < kHeadsPerThread; ++j) {
    const int q = tid + j * kThreads;
    const int plane = q / (2 * kCtaRows);
    const std::int64_t row = row0 + q / 2 % kCtaRows;
    const std::uint32_t* from = packed[0];
#pragma unroll
    for (int p = 1; p < kPlanes; ++p) from = plane == p ? packed[p] : from;
    head_src[j] = !kTma && row_is_live(row) ? from + row * pw + (q % 2) * 4 : nullptr;
  }

  // cp.async: the thread's 16-byte column chunk of the staged B rows is fixed; it copies every
  // kRowStep-th row from its first, `first_row`. The copies are unrolled over the largest tile
  // with the shared offsets as immediates and the source advanced by a fixed stride: a generic
  // loop spent ~21 instructions per copy on 64-bit addresses, about a fifth of the kernel's.
  constexpr int kRowStep = kThreads / kChunksPerRow;
  static_assert(kMaxTile % kRowStep == 0, "the unrolled copies cover the largest tile");
  const T* __restrict__ b = batch.b[first_plane];
  const std::int64_t ldb = batch.ldb[first_plane];
  const int chunk = tid % kChunksPerRow, first_row = tid / kChunksPerRow;
  const bool chunk_inside = col0 + chunk * 8 < nb;
  const T* b_chunk = b + (chunk_inside ? col0 + chunk * 8 : 0) + first_row * ldb;
  const auto row_step_bytes = static_cast<std::uintptr_t>(kRowStep * ldb * static_cast<std::int64_t>(sizeof(T)));
  const std::uint32_t smem_base = shared_address(smem);
  const std::uint32_t chunk_dst = smem_base + first_row * kRowBytes + chunk * 16;
  // Tile t into its stage: by TMA, one thread's boxes completing on the stage's mbarrier; by
  // cp.async, every thread's share.
  const auto stage_tile = [&](int t) {
    if constexpr (kTma) {
      const int s = t % kStages;
      unsigned char* const stage = smem + s * kStageBytes;
      mbar_expect_tx(&full[s], static_cast<std::uint32_t>(tile * kRowBytes + kHeadBytes));  // zeros included
      tma_load_2d(stage, &maps.b[first_plane], &full[s], static_cast<int>(col0),
                  static_cast<int>(layout.tile_begin(t)));
#pragma unroll
      for (int p = 0; p < kPlanes; ++p)
        tma_load_2d(stage + kBBytes + p * kCtaRows * kHeadSlots * 4, &maps.heads[first_plane + p], &full[s], t * slots,
                    static_cast<int>(row0));
    } else {
      const std::uint32_t dst = chunk_dst + (t % kStages) * kStageBytes;
      const int rows_left = layout.tile_cols(t, k_cols) - first_row;  // rows of this tile from first_row on
      // The address of row first_row + j * kRowStep as an integer: on the ragged last tile it runs
      // past B, and only copies inside the tile read it.
      auto src = reinterpret_cast<std::uintptr_t>(b_chunk + layout.tile_begin(t) * ldb);
#pragma unroll
      for (int j = 0; j < kMaxTile / kRowStep; ++j) {
        if (first_row + j * kRowStep >= tile) break;
        const bool inside = j * kRowStep < rows_left && chunk_inside;
        cp_async16_or_zero(dst + j * kRowStep * kRowBytes, inside ? reinterpret_cast<const void*>(src) : b, inside);
        src += row_step_bytes;
      }
      const std::uint32_t stage = smem_base + (t % kStages) * kStageBytes;
#pragma unroll
      for (int j = 0; j < kHeadsPerThread; ++j) {
        const std::uint32_t* src = head_src[j];
        cp_async16_or_zero(stage + kBBytes + (tid + j * kThreads) * 16,
                           src != nullptr ? src + static_cast<std::int64_t>(t) * slots : packed[0], src != nullptr);
      }
    }
  };
  if constexpr (kTma) {
    if (tid == 0) {
      for (int s = 0; s < kStages; ++s) {
        mbar_init(&full[s], 1);
        done[s] = 0;
      }
      mbar_init_fence();
    }
    __syncthreads();
    if (tid == 0)
      for (int t = 0; t < kStages && t < tiles; ++t) stage_tile(t);
  } else {
    for (int t = 0; t < kStages - 1; ++t) {
      if (t < tiles) stage_tile(t);
      cp_async_commit_group();
    }
  }

  // The warp's rows (deal_rows): lane r's is first + local[r] (below); live bit r says whether it
  // is C's to write (inside A and not a shadow row). TMA copies every row's heads, so its walk
  // takes the others' counts as 0, whatever their staged heads hold.
  const auto row_entries = [&](int local_row, int part, int parts) {
    const std::int64_t row = row0 + local_row;
    unsigned n = 0;
    if (!row_is_live(row)) return n;
    const std::uint32_t* counts = packed[0] + row * pw;
#pragma unroll 8
    for (int t = part; t < tiles; t += parts) n += min(counts[static_cast<std::int64_t>(t) * slots], cap);
    return n;
  };
  // The warp's row r is row `first` + (kDeal ? local[r] : r): without the deal the warp's first
  // row + r, with it the CTA's first row + the dealt row. (The undealt kernels spell out r, not
  // local[r] = r, so that their code stays what it was before the deal, SASS for SASS.)
  const std::int64_t first = row0 + (kDeal ? 0 : warp * kWarpRows);
  int my_local = lane;
  int local[kWarpRows];
#pragma unroll
  for (int r = 0; r < kWarpRows; ++r) local[r] = r;
  if constexpr (kDeal) {
    my_local = deal_rows<kCtaRows, kWarpRows>(smem + kDealOffset, row_entries);
#pragma unroll
    for (int r = 0; r < kWarpRows; ++r) local[r] = __shfl_sync(kFull, my_local, r);
  }
  const std::int64_t my_row = first + my_local;
  const unsigned live = __ballot_sync(kFull, lane < kWarpRows && row_is_live(my_row));
  // Slot offset of the lane's row's tile 0 (row first + local[lane]), for entries past those taken
  // inline.
  const std::int64_t lane_offset = my_row * pw;
  constexpr std::uint32_t kInlineEntries = kTma ? 3 : kHeadSlots - 1;  // of a row's entries of a tile
  float acc[kWarpRows][kPlanes][kColsPerLane] = {};
  for (int t = 0; t < tiles; ++t) {
    const int s = t % kStages;
    if constexpr (kTma) {
      mbar_wait(&full[s], static_cast<std::uint32_t>(t / kStages) & 1u);
    } else {
      // One barrier a tile: it publishes tile t's copies and says that every warp has left tile
      // t - 1's stage, which the copies of tile t + kStages - 1 then refill.
      cp_async_wait_groups<kStages - 2>();  // this thread's copies of tile t; tile t + 1's may fly
      __syncthreads();
      if (t + kStages - 1 < tiles) stage_tile(t + kStages - 1);
      cp_async_commit_group();
    }

    const unsigned char* stage = smem + s * kStageBytes;
    const unsigned char* b_lane = stage + lane * kColsPerLane * 2;
    // Row r's heads of plane p: 16-byte chunks 2 (p kCtaRows + first - row0 + local[r]) and the
    // next.
    const auto* heads = reinterpret_cast<const uint4*>(stage + kBBytes) + (kDeal ? 0 : 2 * warp * kWarpRows);
    const auto head_chunk = [&](int r, int p, int half) {
      return heads[2 * (p * kCtaRows + (kDeal ? local[r] : r)) + half];
    };
    // Row r's entry in word `member` (0..3) of each plane's 16-byte head chunk q, or the zero row's.
    const auto add_head = [&](const uint4(&q)[kPlanes], int member, bool present, int r) {
      std::array<std::uint32_t, kPlanes> words;
#pragma unroll
      for (int p = 0; p < kPlanes; ++p) {
        const uint4 v = q[p];
        words[p] = !present ? kZeroWord : member == 0 ? v.x : member == 1 ? v.y : member == 2 ? v.z : v.w;
      }
      add_entry<T, kPlanes>(words, b_lane, acc[r]);
    };
    // The next row's heads are loaded before this row's entries, and a row's first two entries
    // take no branch (a missing second entry reads the zero row), so that shared loads of
    // different entries overlap.
    uint4 h_next[kPlanes];
#pragma unroll
    for (int p = 0; p < kPlanes; ++p) h_next[p] = head_chunk(0, p, 0);
#pragma unroll
    for (int r = 0; r < kWarpRows; ++r) {
      uint4 h[kPlanes];
#pragma unroll
      for (int p = 0; p < kPlanes; ++p) {
        h[p] = h_next[p];
        if (r + 1 < kWarpRows) h_next[p] = head_chunk(r + 1, p, 0);
      }
      const std::uint32_t n = !kTma || (live >> r & 1u) != 0 ? min(h[0].x, cap) : 0u;
      if (n == 0) continue;
      add_head(h, 1, true, r);
      add_head(h, 2, n > 1, r);
      if (n <= 2) continue;
      add_head(h, 3, true, r);
      if (n <= 3) continue;
      if constexpr (kInlineEntries == kHeadSlots - 1) {
        uint4 g[kPlanes];
#pragma unroll
        for (int p = 0; p < kPlanes; ++p) g[p] = head_chunk(r, p, 1);
        add_head(g, 0, true, r);
        add_head(g, 1, n > 4, r);
        add_head(g, 2, n > 5, r);
        add_head(g, 3, n > 6, r);
        if (n <= 7) continue;
      }
      // The other slots from global memory, 32 at a time, one per lane. The group's offset comes
      // from lane r, so the compiler does not keep one per row in registers.
      const std::int64_t offset = __shfl_sync(kFull, lane_offset, r) + static_cast<std::int64_t>(t) * slots;
      for (std::uint32_t j0 = kInlineEntries + 1; j0 <= n; j0 += 32) {
        std::uint32_t mine[kPlanes];
#pragma unroll
        for (int p = 0; p < kPlanes; ++p) mine[p] = j0 + lane <= n ? packed[p][offset + j0 + lane] : 0u;
        const int m = static_cast<int>(min(32u, n + 1 - j0));
#pragma unroll 1
        for (int q = 0; q < m; ++q) {
          std::array<std::uint32_t, kPlanes> words;
#pragma unroll
          for (int p = 0; p < kPlanes; ++p) words[p] = __shfl_sync(kFull, mine[p], q);
          add_entry<T, kPlanes>(words, b_lane, acc[r]);
        }
      }
    }
    if constexpr (kTma) {
      // The last warp done with the stage refills it: its reads, and through the fences every
      // warp's, come before the TMA engine's writes.
      __syncwarp();
      if (lane == 0) {
        __threadfence_block();
        const unsigned before = atomicAdd(&done[s], 1u);
        if (before == kWarps * static_cast<unsigned>(t / kStages + 1) - 1 && t + kStages < tiles) {
          __threadfence_block();
          fence_proxy_async_shared();
          stage_tile(t + kStages);
        }
      }
    }
  }
  if constexpr (!kTma) cp_async_wait_groups<0>();

  const std::int64_t col = col0 + lane * kColsPerLane;
  if (col >= nb) return;  // nb is a multiple of 8: a lane's 4 columns are all inside or all out
#pragma unroll
  for (int p = 0; p < kPlanes; ++p) {
#pragma unroll
    for (int r = 0; r < kWarpRows; ++r) {
      if ((live >> r & 1u) == 0) continue;
      auto* out = reinterpret_cast<uint2*>(c[p] + (first + (kDeal ? local[r] : r)) * ldc[p] + col);
      float v[kColsPerLane];
#pragma unroll
      for (int u = 0; u < kColsPerLane; ++u) v[u] = alpha * acc[r][p][u];
      if (beta != 0.0f) {
        const uint2 old = *out;
        const float2 lo = unpack_pair<T>(old.x), hi = unpack_pair<T>(old.y);
        v[0] += beta * lo.x;
        v[1] += beta * lo.y;
        v[2] += beta * hi.x;
        v[3] += beta * hi.y;
      }
      *out = make_uint2(pack_pair<T>(v[0], v[1]), pack_pair<T>(v[2], v[3]));
    }
  }
}

// Where this build's sm_90a code runs, the stages fill by TMA (stream_cta).
constexpr bool kTmaStaging = TWELL_SM90A_DEVICE != 0;
// The deal (deal_rows) was measured with TMA staging only, and the cp.async form's paired kernel
// spills with it (sm_80, 28 bytes): the host asks for it only where TMA stages, and elsewhere
// kDealHere leaves it out of the code.
template <bool kDeal>
constexpr bool kDealHere = kDeal&& kTmaStaging;

// Products blockIdx.z of one plane each; kDeal: deal_rows.
template <class T, bool kDeal>
__global__ void __launch_bounds__(kThreads, 1)
    stream_kernel(std::int64_t rows, std::int64_t k_cols, TwellLayout layout, StreamBatch<T> batch,
                  const __grid_constant__ StreamMaps maps, std::int64_t nb, float alpha, float beta) {
  ::twell::detail::wait_for_prior_grids();
  stream_cta<T, 1, kTmaStaging, kDealHere<kDeal>>(rows, k_cols, layout, batch, maps, blockIdx.z, nb, alpha, beta);
}

// Product 0 of one plane (blockIdx.z = 0) and products 1 and 2 as the two planes of one
// (blockIdx.z = 1): the training backward's dwd = h^T dy beside dg^T x and du^T x.
template <class T, bool kDeal>
__global__ void __launch_bounds__(kThreads, 1)
    stream_pair_kernel(std::int64_t rows, std::int64_t k_cols, TwellLayout layout, StreamBatch<T> batch,
                       const __grid_constant__ StreamMaps maps, std::int64_t nb, float alpha, float beta) {
  ::twell::detail::wait_for_prior_grids();
  if (blockIdx.z == 0) {
    stream_cta<T, 1, kTmaStaging, kDealHere<kDeal>>(rows, k_cols, layout, batch, maps, 0, nb, alpha, beta);
  } else {
    stream_cta<T, 2, kTmaStaging, kDealHere<kDeal>>(rows, k_cols, layout, batch, maps, 1, nb, alpha, beta);
  }
}

// The kernel's grid: a CTA per kRows<planes> rows of A (x) and kCols columns of B (y).
struct StreamGrid {
  std::int64_t row_blocks, slices;
};
StreamGrid stream_grid(std::int64_t rows, std::int64_t b_cols, int planes = 1) {
  const std::int64_t block = planes == 1 ? kRows<1> : kRows<2>;
  return {(rows + block - 1) / block, (b_cols + kCols - 1) / kCols};
}

}  // namespace

template <class T>
bool spmm_stream_applies(TwellView<const T> a, DenseView<const T> b, DenseView<T> c) {
  if constexpr (sizeof(T) != 2) {
    return false;
  } else {
    if (a.rows <= 0 || a.cols <= 0 || b.cols <= 0) return false;
    if (a.rows > INT_MAX || a.cols > INT_MAX || a.layout.packed_width(a.cols) > INT_MAX) return false;
    if (b.cols > spmm_stream_max_b_cols()) return false;  // the other kernels take more
    if (!tma_row_stride_ok(b.ld, 2)) return false;        // on every build: see spmm_stream.cuh
    const int slots = a.layout.slots();
    if (a.layout.tile > kMaxTile || slots < kHeadSlots || slots % 4 != 0 || !aligned16(a.packed)) return false;
    if (!vector_operands(b, c)) return false;
    // The four kernels share one body and its dynamic shared memory only.
    return kSmemBytes <= ::twell::detail::dynamic_shared_limit(stream_pair_kernel<T, true>,
                                                               "twell::cuda::spmm (shared memory per block)");
  }
}

int spmm_stream_shared_bytes() { return kSmemBytes; }

std::int64_t spmm_stream_max_b_cols() { return std::int64_t{65535} * kCols; }

std::int64_t spmm_stream_ctas(std::int64_t rows, std::int64_t b_cols) {
  const StreamGrid grid = stream_grid(rows, b_cols);
  return grid.row_blocks * grid.slices;
}

template <class T>
void spmm_twell_stream(std::span<const StreamProduct<T>> products, float alpha, float beta, cudaStream_t stream,
                       bool pair_last_two) {
  require(!products.empty() && products.size() <= kMaxStreamBatch, ErrorCode::invalid_argument, kWhere,
          "the tile-streaming TwELL kernel takes 1 to ", kMaxStreamBatch, " products at once, not ", products.size());
  require(!pair_last_two || (products.size() == 3 && products[1].b.data == products[2].b.data &&
                             products[1].b.ld == products[2].b.ld && products[1].shadow == products[2].shadow),
          ErrorCode::invalid_argument, kWhere,
          "the tile-streaming TwELL kernel pairs the last two of three products only where they share B and shadow");
  const StreamProduct<T>& first = products.front();
  StreamBatch<T> batch{};
  for (std::size_t i = 0; i < products.size(); ++i) {
    const StreamProduct<T>& p = products[i];
    require(spmm_stream_applies(p.a, p.b, p.c) && p.a.rows == first.a.rows && p.a.cols == first.a.cols &&
                p.a.layout == first.a.layout && p.b.cols == first.b.cols,
            ErrorCode::invalid_argument, kWhere,
            "the tile-streaming TwELL kernel was called on operands it does not take, or on products of different "
            "shapes");
    batch.packed[i] = p.a.packed;
    batch.shadow[i] = p.shadow;
    batch.b[i] = p.b.data;
    batch.ldb[i] = p.b.ld;
    batch.c[i] = p.c.data;
    batch.ldc[i] = p.c.ld;
  }
  const auto [row_blocks, slices] = stream_grid(first.a.rows, first.b.cols, pair_last_two ? 2 : 1);
  require(row_blocks <= 0x7fffffffLL && slices <= 65535, ErrorCode::unsupported, kWhere, "A has ", first.a.rows,
          " rows and B ", first.b.cols, " columns; the tile-streaming kernel takes at most ",
          0x7fffffffLL * (pair_last_two ? kRows<2> : kRows<1>), " and ", 65535LL * kCols);
  if constexpr (sizeof(T) == 2) {
    // Where the launch runs this build's sm_90a code, its stages fill by TMA (stream_cta).
    int device = 0;
    ::twell::detail::check_cuda(cudaGetDevice(&device), kWhere);
    const bool tma = device_runs_sm90a_code(device, kWhere);
    StreamMaps maps{};
    if (tma) {
      const std::int64_t pw = first.a.layout.packed_width(first.a.cols);
      for (std::size_t i = 0; i < products.size(); ++i) {
        const StreamProduct<T>& p = products[i];
        const int head_rows = pair_last_two && i > 0 ? kRows<2> : kRows<1>;
        if (!pair_last_two || i < 2)  // a paired launch's planes read their first plane's B (entry 1's)
          maps.b[i] = tensor_map_2d(tensor_map_type<T>(), p.b.data, p.b.rows, p.b.cols, p.b.ld * 2, kCols,
                                    p.a.layout.tile, CU_TENSOR_MAP_SWIZZLE_NONE, kWhere);
        maps.heads[i] = tensor_map_2d(CU_TENSOR_MAP_DATA_TYPE_UINT32, p.a.packed, p.a.rows, pw, pw * 4, kHeadSlots,
                                      head_rows, CU_TENSOR_MAP_SWIZZLE_NONE, kWhere);
      }
    }
    // The deal (deal_rows) only where a product's rows are uneven: it costs uniform rows 6-12 %.
    const bool deal = tma && std::ranges::any_of(products, [](const StreamProduct<T>& p) { return p.uneven_rows; });
    auto kernel = pair_last_two ? (deal ? stream_pair_kernel<T, true> : stream_pair_kernel<T, false>)
                                : (deal ? stream_kernel<T, true> : stream_kernel<T, false>);
    ::twell::detail::allow_dynamic_shared(kernel, kSmemBytes, "twell::cuda::spmm (cudaFuncSetAttribute)");
    const dim3 grid(static_cast<unsigned>(row_blocks), static_cast<unsigned>(slices),
                    static_cast<unsigned>(pair_last_two ? 2 : products.size()));
    ::twell::detail::launch_kernel("twell::cuda::spmm (tile-streaming kernel)", kernel, grid, kThreads, kSmemBytes,
                                   stream, first.a.rows, first.a.cols, first.a.layout, batch, maps, first.b.cols, alpha,
                                   beta);
  }
}

#define TWELL_INSTANTIATE(T)                                                                  \
  template bool spmm_stream_applies<T>(TwellView<const T>, DenseView<const T>, DenseView<T>); \
  template void spmm_twell_stream<T>(std::span<const StreamProduct<T>>, float, float, cudaStream_t, bool);
TWELL_INSTANTIATE(bf16)
TWELL_INSTANTIATE(fp16)
TWELL_INSTANTIATE(float)
#undef TWELL_INSTANTIATE

}  // namespace twell::cuda::detail
