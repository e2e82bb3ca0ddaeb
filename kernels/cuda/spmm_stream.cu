// cuda spmm, TwELL (and the TwELL part of a Hybrid) with op none and 16-bit values: the
// tile-streaming path, report path "tile_stream". spmm.cu chooses it for mid-sized products
// (choose_twell_path) or when SpmmAlgorithm::tile_stream asks for it, and for products on A^T
// (up to three in one launch; two value planes of one structure times one B as one product of
// 128-row CTAs, below "Two planes").
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
// Two planes. Where two products have A of one slot structure (SlotStructure::shared) and one B,
// a CTA owns 128 rows and both planes' accumulators (a warp 8 rows x 2 planes), staging each
// row's heads of both planes and loading each entry's B row once for the two; each plane's sums
// run in the one-plane order, so each C has the bits of the unpaired launch.
//
// Determinism: each output element is summed by one lane, tiles in order and a tile's entries in
// slot order; no atomics. The result does not depend on the grid.
#include <array>
#include <cstdint>

#include <twell/error.hpp>
#include <twell/types.hpp>

#include "cp_async.cuh"
#include "cuda_launch.cuh"
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
constexpr int kHeadChunks = kRowHeads * kHeadSlots * 4 / 16;  // 16-byte copies of a stage's heads
constexpr int kStageBytes = kBBytes + kRowHeads * kHeadSlots * 4;
constexpr int kSmemBytes = kStages * kStageBytes;
static_assert(kHeadChunks % kThreads == 0 && kBBytes % 16 == 0 && kColsPerLane == 4);
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

