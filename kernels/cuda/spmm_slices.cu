// cuda spmm, TwELL (and the TwELL part of a Hybrid) with op none: the slice-reuse path.
// spmm.cu selects it when spmm_slices_applies holds and keeps its pair-balanced kernel as the
// generic fallback. Three kernels on one stream, report path "slice_reuse":
//   count_kernel  per-row entry counts and per-256-row sums (lanes, huge rows), read from the
//                 TwELL slot-0 words once;
//   fill_kernel   cuts the rows into chunks of at most 32 entries (one chunk per lane), packs the
//                 chunks into row groups of at most 1024 lanes, and copies B slice-major; its
//                 other CTAs write that copy;
//   slices_kernel a CTA holds one row group's entries in registers and walks B's columns one
//                 8-column slice at a time, the slice of all K rows of B staged in shared memory.
//
// Why this shape. Each entry of A is used once per output column slice and each B row slice once
// per row group, so the two reuse axes are the row group (B traffic falls as it grows) and the
// slice (entries must stay on chip across slices). The register file is the largest on-chip
// store (256 KB per SM), so the entries live there: 1024 threads x 32 entries = 32 K entries per
// CTA, which at 0.5 % density (28 entries per row) is a group of ~830 rows; B's slice of all K
// rows (K x 16 bytes, 88 KB at K = 5632) is double-buffered in shared memory. Every entry of the
// group then costs, per slice, one 16-byte shared load at a random row and 8 FMAs; nothing is
// re-read from L2 per slice. B is first copied slice-major (B' [Nb / 8][K + 2][8]) because
// staging 16 bytes per row of row-major B would move a whole 32-byte sector from L2 for each.
//
// Determinism: the pre-pass is a deterministic function of A (integer scans, a stable sort, no
// atomics); each output element is summed by fixed lanes in a fixed order (a lane's entries in
// the pre-pass's order, then a fixed shuffle tree over the row's lanes, then a fixed order over
// warps for rows that span warps). The result does not depend on the grid.
#include <algorithm>
#include <climits>
#include <cstdint>
#include <type_traits>

#include <twell/error.hpp>
#include <twell/types.hpp>

#include "../../converters/cuda/warp_scan.cuh"
#include "cp_async.cuh"
#include "cuda_launch.cuh"
#include "mbarrier.cuh"
#include "sparse_common.cuh"
#include "spmm_slices.cuh"
#include "vec16.cuh"

