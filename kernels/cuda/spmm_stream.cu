// cuda spmm, TwELL (and the TwELL part of a Hybrid) with op none and 16-bit values: the
// tile-streaming path, report path "tile_stream". spmm.cu chooses it for mid-sized products
// (choose_twell_path) or when SpmmAlgorithm::tile_stream asks for it.
//
// Why this shape. At 0.5 % density a row of A has ~28 entries spread over all of K, so rows share
// few B rows and gathering a B row per entry moves nnz x Nb x 2 bytes (1.9 GB at the paper's down
// projection) through L2. Here a CTA owns a block of kRows = 256 rows and kCols = 128 columns of
// C, held in fp32 registers (a warp owns 16 rows, a lane 4 columns of each), and walks A's column
// tiles in order: for tile t it stages B(tile t's rows, its columns), every row of the tile whether
// used or not, and the first 32 bytes of each of its rows' (row, t) slot groups, three stages deep
// with cp.async. B then crosses L2 once per row block, (M / 256) x K x Nb x 2 bytes, and A's slot
// heads once per column slice; there is no pre-pass and no workspace. An entry costs its warp one
// conflict-free shared load of 256 bytes (all lanes read one B row) and 4 FMAs per lane. Entries
// past the 7 a head holds (rare below ~2 % density) are read from global memory.
//
// Where it stands. Its time is the instructions per entry (~14 per warp, for 4 FMAs per lane),
// per (row, tile) visit and per staged copy, not bytes: Nsight Compute at M = 4096 (H100,
// 2026-11-25): 105 us, 62.6 M warp instructions, issue 62 % busy (115 us and 69.6 M before the
// staging loop was unrolled with fixed strides); L2 ~30 % busy. The slice-reuse kernel spends
// fewer instructions per entry but pays a pre-pass of ~70 us, so this path takes the smaller
// products (choose_twell_path in spmm.cu). A tensor-core product (mma.sync over entries dealt
// into groups of 8) was tried and lost to latency: docs/benchmarks/README.md, "Why each miss".
//
// Determinism: each output element is summed by one lane, tiles in order and a tile's entries in
// slot order; no atomics. The result does not depend on the grid.
#include <cstdint>

#include <twell/error.hpp>
#include <twell/types.hpp>

#include "cp_async.cuh"
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
constexpr int kRowsPerWarp = 16;
constexpr int kColsPerLane = 4;
constexpr int kRows = kWarps * kRowsPerWarp;  // rows of A and C per CTA
constexpr int kCols = 32 * kColsPerLane;      // columns of B and C per CTA
constexpr int kRowBytes = 2 * kCols;          // one staged row of B
constexpr int kChunksPerRow = kRowBytes / 16;
constexpr int kBBytes = (kMaxTile + 1) * kRowBytes;
constexpr int kHeadChunks = kRows * kHeadSlots * 4 / 16;  // 16-byte copies of a stage's heads
constexpr int kStageBytes = kBBytes + kRows * kHeadSlots * 4;
constexpr int kSmemBytes = kStages * kStageBytes;
static_assert(kHeadChunks % kThreads == 0 && kBBytes % 16 == 0 && kColsPerLane == 4);

template <class T>
__device__ __forceinline__ float2 unpack_pair(std::uint32_t w) {
  return make_float2(bits_to_f<T>(w & 0xffffu), bits_to_f<T>(w >> 16));
}
template <class T>
__device__ __forceinline__ std::uint32_t pack_pair(float lo, float hi) {
  return static_cast<std::uint32_t>(bits_of<T>(lo)) | static_cast<std::uint32_t>(bits_of<T>(hi)) << 16;
}