// Preconditions (spmm_stream_applies): 16-bit T; layout.tile <= 256, slots() a multiple of 4 and
// at least 8, packed 16-byte aligned; B 16-byte aligned, ldb and nb multiples of 8; C 16-byte
// aligned, ldc a multiple of 8; dynamic shared memory of kSmemBytes; with two planes, both of one
// slot structure (counts and columns; plane 0's are read). Counts above capacity are clipped to
// capacity; a column outside the tile reads the zero row, so it adds nothing (NaN if its value is
// Inf or NaN: valid TwELL has no such entry); rows >= M and shadow rows (>= 0) are left untouched.
// A CTA of product z does what the same CTA of a launch of that product alone does, and a plane
// of a two-plane CTA sums its entries in the order a one-plane CTA does (same bits).
// The CTA (blockIdx.x, blockIdx.y) of the product whose planes are batch entries first_plane +
// [0, kPlanes); nothing for a row block past A.
template <class T, int kPlanes>
__device__ __forceinline__ void stream_cta(std::int64_t rows, std::int64_t k_cols, TwellLayout layout,
                                           const StreamBatch<T>& batch, unsigned first_plane, std::int64_t nb,
                                           float alpha, float beta) {
  extern __shared__ __align__(16) unsigned char smem[];  // [kStages][B rows | slot heads]
  constexpr int kWarpRows = kRowsPerWarp<kPlanes>;
  if (static_cast<std::int64_t>(blockIdx.x) * kRows<kPlanes> >= rows) return;
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
  const T* __restrict__ b = batch.b[first_plane];
  const std::int64_t ldb = batch.ldb[first_plane];
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const std::int64_t row0 = static_cast<std::int64_t>(blockIdx.x) * kRows<kPlanes>;
  const std::int64_t col0 = static_cast<std::int64_t>(blockIdx.y) * kCols;
  const int tile = layout.tile, slots = layout.slots();
  const int tiles = static_cast<int>(layout.tiles(k_cols));
  const std::int64_t pw = layout.packed_width(k_cols);
  const auto cap = static_cast<std::uint32_t>(layout.capacity());

  // The slot heads this thread stages, fixed over the tiles: null for rows past M and shadow rows,
  // whose heads are zero-filled (count 0). A row's heads are its planes' in turn, two 16-byte
  // copies each.
  constexpr int kHeadsPerThread = kHeadChunks / kThreads;
  const std::uint32_t* head_src[kHeadsPerThread];
#pragma unroll
  for (int j = 0; j < kHeadsPerThread; ++j) {
    const int q = tid + j * kThreads;
    const std::int64_t row = row0 + q / (2 * kPlanes);
    const int plane = q / 2 % kPlanes;
    const bool live = row < rows && (shadow == nullptr || shadow[row] < 0);
    const std::uint32_t* from = packed[0];
#pragma unroll
    for (int p = 1; p < kPlanes; ++p) from = plane == p ? packed[p] : from;
    head_src[j] = live ? from + row * pw + (q % 2) * 4 : nullptr;
  }

  // Staged rows at and past the tile width never receive a copy: zero them once in every stage.
  for (int s = 0; s < kStages; ++s) {
    auto* zero = reinterpret_cast<std::uint32_t*>(smem + s * kStageBytes + tile * kRowBytes);
    for (int i = tid; i < (kMaxTile + 1 - tile) * kRowBytes / 4; i += kThreads) zero[i] = 0;
  }

  // The thread's 16-byte column chunk of the staged B rows is fixed; it copies every
  // kRowStep-th row from its first, `first_row`. The copies are unrolled over the largest tile
  // with the shared offsets as immediates and the source advanced by a fixed stride: a generic
  // loop spent ~21 instructions per copy on 64-bit addresses, about a fifth of the kernel's.
  constexpr int kRowStep = kThreads / kChunksPerRow;
  static_assert(kMaxTile % kRowStep == 0, "the unrolled copies cover the largest tile");
  const int chunk = tid % kChunksPerRow, first_row = tid / kChunksPerRow;
  const bool chunk_inside = col0 + chunk * 8 < nb;
  const T* b_chunk = b + (chunk_inside ? col0 + chunk * 8 : 0) + first_row * ldb;
  const auto row_step_bytes = static_cast<std::uintptr_t>(kRowStep * ldb * static_cast<std::int64_t>(sizeof(T)));
  const std::uint32_t smem_base = shared_address(smem);
  const std::uint32_t chunk_dst = smem_base + first_row * kRowBytes + chunk * 16;
  const auto stage_tile = [&](int t) {
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
  };

  // Slot offset of row (the warp's first row + lane)'s tile 0, for entries past the heads.
  const std::int64_t lane_offset = (row0 + warp * kWarpRows + lane) * pw;
  float acc[kWarpRows][kPlanes][kColsPerLane] = {};
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
    const auto* heads = reinterpret_cast<const uint4*>(stage + kBBytes) + warp * kWarpRows * kPlanes * 2;
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
    for (int p = 0; p < kPlanes; ++p) h_next[p] = heads[2 * p];
#pragma unroll
    for (int r = 0; r < kWarpRows; ++r) {
      uint4 h[kPlanes];
#pragma unroll
      for (int p = 0; p < kPlanes; ++p) {
        h[p] = h_next[p];
        if (r + 1 < kWarpRows) h_next[p] = heads[2 * ((r + 1) * kPlanes + p)];
      }
      const std::uint32_t n = min(h[0].x, cap);
      if (n == 0) continue;
      add_head(h, 1, true, r);
      add_head(h, 2, n > 1, r);
      if (n <= 2) continue;
      add_head(h, 3, true, r);
      if (n <= 3) continue;
      uint4 g[kPlanes];
#pragma unroll
      for (int p = 0; p < kPlanes; ++p) g[p] = heads[2 * (r * kPlanes + p) + 1];
      add_head(g, 0, true, r);
      add_head(g, 1, n > 4, r);
      add_head(g, 2, n > 5, r);
      add_head(g, 3, n > 6, r);
      if (n <= 7) continue;
      // Slots 8..n from global memory, 32 at a time, one per lane. The group's offset comes from
      // lane r, so the compiler does not keep one per row in registers.
      const std::int64_t offset = __shfl_sync(kFull, lane_offset, r) + static_cast<std::int64_t>(t) * slots;
      for (std::uint32_t j0 = kHeadSlots; j0 <= n; j0 += 32) {
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
    __syncthreads();  // this stage is refilled kStages - 1 tiles later
  }
  cp_async_wait_groups<0>();

  const std::int64_t first = row0 + warp * kWarpRows;
  const std::int64_t my_row = first + lane;
  const bool mine_live = lane < kWarpRows && my_row < rows && (shadow == nullptr || shadow[my_row] < 0);
  const unsigned live = __ballot_sync(kFull, mine_live);
  const std::int64_t col = col0 + lane * kColsPerLane;
  if (col >= nb) return;  // nb is a multiple of 8: a lane's 4 columns are all inside or all out
#pragma unroll
  for (int p = 0; p < kPlanes; ++p) {
#pragma unroll
    for (int r = 0; r < kWarpRows; ++r) {
      if ((live >> r & 1u) == 0) continue;
      auto* out = reinterpret_cast<uint2*>(c[p] + (first + r) * ldc[p] + col);
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

// Products blockIdx.z of one plane each.
template <class T>
__global__ void __launch_bounds__(kThreads, 1)
    stream_kernel(std::int64_t rows, std::int64_t k_cols, TwellLayout layout, StreamBatch<T> batch, std::int64_t nb,
                  float alpha, float beta) {
  ::twell::detail::wait_for_prior_grids();
  stream_cta<T, 1>(rows, k_cols, layout, batch, blockIdx.z, nb, alpha, beta);
}

// Product 0 of one plane (blockIdx.z = 0) and products 1 and 2 as the two planes of one
// (blockIdx.z = 1): the training backward's dwd = h^T dy beside dg^T x and du^T x.
template <class T>
__global__ void __launch_bounds__(kThreads, 1)
    stream_pair_kernel(std::int64_t rows, std::int64_t k_cols, TwellLayout layout, StreamBatch<T> batch,
                       std::int64_t nb, float alpha, float beta) {
  ::twell::detail::wait_for_prior_grids();
  if (blockIdx.z == 0) {
    stream_cta<T, 1>(rows, k_cols, layout, batch, 0, nb, alpha, beta);
  } else {
    stream_cta<T, 2>(rows, k_cols, layout, batch, 1, nb, alpha, beta);
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
    const int slots = a.layout.slots();
    if (a.layout.tile > kMaxTile || slots < kHeadSlots || slots % 4 != 0 || !aligned16(a.packed)) return false;
    if (!vector_operands(b, c)) return false;
    return kSmemBytes <= shared_memory_per_block("twell::cuda::spmm (shared memory per block)");
  }
}

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
    auto kernel = pair_last_two ? stream_pair_kernel<T> : stream_kernel<T>;
    ::twell::detail::allow_dynamic_shared(kernel, kSmemBytes, "twell::cuda::spmm (cudaFuncSetAttribute)");
    const dim3 grid(static_cast<unsigned>(row_blocks), static_cast<unsigned>(slices),
                    static_cast<unsigned>(pair_last_two ? 2 : products.size()));
    ::twell::detail::launch_kernel("twell::cuda::spmm (tile-streaming kernel)", kernel, grid, kThreads, kSmemBytes,
                                   stream, first.a.rows, first.a.cols, first.a.layout, batch, first.b.cols, alpha,
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