namespace twell::cuda::detail {
namespace {

constexpr const char* kWhere = "twell::cuda::spmm";

// The product stages B's slices by one bulk copy of the TMA engine per slice where the device
// pass has it (sm_90 and up), by per-thread cp.async before. H100, paper shape, 0.5 %, M = 16384
// (Nsight Compute, 2026-11-27): the 16-byte cp.async copies took 15 shared-memory wavefronts per
// warp instruction against 4 ideal, 13.7 M of the kernel's 44 M, and 0.9 M LDGSTS of its 130 M
// instructions; the bulk copy leaves 30 M wavefronts and 120 M instructions, but its slice now
// lands late (a third of the warps' stall samples wait on it), so spmm gained only 1-2 % on
// uniform rows and 4 % on token-skewed ones (docs/benchmarks/history.md, "Why each miss").
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
#define TWELL_SLICES_BULK_COPY 1
#else
#define TWELL_SLICES_BULK_COPY 0
#endif
constexpr unsigned kFull = 0xffffffffu;

constexpr int kChunk = 32;                // entries a lane holds in registers
constexpr int kLanes = 1024;              // lanes of a row group = threads of a product CTA
constexpr int kCtaWarps = kLanes / 32;    // warps of a product CTA
constexpr int kRegularMax = kChunk * 32;  // entries of a row that one warp holds
// Group g holds the rows whose first lane is in [993 g, 993 (g + 1)): such a row of at most 32
// lanes ends by lane 1023 of the group.
constexpr int kGroupStride = kLanes - 32 + 1;
constexpr int kPieceRows = 256;                       // rows of a pre-pass CTA
constexpr int kPieceWarps = kPieceRows / 32;          // warps of a count CTA
// Threads of a fill CTA: two per row (fill_kernel splits each row's sort between them), so that
// a row piece's ~1.2 chunks per row (0.5 % uniform) are one chunk per thread; each chunk is a long
// serial chain (gather, bank ordering), and with a thread per row the threads that took a second
// chunk set the kernel's length (H100, paper shape, M = 16384: fill 61 us of the spmm's 282,
// docs/benchmarks/history.md, "Why each miss").
constexpr int kFillThreads = 2 * kPieceRows;
constexpr int kFillWarps = kFillThreads / 32;
constexpr int kMaxTiles = 128;                        // per-row tile counts staged by the pre-pass
// Rows of a layout the path takes hold at most this many entries. A row over kRegularMax is a
// group of its own, which stages all of B for one row: at 20 % density (C = 1, every row ~1100
// entries) that took 102 ms on an H100 against cuSPARSE's 9 ms, so such layouts take the
// pair-balanced kernel; up to 2 kRegularMax the rare rows over kRegularMax (5 % density, C = 4)
// still go through their own groups.
constexpr std::int64_t kMaxRowEntries = 2 * kRegularMax;
constexpr std::int64_t kMaxRows = std::int64_t{1} << 25;
constexpr std::int64_t kMaxCols = 65534;  // entry columns are 16 bits, and column K is B's zero row
constexpr int kScratch = 80;              // per-thread bytes of the pre-pass's bank ordering

// Entries are 32-bit words: value bits << 16 | global column (so K <= 65534). Column K names the
// zero row that the staged B slice carries, so padding and malformed entries need no branch.
// A lane's descriptor word: rank k of the lane within its row | (lanes of the row - 1) << 10 |
// entries of the lane << 20.
__host__ __device__ constexpr std::uint32_t lane_bits(int k, int lanes, int len) {
  return static_cast<std::uint32_t>(k) | static_cast<std::uint32_t>(lanes - 1) << 10 |
         static_cast<std::uint32_t>(len) << 20;
}

// Rows of B' per slice: K rows, B's zero row, padding to an even count (16-byte slices for 4
// columns).
constexpr std::int64_t padded_k(std::int64_t k_cols) { return (k_cols + 2) / 2 * 2; }

// The shared address of an entry's B row: buf + column * row_bytes, written so that it compiles
// to one mask and one shift-add (LEA); in C++ the compiler turns it into a shift, a mask and an add.
template <int kRowBytes>
__device__ __forceinline__ std::uint32_t row_address(std::uint32_t buf, std::uint32_t word) {
  static_assert(kRowBytes == 16 || kRowBytes == 8);
  std::uint32_t addr;
  asm("{\n\t.reg .b32 col;\n\tand.b32 col, %1, 65535;\n\tmad.lo.u32 %0, col, %2, %3;\n\t}"
      : "=r"(addr)
      : "r"(word), "n"(kRowBytes), "r"(buf));
  return addr;
}

// Shared-memory loads at 32-bit shared addresses, kept on their side of the barriers.
__device__ __forceinline__ void load_shared(std::uint32_t addr, uint4& v) {
  asm volatile("ld.shared.v4.u32 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
               : "r"(addr)
               : "memory");
}
__device__ __forceinline__ void load_shared(std::uint32_t addr, uint2& v) {
  asm volatile("ld.shared.v2.u32 {%0, %1}, [%2];\n" : "=r"(v.x), "=r"(v.y) : "r"(addr) : "memory");
}

// The pre-pass's output inside the caller's workspace. A row group's entries are lane-minor in
// 16-byte quads: word e of lane l at ((e / 4) * lanes + l) * 4 + e % 4, so that a warp loads its
// lanes' quads coalesced. Regular groups have 1024 lanes; a row of more than 1024 entries (a
// "huge" row) is a group of its own, with as many lanes as chunks, in a separate lane space.
struct Lists {
  std::int32_t* row_n;         // [pieces * 256]: entries of each row (clipped counts), -1: not computed here
  std::uint8_t* counts;        // [pieces * 256][tiles]: clipped per-(row, tile) counts
  int4* piece_sums;            // [pieces]: regular lanes, huge rows, huge lanes of each 256 rows
  uint2* group_meta;           // [groups_max * 1024]: (row or -1, lane_bits) per lane
  std::uint32_t* group_words;  // [groups_max][8][1024][4]
  longlong2* huge_rows;        // [huge_max]: (first lane in the huge lane space, lanes)
  uint2* huge_meta;            // [huge_lanes_max]
  std::uint32_t* huge_words;   // [huge_lanes_max * 32], each huge row lane-minor over its own lanes
};

// Sizes of the workspace regions; every bound holds for any A of this shape and layout.
struct Geometry {
  std::int64_t pieces = 0, tiles = 0, groups_max = 0, huge_max = 0, huge_lanes_max = 0;
  std::size_t bytes[8] = {};
  std::size_t total = 0;
};

constexpr std::size_t round16(std::size_t n) { return (n + 15) / 16 * 16; }

Geometry geometry(std::int64_t rows, std::int64_t cols, TwellLayout layout) {
  Geometry g;
  g.tiles = layout.tiles(cols);
  g.pieces = (rows + kPieceRows - 1) / kPieceRows;
  const std::int64_t padded_rows = g.pieces * kPieceRows;
  const std::int64_t row_max = static_cast<std::int64_t>(layout.capacity()) * g.tiles;
  // A regular row of n entries takes max(1, ceil(n / 32)) lanes; groups start every 993 lanes.
  const std::int64_t regular_lanes =
      std::max<std::int64_t>(1, (std::min<std::int64_t>(row_max, kRegularMax) + 31) / 32);
  g.groups_max = (padded_rows * regular_lanes + kGroupStride - 1) / kGroupStride;
  g.huge_max = row_max > kRegularMax ? padded_rows : 0;
  g.huge_lanes_max = g.huge_max * ((row_max + kChunk - 1) / kChunk);
  const auto u = [](std::int64_t n) { return static_cast<std::size_t>(n); };
  g.bytes[0] = round16(u(padded_rows) * sizeof(std::int32_t));
  g.bytes[1] = round16(u(padded_rows * g.tiles));
  g.bytes[2] = round16(u(g.pieces) * sizeof(int4));
  g.bytes[3] = round16(u(g.groups_max * kLanes) * sizeof(uint2));
  g.bytes[4] = round16(u(g.groups_max * kLanes * kChunk) * sizeof(std::uint32_t));
  g.bytes[5] = round16(u(g.huge_max) * sizeof(longlong2));
  g.bytes[6] = round16(u(g.huge_lanes_max) * sizeof(uint2));
  g.bytes[7] = round16(u(g.huge_lanes_max * kChunk) * sizeof(std::uint32_t));
  for (const std::size_t b : g.bytes) g.total += b;
  return g;
}

Lists carve(void* workspace, const Geometry& g) {
  auto* p = static_cast<unsigned char*>(workspace);
  unsigned char* at[8];
  for (int i = 0; i < 8; ++i) {
    at[i] = p;
    p += g.bytes[i];
  }
  Lists l;
  l.row_n = reinterpret_cast<std::int32_t*>(at[0]);
  l.counts = at[1];
  l.piece_sums = reinterpret_cast<int4*>(at[2]);
  l.group_meta = reinterpret_cast<uint2*>(at[3]);
  l.group_words = reinterpret_cast<std::uint32_t*>(at[4]);
  l.huge_rows = reinterpret_cast<longlong2*>(at[5]);
  l.huge_meta = reinterpret_cast<uint2*>(at[6]);
  l.huge_words = reinterpret_cast<std::uint32_t*>(at[7]);
  return l;
}

// ---- pre-pass ------------------------------------------------------------------------------------

// Exclusive prefix of v over a CTA of kWarps warps in thread order, and the CTA's total. `scratch`
// holds kWarps values; the barrier at the end lets the next call reuse it.
template <int kWarps>
__device__ __forceinline__ long long block_exclusive_scan(long long v, long long* scratch, long long& total) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const long long incl = warp_inclusive_sum(v, lane);
  if (lane == 31) scratch[warp] = incl;
  __syncthreads();
  long long before = 0;
  total = 0;
#pragma unroll
  for (int w = 0; w < kWarps; ++w) {
    const long long s = scratch[w];
    if (w < warp) before += s;
    total += s;
  }
  __syncthreads();
  return before + incl - v;
}

// Lanes a row of n entries (n < 0: a row not computed here) takes: one per chunk of <= 32.
__device__ __forceinline__ int lanes_of(int n) { return n < 0 ? 0 : max(1, (n + kChunk - 1) / kChunk); }

// Benchmark: bench/suites/spmm.cpp (through SpmmPlan::run). A CTA owns 256 rows, a thread one row:
// it reads the row's slot-0 words (8 in flight), keeps the clipped counts as bytes (written out
// coalesced through shared memory) and the row's total (-1 for rows >= M and Hybrid shadow rows,
// which the overflow path computes); the CTA writes its sums of regular lanes, huge rows and huge
// lanes. The grid also marks every lane of the group region empty (row -1), so lanes that no row
// fills are skipped by the product. Cost: M x tiles scattered 4-byte loads (one sector each, ~11 MB
// at the paper shape) and M x tiles bytes written.
__global__ void __launch_bounds__(kPieceRows)
    count_kernel(std::int64_t rows, std::int64_t k_cols, TwellLayout layout, const std::uint32_t* __restrict__ packed,
                 const std::int32_t* __restrict__ shadow, Lists lists, std::int64_t meta_lanes) {
  ::twell::detail::wait_for_prior_grids();
  extern __shared__ __align__(16) unsigned char counts[];  // [kPieceRows][tiles]
  __shared__ long long scratch[kPieceWarps];
  const int tid = threadIdx.x;
  const int tiles = static_cast<int>(layout.tiles(k_cols));
  const int slots = layout.slots();
  const unsigned cap = static_cast<unsigned>(layout.capacity());
  const std::int64_t piece = blockIdx.x;
  const std::int64_t row = piece * kPieceRows + tid;
  const bool live = row < rows && (shadow == nullptr || shadow[row] < 0);
  const std::uint32_t* src = packed + (live ? row : 0) * layout.packed_width(k_cols);
  int n = 0;
  for (int t0 = 0; t0 < tiles; t0 += 8) {
    unsigned v[8];
#pragma unroll
    for (int u = 0; u < 8; ++u)
      v[u] = live && t0 + u < tiles ? min(__ldg(src + static_cast<std::int64_t>(t0 + u) * slots), cap) : 0u;
#pragma unroll
    for (int u = 0; u < 8; ++u) {
      if (t0 + u < tiles) counts[tid * tiles + t0 + u] = static_cast<unsigned char>(v[u]);
      n += static_cast<int>(v[u]);
    }
  }
  if (!live) n = -1;
  lists.row_n[row] = n;
  const int lanes = lanes_of(n);
  const bool huge = n > kRegularMax;
  long long regular_total, huge_total, huge_lanes_total;
  block_exclusive_scan<kPieceWarps>(huge ? 0 : lanes, scratch, regular_total);
  block_exclusive_scan<kPieceWarps>(huge ? 1 : 0, scratch, huge_total);
  block_exclusive_scan<kPieceWarps>(huge ? lanes : 0, scratch, huge_lanes_total);  // its barriers also publish `counts`
  auto* dst = reinterpret_cast<uint4*>(lists.counts + piece * kPieceRows * tiles);
  const auto* from = reinterpret_cast<const uint4*>(counts);
  for (int i = tid; i < tiles * (kPieceRows / 16); i += kPieceRows) dst[i] = from[i];
  if (tid == 0)
    lists.piece_sums[piece] =
        make_int4(static_cast<int>(regular_total), static_cast<int>(huge_total), static_cast<int>(huge_lanes_total), 0);
  for (std::int64_t i = piece * kPieceRows + tid; i < meta_lanes;
       i += static_cast<std::int64_t>(gridDim.x) * kPieceRows)
    lists.group_meta[i] = make_uint2(0xffffffffu, 0u);
}

// B (k_cols x b_cols, row-major, ld ldb) to B' [b_cols / kKc][padded_k][kKc], rows k_cols and up of
// each slice zero. A warp copies units of 8 rows x 4 slices: loads of 4 x 2 kKc contiguous bytes
// per row, stores of 8 x 2 kKc contiguous bytes per slice, so both sides move whole sectors. It has
// kInFlight units' loads issued before their stores: a fill CTA takes a whole SM (registers), so
// the copy runs on few CTAs, the SMs the row CTAs leave free, and each warp must keep several
// loads in flight.
template <int kKc>
__device__ void stage_b(const std::uint16_t* __restrict__ b, std::int64_t ldb, std::int64_t k_cols, std::int64_t b_cols,
                        std::uint16_t* __restrict__ staged, std::int64_t block, std::int64_t blocks) {
  using Piece = std::conditional_t<kKc == 8, uint4, uint2>;
  constexpr int kInFlight = 8;
  const std::int64_t k_pad = padded_k(k_cols);
  const std::int64_t slices = b_cols / kKc;
  const std::int64_t slice_quads = (slices + 3) / 4;
  const std::int64_t units = (k_pad + 7) / 8 * slice_quads;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const std::int64_t step = blocks * kFillWarps;
  for (std::int64_t u0 = block * kFillWarps + warp; u0 < units; u0 += kInFlight * step) {
    Piece v[kInFlight];
    std::int64_t to[kInFlight];
#pragma unroll
    for (int i = 0; i < kInFlight; ++i) {
      const std::int64_t u = u0 + i * step;
      const std::int64_t j = u / slice_quads * 8 + (lane >> 2);
      const std::int64_t s = u % slice_quads * 4 + (lane & 3);
      v[i] = Piece{};
      to[i] = u < units && j < k_pad && s < slices ? (s * k_pad + j) * kKc : -1;
      if (to[i] >= 0 && j < k_cols) v[i] = __ldg(reinterpret_cast<const Piece*>(b + j * ldb + s * kKc));
    }
#pragma unroll
    for (int i = 0; i < kInFlight; ++i)
      if (to[i] >= 0) *reinterpret_cast<Piece*>(staged + to[i]) = v[i];
  }
}

// Orders one chunk's entries against shared-memory bank conflicts. The product kernel's lanes load
// 16-byte (kKc = 8) or 8-byte (kKc = 4) rows of the staged slice, a quarter (half) warp per
// wavefront, so the entry's column modulo kClasses picks its bank group. Lane l takes, at step e,
// an entry of class (e + l) mod kClasses when it has one left, else one of the class with the most
// left: lanes of one wavefront then mostly hit distinct bank groups (measured in simulation at
// 0.5 % uniform: ~7 wavefronts per warp load instead of ~10). Writes the chunk's words to their
// positions in `dst` (word e at ((e / 4) * stride + lane) * 4 + e % 4; any order is correct), and
// the zero row's word up to the end of the last quad, so the product loads whole quads unmasked.
template <int kClasses>
__device__ void write_chunk(const std::uint32_t (&word)[kChunk], int len, int lane, int stride, std::uint32_t zero_word,
                            std::uint32_t* dst, unsigned char* scratch) {
  unsigned char* left = scratch;        // [kClasses] entries not yet scheduled
  unsigned char* first = scratch + 16;  // [kClasses] first slot of the class in `steps`
  unsigned char* taken = scratch + 32;  // [kClasses]
  unsigned char* steps = scratch + 48;  // [kChunk] the steps given to each class, class after class
  for (int q = 0; q < kClasses; ++q) left[q] = taken[q] = 0;
#pragma unroll
  for (int i = 0; i < kChunk; ++i)
    if (i < len) ++left[word[i] & (kClasses - 1)];
  int run = 0;
  for (int q = 0; q < kClasses; ++q) {
    first[q] = static_cast<unsigned char>(run);
    run += left[q];
  }
  for (int e = 0; e < len; ++e) {
    const int want = (e + lane) & (kClasses - 1);
    int pick = want;
    if (left[want] == 0) {
      int most = 0;
      for (int s = 1; s < kClasses; ++s) {
        const int q = (want + s) & (kClasses - 1);
        if (left[q] > most) {
          most = left[q];
          pick = q;
        }
      }
    }
    steps[first[pick] + taken[pick]] = static_cast<unsigned char>(e);
    ++taken[pick];
    --left[pick];
  }
  for (int q = 0; q < kClasses; ++q) taken[q] = 0;
#pragma unroll
  for (int i = 0; i < kChunk; ++i) {
    if (i < len) {
      const int q = word[i] & (kClasses - 1);
      const int e = steps[first[q] + taken[q]];
      ++taken[q];
      dst[(static_cast<std::int64_t>(e >> 2) * stride + lane) * 4 + (e & 3)] = word[i];
    }
  }
  for (int e = len; e % 4 != 0; ++e) dst[(static_cast<std::int64_t>(e >> 2) * stride + lane) * 4 + (e & 3)] = zero_word;
}

// Benchmark: bench/suites/spmm.cpp (through SpmmPlan::run). CTAs below `pieces` own 256 rows each
// (thread r < 256 row r, then every thread one chunk at a time); the others copy B slice-major
// (stage_b).
// Rows: a row of n <= 1024 entries is "regular" and takes lanes = max(1, ceil(n / 32)) lanes with
// chunks of ceil or floor(n / lanes) consecutive entries (in column order); its first lane is its
// exclusive prefix P of lanes over all regular rows, and it joins group floor(P / 993), at lane
// P - 993 g of the group: a group's rows start at lanes [0, 993) and end by lane 1023. Rows of more
// than 1024 entries are groups of their own. Inside this CTA, the rows of each group are then
// stably sorted by chunk length, longest first (keeping the group's lane range), so that the
// lanes of a warp carry chunks of about equal length: the warp's lockstep walk wastes little
// ("balance work by pairs": a token-skewed row spreads over as many lanes as it has chunks).
// The sort is a 256 x 256 rank count in shared memory, each half of it counted by one of a row's
// two threads; the chunk gather reads the row's slots at
// addresses computed from the staged counts (32 loads in flight per thread).
// Preconditions: those of slices_kernel; `lists` row_n, counts and piece_sums from count_kernel.
template <int kKc>
__global__ void __launch_bounds__(kFillThreads)
    fill_kernel(std::int64_t k_cols, TwellLayout layout, const std::uint32_t* __restrict__ packed, Lists lists,
                std::int64_t pieces, const std::uint16_t* __restrict__ b, std::int64_t ldb, std::int64_t b_cols,
                std::uint16_t* __restrict__ staged) {
  ::twell::detail::wait_for_prior_grids();
  if (blockIdx.x >= pieces) {
    stage_b<kKc>(b, ldb, k_cols, b_cols, staged, blockIdx.x - pieces, gridDim.x - pieces);
    return;
  }
  constexpr int kClasses = 128 / (2 * kKc);              // bank groups of one shared-memory wavefront
  extern __shared__ __align__(16) unsigned char smem[];  // counts [256][tiles], then [512][kScratch]
  __shared__ int row_n[kPieceRows], row_lanes[kPieceRows], row_key[kPieceRows], row_sort_lanes[kPieceRows];
  __shared__ int row_lane[kPieceRows], row_items[kPieceRows], row_sorted_high[kPieceRows];
  __shared__ long long row_base[kPieceRows];
  __shared__ long long scratch[kFillWarps];
  const int tid = threadIdx.x;
  const int tiles = static_cast<int>(layout.tiles(k_cols));
  const int slots = layout.slots();
  const std::int64_t pw = layout.packed_width(k_cols);
  const std::uint32_t zero_word = static_cast<std::uint32_t>(k_cols);
  unsigned char* counts = smem;
  unsigned char* my_scratch = smem + kPieceRows * tiles + tid * kScratch;
  const std::int64_t piece = blockIdx.x;

  // Regular lanes, huge rows and huge lanes of the rows before this CTA's.
  long long before[3] = {0, 0, 0};
  for (std::int64_t p = tid; p < piece; p += kFillThreads) {
    const int4 s = lists.piece_sums[p];
    before[0] += s.x;
    before[1] += s.y;
    before[2] += s.z;
  }
  for (long long& v : before) {
    long long total;
    block_exclusive_scan<kFillWarps>(v, scratch, total);
    v = total;
  }

  // Thread r < 256 owns row r; the threads after them add nothing to the scans.
  const bool owner = tid < kPieceRows;
  const int r = tid % kPieceRows;
  const int n = owner ? lists.row_n[piece * kPieceRows + r] : -1;
  const bool huge = n > kRegularMax, regular = n >= 0 && !huge;
  const int lanes = lanes_of(n);
  {
    const auto* src = reinterpret_cast<const uint4*>(lists.counts + piece * kPieceRows * tiles);
    auto* to = reinterpret_cast<uint4*>(counts);
    for (int i = tid; i < tiles * (kPieceRows / 16); i += kFillThreads) to[i] = src[i];
  }
  long long total;
  const long long lane_start = before[0] + block_exclusive_scan<kFillWarps>(regular ? lanes : 0, scratch, total);
  const long long huge_index = before[1] + block_exclusive_scan<kFillWarps>(huge ? 1 : 0, scratch, total);
  const long long huge_lane = before[2] + block_exclusive_scan<kFillWarps>(huge ? lanes : 0, scratch, total);
  const long long group = lane_start / kGroupStride;
  if (owner) {
    const int chunk_len = lanes > 0 ? (n + lanes - 1) / lanes : 0;
    // Group offset inside this CTA (a group spans >= 31 rows, so < 10 here), then longest chunks first.
    row_key[r] = regular ? static_cast<int>(group - before[0] / kGroupStride) * 64 + (kChunk - chunk_len) : INT_MAX;
    row_sort_lanes[r] = regular ? lanes : 0;
    row_n[r] = n;
    row_lanes[r] = lanes;
  }
  __syncthreads();
  // The lanes of the rows sorted before row r: rows [0, 128) counted by its owner, [128, 256) by
  // thread r + 256.
  const int key = row_key[r];
  int sorted = 0;
  if (key != INT_MAX) {
    const int j0 = owner ? 0 : kPieceRows / 2;
    for (int j = j0; j < j0 + kPieceRows / 2; ++j) {
      const int kj = row_key[j];
      if (kj < key || (kj == key && j < r)) sorted += row_sort_lanes[j];
    }
    if (!owner) row_sorted_high[r] = sorted;
  }
  __syncthreads();
  if (owner && regular) {
    row_base[r] = group;
    row_lane[r] = static_cast<int>(before[0] + sorted + row_sorted_high[r] - group * kGroupStride);
  } else if (huge) {
    row_base[r] = huge_lane;
    row_lane[r] = 0;
    lists.huge_rows[huge_index] = make_longlong2(huge_lane, lanes);
  }
  const long long items_before = block_exclusive_scan<kFillWarps>(lanes, scratch, total);
  if (owner) row_items[r] = static_cast<int>(items_before) + lanes;
  __syncthreads();

  // One chunk (row j, lane k of the row) per thread at a time.
  const int items = static_cast<int>(total);
  for (int item = tid; item < items; item += kFillThreads) {
    int lo = 0, hi = kPieceRows - 1;  // the first row whose inclusive item count passes `item`
    while (lo < hi) {
      const int mid = (lo + hi) / 2;
      if (row_items[mid] > item) {
        hi = mid;
      } else {
        lo = mid + 1;
      }
    }
    const int j = lo;
    const int rn = row_n[j], rl = row_lanes[j];
    const int k = item - (row_items[j] - rl);
    const int q = rn / rl, rem = rn % rl;
    const int start = k * q + min(k, rem), len = q + (k < rem ? 1 : 0);
    std::uint32_t* dst;
    uint2* meta;
    int stride, lane;
    if (rn > kRegularMax) {
      const long long first = row_base[j];
      dst = lists.huge_words + first * kChunk;
      meta = lists.huge_meta + first + k;
      stride = rl;
      lane = k;
    } else {
      const long long g = row_base[j];
      lane = row_lane[j] + k;
      dst = lists.group_words + g * (kLanes * kChunk);
      meta = lists.group_meta + g * kLanes + lane;
      stride = kLanes;
    }

    // The chunk's slot words: addresses from the staged counts, all loads issued before any use.
    const std::uint32_t* row_slots = packed + (piece * kPieceRows + j) * pw + 1;
    const unsigned char* cnt = counts + j * tiles;
    std::uint32_t word[kChunk];
    int tile_of[kChunk];
    int t = 0, o = start;
#pragma unroll
    for (int i = 0; i < kChunk; ++i) {
      word[i] = 0;
      tile_of[i] = 0;
      if (i < len) {
        while (o >= cnt[t]) {
          o -= cnt[t];
          ++t;
        }
        tile_of[i] = t;
        word[i] = __ldg(row_slots + static_cast<std::int64_t>(t) * slots + o);
        ++o;
      }
    }
    // Tile-local columns to global ones; a column outside its tile (malformed A) reads the zero row.
#pragma unroll
    for (int i = 0; i < kChunk; ++i) {
      if (i < len) {
        const std::uint32_t col = TwellLayout::slot_column(word[i]);
        const int ti = tile_of[i];
        word[i] = col < static_cast<std::uint32_t>(layout.tile_cols(ti, k_cols))
                      ? (word[i] & 0xffff0000u) | (static_cast<std::uint32_t>(ti * layout.tile) + col)
                      : zero_word;
      }
    }
    write_chunk<kClasses>(word, len, lane, stride, zero_word, dst, my_scratch);
    *meta = make_uint2(static_cast<std::uint32_t>(piece * kPieceRows + j), lane_bits(k, rl, len));
  }
}

// ---- product -------------------------------------------------------------------------------------

template <class T>
__device__ __forceinline__ float entry_value(std::uint32_t word) {
  if constexpr (std::is_same_v<T, bf16>) {
    return __uint_as_float(word & 0xffff0000u);
  } else {
    return bits_to_f<T>(word >> 16);
  }
}

template <class T>
__device__ __forceinline__ void unpack(const uint4& v, float (&out)[8]) {
  unpack16<T>(v, out);
}
template <class T>
__device__ __forceinline__ void unpack(const uint2& v, float (&out)[4]) {
  out[0] = bits_to_f<T>(v.x & 0xffffu);
  out[1] = bits_to_f<T>(v.x >> 16);
  out[2] = bits_to_f<T>(v.y & 0xffffu);
  out[3] = bits_to_f<T>(v.y >> 16);
}

template <class T>
__device__ __forceinline__ std::uint32_t pack2(float lo, float hi) {
  return static_cast<std::uint32_t>(bits_of<T>(lo)) | static_cast<std::uint32_t>(bits_of<T>(hi)) << 16;
}
template <class T>
__device__ __forceinline__ void pack(const float (&v)[8], uint4& out) {
  out = make_uint4(pack2<T>(v[0], v[1]), pack2<T>(v[2], v[3]), pack2<T>(v[4], v[5]), pack2<T>(v[6], v[7]));
}
template <class T>
__device__ __forceinline__ void pack(const float (&v)[4], uint2& out) {
  out = make_uint2(pack2<T>(v[0], v[1]), pack2<T>(v[2], v[3]));
}

// Benchmark: bench/suites/spmm.cpp (the down projection: A 16384 x 5632 Hybrid(256, 16) at 0.5 %,
// B 5632 x 2048, C 16384 x 2048).
// Persistent: one CTA of 1024 threads per SM; the work items (row group, slice) are numbered group
// by group and each CTA takes an equal contiguous range of them, so it loads a group's entries
// once for its whole run of slices (a range spans one or two groups at the paper shape).
// A thread is one lane of the group: up to 32 entries of one row in registers (ent[], padded with
// the zero row's word); its row and role live in shared memory (lane_row, lane_info), since at 64
// registers the entries, 8 sums and the loads in flight leave no room. A warp holds 32 lanes: up
// to 32 rows of one chunk, or the chunks of fewer, longer rows. Per item the CTA has B's slice s
// (B' rows 0..K, 16 or 8 bytes each) in one of two shared buffers; the next slice is copied by
// the TMA engine (cp.async before sm_90) into the other while this one is used (one barrier per
// item: after it, slice s has landed and every warp is done with slice s - 1, whose buffer the
// copy of s + 1 reuses). Each lane then walks its entries, the warp to its longest lane by quads
// of 4 (straight-line code entered at the warp's length): per entry one shared load of the B row
// (16 bytes), kKc unpacks and kKc FMAs into acc[kKc] fp32; ptxas makes that 19.7 instructions
// per entry for bf16. A row's lanes are then summed by a shuffle tree inside the warp (only as
// many levels as the warp's longest row needs); the row's first lane finishes the row's piece of
// C (alpha/beta applied there; beta == 0 never reads C) and writes it, together with the piece of
// the adjacent slice where this CTA computes both (store_c). A row that crosses a warp boundary
// leaves one partial per warp in shared memory; its first lane adds them in warp order after the
// next barrier, then writes C.
// Cost model at the paper shape, 0.5 % uniform (462 k entries, 28 per row; ~19.4 k lanes, 20
// groups of ~830 rows; 256 slices of 8 columns; 132 SMs, ~39 items per CTA):
//   issue: per entry and slice ~20 instructions (column mask, address, LDS.128, value, 8 unpacks,
//   8 FFMA) on 118 M lane-entries / 32 / ~0.9 lockstep efficiency = 4.1 M warp-steps -> 82 M,
//   plus ~80 per warp and item (barrier, staging, reduction, C store) -> 13 M: ~95 M warp
//   instructions, ~0.095 ms at one per cycle and scheduler (1.9 GHz);
//   shared memory: a warp load of 32 random 16-byte rows takes 4 wavefronts when conflict-free;
//   simulated, if conflicts count per quarter warp, ~10.4 in column order and ~7 in write_chunk's
//   order (per whole warp: ~6.8 and ~5.5): 4.1 M x 7 / 132 SMs = ~0.11 ms. The two overlap;
//   expect ~0.1-0.12 ms, bound by shared-memory wavefronts or issue;
//   L2: B' staged 20 groups x 23 MB = 0.46 GB (~0.08 ms at ~5.5 TB/s, hidden by the double
//   buffer), entries 20 x 128 KB once, C 67 MB written in 32-byte pieces (see store_c).
//   Pre-pass: count ~11 MB of scattered slot-0 reads, fill ~12 MB of entry reads and 3 MB of
//   writes plus the 23 MB -> 23 MB copy of B: ~0.01 ms.
// Balance: every warp walks about its lanes' equal chunk lengths (sorted); a heavy token is one
// row of several lanes, never a longer walk for one lane; a row of > 1024 entries fills a CTA.
// Preconditions (spmm_slices_applies): 16-bit T; staged holds B' for this B (fill_kernel); B' slice
// bytes = padded_k * 2 kKc, double-buffered in dynamic shared memory; C 16-byte aligned with ldc
// a multiple of 8; `lists` written by the pre-pass for this A and shadow. Rows >= M and shadow rows
// belong to no group and are left untouched.
template <class T, int kKc>
__global__ void __launch_bounds__(kLanes, 1)
    slices_kernel(std::int64_t k_cols, std::int64_t pieces, Lists lists, const unsigned char* __restrict__ staged,
                  int slice_bytes, int slices, T* __restrict__ c, std::int64_t ldc, float alpha, float beta) {
  ::twell::detail::wait_for_prior_grids();
  using Piece = std::conditional_t<kKc == 8, uint4, uint2>;
  constexpr int kRowBytes = 2 * kKc;
  // Everything but the entries and the accumulators lives in shared memory and is read where it is
  // used: at 64 registers a thread holds 32 entries, 8 sums and the loads in flight, little else.
  extern __shared__ __align__(16) unsigned char stage[];  // [2][slice_bytes]
  __shared__ float parts[2][2][kCtaWarps][kKc];           // [parity][owner, continuation][warp][column]
  __shared__ int lane_row[kLanes];                        // the lane's row, -1: none
  __shared__ unsigned lane_info[kLanes];                  // see load_group
  __shared__ int warp_steps[kCtaWarps], warp_tree[kCtaWarps];
  __shared__ int sched[3];  // first and end item of this CTA, regular groups
  __shared__ Piece held[kLanes];  // a direct lane's piece of C for an even slice (store_c)
#if TWELL_SLICES_BULK_COPY
  __shared__ std::uint64_t slice_landed[2];  // each buffer's slice completes here
#endif
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const std::uint32_t zero_word = static_cast<std::uint32_t>(k_cols);

  if (warp == 0) {
    long long lanes_total = 0, huge_total = 0;
    for (std::int64_t p = lane; p < pieces; p += 32) {
      const int4 sums = lists.piece_sums[p];
      lanes_total += sums.x;
      huge_total += sums.y;
    }
#pragma unroll
    for (int d = 16; d > 0; d >>= 1) {
      lanes_total += __shfl_xor_sync(kFull, lanes_total, d);
      huge_total += __shfl_xor_sync(kFull, huge_total, d);
    }
    if (lane == 0) {
      // At most 2^31 - 1 items (spmm_slices_applies bounds the groups times the slices).
      const int regular_groups = static_cast<int>((lanes_total + kGroupStride - 1) / kGroupStride);
      const int items = (regular_groups + static_cast<int>(huge_total)) * slices;
      const int per = items / static_cast<int>(gridDim.x), extra = items % static_cast<int>(gridDim.x);
      const int bid = static_cast<int>(blockIdx.x);
      sched[0] = per * bid + min(bid, extra);
      sched[1] = sched[0] + per + (bid < extra ? 1 : 0);
      sched[2] = regular_groups;
    }
  }
#if TWELL_SLICES_BULK_COPY
  if (tid == 0) {
    mbar_init(&slice_landed[0], 1);
    mbar_init(&slice_landed[1], 1);
    mbar_init_fence();
  }
#endif
  __syncthreads();
  if (sched[0] >= sched[1]) return;

  // Starts the copy of slice `slice` into buffer `buf`, which every warp has left (behind a barrier).
  auto stage_slice = [&](int slice, int buf) {
    const unsigned char* src = staged + static_cast<std::int64_t>(slice) * slice_bytes;
    const std::uint32_t dst = shared_address(stage) + buf * slice_bytes;
#if TWELL_SLICES_BULK_COPY
    if (tid == 0) {
      fence_proxy_async_shared();
      // One copy of the whole slice (below the 2^20 - 1 bytes an mbarrier phase can expect).
      mbar_expect_tx(&slice_landed[buf], static_cast<std::uint32_t>(slice_bytes));
      bulk_copy_to_shared(dst, src, static_cast<std::uint32_t>(slice_bytes), &slice_landed[buf]);
    }
#else
    for (int i = tid * 16; i < slice_bytes; i += kLanes * 16) cp_async16(dst + i, src + i);
    cp_async_commit_group();
#endif
  };
  // Waits for the slice of item n (this CTA's n-th) in buffer n % 2; with cp.async, for this
  // thread's copies, which the barrier after it publishes to the CTA.
  auto wait_slice = [&](int n) {
#if TWELL_SLICES_BULK_COPY
    mbar_wait(&slice_landed[n & 1], static_cast<std::uint32_t>(n >> 1) & 1u);
#else
    (void)n;
    cp_async_wait_groups<0>();
#endif
  };

  // Loads the lane's entries of group gid and its state: lane_row, and lane_info = the end of the
  // row's lanes in this warp (bits 0-5), the row's last warp (6-10), whether the lane writes C
  // directly (11), owns a row that spans warps (12) or continues one (13); per warp, the entries
  // of its longest lane and the lanes of its longest row segment (read after the next barrier).
  constexpr unsigned kDirect = 1u << 11, kOwner = 1u << 12, kCont = 1u << 13;
  std::uint32_t ent[kChunk];
  auto load_group = [&](int gid) {
    const int regular_groups = sched[2];
    const uint4* words;
    const uint2* meta;
    int stride;
    if (gid < regular_groups) {
      words = reinterpret_cast<const uint4*>(lists.group_words + static_cast<std::int64_t>(gid) * (kLanes * kChunk));
      meta = lists.group_meta + static_cast<std::int64_t>(gid) * kLanes;
      stride = kLanes;
    } else {
      const longlong2 h = lists.huge_rows[gid - regular_groups];
      words = reinterpret_cast<const uint4*>(lists.huge_words + h.x * kChunk);
      meta = lists.huge_meta + h.x;
      stride = static_cast<int>(h.y);
    }
    const uint2 m = tid < stride ? __ldg(meta + tid) : make_uint2(0xffffffffu, 0u);
    const int row = static_cast<int>(m.x);
    const bool active = row >= 0;
    const int k = active ? static_cast<int>(m.y & 1023u) : 0;
    const int lanes = active ? static_cast<int>((m.y >> 10) & 1023u) + 1 : 1;
    const int len = active ? static_cast<int>((m.y >> 20) & 63u) : 0;
#pragma unroll
    for (int q = 0; q < kChunk / 4; ++q) {
      uint4 v = make_uint4(zero_word, zero_word, zero_word, zero_word);
      if (4 * q < len) v = __ldg(words + static_cast<std::int64_t>(q) * stride + tid);  // quads padded by write_chunk
      ent[4 * q] = v.x;
      ent[4 * q + 1] = v.y;
      ent[4 * q + 2] = v.z;
      ent[4 * q + 3] = v.w;
    }
    const unsigned steps = __reduce_max_sync(kFull, static_cast<unsigned>(len));
    const int first = lane - k, end = first + lanes;  // the row's lanes in this warp's numbering
    const int seg_end = min(end, 32);
    const unsigned tree = __reduce_max_sync(kFull, static_cast<unsigned>(seg_end - max(first, 0)));
    // The row's last lane is at most 1023 of the group, so its warp fits bits 6-10.
    unsigned info = static_cast<unsigned>(seg_end) | static_cast<unsigned>((warp * 32 + first + lanes - 1) >> 5) << 6;
    if (active && k == 0) info |= end <= 32 ? kDirect : kOwner;
    if (active && lane == 0 && k > 0) info |= kCont;
    lane_row[tid] = row;
    lane_info[tid] = info;
    if (lane == 0) {
      warp_steps[warp] = static_cast<int>(steps);
      warp_tree[warp] = static_cast<int>(tree);
    }
  };

  // The lane's piece of C at columns slice * kKc.. (alpha, beta applied). A direct lane holds the
  // piece of an even slice whose odd neighbour is this CTA's next item and writes both with that
  // one: C goes out in whole 32-byte sectors (kKc = 8, rows of C 32-byte aligned), not in halves
  // an item (~6 us) apart.
  // H100, paper shape, 0.5 %, M = 16384 (2026-11-27): spmm 0.346 -> 0.282 ms; the half-sector
  // writes had also held back the slices' bulk copies (docs/benchmarks/history.md, "Why each miss").
  enum class Pair { none, hold, with_held };
  auto store_c = [&](int slice, const float(&v)[kKc], Pair pair) {
    T* p = c + static_cast<std::int64_t>(lane_row[tid]) * ldc + slice * kKc;
    float out[kKc];
#pragma unroll
    for (int u = 0; u < kKc; ++u) out[u] = alpha * v[u];
    if (beta != 0.0f) {
      float old[kKc];
      unpack<T>(*reinterpret_cast<const Piece*>(p), old);
#pragma unroll
      for (int u = 0; u < kKc; ++u) out[u] = fmaf(beta, old[u], out[u]);
    }
    Piece o;
    pack<T>(out, o);
    if (pair == Pair::hold) {
      held[tid] = o;
      return;
    }
    if (pair == Pair::with_held) reinterpret_cast<Piece*>(p)[-1] = held[tid];
    reinterpret_cast<Piece*>(p)[0] = o;
  };
  // A row that spans warps: its first lane adds the warps' partials of item `parity`, in order.
  auto combine = [&](int parity, int slice) {
    const unsigned info = lane_info[tid];
    if ((info & kOwner) == 0) return;
    float sum[kKc];
#pragma unroll
    for (int u = 0; u < kKc; ++u) sum[u] = parts[parity][0][warp][u];
    const int last_warp = static_cast<int>(info >> 6) & 31;
#pragma unroll 1
    for (int w = warp + 1; w <= last_warp; ++w)
#pragma unroll
      for (int u = 0; u < kKc; ++u) sum[u] += parts[parity][1][w][u];
    store_c(slice, sum, Pair::none);
  };

  // Item it = g * slices + s of this CTA's range; a new group starts where s wraps to 0.
  int g = sched[0] / slices, s = sched[0] % slices;
  stage_slice(s, 0);
  for (;;) {
    const int it = g * slices + s;
    if (it >= sched[1]) break;
    const int n = it - sched[0];
    const int parity = n & 1;
    const int prev_slice = (s == 0 ? slices : s) - 1;
    if (n == 0 || s == 0) {
      if (n > 0) {
        __syncthreads();
        combine(parity ^ 1, prev_slice);  // with the old group's lanes, before they are replaced
      }
      load_group(g);
    }
    wait_slice(n);
    __syncthreads();
    if (n > 0 && s != 0) combine(parity ^ 1, prev_slice);
    if (it + 1 < sched[1]) stage_slice(s + 1 == slices ? 0 : s + 1, parity ^ 1);

    const std::uint32_t buf = static_cast<std::uint32_t>(__cvta_generic_to_shared(stage)) + parity * slice_bytes;
    float acc[kKc];
#pragma unroll
    for (int u = 0; u < kKc; ++u) acc[u] = 0.0f;
    auto quad = [&](int q) {
#pragma unroll
      for (int e = 4 * q; e < 4 * q + 4; ++e) {
        const std::uint32_t w = ent[e];
        Piece bv;
        load_shared(row_address<kRowBytes>(buf, w), bv);
        const float a = entry_value<T>(w);
        float bf[kKc];
        unpack<T>(bv, bf);
#pragma unroll
        for (int u = 0; u < kKc; ++u) acc[u] = fmaf(a, bf[u], acc[u]);
      }
    };
    // The warp's quads of entries, last first: one entry point per length and a single exit, so the
    // walk is straight-line code with no register moves where a shorter walk would have stopped.
    switch ((warp_steps[warp] + 3) / 4) {
      case 8:
        quad(7);
        [[fallthrough]];
      case 7:
        quad(6);
        [[fallthrough]];
      case 6:
        quad(5);
        [[fallthrough]];
      case 5:
        quad(4);
        [[fallthrough]];
      case 4:
        quad(3);
        [[fallthrough]];
      case 3:
        quad(2);
        [[fallthrough]];
      case 2:
        quad(1);
        [[fallthrough]];
      case 1:
        quad(0);
        [[fallthrough]];
      default:
        break;
    }
    // Sum each row's lanes inside the warp onto its first lane here (a fixed tree).
    const unsigned info = lane_info[tid];
    const int seg_end = static_cast<int>(info & 63u);
    const int tree = warp_tree[warp];
#pragma unroll
    for (int d = 1; d < 32; d <<= 1) {
      if (d >= tree) break;
#pragma unroll
      for (int u = 0; u < kKc; ++u) {
        const float x = __shfl_down_sync(kFull, acc[u], d);
        if (lane + d < seg_end) acc[u] += x;
      }
    }
    if (info & kDirect) {
      // Item it + 1 of this CTA is slice s + 1 of the same group, or item it - 1 held slice s - 1.
      const bool next_pairs = (s & 1) == 0 && s + 1 < slices && it + 1 < sched[1];
      const bool prev_held = (s & 1) == 1 && n > 0;
      store_c(s, acc, next_pairs ? Pair::hold : prev_held ? Pair::with_held : Pair::none);
    }
    if (info & (kOwner | kCont)) {
      float* part = parts[parity][(info & kOwner) ? 0 : 1][warp];
#pragma unroll
      for (int u = 0; u < kKc; ++u) part[u] = acc[u];
    }
    if (++s == slices) {
      s = 0;
      ++g;
    }
  }
  __syncthreads();
  const int last = sched[1] - 1;
  combine((last - sched[0]) & 1, last % slices);
}

// Columns of one staged slice: 8 when two slices of 8 fit beside the product kernel's static shared
// memory, else 4, else 0 (the path does not apply).
template <class T>
int slice_columns(std::int64_t k_cols) {
  constexpr const char* kLimitWhere = "twell::cuda::spmm (shared memory per block)";
  const std::int64_t k_pad = padded_k(k_cols);
  if (2 * k_pad * 16 <= ::twell::detail::dynamic_shared_limit(slices_kernel<T, 8>, kLimitWhere)) return 8;
  if (2 * k_pad * 8 <= ::twell::detail::dynamic_shared_limit(slices_kernel<T, 4>, kLimitWhere)) return 4;
  return 0;
}

template <class T, int kKc>
void launch(TwellView<const T> a, const std::int32_t* shadow, DenseView<const T> b, DenseView<T> c, float alpha,
            float beta, void* workspace, void* staged_b, cudaStream_t stream,
            const std::function<void()>& before_product, bool b_staged) {
  const Geometry geo = geometry(a.rows, a.cols, a.layout);
  const Lists lists = carve(workspace, geo);
  const int tiles = static_cast<int>(geo.tiles);
  const unsigned pieces = static_cast<unsigned>(geo.pieces);
  const int sms = multiprocessor_count("twell::cuda::spmm (multiprocessors)");

  ::twell::detail::launch_kernel_in_order("twell::cuda::spmm (slice pre-pass: counts)", count_kernel, pieces,
                                          kPieceRows, kPieceRows * tiles, stream, a.rows, a.cols, a.layout, a.packed,
                                          shadow, lists, geo.groups_max * kLanes);

  const int fill_shared = kPieceRows * tiles + kFillThreads * kScratch;
  auto fill = fill_kernel<kKc>;
  ::twell::detail::allow_dynamic_shared(fill, static_cast<std::size_t>(fill_shared),
                                        "twell::cuda::spmm (cudaFuncSetAttribute, slice pre-pass)");
  const std::int64_t k_pad = padded_k(a.cols);
  const std::int64_t copy_units = (k_pad + 7) / 8 * ((b.cols / kKc + 3) / 4);
  // One fill CTA fits an SM (registers). The copy takes the SMs that the row CTAs leave free, so
  // it runs beside them; when they leave fewer than a quarter of the SMs it takes a wave of its
  // own after them instead, since each copy CTA has an equal share of B' (H100, paper shape, the
  // copy alone: 27 us on 68 CTAs, 38 on 32, 222 on 4, 850 on 1; the rows take ~38 us).
  const std::int64_t free_sms = sms - static_cast<std::int64_t>(pieces);
  const std::int64_t copy_ctas = free_sms > 0 && free_sms >= sms / 4 ? free_sms : sms;
  const unsigned copy_blocks =
      b_staged
          ? 0u
          : static_cast<unsigned>(std::clamp<std::int64_t>((copy_units + kFillWarps - 1) / kFillWarps, 1, copy_ctas));
  ::twell::detail::launch_kernel("twell::cuda::spmm (slice pre-pass: chunks and B copy)", fill, pieces + copy_blocks,
                                 kFillThreads, fill_shared, stream, a.cols, a.layout, a.packed, lists, geo.pieces,
                                 reinterpret_cast<const std::uint16_t*>(b.data), b.ld, b.cols,
                                 static_cast<std::uint16_t*>(staged_b));
  if (before_product) before_product();

  const int slice_bytes = static_cast<int>(k_pad * 2 * kKc);
  // One bulk copy per slice completes on an mbarrier phase, which counts fewer than 2^20 bytes.
  require(slice_bytes < (1 << 20), ErrorCode::unsupported, kWhere, "a B slice of ", slice_bytes,
          " bytes is past what one mbarrier phase can expect");
  auto product = slices_kernel<T, kKc>;
  ::twell::detail::allow_dynamic_shared(product, static_cast<std::size_t>(2 * slice_bytes),
                                        "twell::cuda::spmm (cudaFuncSetAttribute, slice kernel)");
  ::twell::detail::launch_kernel("twell::cuda::spmm (slice kernel)", product, static_cast<unsigned>(sms), kLanes,
                                 2 * slice_bytes, stream, a.cols, geo.pieces, lists,
                                 static_cast<const unsigned char*>(staged_b), slice_bytes,
                                 static_cast<int>(b.cols / kKc), c.data, c.ld, alpha, beta);
}

}  // namespace