// *out = alpha * acc + beta * *out for a lane's 4 columns of C (*out not read when beta is 0).
template <class T>
__device__ __forceinline__ void store_scaled(uint2* out, const float (&acc)[kColsPerLane], float alpha, float beta) {
  float v[kColsPerLane];
#pragma unroll
  for (int u = 0; u < kColsPerLane; ++u) v[u] = alpha * acc[u];
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

// Copies blocks of at most kMaxTile consecutive rows of B's kCols columns from col0 into a stage,
// kRowBytes apart. A thread owns one 16-byte column chunk and copies every kRowStep-th row from
// its first; the copies are unrolled over the largest block with the shared offsets as immediates
// and the source advanced by a fixed stride (a generic loop spent ~21 instructions per copy on
// 64-bit addresses, about a fifth of the tile-streaming kernel's).
template <class T>
class BlockStager {
 public:
  __device__ BlockStager(const T* b, std::int64_t ldb, std::int64_t col0, std::int64_t nb, int tid)
      : b_(b), ldb_(ldb), first_row_(tid / kChunksPerRow) {
    const int chunk = tid % kChunksPerRow;
    chunk_inside_ = col0 + chunk * 8 < nb;
    b_chunk_ = b + (chunk_inside_ ? col0 + chunk * 8 : 0) + first_row_ * ldb;
    row_step_bytes_ = static_cast<std::uintptr_t>(kRowStep * ldb * static_cast<std::int64_t>(sizeof(T)));
    dst_offset_ = first_row_ * kRowBytes + chunk * 16;
  }

  // Rows begin .. begin + count - 1 of B into the stage at shared address `stage`; staged rows from
  // count to extent - 1 are zero-filled and rows from extent on are left alone.
  __device__ __forceinline__ void stage(std::uint32_t stage, std::int64_t begin, int count, int extent) const {
    const std::uint32_t dst = stage + dst_offset_;
    const int rows_left = count - first_row_;  // rows of the block from first_row_ on
    // The address of row first_row_ + j * kRowStep as an integer: on a ragged last block it runs
    // past B, and only copies inside the block read it.
    auto src = reinterpret_cast<std::uintptr_t>(b_chunk_ + begin * ldb_);
#pragma unroll
    for (int j = 0; j < kMaxTile / kRowStep; ++j) {
      if (first_row_ + j * kRowStep >= extent) break;
      const bool inside = j * kRowStep < rows_left && chunk_inside_;
      cp_async16_or_zero(dst + j * kRowStep * kRowBytes, inside ? reinterpret_cast<const void*>(src) : b_, inside);
      src += row_step_bytes_;
    }
  }

 private:
  static constexpr int kRowStep = kThreads / kChunksPerRow;
  static_assert(kMaxTile % kRowStep == 0, "the unrolled copies cover the largest block");

  const T* b_;
  std::int64_t ldb_;
  int first_row_;
  bool chunk_inside_;
  const T* b_chunk_;
  std::uintptr_t row_step_bytes_;
  std::uint32_t dst_offset_;
};

// acc += a x the lane's 4 columns of the staged B row at b_row (the lane's first column).
template <class T>
__device__ __forceinline__ void add_row(float a, const unsigned char* b_row, float (&acc)[kColsPerLane]) {
  const uint2 w = *reinterpret_cast<const uint2*>(b_row);
  const float2 lo = unpack_pair<T>(w.x), hi = unpack_pair<T>(w.y);
  acc[0] = fmaf(a, lo.x, acc[0]);
  acc[1] = fmaf(a, lo.y, acc[1]);
  acc[2] = fmaf(a, hi.x, acc[2]);
  acc[3] = fmaf(a, hi.y, acc[3]);
}

// acc += value(word) x the lane's 4 columns of B row column(word) of the stage at b_lane (the
// lane's first column of staged row 0). Columns past the tile read the zero row.
template <class T>
__device__ __forceinline__ void add_entry(std::uint32_t word, const unsigned char* b_lane, float (&acc)[kColsPerLane]) {
  const std::uint32_t k = min(TwellLayout::slot_column(word), static_cast<std::uint32_t>(kZeroRow));
  add_row<T>(twell_value<T>(word, static_cast<const T*>(nullptr), 0), b_lane + k * kRowBytes, acc);
}

// Preconditions (spmm_stream_applies): 16-bit T; layout.tile <= 256, slots() a multiple of 4 and
// at least 8, packed 16-byte aligned; B 16-byte aligned, ldb and nb multiples of 8; C 16-byte
// aligned, ldc a multiple of 8; dynamic shared memory of kSmemBytes. Counts above capacity
// are clipped to capacity; a column outside the tile reads the zero row, so it adds nothing
// (NaN if its value is Inf or NaN: valid TwELL has no such entry); rows >= M and shadow rows (>= 0)
// are left untouched.
template <class T>
__global__ void __launch_bounds__(kThreads, 1)
    stream_kernel(std::int64_t rows, std::int64_t k_cols, TwellLayout layout, const std::uint32_t* __restrict__ packed,
                  const std::int32_t* __restrict__ shadow, const T* __restrict__ b, std::int64_t ldb, T* __restrict__ c,
                  std::int64_t ldc, std::int64_t nb, float alpha, float beta) {
  extern __shared__ __align__(16) unsigned char smem[];  // [kStages][B rows | slot heads]
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const std::int64_t row0 = static_cast<std::int64_t>(blockIdx.x) * kRows;
  const std::int64_t col0 = static_cast<std::int64_t>(blockIdx.y) * kCols;
  const int tile = layout.tile, slots = layout.slots();
  const int tiles = static_cast<int>(layout.tiles(k_cols));
  const std::int64_t pw = layout.packed_width(k_cols);
  const auto cap = static_cast<std::uint32_t>(layout.capacity());

  // The slot heads this thread stages, fixed over the tiles: null for rows past M and shadow rows,
  // whose heads are zero-filled (count 0).
  constexpr int kHeadsPerThread = kHeadChunks / kThreads;
  const std::uint32_t* head_src[kHeadsPerThread];
#pragma unroll
  for (int j = 0; j < kHeadsPerThread; ++j) {
    const int q = tid + j * kThreads;
    const std::int64_t row = row0 + q / 2;
    const bool live = row < rows && (shadow == nullptr || shadow[row] < 0);
    head_src[j] = live ? packed + row * pw + (q % 2) * 4 : nullptr;
  }

  // Staged rows at and past the tile width never receive a copy: zero them once in every stage.
  for (int s = 0; s < kStages; ++s) {
    auto* zero = reinterpret_cast<std::uint32_t*>(smem + s * kStageBytes + tile * kRowBytes);
    for (int i = tid; i < (kMaxTile + 1 - tile) * kRowBytes / 4; i += kThreads) zero[i] = 0;
  }

  const std::uint32_t smem_base = shared_address(smem);
  const BlockStager<T> stager(b, ldb, col0, nb, tid);
  const auto stage_tile = [&](int t) {
    const std::uint32_t stage = smem_base + (t % kStages) * kStageBytes;
    stager.stage(stage, layout.tile_begin(t), layout.tile_cols(t, k_cols), tile);
#pragma unroll
    for (int j = 0; j < kHeadsPerThread; ++j) {
      const std::uint32_t* src = head_src[j];
      cp_async16_or_zero(stage + kBBytes + (tid + j * kThreads) * 16,
                         src != nullptr ? src + static_cast<std::int64_t>(t) * slots : packed, src != nullptr);
    }
  };

  // Slot offset of row (the warp's first row + lane)'s tile 0, for entries past the heads.
  const std::int64_t lane_offset = (row0 + warp * kRowsPerWarp + lane) * pw;
  float acc[kRowsPerWarp][kColsPerLane] = {};
  for (int t = 0; t < kStages - 1; ++t) {
    if (t < tiles) stage_tile(t);
    cp_async_commit_group();
  }
  for (int t = 0; t < tiles; ++t) {
    if (t + kStages - 1 < tiles) stage_tile(t + kStages - 1);
    cp_async_commit_group();
    cp_async_wait_groups<kStages - 1>();
    __syncthreads();

    const unsigned char* stage = smem + (t % kStages) * kStageBytes;
    const unsigned char* b_lane = stage + lane * kColsPerLane * 2;
    const auto* heads = reinterpret_cast<const uint4*>(stage + kBBytes) + warp * kRowsPerWarp * 2;
    // The next row's head is loaded before this row's entries, and a row's first two entries
    // take no branch (a missing second entry reads the zero row), so that shared loads of
    // different entries overlap.
    uint4 h_next = heads[0];
#pragma unroll
    for (int r = 0; r < kRowsPerWarp; ++r) {
      const uint4 h = h_next;
      if (r + 1 < kRowsPerWarp) h_next = heads[2 * (r + 1)];
      const std::uint32_t n = min(h.x, cap);
      if (n == 0) continue;
      add_entry<T>(h.y, b_lane, acc[r]);
      add_entry<T>(n > 1 ? h.z : kZeroWord, b_lane, acc[r]);
      if (n <= 2) continue;
      add_entry<T>(h.w, b_lane, acc[r]);
      if (n <= 3) continue;
      const uint4 g = heads[2 * r + 1];
      add_entry<T>(g.x, b_lane, acc[r]);
      add_entry<T>(n > 4 ? g.y : kZeroWord, b_lane, acc[r]);
      add_entry<T>(n > 5 ? g.z : kZeroWord, b_lane, acc[r]);
      add_entry<T>(n > 6 ? g.w : kZeroWord, b_lane, acc[r]);
      if (n <= 7) continue;
      // Slots 8..n from global memory, 32 at a time, one per lane. The group's offset comes from
      // lane r, so the compiler does not keep one per row in registers.
      const std::int64_t offset = __shfl_sync(kFull, lane_offset, r) + static_cast<std::int64_t>(t) * slots;
      const std::uint32_t* group = packed + offset;
      for (std::uint32_t j0 = kHeadSlots; j0 <= n; j0 += 32) {
        const std::uint32_t mine = j0 + lane <= n ? group[j0 + lane] : 0u;
        const int m = static_cast<int>(min(32u, n + 1 - j0));
#pragma unroll 1
        for (int q = 0; q < m; ++q) add_entry<T>(__shfl_sync(kFull, mine, q), b_lane, acc[r]);
      }
    }
    __syncthreads();  // this stage is refilled kStages - 1 tiles later
  }
  cp_async_wait_groups<0>();

  const std::int64_t first = row0 + warp * kRowsPerWarp;
  const std::int64_t my_row = first + lane;
  const bool mine_live = lane < kRowsPerWarp && my_row < rows && (shadow == nullptr || shadow[my_row] < 0);
  const unsigned live = __ballot_sync(kFull, mine_live);
  const std::int64_t col = col0 + lane * kColsPerLane;
  if (col >= nb) return;  // nb is a multiple of 8: a lane's 4 columns are all inside or all out
#pragma unroll
  for (int r = 0; r < kRowsPerWarp; ++r) {
    if ((live >> r & 1u) == 0) continue;
    store_scaled<T>(reinterpret_cast<uint2*>(c + (first + r) * ldc + col), acc[r], alpha, beta);
  }
}

// ---- op(A) = A^T -----------------------------------------------------------------------------------
//
// C = A^T B with B and A of M rows: C's rows are A's columns. A CTA owns one tile of A's columns
// (C rows tile_begin(t) on, 256 at most) and kCols columns of C, in registers as above: a warp owns
// a window of 16 of the tile's columns, a lane 4 columns of C. It streams A's rows through
// shared memory in blocks of 256 (the rows of B alongside, staged as the tile rows of the kernel
// above, and the 32-byte heads of the rows' (row, t) slot groups). The slots of a group are in
// column order, so a warp's entries in a row are one run of slots: per block, two threads per row
// write where each window's run starts (`RowRecord`), and a warp then walks its runs 32 rows at a
// time, one row per lane, applying each entry to its C row (a switch on the row: registers cannot
// be indexed). Rows of a Hybrid's dense block are read from it, 16 values per window.
//
// Determinism: an output element is summed by one lane, A's row blocks in order; within a block,
// the warp takes the first entry of every row that has one, then every second, and so on, rows in
// order. The order depends on A alone, not on the grid or timing.

constexpr int kWindow = 16;  // columns of A (rows of C) per warp: kRowsPerWarp rows of the CTA's block
static_assert(kWindow == kRowsPerWarp && kWarps * kWindow == kMaxTile);

// Per staged row of A: where each warp's run of slots starts (starts[w]: entries with a column
// below w * kWindow; starts[kWarps]: all of them) and the row's index in the Hybrid's dense block
// (-1 for none).
struct RowRecord {
  std::uint8_t starts[kWarps + 1];
  std::uint8_t pad[3];
  std::int32_t dense_row;
};
static_assert(sizeof(RowRecord) == 24);
constexpr int kRecordBytes = kMaxTile * static_cast<int>(sizeof(RowRecord));
constexpr int kSmemBytesT = kStages * kStageBytes + kRecordBytes;

// acc[r % 16] += a x the lane's 4 columns of the staged B row at b_row: one jump on r, which keeps
// acc in registers (they cannot be indexed). Valid TwELL gives 0 <= r < kWindow.
template <class T>
__device__ __forceinline__ void add_to_row(int r, float a, const unsigned char* b_row,
                                           float (&acc)[kRowsPerWarp][kColsPerLane]) {
  static_assert(kRowsPerWarp == 16);
  const uint2 w = *reinterpret_cast<const uint2*>(b_row);
  const float2 lo = unpack_pair<T>(w.x), hi = unpack_pair<T>(w.y);
  const auto add = [&](float(&row)[kColsPerLane]) {
    row[0] = fmaf(a, lo.x, row[0]);
    row[1] = fmaf(a, lo.y, row[1]);
    row[2] = fmaf(a, hi.x, row[2]);
    row[3] = fmaf(a, hi.y, row[3]);
  };
  switch (static_cast<unsigned>(r) % 16u) {
    case 0: return add(acc[0]);
    case 1: return add(acc[1]);
    case 2: return add(acc[2]);
    case 3: return add(acc[3]);
    case 4: return add(acc[4]);
    case 5: return add(acc[5]);
    case 6: return add(acc[6]);
    case 7: return add(acc[7]);
    case 8: return add(acc[8]);
    case 9: return add(acc[9]);
    case 10: return add(acc[10]);
    case 11: return add(acc[11]);
    case 12: return add(acc[12]);
    case 13: return add(acc[13]);
    case 14: return add(acc[14]);
    default: return add(acc[15]);
  }
}

// Preconditions (spmm_stream_t_applies): those of stream_kernel for A, B (M x nb) and C (K x nb),
// dynamic shared memory of kSmemBytesT; `overflow` (R x K, ld_overflow) holds the rows whose
// `shadow` entry is >= 0 (shadow null: none). Every row of C below K is written.
template <class T>
__global__ void __launch_bounds__(kThreads, 1)
    stream_t_kernel(std::int64_t rows, std::int64_t k_cols, TwellLayout layout, const std::uint32_t* __restrict__ packed,
                    const std::int32_t* __restrict__ shadow, const T* __restrict__ overflow, std::int64_t ld_overflow,
                    const T* __restrict__ b, std::int64_t ldb, T* __restrict__ c, std::int64_t ldc, std::int64_t nb,
                    float alpha, float beta) {
  extern __shared__ __align__(16) unsigned char smem[];  // [kStages][B rows | slot heads], row records
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int t = static_cast<int>(blockIdx.x);
  const std::int64_t col0 = static_cast<std::int64_t>(blockIdx.y) * kCols;
  const int slots = layout.slots();
  const std::int64_t pw = layout.packed_width(k_cols);
  const auto cap = static_cast<std::uint32_t>(layout.capacity());
  const int window = warp * kWindow;
  const std::int64_t blocks = (rows + kMaxTile - 1) / kMaxTile;

  const std::uint32_t smem_base = shared_address(smem);
  auto* records = reinterpret_cast<RowRecord*>(smem + kStages * kStageBytes);
  const BlockStager<T> stager(b, ldb, col0, nb, tid);
  // Thread tid stages half tid % 2 of the head of row tid / 2 of each block.
  static_assert(kMaxTile * 2 == kThreads);
  const int head_row = tid / 2;
  const std::int64_t head_offset = head_row * pw + static_cast<std::int64_t>(t) * slots + (tid % 2) * 4;
  const auto stage_block = [&](std::int64_t i) {
    const std::uint32_t stage = smem_base + static_cast<std::uint32_t>(i % kStages) * kStageBytes;
    const std::int64_t first = i * kMaxTile;
    const int count = static_cast<int>(min(static_cast<std::int64_t>(kMaxTile), rows - first));
    stager.stage(stage, first, count, count);
    const bool live = head_row < count;
    cp_async16_or_zero(stage + kBBytes + tid * 16, live ? packed + (first * pw + head_offset) : packed, live);
  };

  float acc[kRowsPerWarp][kColsPerLane] = {};
  for (int i = 0; i < kStages - 1; ++i) {
    if (i < blocks) stage_block(i);
    cp_async_commit_group();
  }
  for (std::int64_t i = 0; i < blocks; ++i) {
    cp_async_wait_groups<kStages - 2>();
    __syncthreads();  // block i is staged, and every warp is done with block i - 1
    if (i + kStages - 1 < blocks) stage_block(i + kStages - 1);  // into block i - 1's stage
    cp_async_commit_group();

    const unsigned char* stage = smem + (i % kStages) * kStageBytes;
    const auto* heads = reinterpret_cast<const std::uint32_t*>(stage + kBBytes);  // [row][kHeadSlots]
    const std::int64_t first = i * kMaxTile;
    // Slot s (0-based entry) of block row `row`: the first 7 from the staged head.
    const auto slot_word = [&](int row, std::uint32_t s) {
      return s + 1 < kHeadSlots ? heads[row * kHeadSlots + 1 + s]
                                : packed[(first + row) * pw + static_cast<std::int64_t>(t) * slots + 1 + s];
    };
    {  // Row records: thread pair (row, half) counts the entries below windows 8 * half .. 8 * half + 8.
      const int row = tid / 2, half = tid % 2;
      const std::int64_t m = first + row;
      const int dense_row = shadow != nullptr && m < rows ? shadow[m] : -1;
      const std::uint32_t n = dense_row >= 0 ? 0u : min(heads[row * kHeadSlots], cap);
      RowRecord& rec = records[row];
      std::uint32_t e = 0;
      const int w_end = half == 0 ? kWarps / 2 : kWarps + 1;
      for (int w = half * (kWarps / 2); w < w_end; ++w) {
        while (e < n && TwellLayout::slot_column(slot_word(row, e)) < static_cast<std::uint32_t>(w * kWindow)) ++e;
        rec.starts[w] = static_cast<std::uint8_t>(e);
      }
      if (half == 0) rec.dense_row = dense_row;
    }
    __syncthreads();

    const unsigned char* b_lane = stage + lane * kColsPerLane * 2;
#pragma unroll 1
    for (int row0 = 0; row0 < kMaxTile; row0 += 32) {
      const int row = row0 + lane;
      const RowRecord& rec = records[row];
      const int dense_row = rec.dense_row;
      std::uint32_t s = rec.starts[warp], left = rec.starts[warp + 1] - s;
      std::uint32_t hits = 0;  // a dense row: its nonzero columns in the window
      const T* dense = nullptr;
      if (dense_row >= 0) {
        dense = overflow + dense_row * ld_overflow + layout.tile_begin(t) + window;
        const std::int64_t inside = k_cols - (layout.tile_begin(t) + window);
#pragma unroll
        for (int r = 0; r < kWindow; ++r) {
          const std::uint16_t v = r < inside ? *reinterpret_cast<const std::uint16_t*>(dense + r) : 0;
          hits |= static_cast<std::uint32_t>((v & 0x7fffu) != 0) << r;  // +-0 is not an entry
        }
        left = __popc(hits);
      }
      // Round j applies every row's j-th entry in the window, rows in order.
      for (;;) {
        const unsigned busy = __ballot_sync(kFull, left != 0);
        if (busy == 0) break;
        std::uint32_t word = 0;
        if (left != 0) {
          if (dense != nullptr) {
            const int r = __ffs(hits) - 1;
            hits &= hits - 1;
            word = TwellLayout::pack(*reinterpret_cast<const std::uint16_t*>(dense + r),
                                     static_cast<std::uint32_t>(window + r));
          } else {
            word = slot_word(row, s++);
          }
          --left;
        }
        for (unsigned pending = busy; pending != 0; pending &= pending - 1) {
          const int from = __ffs(pending) - 1;
          const std::uint32_t w = __shfl_sync(kFull, word, from);
          add_to_row<T>(static_cast<int>(TwellLayout::slot_column(w)) - window,
                        twell_value<T>(w, static_cast<const T*>(nullptr), 0), b_lane + (row0 + from) * kRowBytes, acc);
        }
      }
    }
  }
  cp_async_wait_groups<0>();

  const int width = layout.tile_cols(t, k_cols);
  const std::int64_t col = col0 + lane * kColsPerLane;
  if (col >= nb) return;  // nb is a multiple of 8: a lane's 4 columns are all inside or all out
#pragma unroll
  for (int r = 0; r < kRowsPerWarp; ++r) {
    if (window + r >= width) break;
    auto* out = reinterpret_cast<uint2*>(c + (layout.tile_begin(t) + window + r) * ldc + col);
    store_scaled<T>(out, acc[r], alpha, beta);
  }
}

// The operand conditions both kernels share, with the shared memory of `smem_bytes`.
template <class T>
bool stream_operands_apply(TwellView<const T> a, DenseView<const T> b, DenseView<T> c, int smem_bytes) {
  if constexpr (sizeof(T) != 2) {
    return false;
  } else {
    if (a.cols <= 0 || b.cols <= 0) return false;
    const int slots = a.layout.slots();
    if (a.layout.tile > kMaxTile || slots < kHeadSlots || slots % 4 != 0 || !aligned16(a.packed)) return false;
    if (!vector_operands(b, c)) return false;
    return smem_bytes <= shared_memory_per_block("twell::cuda::spmm (shared memory per block)");
  }
}

void check_grid(std::int64_t blocks, std::int64_t slices, std::int64_t b_cols) {
  require(blocks <= 0x7fffffffLL && slices <= 65535, ErrorCode::unsupported, kWhere, "A has ", blocks,
          " blocks of rows or column tiles and B ", b_cols, " columns; the tile-streaming kernels take at most ",
          0x7fffffffLL, " and ", 65535LL * kCols);
}

}  // namespace

