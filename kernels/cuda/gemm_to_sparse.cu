// twell::cuda::gemm_to_sparse: Y = act(X W) written as TwELL/Hybrid straight from the GEMM
// epilogue (docs/gemm_to_sparse.md). Mainloop: mma.sync m16n8k16 (bf16/fp16 in, fp32
// accumulate) fed by ldmatrix from a cp.async multi-stage shared-memory pipeline; it runs on
// every sm_80+ device, Hopper included.
#include <algorithm>
#include <climits>
#include <cstdint>
#include <string>
#include <type_traits>
#include <vector>

#include <cuda_runtime.h>

#include <twell/converters/backends.hpp>
#include <twell/instantiate.hpp>
#include <twell/kernels/backends.hpp>

#include "cuda_check.hpp"
#include "gemm_to_sparse.cuh"

namespace twell::cuda {
namespace {

constexpr int kBM = 128;    // CTA rows
constexpr int kBK = 32;     // K per pipeline stage
constexpr int kStages = 4;  // cp.async pipeline depth
constexpr int kThreads = 256;
constexpr int kPad = 8;     // halves of padding per shared row: ldmatrix rows land in distinct banks
constexpr int kALd = kBK + kPad;

template <int BN>
constexpr int b_ld() {
  return BN + kPad;
}
template <int BN>
constexpr int smem_bytes() {
  return kStages * (kBM * kALd + kBK * b_ld<BN>()) * 2;
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
};

struct TwellOut {
  std::uint32_t* packed = nullptr;
  TwellLayout layout{};
  std::int32_t* row_flags = nullptr;              // set to 1 for a row with an overflowed tile
  unsigned long long* stored_total = nullptr;     // sum of true counts
  unsigned long long* excess_total = nullptr;     // sum of count - capacity over overflowed tiles
  bool clamp_count = false;                       // drop policy: slot 0 = min(count, capacity)
};

__device__ __forceinline__ float activate(Activation kind, float v) {
  switch (kind) {
    case Activation::relu: return v < 0.0f ? 0.0f : v;
    case Activation::silu: return v / (1.0f + expf(-v));
    case Activation::gelu: return 0.5f * v * (1.0f + erff(v * 0.70710678118654752f));
  }
  return v;
}

// The activated value with the threshold applied in fp32 (|a| <= threshold becomes 0), rounded
// once to T; a result that rounds to -0 comes out +0, so "stored" is simply "bits != 0". This is
// the reference's order: threshold in fp32, round, then keep what did not round to zero.
template <class T>
__device__ __forceinline__ T sparsified(float acc, Activation kind, float threshold) {
  float a = activate(kind, acc);
  if (fabsf(a) <= threshold) a = 0.0f;
  const T v = from_float<T>(a);
  return is_stored(v) ? v : from_float<T>(0.0f);
}

__device__ __forceinline__ void cp_async16(void* smem, const void* gmem, int src_bytes) {
  const auto s = static_cast<unsigned>(__cvta_generic_to_shared(smem));
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(s), "l"(gmem), "r"(src_bytes));
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::); }
template <int N>
__device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(N));
}

__device__ __forceinline__ void ldmatrix_x4(std::uint32_t (&r)[4], const void* smem) {
  const auto s = static_cast<unsigned>(__cvta_generic_to_shared(smem));
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(s));
}
__device__ __forceinline__ void ldmatrix_x4_trans(std::uint32_t (&r)[4], const void* smem) {
  const auto s = static_cast<unsigned>(__cvta_generic_to_shared(smem));
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(s));
}

template <class T>
__device__ __forceinline__ void mma16816(float (&d)[4], const std::uint32_t (&a)[4], std::uint32_t b0,
                                         std::uint32_t b1) {
  if constexpr (std::is_same_v<T, bf16>) {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
        "{%0, %1, %2, %3};\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
  } else {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
        "{%0, %1, %2, %3};\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
  }
}