template <class T>
bool spmm_slices_applies(TwellView<const T> a, DenseView<const T> b, DenseView<T> c) {
  if constexpr (sizeof(T) != 2) {
    return false;
  } else {
    if (a.rows <= 0 || a.cols <= 0 || b.cols <= 0 || a.rows > kMaxRows || a.cols > kMaxCols) return false;
    const std::int64_t tiles = a.layout.tiles(a.cols);
    if (a.layout.tile > 256 || tiles > kMaxTiles || a.layout.capacity() * tiles > kMaxRowEntries) return false;
    if (!aligned16(b.data) || !aligned16(c.data) || b.ld % 8 != 0 || c.ld % 8 != 0) return false;
    const int kc = slice_columns<T>(a.cols);
    if (kc == 0 || b.cols % kc != 0) return false;
    const Geometry geo = geometry(a.rows, a.cols, a.layout);
    return (geo.groups_max + geo.huge_max) * (b.cols / kc) <= INT_MAX;  // work items are counted in int
  }
}

std::size_t spmm_slices_workspace_bytes(std::int64_t rows, std::int64_t cols, TwellLayout layout) {
  return geometry(rows, cols, layout).total;
}

std::size_t spmm_slices_staged_b_bytes(std::int64_t cols, std::int64_t b_cols) {
  return static_cast<std::size_t>(b_cols * padded_k(cols)) * 2;
}