template <class T>
bool spmm_stream_applies(TwellView<const T> a, DenseView<const T> b, DenseView<T> c) {
  return a.rows > 0 && stream_operands_apply(a, b, c, kSmemBytes);
}

template <class T>
bool spmm_stream_t_applies(TwellView<const T> a, DenseView<const T> b, DenseView<T> c) {
  return stream_operands_apply(a, b, c, kSmemBytesT);
}

template <class T>
void spmm_twell_stream(TwellView<const T> a, const std::int32_t* shadow, DenseView<const T> b, DenseView<T> c,
                       float alpha, float beta, cudaStream_t stream) {
  require(spmm_stream_applies(a, b, c), ErrorCode::invalid_argument, kWhere,
          "the tile-streaming TwELL kernel was called on operands it does not take");
  const std::int64_t row_blocks = (a.rows + kRows - 1) / kRows;
  const std::int64_t slices = (b.cols + kCols - 1) / kCols;
  check_grid(row_blocks, slices, b.cols);
  if constexpr (sizeof(T) == 2) {
    auto kernel = stream_kernel<T>;
    check_cuda(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, kSmemBytes),
               "twell::cuda::spmm (cudaFuncSetAttribute)");
    const dim3 grid(static_cast<unsigned>(row_blocks), static_cast<unsigned>(slices));
    kernel<<<grid, kThreads, kSmemBytes, stream>>>(a.rows, a.cols, a.layout, a.packed, shadow, b.data, b.ld, c.data,
                                                   c.ld, b.cols, alpha, beta);
    check_launch("twell::cuda::spmm (tile-streaming kernel)");
  }
}