// One pipeline stage: A is kBM x kBK (row-major, padded), B is kBK x BN (row-major, padded).
// K % 8 == 0 and N % 8 == 0 make every 16-byte chunk either fully inside or fully outside;
// outside chunks are zero-filled (src-size 0), so ragged edges contribute nothing.
template <int BN>
__device__ __forceinline__ void load_stage(const GemmArgs& g, std::uint16_t* as, std::uint16_t* bs, std::int64_t m0,
                                           std::int64_t n0, std::int64_t k0, int tid) {
  constexpr int kAChunksPerRow = kBK / 8;
#pragma unroll
  for (int i = 0; i < kBM * kAChunksPerRow / kThreads; ++i) {
    const int c = tid + i * kThreads;
    const int r = c / kAChunksPerRow;
    const int kc = (c % kAChunksPerRow) * 8;
    const std::int64_t gm = m0 + r;
    const std::int64_t gk = k0 + kc;
    const bool inside = gm < g.m && gk < g.k;
    const std::uint16_t* src = g.x;
    if (inside) {
      const std::int64_t row = g.x_rows != nullptr ? g.x_rows[gm] : gm;
      src = g.x + row * g.ldx + gk;
    }
    cp_async16(as + r * kALd + kc, src, inside ? 16 : 0);
  }
  constexpr int kBChunksPerRow = BN / 8;
#pragma unroll
  for (int i = 0; i < kBK * kBChunksPerRow / kThreads; ++i) {
    const int c = tid + i * kThreads;
    const int r = c / kBChunksPerRow;
    const int nc = (c % kBChunksPerRow) * 8;
    const std::int64_t gk = k0 + r;
    const std::int64_t gn = n0 + nc;
    const bool inside = gk < g.k && gn < g.n;
    cp_async16(bs + r * b_ld<BN>() + nc, inside ? g.w + gk * g.ldw + gn : g.w, inside ? 16 : 0);
  }
}