template <class T>
void spmm_twell_slices(TwellView<const T> a, const std::int32_t* shadow, DenseView<const T> b, DenseView<T> c,
                       float alpha, float beta, void* workspace, void* staged_b, cudaStream_t stream,
                       const std::function<void()>& before_product, bool b_staged) {
  require(spmm_slices_applies(a, b, c), ErrorCode::invalid_argument, kWhere,
          "the slice-reuse TwELL kernel was called on operands it does not take");
  require(workspace != nullptr && aligned16(workspace) && staged_b != nullptr && aligned16(staged_b),
          ErrorCode::invalid_argument, kWhere, "the slice-reuse TwELL kernel needs 16-byte aligned workspaces");
  if constexpr (sizeof(T) == 2) {
    if (slice_columns<T>(a.cols) == 8) {
      launch<T, 8>(a, shadow, b, c, alpha, beta, workspace, staged_b, stream, before_product, b_staged);
    } else {
      launch<T, 4>(a, shadow, b, c, alpha, beta, workspace, staged_b, stream, before_product, b_staged);
    }
  }
}

#define TWELL_INSTANTIATE(T)                                                                                           \
  template bool spmm_slices_applies<T>(TwellView<const T>, DenseView<const T>, DenseView<T>);                          \
  template void spmm_twell_slices<T>(TwellView<const T>, const std::int32_t*, DenseView<const T>, DenseView<T>, float, \
                                     float, void*, void*, cudaStream_t, const std::function<void()>&, bool);
TWELL_INSTANTIATE(bf16)
TWELL_INSTANTIATE(fp16)
TWELL_INSTANTIATE(float)
#undef TWELL_INSTANTIATE

}  // namespace twell::cuda::detail