template <class T>
void spmm_twell_stream_t(TwellView<const T> a, const std::int32_t* shadow, DenseView<const T> overflow,
                         DenseView<const T> b, DenseView<T> c, float alpha, float beta, cudaStream_t stream) {
  require(spmm_stream_t_applies(a, b, c), ErrorCode::invalid_argument, kWhere,
          "the transposed tile-streaming TwELL kernel was called on operands it does not take");
  const std::int64_t tiles = a.layout.tiles(a.cols);
  const std::int64_t slices = (b.cols + kCols - 1) / kCols;
  check_grid(tiles, slices, b.cols);
  if constexpr (sizeof(T) == 2) {
    auto kernel = stream_t_kernel<T>;
    check_cuda(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, kSmemBytesT),
               "twell::cuda::spmm (cudaFuncSetAttribute)");
    const dim3 grid(static_cast<unsigned>(tiles), static_cast<unsigned>(slices));
    kernel<<<grid, kThreads, kSmemBytesT, stream>>>(a.rows, a.cols, a.layout, a.packed, shadow, overflow.data,
                                                    overflow.ld, b.data, b.ld, c.data, c.ld, b.cols, alpha, beta);
    check_launch("twell::cuda::spmm (transposed tile-streaming kernel)");
  }
}

#define TWELL_INSTANTIATE(T)                                                                                           \
  template bool spmm_stream_applies<T>(TwellView<const T>, DenseView<const T>, DenseView<T>);                          \
  template bool spmm_stream_t_applies<T>(TwellView<const T>, DenseView<const T>, DenseView<T>);                        \
  template void spmm_twell_stream<T>(TwellView<const T>, const std::int32_t*, DenseView<const T>, DenseView<T>, float, \
                                     float, cudaStream_t);                                                             \
  template void spmm_twell_stream_t<T>(TwellView<const T>, const std::int32_t*, DenseView<const T>,                    \
                                       DenseView<const T>, DenseView<T>, float, float, cudaStream_t);
TWELL_INSTANTIATE(bf16)
TWELL_INSTANTIATE(fp16)
TWELL_INSTANTIATE(float)
#undef TWELL_INSTANTIATE

}  // namespace twell::cuda::detail