// Warps are laid out 2 (M) x 4 (N); a warp owns 64 x BN/4 of the CTA tile as 4 x BN/32
// m16n8 accumulator fragments.
template <class T, int BN>
__device__ __forceinline__ void mma_stage(const std::uint16_t* as, const std::uint16_t* bs,
                                          float (&acc)[4][BN / 32][4], int warp_m, int warp_n, int lane) {
  constexpr int kNi = BN / 32;
#pragma unroll
  for (int kk = 0; kk < kBK; kk += 16) {
    std::uint32_t a[4][4];
#pragma unroll
    for (int mi = 0; mi < 4; ++mi) {
      const int row = warp_m * 64 + mi * 16 + (lane & 15);
      ldmatrix_x4(a[mi], as + row * kALd + kk + (lane >> 4) * 8);
    }
    std::uint32_t b[kNi][2];
#pragma unroll
    for (int nj = 0; nj < kNi / 2; ++nj) {
      std::uint32_t r[4];
      const int col = warp_n * (BN / 4) + nj * 16 + (lane >> 4) * 8;
      ldmatrix_x4_trans(r, bs + (kk + (lane & 15)) * b_ld<BN>() + col);
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
  const int tid = static_cast<int>(threadIdx.x);
  const int lane = tid & 31;
  const int warp = tid >> 5;
  constexpr int kAStage = kBM * kALd;
  constexpr int kBStage = kBK * b_ld<BN>();
  std::uint16_t* a_base = smem;
  std::uint16_t* b_base = smem + kStages * kAStage;

#pragma unroll
  for (int mi = 0; mi < 4; ++mi)
#pragma unroll
    for (int ni = 0; ni < BN / 32; ++ni)
#pragma unroll
      for (int e = 0; e < 4; ++e) acc[mi][ni][e] = 0.0f;

  const int ktiles = static_cast<int>((g.k + kBK - 1) / kBK);
#pragma unroll
  for (int s = 0; s < kStages - 1; ++s) {
    if (s < ktiles) load_stage<BN>(g, a_base + s * kAStage, b_base + s * kBStage, m0, n0, std::int64_t{s} * kBK, tid);
    cp_async_commit();
  }
  for (int kt = 0; kt < ktiles; ++kt) {
    cp_async_wait<kStages - 2>();
    __syncthreads();  // stage kt landed for all threads; stage kt-1 is no longer read by anyone
    const int next = kt + kStages - 1;
    if (next < ktiles) {
      const int s = next % kStages;
      load_stage<BN>(g, a_base + s * kAStage, b_base + s * kBStage, m0, n0, std::int64_t{next} * kBK, tid);
    }
    cp_async_commit();
    const int s = kt % kStages;
    mma_stage<T, BN>(a_base + s * kAStage, b_base + s * kBStage, acc, warp >> 2, warp & 3, lane);
  }
  cp_async_wait<0>();
  __syncthreads();
}

// Fused GEMM + activation + TwELL packing. CTA: a 128-row block (blockIdx.y) times one TwELL
// tile of BN columns (blockIdx.x), so the (row, tile) slot groups it writes are its own and no
// CTA waits for another. 8 warps run the mainloop (2 x 4 warp grid); in the epilogue the CTA
// stages the activated tile in shared memory and each warp packs 16 of its rows: per 32-column
// chunk one ballot gives the stored lanes, a popc prefix their slot, so slots come out in
// column order. Every slot of every (row, tile) is written (unused ones zero), so the output
// needs no initialisation. Preconditions: T 16-bit, layout.tile == BN, K % 8 == 0,
// N % 8 == 0, 16-byte aligned x, w and leading dimensions; row_flags zeroed.
// Benchmark: bench/ (gemm_to_sparse vs cuBLAS).
template <class T, int BN>
__global__ void __launch_bounds__(kThreads) gemm_twell_kernel(GemmArgs g, TwellOut o) {
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
#pragma unroll
  for (int mi = 0; mi < 4; ++mi)
#pragma unroll
    for (int ni = 0; ni < BN / 32; ++ni)
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const int r = warp_m * 64 + mi * 16 + (lane >> 2) + h * 8;
        const int c = warp_n * (BN / 4) + ni * 8 + (lane & 3) * 2;
        const std::uint32_t lo = ValueTraits<T>::to_bits(sparsified<T>(acc[mi][ni][2 * h], g.kind, g.threshold));
        const std::uint32_t hi = ValueTraits<T>::to_bits(sparsified<T>(acc[mi][ni][2 * h + 1], g.kind, g.threshold));
        *reinterpret_cast<std::uint32_t*>(vals + r * kLd + c) = lo | (hi << 16);
      }
  __syncthreads();

  const int tile_cols = static_cast<int>(min(std::int64_t{BN}, g.n - n0));
  const int capacity = o.layout.capacity();
  const int slots = o.layout.slots();
  const std::uint32_t lanes_below = (1u << lane) - 1u;
  unsigned long long stored = 0, excess = 0;
  for (int r = warp; r < kBM; r += kThreads / 32) {
    const std::int64_t row = m0 + r;
    if (row >= g.m) break;
    std::uint32_t* out = o.packed + o.layout.slot_offset(row, tile, g.n);
    int count = 0;
#pragma unroll
    for (int c0 = 0; c0 < BN; c0 += 32) {
      const int col = c0 + lane;
      const std::uint16_t bits = vals[r * kLd + col];
      const bool here = bits != 0 && col < tile_cols;  // +0 marks "not stored" (sparsified)
      const std::uint32_t mask = __ballot_sync(0xffffffffu, here);
      const int pos = count + __popc(mask & lanes_below);
      if (here && pos < capacity) out[1 + pos] = TwellLayout::pack(bits, static_cast<std::uint32_t>(col));
      count += __popc(mask);
    }
    const int written = min(count, capacity);
    for (int s = 1 + written + lane; s < slots; s += 32) out[s] = 0u;
    if (lane == 0) {
      out[0] = static_cast<std::uint32_t>(o.clamp_count ? written : count);
      if (count > capacity) {
        o.row_flags[row] = 1;
        excess += static_cast<unsigned long long>(count - capacity);
      }
      stored += static_cast<unsigned long long>(count);
    }
  }
  if (lane == 0 && stored != 0) atomicAdd(o.stored_total, stored);
  if (lane == 0 && excess != 0) atomicAdd(o.excess_total, excess);
}

// Same mainloop, dense epilogue: out(i, j) = sparsified act of the product, for i < m, j < n.
// CTA: 128 (gathered) rows x BN columns. Preconditions as gemm_twell_kernel except the tile.
template <class T, int BN>
__global__ void __launch_bounds__(kThreads) gemm_dense_kernel(GemmArgs g, T* out, std::int64_t ldo) {
  extern __shared__ __align__(16) unsigned char smem_raw[];
  auto* smem = reinterpret_cast<std::uint16_t*>(smem_raw);
  const int lane = static_cast<int>(threadIdx.x) & 31;
  const int warp = static_cast<int>(threadIdx.x) >> 5;
  const std::int64_t n0 = std::int64_t{blockIdx.x} * BN;
  const std::int64_t m0 = std::int64_t{blockIdx.y} * kBM;
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

// One CTA of 1024 threads walks the row flags in order: row_to_overflow gets each flagged row's
// rank (or -1 for every row when !route), summary[0] the number of flagged rows and summary[1]
// the first flagged row (-1 if none). Deterministic; M is at most a few hundred thousand.
__global__ void __launch_bounds__(1024) overflow_scan_kernel(const std::int32_t* flags, std::int64_t m, bool route,
                                                             std::int32_t* row_to_overflow, std::int32_t* summary) {
  __shared__ std::int32_t warp_offset[32];
  __shared__ std::int32_t base;
  __shared__ std::int32_t first;
  const int tid = static_cast<int>(threadIdx.x);
  const int lane = tid & 31, warp = tid >> 5;
  if (tid == 0) {
    base = 0;
    first = INT_MAX;
  }
  __syncthreads();
  for (std::int64_t c0 = 0; c0 < m; c0 += 1024) {
    const std::int64_t i = c0 + tid;
    const bool flagged = i < m && flags[i] != 0;
    const std::uint32_t mask = __ballot_sync(0xffffffffu, flagged);
    if (lane == 0) warp_offset[warp] = __popc(mask);
    __syncthreads();
    if (warp == 0) {
      const std::int32_t own = warp_offset[lane];
      std::int32_t inclusive = own;
      for (int d = 1; d < 32; d <<= 1) {
        const std::int32_t up = __shfl_up_sync(0xffffffffu, inclusive, d);
        if (lane >= d) inclusive += up;
      }
      warp_offset[lane] = inclusive - own;
    }
    __syncthreads();
    const std::int32_t rank = base + warp_offset[warp] + __popc(mask & ((1u << lane) - 1u));
    if (i < m) row_to_overflow[i] = (route && flagged) ? rank : -1;
    if (flagged) atomicMin(&first, static_cast<std::int32_t>(i));
    __syncthreads();
    if (tid == 1023) base = rank + (flagged ? 1 : 0);
    __syncthreads();
  }
  if (tid == 0) {
    summary[0] = base;
    summary[1] = first == INT_MAX ? -1 : first;
  }
}

// Thread per row: overflow_to_row[row_to_overflow[i]] = i.
__global__ void invert_overflow_map_kernel(const std::int32_t* row_to_overflow, std::int64_t m,
                                           std::int32_t* overflow_to_row) {
  const std::int64_t i = std::int64_t{blockIdx.x} * blockDim.x + threadIdx.x;
  if (i < m && row_to_overflow[i] >= 0) overflow_to_row[row_to_overflow[i]] = static_cast<std::int32_t>(i);
}

__global__ void fill_kernel(std::int32_t* p, std::int64_t n, std::int32_t v) {
  const std::int64_t i = std::int64_t{blockIdx.x} * blockDim.x + threadIdx.x;
  if (i < n) p[i] = v;
}

// Shared memory a block may opt into on the current device (99 KB on sm_86/89, more on sm_80/90).
int smem_optin(const char* where) {
  int device = 0, bytes = 0;
  ::twell::detail::check_cuda(cudaGetDevice(&device), where);
  ::twell::detail::check_cuda(cudaDeviceGetAttribute(&bytes, cudaDevAttrMaxSharedMemoryPerBlockOptin, device), where);
  return bytes;
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

template <class Kernel>
void allow_smem(Kernel kernel, int bytes, const char* where) {
  ::twell::detail::check_cuda(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, bytes), where);
}

dim3 grid_for(std::int64_t m, std::int64_t n, int bm, int bn, const char* where) {
  const std::int64_t gx = (n + bn - 1) / bn, gy = (m + bm - 1) / bm;
  require(gy <= 65535, ErrorCode::unsupported, where, "M = ", m, " needs ", gy, " row blocks; at most 65535");
  return dim3(static_cast<unsigned>(gx), static_cast<unsigned>(gy));
}

void fill(std::int32_t* p, std::int64_t n, std::int32_t v, cudaStream_t stream, const char* where) {
  if (n == 0) return;
  fill_kernel<<<static_cast<unsigned>((n + 255) / 256), 256, 0, stream>>>(p, n, v);
  ::twell::detail::check_launch(where);
}

template <class T>
void check_operands(DenseView<const T> x, DenseView<const T> w, ActivationSpec act, const char* where) {
  require(x.space == MemorySpace::device && w.space == MemorySpace::device, ErrorCode::space_mismatch, where,
          "x and w must live in device memory (x: ", to_string(x.space), ", w: ", to_string(w.space), ")");
  require(x.rows >= 0 && x.cols >= 0 && w.rows >= 0 && w.cols >= 0, ErrorCode::invalid_argument, where,
          "negative shape: x ", x.rows, " x ", x.cols, ", w ", w.rows, " x ", w.cols);
  require(x.cols == w.rows, ErrorCode::shape_mismatch, where, "x is ", x.rows, " x ", x.cols, " but w is ", w.rows,
          " x ", w.cols, " (x.cols must equal w.rows)");
  require((x.rows == 0 || x.ld >= x.cols) && (w.rows == 0 || w.ld >= w.cols), ErrorCode::invalid_argument, where,
          "leading dimension below the column count: x.ld = ", x.ld, ", w.ld = ", w.ld);
  require((x.rows * x.cols == 0 || x.data != nullptr) && (w.rows * w.cols == 0 || w.data != nullptr),
          ErrorCode::invalid_argument, where, "null data pointer for a non-empty operand");
  require(act.kind == Activation::relu || act.kind == Activation::silu || act.kind == Activation::gelu,
          ErrorCode::invalid_argument, where, "activation kind ", static_cast<int>(act.kind), " is unknown");
  require(act.threshold >= 0.0f, ErrorCode::invalid_argument, where, "activation threshold ", act.threshold,
          " must be a non-negative number");
  require(x.rows <= INT32_MAX, ErrorCode::unsupported, where, "M = ", x.rows, " exceeds the 32-bit row maps");
}

// Any layout: a dense activated product, then the cuda dense -> TwELL/Hybrid converter.
template <class T>
HybridMatrix<T> generic_path(DenseView<const T> x, DenseView<const T> w, ActivationSpec act, TwellLayout layout,
                             const ConvertOptions& convert, const KernelOptions& options, const char* where) {
  const auto stream = static_cast<cudaStream_t>(options.stream.handle);
  DenseMatrix<T> dense(x.rows, w.cols, MemorySpace::device);
  std::string path = detail::gemm_activate_dense<T>(x, nullptr, x.rows, w, act, dense.view(), stream);
  ConvertOptions c = convert;
  c.threshold = 0.0f;  // the threshold was applied in fp32 by the GEMM's epilogue
  c.stream = options.stream;
  HybridMatrix<T> result;
  if (convert.overflow == OverflowPolicy::hybrid) {
    result = dense_to_hybrid<T>(DenseView<const T>(dense.view()), layout, c);
    path += "+dense_to_hybrid";
  } else {
    TwellMatrix<T> t = dense_to_twell<T>(DenseView<const T>(dense.view()), layout, c);
    result = HybridMatrix<T>(x.rows, w.cols, layout, 0, MemorySpace::device);
    result.twell() = std::move(t);
    fill(result.row_to_overflow().data(), x.rows, -1, stream, where);
    path += "+dense_to_twell";
  }
  if (options.report != nullptr) options.report->path = "generic:" + path;
  return result;
}

template <class T, int BN>
void launch_twell(const GemmArgs& g, const TwellOut& o, cudaStream_t stream, const char* where) {
  constexpr int kSmem = smem_bytes<BN>();
  static_assert(kBM * (BN + kPad) * 2 <= kSmem, "the epilogue tile must fit in the pipeline's shared memory");
  allow_smem(gemm_twell_kernel<T, BN>, kSmem, where);
  gemm_twell_kernel<T, BN><<<grid_for(g.m, g.n, kBM, BN, where), kThreads, kSmem, stream>>>(g, o);
  ::twell::detail::check_launch(where);
}

template <class T>
HybridMatrix<T> fused_path(DenseView<const T> x, DenseView<const T> w, ActivationSpec act, TwellLayout layout,
                           const ConvertOptions& convert, const KernelOptions& options, const char* where) {
  const auto stream = static_cast<cudaStream_t>(options.stream.handle);
  const std::int64_t m = x.rows, n = w.cols;
  HybridMatrix<T> result(m, n, layout, 0, MemorySpace::device);
  Buffer<std::int32_t> flags(static_cast<std::size_t>(m), MemorySpace::device);
  Buffer<std::uint64_t> totals(2, MemorySpace::device);
  Buffer<std::int32_t> summary(2, MemorySpace::device);
  static_assert(sizeof(std::uint64_t) == sizeof(unsigned long long));
  // Buffer zero-fills on the legacy stream; clear again on `stream` so the order is explicit.
  if (m > 0) ::twell::detail::check_cuda(cudaMemsetAsync(flags.data(), 0, flags.bytes(), stream), where);
  ::twell::detail::check_cuda(cudaMemsetAsync(totals.data(), 0, totals.bytes(), stream), where);

  const GemmArgs g = make_args<T>(x, nullptr, m, w, act);
  TwellOut o;
  o.packed = result.twell().packed().data();
  o.layout = layout;
  o.row_flags = flags.data();
  o.stored_total = reinterpret_cast<unsigned long long*>(totals.data());
  o.excess_total = o.stored_total + 1;
  o.clamp_count = convert.overflow == OverflowPolicy::drop;
  if (m > 0 && n > 0) {
    if (layout.tile == 128) {
      launch_twell<T, 128>(g, o, stream, where);
    } else {
      launch_twell<T, 256>(g, o, stream, where);
    }
  }
  const bool route = convert.overflow == OverflowPolicy::hybrid;
  overflow_scan_kernel<<<1, 1024, 0, stream>>>(flags.data(), m, route, result.row_to_overflow().data(),
                                                summary.data());
  ::twell::detail::check_launch(where);

  std::int32_t host_summary[2] = {0, -1};
  std::uint64_t host_totals[2] = {0, 0};
  ::twell::detail::check_cuda(cudaMemcpyAsync(host_summary, summary.data(), sizeof host_summary, cudaMemcpyDeviceToHost, stream),
                     where);
  ::twell::detail::check_cuda(cudaMemcpyAsync(host_totals, totals.data(), sizeof host_totals, cudaMemcpyDeviceToHost, stream),
                     where);
  ::twell::detail::check_cuda(cudaStreamSynchronize(stream), where);
  const std::int32_t overflowed = host_summary[0];

  if (convert.overflow == OverflowPolicy::error && overflowed > 0) {
    const std::int64_t row = host_summary[1];
    std::vector<std::uint32_t> packed(static_cast<std::size_t>(result.twell().packed_width()));
    ::twell::detail::check_cuda(cudaMemcpy(packed.data(), result.twell().packed().data() + row * result.twell().packed_width(),
                                  packed.size() * sizeof(std::uint32_t), cudaMemcpyDeviceToHost),
                       where);
    std::int64_t t = 0;
    while (t + 1 < layout.tiles(n) && !layout.overflows(packed[static_cast<std::size_t>(t * layout.slots())])) ++t;
    fail(ErrorCode::overflow, where, "row ", row, ", tile ", t, " has ", packed[static_cast<std::size_t>(t * layout.slots())],
         " nonzeros but TwELL(tile ", layout.tile, ", C ", layout.compression, ") holds ", layout.capacity(),
         " per (row, tile); ", overflowed, " rows overflow (use OverflowPolicy::hybrid or drop)");
  }
  std::string path = layout.tile == 128 ? "fused_mma_sync_tile128" : "fused_mma_sync_tile256";
  if (route && overflowed > 0) {
    result.overflow() = DenseMatrix<T>(overflowed, n, MemorySpace::device);
    result.overflow_to_row() = Buffer<std::int32_t>(static_cast<std::size_t>(overflowed), MemorySpace::device);
    invert_overflow_map_kernel<<<static_cast<unsigned>((m + 255) / 256), 256, 0, stream>>>(
        result.row_to_overflow().data(), m, result.overflow_to_row().data());
    ::twell::detail::check_launch(where);
    path += "+overflow:" + detail::gemm_activate_dense<T>(x, result.overflow_to_row().data(), overflowed, w, act,
                                                           result.overflow().view(), stream);
  }
  if (convert.report != nullptr) {
    const auto stored = static_cast<std::int64_t>(host_totals[0]);
    const auto excess = static_cast<std::int64_t>(host_totals[1]);
    convert.report->nnz = convert.overflow == OverflowPolicy::drop ? stored - excess : stored;
    convert.report->dropped = convert.overflow == OverflowPolicy::drop ? excess : 0;
    convert.report->overflow_rows = route ? overflowed : 0;
  }
  if (options.report != nullptr) options.report->path = path;
  return result;
}

}  // namespace

namespace detail {

template <class T>
std::string gemm_activate_dense(DenseView<const T> x, const std::int32_t* rows, std::int64_t m, DenseView<const T> w,
                                ActivationSpec act, DenseView<T> out, cudaStream_t stream) {
  constexpr const char* kWhere = "twell::cuda::gemm_to_sparse (dense GEMM)";
  if (m == 0 || w.cols == 0) return "empty";
  if (tensor_core_ok<T>(x, w) && smem_bytes<128>() <= smem_optin(kWhere)) {
    if constexpr (ValueTraits<T>::packs_in_slot) {
      constexpr int kSmem = smem_bytes<128>();
      allow_smem(gemm_dense_kernel<T, 128>, kSmem, kWhere);
      gemm_dense_kernel<T, 128><<<grid_for(m, w.cols, kBM, 128, kWhere), kThreads, kSmem, stream>>>(
          make_args<T>(x, rows, m, w, act), out.data, out.ld);
      ::twell::detail::check_launch(kWhere);
      return "mma_sync_dense";
    }
  }
  gemm_simt_kernel<T><<<grid_for(m, w.cols, 64, 64, kWhere), 256, 0, stream>>>(
      x.data, x.ld, rows, w.data, w.ld, m, w.cols, x.cols, act.kind, act.threshold, out.data, out.ld);
  ::twell::detail::check_launch(kWhere);
  return "simt_dense";
}

}  // namespace detail

template <Value T>
HybridMatrix<T> gemm_to_sparse(DenseView<const T> x, DenseView<const T> w, ActivationSpec act, TwellLayout layout,
                               const ConvertOptions& convert, const KernelOptions& options) {
  constexpr const char* kWhere = "twell::cuda::gemm_to_sparse";
  check_operands<T>(x, w, act, kWhere);
  check_layout(layout, kWhere);
  require(convert.overflow == OverflowPolicy::error || convert.overflow == OverflowPolicy::hybrid ||
              convert.overflow == OverflowPolicy::drop,
          ErrorCode::invalid_argument, kWhere, "convert.overflow ", static_cast<int>(convert.overflow), " is unknown");
  if constexpr (ValueTraits<T>::packs_in_slot) {
    const int need = layout.tile == 128 ? smem_bytes<128>() : smem_bytes<256>();
    if ((layout.tile == 128 || layout.tile == 256) && tensor_core_ok<T>(x, w) && need <= smem_optin(kWhere))
      return fused_path<T>(x, w, act, layout, convert, options, kWhere);
  }
  return generic_path<T>(x, w, act, layout, convert, options, kWhere);
}

#define TWELL_INSTANTIATE(T)                                                                                       \
  template HybridMatrix<T> gemm_to_sparse<T>(DenseView<const T>, DenseView<const T>, ActivationSpec, TwellLayout,  \
                                             const ConvertOptions&, const KernelOptions&);                         \
  template std::string detail::gemm_activate_dense<T>(DenseView<const T>, const std::int32_t*, std::int64_t,       \
                                                      DenseView<const T>, ActivationSpec, DenseView<T>, cudaStream_t);
TWELL_FOR_EACH_VALUE_TYPE(TWELL_INSTANTIATE)
#undef TWELL_INSTANTIATE

}  // namespace twell::cuda
