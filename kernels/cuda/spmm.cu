// cuda spmm: C = alpha * op(A) * B + beta * C for CSR, ELL, TwELL and Hybrid A.
// op = none runs the format's own kernel (TwELL and Hybrid: the pair-balanced kernel below, the
// tile-streaming kernel of spmm_stream.cu or the slice-reuse pre-pass and product of
// spmm_slices.cu, by rows and layout (choose_twell_path) or as KernelOptions::spmm_algorithm asks;
// Hybrid overflow rows by cuBLAS); SpmmPlan runs the same paths on workspace it owns, its Hybrid
// overflow rows on a stream of its own beside the tile-streaming and pair-balanced kernels, and,
// with op transpose and several products at once, A^T's dense rows beside the products and
// slice-reuse products' pre-passes side by side, on streams of their own.
// op = transpose transposes a 16-bit TwELL or Hybrid of at most 32 slots per 256 columns into a
// Hybrid directly (transpose_twell.cu) and runs the op-none Hybrid path on it (path
// ".../via_transpose+<path>"); other operands are converted to CSR, transposed (stable radix
// sort, deterministic), and the CSR kernel runs on A^T (path ".../via_csr_transpose").
// Every path is deterministic: each output element is summed in a fixed order, without atomics.
#include <algorithm>
#include <array>
#include <bit>
#include <cstdint>
#include <functional>
#include <optional>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include <cublas_v2.h>

#include <twell/converters/backends.hpp>
#include <twell/instantiate.hpp>
#include <twell/kernels/backends.hpp>
#include <twell/kernels/spmm_plan.hpp>

#include "../../converters/cuda/row_builders.cuh"
#include "../../converters/cuda/warp_scan.cuh"
#include "cuda_launch.cuh"
#include "device_pool.hpp"
#include "read_back.cuh"
#include "sparse_common.cuh"
#include "spmm_slices.cuh"
#include "spmm_stream.cuh"
#include "transpose_twell.cuh"
#include "vec16.cuh"

namespace twell::cuda {

namespace {

// A non-blocking stream beside a plan's stream (with its priority), and the events that make it
// start after work queued elsewhere and make other streams wait for it.
class SideStream {
 public:
  SideStream() = default;
  SideStream(const SideStream&) = delete;
  SideStream& operator=(const SideStream&) = delete;
  ~SideStream() { release(); }

  // Creates the stream and events; on an error, returns it and holds nothing.
  cudaError_t create(cudaStream_t plan_stream) {
    int priority = 0;
    cudaError_t status = cudaStreamGetPriority(plan_stream, &priority);
    if (status == cudaSuccess) status = cudaStreamCreateWithPriority(&stream_, cudaStreamNonBlocking, priority);
    if (status == cudaSuccess) status = cudaEventCreateWithFlags(&forked_, cudaEventDisableTiming);
    if (status == cudaSuccess) status = cudaEventCreateWithFlags(&done_, cudaEventDisableTiming);
    if (status != cudaSuccess) release();
    return status;
  }
  cudaStream_t stream() const { return stream_; }
  // This stream's next work comes after everything queued on `from` so far.
  void fork(cudaStream_t from) const {
    detail::check_cuda(cudaEventRecord(forked_, from), "twell::cuda::SpmmPlan (fork to a side stream)");
    detail::check_cuda(cudaStreamWaitEvent(stream_, forked_), "twell::cuda::SpmmPlan (fork to a side stream)");
  }
  // `into`'s next work comes after everything queued on this stream so far.
  void join(cudaStream_t into) const {
    detail::check_cuda(cudaEventRecord(done_, stream_), "twell::cuda::SpmmPlan (join a side stream)");
    detail::check_cuda(cudaStreamWaitEvent(into, done_), "twell::cuda::SpmmPlan (join a side stream)");
  }

 private:
  // A stream or event with work pending is released when the work ends. Failures cannot be
  // reported from a destructor.
  void release() noexcept {
    if (done_ != nullptr) cudaEventDestroy(done_);
    if (forked_ != nullptr) cudaEventDestroy(forked_);
    if (stream_ != nullptr) cudaStreamDestroy(stream_);
    done_ = forked_ = nullptr;
    stream_ = nullptr;
  }

  cudaStream_t stream_ = nullptr;
  cudaEvent_t forked_ = nullptr, done_ = nullptr;
};

}  // namespace

// An SpmmPlan's side streams: the side lane proper, with a cuBLAS handle bound to it for good
// (one handle per stream keeps cuBLAS's choice of kernel, and so its bits, the same on every run),
// for overflow and dense rows; and one stream for each product on A^T past the first, for
// slice-reuse products whose pre-passes run side by side.
struct detail::SpmmSideLane {
  explicit SpmmSideLane(cudaStream_t plan_stream) {
    constexpr const char* where = "twell::cuda::SpmmPlan (side streams)";
    check_cuda(cudaGetDevice(&device), where);
    try {
      check_cuda(side.create(plan_stream), where);
      for (SideStream& lane : products) check_cuda(lane.create(plan_stream), where);
      check_cublas(
          twell::detail::retry_after_trim([&] { return cublasCreate(&blas); }, CUBLAS_STATUS_ALLOC_FAILED, where),
          where);
      check_cublas(cublasSetStream(blas, side.stream()), where);
    } catch (...) {
      release();
      throw;
    }
  }
  SpmmSideLane(const SpmmSideLane&) = delete;
  SpmmSideLane& operator=(const SpmmSideLane&) = delete;
  ~SpmmSideLane() { release(); }

  // The side lane's next work comes after everything queued on `stream` so far.
  void fork(cudaStream_t stream) const { side.fork(stream); }
  // Queues work(side stream, its cuBLAS handle), then makes `stream`'s later work wait for it, also
  // when `work` throws after queuing part of it.
  template <class Work>
  void run(Work&& work, cudaStream_t stream) const {
    try {
      work(side.stream(), blas);
    } catch (...) {
      side.join(stream);
      throw;
    }
    side.join(stream);
  }

  // Streams for products 1 and 2 of a batch on A^T (product 0 runs on the plan's stream).
  std::array<SideStream, detail::kMaxStreamBatch - 1> products;

 private:
  // cublasDestroy waits for the device. It wants the handle's device current, and a plan may be
  // destroyed with another one current (plans made one per device, then destroyed together).
  void release() noexcept {
    if (blas == nullptr) return;
    int current = device;
    bool switched = false;
    if (cudaGetDevice(&current) == cudaSuccess && current != device) {
      switched = cudaSetDevice(device) == cudaSuccess;
      // A failed switch leaves the handle destroyed where it is, as before, and no error behind.
      if (!switched) cudaGetLastError();
    }
    cublasDestroy(blas);
    if (switched) cudaSetDevice(current);
    blas = nullptr;
  }

  int device = 0;  // the plan's
  SideStream side;
  cublasHandle_t blas = nullptr;
};

void detail::SpmmSideLaneDeleter::operator()(SpmmSideLane* lane) const noexcept { delete lane; }

namespace {

constexpr const char* kWhere = "twell::cuda::spmm";
constexpr int kWarps = 8;
constexpr int kThreads = kWarps * 32;
// CSR rows of more entries than this take a CTA per column slice (long_row_spmm_kernel), not a warp:
// a warp walks a row once per 32 * V-column chunk, so past ~128 entries its chain outlasts the
// typical row's by more than the CTA's 8 warps cost. kLongRowCtas: that kernel's grid, which
// strides over all (row, chunk) pairs, checking 32 at a time, and skips the short rows.
constexpr std::int64_t kLongRow = 128;
constexpr unsigned kLongRowCtas = 2048;

// ---- per-lane column chunks --------------------------------------------------------------------
// A lane owns V consecutive output columns of its warp's slice (V * sizeof(T) == 16 bytes when the
// operands allow 16-byte accesses, V == 1 otherwise).

template <class T, int V, bool kVec>
__device__ __forceinline__ void load_chunk(const T* p, std::int64_t valid, float (&out)[V]) {
  if constexpr (kVec) {
    detail::unpack16<T>(__ldg(reinterpret_cast<const uint4*>(p)), out);
  } else {
#pragma unroll
    for (int u = 0; u < V; ++u) out[u] = u < valid ? detail::load_f(p + u) : 0.0f;
  }
}

// C chunk = alpha * acc + beta * C chunk; beta == 0 never reads C.
template <class T, int V, bool kVec>
__device__ __forceinline__ void store_chunk(T* p, std::int64_t valid, const float (&acc)[V], float alpha, float beta) {
  float v[V];
  if (beta != 0.0f) {
    float old[V];
    if constexpr (kVec) {
      load_chunk<T, V, true>(p, V, old);
    } else {
#pragma unroll
      for (int u = 0; u < V; ++u) old[u] = u < valid ? detail::load_f(p + u) : 0.0f;
    }
#pragma unroll
    for (int u = 0; u < V; ++u) v[u] = alpha * acc[u] + beta * old[u];
  } else {
#pragma unroll
    for (int u = 0; u < V; ++u) v[u] = alpha * acc[u];
  }
  if constexpr (kVec) {
    uint4 o;
    if constexpr (std::is_same_v<T, float>) {
      o = make_uint4(__float_as_uint(v[0]), __float_as_uint(v[1]), __float_as_uint(v[2]), __float_as_uint(v[3]));
    } else {
      std::uint32_t w[4];
#pragma unroll
      for (int q = 0; q < 4; ++q)
        w[q] = static_cast<std::uint32_t>(detail::bits_of<T>(v[2 * q])) |
               (static_cast<std::uint32_t>(detail::bits_of<T>(v[2 * q + 1])) << 16);
      o = make_uint4(w[0], w[1], w[2], w[3]);
    }
    *reinterpret_cast<uint4*>(p) = o;
  } else {
#pragma unroll
    for (int u = 0; u < V; ++u)
      if (u < valid) detail::store_f(p + u, v[u]);
  }
}

// acc += values[e] * B(col_idx[e], lane's columns) for entries [begin, end) in order; b points at
// the lane's first column of B row 0. Columns outside [0, k_cols) are skipped, never read.
template <class T, int V, bool kVec>
__device__ __forceinline__ void add_entries(const std::int32_t* col_idx, const T* values, std::int64_t begin,
                                            std::int64_t end, std::int64_t k_cols, const T* b, std::int64_t ldb,
                                            std::int64_t valid, float (&acc)[V]) {
  for (std::int64_t e = begin; e < end; ++e) {
    const std::int64_t k = col_idx[e];
    if (k < 0 || k >= k_cols) continue;
    const float a = detail::load_f(values + e);
    float bv[V];
    load_chunk<T, V, kVec>(b + k * ldb, valid, bv);
#pragma unroll
    for (int u = 0; u < V; ++u) acc[u] = fmaf(a, bv[u], acc[u]);
  }
}

// ---- CSR and ELL: one warp per row -------------------------------------------------------------
// Benchmark: bench/suites/spmm.cpp. A warp owns one row of A and, in turn, every
// 32 * V-column chunk of that row of C; a lane owns V consecutive columns of the chunk and sums
// the row's entries in stored order. Rows of more than `long_row` entries are left to
// long_row_spmm_kernel. Preconditions: valid CSR/ELL (out-of-range columns are skipped, never
// read); for kVec, B and C 16-byte aligned with ld and cols multiples of V.
template <class T, int V, bool kVec, bool kEll>
__global__ void __launch_bounds__(kThreads)
    row_spmm_kernel(std::int64_t rows, const std::int64_t* row_ptr, const std::int32_t* row_count, std::int64_t width,
                    const std::int32_t* col_idx, const T* values, std::int64_t long_row, std::int64_t k_cols,
                    const T* b, std::int64_t ldb, T* c, std::int64_t ldc, std::int64_t nb, float alpha, float beta) {
  ::twell::detail::wait_for_prior_grids();
  const int lane = threadIdx.x & 31;
  const std::int64_t warps = static_cast<std::int64_t>(gridDim.x) * kWarps;
  for (std::int64_t i = static_cast<std::int64_t>(blockIdx.x) * kWarps + threadIdx.x / 32; i < rows; i += warps) {
    std::int64_t begin, end;
    if constexpr (kEll) {
      begin = i * width;
      end = begin + min(max(static_cast<std::int64_t>(row_count[i]), std::int64_t{0}), width);
    } else {
      begin = row_ptr[i];
      end = row_ptr[i + 1];
    }
    if (end - begin > long_row) continue;
    for (std::int64_t c0 = 0; c0 < nb; c0 += 32 * V) {
      const std::int64_t col = c0 + lane * V;
      const std::int64_t valid = nb - col;
      float acc[V] = {};
      if (valid > 0) {
        add_entries<T, V, kVec>(col_idx, values, begin, end, k_cols, b + col, ldb, valid, acc);
        store_chunk<T, V, kVec>(c + i * ldc + col, valid, acc, alpha, beta);
      }
    }
  }
}

// The CSR rows the row kernel leaves (more than long_row entries): a CTA per (row, 32 * V-column
// chunk), the row's entries cut into kWarps equal ranges, the warps' partial sums added in warp
// order through shared memory (deterministic). Rows far longer than the mean, such as the rows of
// A^T for op(A) = A^T, whose lengths follow the units' firing rates (~60x the mean on skewed
// workloads), then cost a CTA what a warp per row would pay alone: 9.8-10.4 ms against 0.84-0.98
// for the same entries spread evenly (H200, 2026-11-24, paper shape, M = 16384).
template <class T, int V, bool kVec>
__global__ void __launch_bounds__(kThreads)
    long_row_spmm_kernel(std::int64_t rows, const std::int64_t* row_ptr, const std::int32_t* col_idx, const T* values,
                         std::int64_t long_row, std::int64_t k_cols, const T* b, std::int64_t ldb, T* c,
                         std::int64_t ldc, std::int64_t nb, float alpha, float beta) {
  ::twell::detail::wait_for_prior_grids();
  __shared__ float part[kWarps][32 * V];
  __shared__ unsigned long_items;
  const int lane = threadIdx.x & 31, warp = threadIdx.x / 32;
  const std::int64_t chunks = (nb + 32 * V - 1) / (32 * V), items = rows * chunks;
  // This CTA's (row, chunk) items are blockIdx.x + gridDim.x * j (a long row's chunks go to
  // different CTAs), 32 values of j at a time: warp 0 finds the long ones in one round of loads
  // (most matrices have none, and a serial walk would pay a load latency per item).
  const auto item = [&](std::int64_t j) { return blockIdx.x + static_cast<std::int64_t>(gridDim.x) * j; };
  for (std::int64_t base = 0; item(base) < items; base += 32) {
    if (warp == 0) {
      const std::int64_t w = item(base + lane);
      const bool is_long = w < items && row_ptr[w / chunks + 1] - row_ptr[w / chunks] > long_row;
      const unsigned found = __ballot_sync(0xffffffffu, is_long);
      if (lane == 0) long_items = found;
    }
    __syncthreads();
    unsigned todo = long_items;
    __syncthreads();  // long_items is rewritten by the next round
    for (; todo != 0; todo &= todo - 1) {
      const std::int64_t w = item(base + __ffs(todo) - 1);
      const std::int64_t r = w / chunks, rs = row_ptr[r], len = row_ptr[r + 1] - rs;
      const std::int64_t col = (w % chunks) * 32 * V + lane * V, valid = nb - col;
      float acc[V] = {};
      if (valid > 0) {
        add_entries<T, V, kVec>(col_idx, values, rs + len * warp / kWarps, rs + len * (warp + 1) / kWarps, k_cols,
                                b + col, ldb, valid, acc);
      }
#pragma unroll
      for (int u = 0; u < V; ++u) part[warp][lane * V + u] = acc[u];
      __syncthreads();
      if (warp == 0 && valid > 0) {
        float sum[V] = {};
        for (int q = 0; q < kWarps; ++q)
#pragma unroll
          for (int u = 0; u < V; ++u) sum[u] += part[q][lane * V + u];
        store_chunk<T, V, kVec>(c + r * ldc + col, valid, sum, alpha, beta);
      }
      __syncthreads();
    }
  }
}

// ---- TwELL (and the TwELL part of a Hybrid) ------------------------------------------------------
// Benchmark: bench/suites/spmm.cpp (the down projection: A M x 5632 TwELL at 0.5 %, B 5632 x 2048).
// A CTA owns a block of `block_rows` rows of A and one 32 * V-column slice of C. It reads the
// block's (row, tile) counts, prefix-sums them in shared memory, and cuts the block's entries
// into kWarps equal ranges: a warp owns a range of (row, entry) pairs, not rows, so a token with
// many nonzeros is spread over the CTA's warps. A lane owns V columns of the slice and
// accumulates in fp32 registers; rows wholly inside one warp's range are written by that warp,
// rows split between warps leave per-warp partials in shared memory that the epilogue adds in
// warp order (deterministic). Entries are read straight from the slots (4 in flight per lane),
// each pulling a 16-byte chunk of the B row per lane.
// Preconditions: valid TwELL (counts above capacity are clipped to capacity, columns outside the
// matrix skipped); `shadow` (Hybrid row_to_overflow, or null) marks rows this kernel leaves
// untouched; kVec as for the row kernel.
template <class T, int V, bool kVec>
__global__ void __launch_bounds__(kThreads)
    twell_spmm_kernel(std::int64_t rows, std::int64_t k_cols, TwellLayout layout, const std::uint32_t* packed,
                      const T* value_plane, const std::int32_t* shadow, int block_rows, const T* b, std::int64_t ldb,
                      T* c, std::int64_t ldc, std::int64_t nb, float alpha, float beta) {
  ::twell::detail::wait_for_prior_grids();
  constexpr int kSlice = 32 * V;
  extern __shared__ __align__(16) unsigned char smem[];
  const int tiles = static_cast<int>(layout.tiles(k_cols));
  const int pairs = block_rows * tiles;                           // (row, tile) pairs of the block
  float* part = reinterpret_cast<float*>(smem);                   // [kWarps][2][kSlice]
  int* pre = reinterpret_cast<int*>(part + kWarps * 2 * kSlice);  // [pairs + 1] exclusive prefix
  int* thread_sum = pre + pairs + 1;                              // [kThreads]

  const std::int64_t row0 = static_cast<std::int64_t>(blockIdx.y) * block_rows;
  const std::int64_t c0 = static_cast<std::int64_t>(blockIdx.x) * kSlice;
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int cap = layout.capacity();
  const std::int64_t pw = layout.packed_width(k_cols);

  auto live = [&](int r) {
    const std::int64_t row = row0 + r;
    return row < rows && (shadow == nullptr || shadow[row] < 0);
  };

  // Counts, then a block-wide exclusive scan: each thread scans a contiguous chunk.
  const int per_thread = (pairs + kThreads - 1) / kThreads;
  const int my_begin = min(pairs, tid * per_thread), my_end = min(pairs, my_begin + per_thread);
  int local = 0;
  for (int f = my_begin; f < my_end; ++f) {
    const int r = f / tiles, t = f - r * tiles;
    int n = 0;
    if (live(r))
      n = static_cast<int>(min(packed[(row0 + r) * pw + static_cast<std::int64_t>(t) * layout.slots()],
                               static_cast<std::uint32_t>(cap)));
    pre[f] = n;
    local += n;
  }
  thread_sum[tid] = local;
  __syncthreads();
  if (warp == 0) {
    // Exclusive scan of the kThreads partial sums by warp 0, kThreads / 32 per lane.
    constexpr int kPer = kThreads / 32;
    int vals[kPer];
    int run = 0;
#pragma unroll
    for (int q = 0; q < kPer; ++q) {
      vals[q] = run;
      run += thread_sum[lane * kPer + q];
    }
    const int incl = detail::warp_inclusive_sum(run, lane);
    const int excl = incl - run;
#pragma unroll
    for (int q = 0; q < kPer; ++q) thread_sum[lane * kPer + q] = vals[q] + excl;
  }
  __syncthreads();
  {
    int run = thread_sum[tid];
    for (int f = my_begin; f < my_end; ++f) {
      const int n = pre[f];
      pre[f] = run;
      run += n;
    }
    if (tid == kThreads - 1) pre[pairs] = run;
  }
  __syncthreads();

  const int total = pre[pairs];
  const int lo = static_cast<int>(static_cast<std::int64_t>(total) * warp / kWarps);
  const int hi = static_cast<int>(static_cast<std::int64_t>(total) * (warp + 1) / kWarps);
  const std::int64_t col = c0 + lane * V;
  const std::int64_t valid = nb - col;

  auto flush = [&](int r, bool at_lo, const float(&acc)[V]) {
    const bool whole = pre[r * tiles] >= lo && pre[(r + 1) * tiles] <= hi;
    if (whole) {
      if (valid > 0) store_chunk<T, V, kVec>(c + (row0 + r) * ldc + col, valid, acc, alpha, beta);
    } else {
      float* dst = part + (warp * 2 + (at_lo ? 0 : 1)) * kSlice + lane * V;
#pragma unroll
      for (int u = 0; u < V; ++u) dst[u] = acc[u];
    }
  };

  if (lo < hi) {
    // The (row, tile) pair holding entry `lo`: the last f with pre[f] <= lo.
    int f_lo = 0, f_hi = pairs;  // invariant: pre[f_lo] <= lo < pre[f_hi]
    while (f_hi - f_lo > 1) {
      const int mid = (f_lo + f_hi) / 2;
      if (pre[mid] <= lo) {
        f_lo = mid;
      } else {
        f_hi = mid;
      }
    }
    int f = f_lo;
    int pos = lo;
    int cur_row = f / tiles;
    bool at_lo = true;
    float acc[V] = {};
    while (pos < hi) {
      while (pre[f + 1] <= pos) ++f;
      const int r = f / tiles, t = f - r * tiles;
      if (r != cur_row) {
        flush(cur_row, at_lo, acc);
#pragma unroll
        for (int u = 0; u < V; ++u) acc[u] = 0.0f;
        cur_row = r;
        at_lo = false;
      }
      const int first = pos - pre[f];
      const int end = min(hi, pre[f + 1]) - pre[f];
      const std::int64_t base = (row0 + r) * pw + static_cast<std::int64_t>(t) * layout.slots() + 1;
      const std::int64_t k0 = layout.tile_begin(t);
      for (int j = first; j < end; j += 4) {
        float a[4];
        std::int64_t k[4];
#pragma unroll
        for (int q = 0; q < 4; ++q) {
          a[q] = 0.0f;
          k[q] = -1;
          if (j + q < end) {
            const std::uint32_t word = packed[base + j + q];
            const std::int64_t kk = k0 + TwellLayout::slot_column(word);
            if (kk < k_cols) {
              k[q] = kk;
              a[q] = detail::twell_value<T>(word, value_plane, base + j + q);
            }
          }
        }
        float bv[4][V];
#pragma unroll
        for (int q = 0; q < 4; ++q) {
          if (k[q] >= 0 && valid > 0) {
            load_chunk<T, V, kVec>(b + k[q] * ldb + col, valid, bv[q]);
          } else {
#pragma unroll
            for (int u = 0; u < V; ++u) bv[q][u] = 0.0f;
          }
        }
#pragma unroll
        for (int q = 0; q < 4; ++q)
#pragma unroll
          for (int u = 0; u < V; ++u) acc[u] = fmaf(a[q], bv[q][u], acc[u]);
      }
      pos = pre[f] + end;
    }
    flush(cur_row, at_lo, acc);
  }
  __syncthreads();

  // Rows not written whole by one warp: empty rows and rows split between warps.
  for (int r = warp; r < block_rows; r += kWarps) {
    if (!live(r) || valid <= 0) continue;
    const int s = pre[r * tiles], e = pre[(r + 1) * tiles];
    int owners = 0;
    float acc[V] = {};
    for (int w = 0; w < kWarps; ++w) {
      const int wlo = static_cast<int>(static_cast<std::int64_t>(total) * w / kWarps);
      const int whi = static_cast<int>(static_cast<std::int64_t>(total) * (w + 1) / kWarps);
      if (!(s < e && wlo < whi && wlo < e && s < whi)) continue;  // an empty row has no owner
      ++owners;
      const float* src = part + (w * 2 + (s <= wlo ? 0 : 1)) * kSlice + lane * V;
#pragma unroll
      for (int u = 0; u < V; ++u) acc[u] += src[u];
    }
    const bool whole = owners == 1;
    if (!whole) store_chunk<T, V, kVec>(c + (row0 + r) * ldc + col, valid, acc, alpha, beta);
  }
}

// C(overflow_to_row[i], :) = alpha * tmp(i, :) + beta * C(...). One thread per element.
template <class T>
__global__ void scatter_rows_kernel(std::int64_t r_rows, std::int64_t nb, const float* tmp,
                                    const std::int32_t* overflow_to_row, T* c, std::int64_t ldc, std::int64_t m,
                                    float alpha, float beta) {
  ::twell::detail::wait_for_prior_grids();
  const std::int64_t n = r_rows * nb;
  for (std::int64_t idx = blockIdx.x * static_cast<std::int64_t>(blockDim.x) + threadIdx.x; idx < n;
       idx += static_cast<std::int64_t>(gridDim.x) * blockDim.x) {
    const std::int64_t i = idx / nb, j = idx - i * nb;
    const std::int64_t row = overflow_to_row[i];
    if (row < 0 || row >= m) continue;
    T* p = c + row * ldc + j;
    float v = alpha * tmp[idx];
    if (beta != 0.0f) v += beta * detail::load_f(p);
    detail::store_f(p, v);
  }
}

// ---- host side ------------------------------------------------------------------------------------

void check_op(Op op) {
  require(op == Op::none || op == Op::transpose, ErrorCode::invalid_argument, kWhere, "op_a ", static_cast<int>(op),
          " is unknown");
}

template <class T>
void check_operands(std::int64_t m, std::int64_t k, DenseView<const T> b, DenseView<T> c) {
  detail::check_device_operand(b, kWhere, "B");
  detail::check_device_operand(c, kWhere, "C");
  require(b.rows == k, ErrorCode::shape_mismatch, kWhere, "op(A) is ", detail::shape(m, k), " but B is ",
          detail::shape(b.rows, b.cols));
  require(c.rows == m && c.cols == b.cols, ErrorCode::shape_mismatch, kWhere, "C is ", detail::shape(c.rows, c.cols),
          " but op(A) B is ", detail::shape(m, b.cols));
  twell::detail::check_apart(c, "C", {{"B", b}}, kWhere);  // the GPU reads B while it writes C
}

// C = beta * C (or zero) when op(A) B has no terms: K == 0.
template <class T>
__global__ void scale_kernel(T* c, std::int64_t rows, std::int64_t cols, std::int64_t ldc, float beta) {
  ::twell::detail::wait_for_prior_grids();
  const std::int64_t n = rows * cols;
  for (std::int64_t idx = blockIdx.x * static_cast<std::int64_t>(blockDim.x) + threadIdx.x; idx < n;
       idx += static_cast<std::int64_t>(gridDim.x) * blockDim.x) {
    T* p = c + (idx / cols) * ldc + idx % cols;
    detail::store_f(p, beta != 0.0f ? beta * detail::load_f(p) : 0.0f);
  }
}

template <class T>
void launch_rows(std::int64_t rows, const std::int64_t* row_ptr, const std::int32_t* row_count, std::int64_t width,
                 const std::int32_t* col_idx, const T* values, std::int64_t k_cols, DenseView<const T> b,
                 DenseView<T> c, float alpha, float beta, cudaStream_t stream, bool ell) {
  if (rows == 0 || b.cols == 0) return;
  // ELL keeps a warp per row: its rows are padded to the longest, so a matrix with a few long
  // rows is better stored as CSR, TwELL or Hybrid anyway.
  const std::int64_t long_row = ell ? INT64_MAX : kLongRow;
  const auto launch = [&]<int V, bool kVec>() {
    const unsigned grid = detail::grid_for(rows, kWarps, 1 << 20);
    ::twell::detail::launch_kernel("twell::cuda::spmm (row kernel)",
                                   ell ? row_spmm_kernel<T, V, kVec, true> : row_spmm_kernel<T, V, kVec, false>, grid,
                                   kThreads, 0, stream, rows, row_ptr, row_count, width, col_idx, values, long_row,
                                   k_cols, b.data, b.ld, c.data, c.ld, b.cols, alpha, beta);
    if (ell) return;
    const std::int64_t chunks = (b.cols + 32 * V - 1) / (32 * V);
    ::twell::detail::launch_kernel("twell::cuda::spmm (long-row kernel)", long_row_spmm_kernel<T, V, kVec>,
                                   detail::grid_for(rows * chunks, 1, kLongRowCtas), kThreads, 0, stream, rows, row_ptr,
                                   col_idx, values, long_row, k_cols, b.data, b.ld, c.data, c.ld, b.cols, alpha, beta);
  };
  if (detail::vector_operands(b, c)) {
    launch.template operator()<16 / static_cast<int>(sizeof(T)), true>();
  } else {
    launch.template operator()<4, false>();
  }
}

template <class T>
void launch_scale(DenseView<T> c, float beta, cudaStream_t stream) {
  if (c.rows == 0 || c.cols == 0) return;
  ::twell::detail::launch_kernel("twell::cuda::spmm (scale kernel)", scale_kernel<T>,
                                 detail::grid_for(c.rows * c.cols, 256), 256, 0, stream, c.data, c.rows, c.cols, c.ld,
                                 beta);
}

template <class T>
void csr_none(CsrView<const T> a, DenseView<const T> b, DenseView<T> c, float alpha, float beta, cudaStream_t stream) {
  if (a.cols == 0) return launch_scale(c, beta, stream);
  launch_rows<T>(a.rows, a.row_ptr, nullptr, 0, a.col_idx, a.values, a.cols, b, c, alpha, beta, stream, false);
}

// op = transpose for every format: CSR of A^T (a fresh matrix, so no allocation is saved by
// reusing it), then the CSR kernels (the long rows of A^T, A's busiest columns, a CTA each).
template <class T>
void csr_transposed(CsrView<const T> a, DenseView<const T> b, DenseView<T> c, float alpha, float beta,
                    const KernelOptions& options) {
  KernelOptions inner = options;
  inner.report = nullptr;
  const CsrMatrix<T> at = cuda::transpose(a, inner);
  csr_none(at.view(), b, c, alpha, beta, detail::stream_of(options));
}

template <class T>
void launch_twell(TwellView<const T> a, const std::int32_t* shadow, DenseView<const T> b, DenseView<T> c, float alpha,
                  float beta, cudaStream_t stream) {
  if (a.rows == 0 || b.cols == 0) return;
  if (a.cols == 0) return launch_scale(c, beta, stream);
  const std::int64_t tiles = a.layout.tiles(a.cols);
  // kSlice of the launch below
  const std::int64_t slice_cols = detail::vector_operands(b, c) ? 32 * (16 / sizeof(T)) : 32;
  const std::int64_t slices = (b.cols + slice_cols - 1) / slice_cols;
  // The prefix array holds block_rows * tiles + 1 ints; 32 rows when it fits in 16 KB, fewer when
  // the grid would leave most SMs idle: a CTA's warps then share fewer entries and wait on fewer
  // loads in turn (a decode-sized M = 16 took 43 us on an H100 with one 32-row block per slice).
  int block_rows = static_cast<int>(std::clamp<std::int64_t>(4096 / tiles, 1, 32));
  const std::int64_t busy = 2LL * detail::multiprocessor_count("twell::cuda::spmm (multiprocessors)");
  while (block_rows > 1 && (a.rows + block_rows - 1) / block_rows * slices < busy) block_rows /= 2;
  const std::int64_t pairs = block_rows * tiles;
  require(pairs < (1LL << 26), ErrorCode::unsupported, kWhere, "A has ", tiles,
          " tiles per row; the TwELL kernel supports at most 2^26");
  const std::int64_t row_blocks = (a.rows + block_rows - 1) / block_rows;
  require(row_blocks <= 65535, ErrorCode::unsupported, kWhere, "A has ", a.rows, " rows; at most ",
          65535LL * block_rows, " per call with ", tiles, " tiles per row");
  const auto launch = [&]<int V, bool kVec>() {
    constexpr int kSlice = 32 * V;
    require(slices <= 0x7fffffffLL, ErrorCode::unsupported, kWhere, "B has too many columns: ", b.cols);
    const std::size_t shared = sizeof(float) * kWarps * 2 * kSlice + sizeof(int) * (pairs + 1 + kThreads);
    auto kernel = twell_spmm_kernel<T, V, kVec>;
    ::twell::detail::allow_dynamic_shared(kernel, shared, "twell::cuda::spmm (cudaFuncSetAttribute)");
    const dim3 grid(static_cast<unsigned>(slices), static_cast<unsigned>(row_blocks));
    ::twell::detail::launch_kernel("twell::cuda::spmm (TwELL kernel)", kernel, grid, kThreads, shared, stream, a.rows,
                                   a.cols, a.layout, a.packed, a.value_plane, shadow, block_rows, b.data, b.ld, c.data,
                                   c.ld, b.cols, alpha, beta);
  };
  if (detail::vector_operands(b, c)) {
    launch.template operator()<16 / sizeof(T), true>();
  } else {
    launch.template operator()<1, false>();
  }
}

// The cuBLAS handle of this host thread for the current device, created on first use there and
// kept for the thread's life. A cuBLAS handle belongs to the device it was made on, so a thread that
// switches devices gets one per device.
cublasHandle_t cublas_handle() {
  constexpr const char* where = "twell::cuda::spmm (cuBLAS handle)";
  struct PerDevice {
    std::vector<cublasHandle_t> handles;  // by device ordinal; null until first used there
    ~PerDevice() {
      int current = 0;
      if (cudaGetDevice(&current) != cudaSuccess) return;  // the runtime is gone with the process
      for (std::size_t d = 0; d < handles.size(); ++d)
        if (handles[d] != nullptr && cudaSetDevice(static_cast<int>(d)) == cudaSuccess) cublasDestroy(handles[d]);
      cudaSetDevice(current);
    }
  };
  thread_local PerDevice per_device;
  int device = 0;
  detail::check_cuda(cudaGetDevice(&device), where);
  const auto slot = static_cast<std::size_t>(device);
  if (slot >= per_device.handles.size()) per_device.handles.resize(slot + 1, nullptr);
  if (per_device.handles[slot] == nullptr) {
    detail::check_cublas(twell::detail::retry_after_trim([&] { return cublasCreate(&per_device.handles[slot]); },
                                                         CUBLAS_STATUS_ALLOC_FAILED, where),
                         where);
  }
  return per_device.handles[slot];
}

// Bytes of the fp32 product of a Hybrid's overflow rows with b_cols columns of B.
template <class T>
std::size_t overflow_tmp_bytes(HybridView<const T> a, std::int64_t b_cols) {
  return static_cast<std::size_t>(a.overflow.rows * b_cols) * sizeof(float);
}

// Overflow rows: tmp = overflow * B in fp32 by cuBLAS (`blas`), then scattered into C with
// alpha/beta. `tmp` holds r x Nb floats, or is null and then allocated here (stream-ordered).
template <class T>
void overflow_rows(HybridView<const T> a, DenseView<const T> b, DenseView<T> c, float alpha, float beta,
                   cudaStream_t stream, float* tmp, cublasHandle_t blas) {
  const std::int64_t r = a.overflow.rows;
  // At K = 0 the TwELL kernel has already scaled every row of C, these included.
  if (r == 0 || b.cols == 0 || a.cols() == 0) return;
  detail::Scratch own(tmp == nullptr ? overflow_tmp_bytes(a, b.cols) : 0, stream, "twell::cuda::spmm (overflow)");
  if (tmp == nullptr) tmp = own.as<float>();
  const cudaDataType_t type =
      std::is_same_v<T, bf16> ? CUDA_R_16BF : (std::is_same_v<T, fp16> ? CUDA_R_16F : CUDA_R_32F);
  detail::check_cublas(cublasSetStream(blas, stream), "twell::cuda::spmm (cublasSetStream)");
  const float one = 1.0f, zero = 0.0f;
  // Row-major tmp (r x nb) = overflow (r x K) B (K x nb) is column-major tmp^T = B^T overflow^T.
  detail::check_cublas(cublasGemmEx(blas, CUBLAS_OP_N, CUBLAS_OP_N, static_cast<int>(b.cols), static_cast<int>(r),
                                    static_cast<int>(a.cols()), &one, b.data, type, static_cast<int>(b.ld),
                                    a.overflow.data, type, static_cast<int>(a.overflow.ld), &zero, tmp, CUDA_R_32F,
                                    static_cast<int>(b.cols), CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT),
                       "twell::cuda::spmm (cublasGemmEx of the overflow block)");
  ::twell::detail::launch_kernel("twell::cuda::spmm (overflow scatter)", scatter_rows_kernel<T>,
                                 detail::grid_for(r * b.cols, 256), 256, 0, stream, r, b.cols, tmp, a.overflow_to_row,
                                 c.data, c.ld, c.rows, alpha, beta);
}

void require_int(std::int64_t v, const char* what) {
  require(v <= 0x7fffffffLL, ErrorCode::unsupported, kWhere, what, " ", v, " exceeds the 32-bit range of cuBLAS");
}

constexpr const char* kSlicePath = "slice_reuse";
constexpr const char* kStreamPath = "tile_stream";

// The TwELL kernel for op none: `requested` when it takes the operands (else Error(unsupported);
// an empty product, which only scales C, always takes the pair-balanced path), or with
// SpmmAlgorithm::automatic the fastest measured at 0.5 % on an H100 (2026-11-25 and 2026-11-27,
// paper shape K = 5632, Nb = 2048; docs/benchmarks/history.md, "spmm paths by M"; at 5 % dense cuBLAS is 6x
// faster than every sparse kernel, and the rule below is not the fastest of them at 2048 rows,
// where the tile-streaming kernel wins):
//   - pair-balanced up to 768 rows, and up to 2048 rows for layouts of more than 16 slots (~5 %):
//     its grid narrows its row blocks to fill the SMs, and it reads only the B rows A uses
//     (M = 16: 0.010 ms, tile-streaming 0.045, slice-reuse 0.066; M = 256: 0.024 against 0.060;
//     5 %, M = 2048: 0.415 against slice-reuse 0.474);
//   - tile-streaming up to 4096 rows for layouts of 8-16 slots (~0.5 %: M = 1024 0.060 against
//     pair-balanced 0.067; M = 4096 0.105 against slice-reuse 0.114, token-skewed 0.131 against
//     0.131; 2026-11-27). Its CTAs (256 whole rows x 128 columns, one per SM) fill two waves
//     up to 4096 rows at Nb = 2048 and three up to 6144, so from M = 4608 to 6144 it takes
//     ~0.155 ms where slice-reuse takes 0.126-0.136 at 4608-5120 (token-skewed 0.180 against
//     0.142 at 4608);
//   - slice-reuse above that (M = 16384: 0.268 against 0.405), where it applies;
//   - tile-streaming above 4096 rows too where slice-reuse does not take the operands (K too
//     large to stage two slices of B, past ~13200): at K = 5632, M = 16384 it takes 0.405 ms
//     against pair-balanced's 0.801 (this large-K case itself was not timed);
//   - pair-balanced for the rest (fp32, tiles over 256 columns, misaligned or narrow B and C).
// A Hybrid with overflow rows may take slice-reuse earlier: choose_hybrid_path.
constexpr std::int64_t kPairMaxRows = 768, kPairMaxRowsDense = 2048, kStreamMaxRows = 4096;
constexpr int kStreamMaxSlots = 16;

template <class T>
SpmmAlgorithm choose_twell_path(TwellView<const T> a, DenseView<const T> b, DenseView<T> c, SpmmAlgorithm requested) {
  if (a.rows == 0 || a.cols == 0 || b.cols == 0) return SpmmAlgorithm::pair_balanced;  // nothing or C *= beta
  switch (requested) {
    case SpmmAlgorithm::pair_balanced:
      return requested;
    case SpmmAlgorithm::tile_stream:
      require(detail::spmm_stream_applies(a, b, c), ErrorCode::unsupported, kWhere,
              "the tile_stream algorithm takes 16-bit values, A of at most 2^31 - 1 rows, columns and slot words a "
              "row, tiles of at most 256 columns with 8 or more slots (a multiple of 4), 16-byte aligned operands with "
              "B's columns and leading dimensions in 8s (B's below 2^39, its rows less than 2^40 bytes apart, as TMA "
              "takes them), B of at most ",
              detail::spmm_stream_max_b_cols(), " columns, and ", "a device with ", detail::spmm_stream_shared_bytes(),
              " bytes of shared memory per block; A is ", detail::shape(a.rows, a.cols), " in tiles of ", a.layout.tile,
              " with ", a.layout.slots(), " slots");
      return requested;
    case SpmmAlgorithm::slice_reuse:
      require(detail::spmm_slices_applies(a, b, c), ErrorCode::unsupported, kWhere,
              "the slice_reuse algorithm takes 16-bit values, tiles of at most 256 columns, rows of at most 2048 "
              "entries (capacity x tiles), 16-byte aligned operands with leading dimensions in 8s, B's columns a "
              "multiple of its slice width and K small enough to stage two slices of B; A is ",
              detail::shape(a.rows, a.cols), " in tiles of ", a.layout.tile, " with ", a.layout.slots(), " slots");
      return requested;
    case SpmmAlgorithm::automatic:
      break;
  }
  const int slots = a.layout.slots();
  if (a.rows <= kPairMaxRows || (slots > kStreamMaxSlots && a.rows <= kPairMaxRowsDense))
    return SpmmAlgorithm::pair_balanced;
  const bool stream = slots <= kStreamMaxSlots && detail::spmm_stream_applies(a, b, c);
  if (stream && a.rows <= kStreamMaxRows) return SpmmAlgorithm::tile_stream;
  if (detail::spmm_slices_applies(a, b, c)) return SpmmAlgorithm::slice_reuse;
  return stream ? SpmmAlgorithm::tile_stream : SpmmAlgorithm::pair_balanced;
}

// The TwELL rows of op none whose shadow entry is negative (all when shadow is null) by the
// kernel `path` (from choose_twell_path); uneven_rows as detail::StreamProduct takes it (the
// tile-streaming kernel's only). `workspace` holds spmm_slices_workspace_bytes and `staged_b`
// spmm_slices_staged_b_bytes, or either is null and then allocated here (stream-ordered) if the
// slice-reuse path needs it. `before_product` and `b_staged` are the slice-reuse path's
// (spmm_twell_slices); other paths ignore them. Returns the path's name.
template <class T>
const char* twell_none(TwellView<const T> a, const std::int32_t* shadow, bool uneven_rows, DenseView<const T> b,
                       DenseView<T> c, float alpha, float beta, cudaStream_t stream, SpmmAlgorithm path,
                       void* workspace, void* staged_b, const std::function<void()>& before_product = {},
                       bool b_staged = false) {
  if (path == SpmmAlgorithm::tile_stream) {
    const detail::StreamProduct<T> product{a, shadow, b, c, uneven_rows};
    detail::spmm_twell_stream<T>({&product, 1}, alpha, beta, stream);
    return kStreamPath;
  }
  if (path == SpmmAlgorithm::slice_reuse) {
    const std::size_t bytes = detail::spmm_slices_workspace_bytes(a.rows, a.cols, a.layout);
    const std::size_t b_bytes = detail::spmm_slices_staged_b_bytes(a.cols, b.cols);
    detail::Scratch own(workspace == nullptr ? bytes : 0, stream, "twell::cuda::spmm (slice pre-pass workspace)");
    detail::Scratch own_b(staged_b == nullptr ? b_bytes : 0, stream, "twell::cuda::spmm (slice-major copy of B)");
    detail::spmm_twell_slices(a, shadow, b, c, alpha, beta, workspace != nullptr ? workspace : own.as<void>(),
                              staged_b != nullptr ? staged_b : own_b.as<void>(), stream, before_product, b_staged);
    return kSlicePath;
  }
  launch_twell(a, shadow, b, c, alpha, beta, stream);
  return detail::vector_operands(b, c) ? "pair_balanced_vec16" : "pair_balanced_scalar";
}

// A Hybrid path's name for twell_none's: the pair-balanced kernel without its vec16/scalar suffix.
std::string hybrid_kernel_name(const char* twell_path) {
  const std::string name = twell_path;
  return name == kSlicePath || name == kStreamPath ? name : "pair_balanced";
}

// Whether a Hybrid's overflow rows make a product of their own (overflow_rows: a cuBLAS GEMM and
// a scatter): not when K = 0, where the kernel only scales C, shadow rows included, nor for an
// empty B.
template <class T>
bool has_overflow_product(HybridView<const T> a, std::int64_t b_cols) {
  return a.overflow.rows > 0 && a.cols() > 0 && b_cols > 0;
}

// A Hybrid's path (op none, spmm() and SpmmPlan alike, so that both give the same bits): as
// choose_twell_path, except that with overflow rows, where tile-streaming needs more than one
// wave of CTAs, slice-reuse takes over. A plan runs the overflow GEMM beside slice-reuse's
// pre-pass almost for free, while beside tile-streaming's second wave it costs ~25 us (H100,
// paper shape, token-skewed, 2026-11-27, slice-reuse against tile-streaming: 2560 rows 0.104
// against 0.118 ms, 3072 0.107 against 0.119, 4096 0.116 against 0.131; within one wave, 2048
// rows, 0.093 against 0.075). spmm() queues the GEMM after either kernel (4096 rows: 0.132 ms
// after slice-reuse, 0.142 after tile-streaming).
template <class T>
SpmmAlgorithm choose_hybrid_path(HybridView<const T> a, DenseView<const T> b, DenseView<T> c,
                                 SpmmAlgorithm requested) {
  const SpmmAlgorithm path = choose_twell_path(a.twell, b, c, requested);
  if (requested != SpmmAlgorithm::automatic || path != SpmmAlgorithm::tile_stream ||
      !has_overflow_product(a, b.cols))
    return path;
  const bool waves = detail::spmm_stream_ctas(a.rows(), b.cols) >
                     detail::multiprocessor_count("twell::cuda::spmm (multiprocessors)");
  return waves && detail::spmm_slices_applies(a.twell, b, c) ? SpmmAlgorithm::slice_reuse : path;
}

// Hybrid with op none: the TwELL part without its shadow rows, then the overflow rows. With an
// SpmmPlan's side lane (`side`, else null) they run on its stream beside the kernel: they write
// C's shadow rows, which the kernel skips (tile-streaming, 63 rows at M = 4096: 0.132 against 0.142
// ms after it; docs/benchmarks/history.md). On the slice-reuse path they run beside its pre-pass
// and its product waits for them, since its one CTA per SM waits for any SM the GEMM holds (H100,
// token-skewed, 229 overflow rows at M = 16384: 0.383 ms with the GEMM beside the product against
// 0.372 after). Beside the pre-pass: 63 rows at M = 4096, 0.116 against 0.132 after the product;
// at M = 16384 0.291 either way, the pre-pass's CTAs then holding every SM (2026-11-27).
template <class T>
std::string hybrid_none(HybridView<const T> a, DenseView<const T> b, DenseView<T> c, float alpha, float beta,
                        cudaStream_t stream, SpmmAlgorithm path_choice, void* workspace, void* staged_b,
                        float* overflow_tmp, detail::SpmmSideLane* side) {
  require_int(b.cols, "B columns");
  require_int(a.cols(), "A columns");
  require_int(b.ld, "B leading dimension");
  require_int(a.overflow.ld, "overflow leading dimension");
  const std::int32_t* shadow = a.overflow.rows > 0 ? a.row_to_overflow : nullptr;
  const bool beside = side != nullptr && has_overflow_product(a, b.cols);
  const auto overflow_on_side = [&] {
    side->run([&](cudaStream_t s, cublasHandle_t blas) { overflow_rows(a, b, c, alpha, beta, s, overflow_tmp, blas); },
              stream);
  };
  // What the overflow rows need after the kernel (their fp32 product, the cuBLAS handle) is taken
  // before the kernel writes C: an out_of_memory then leaves C as it was, so that a caller may
  // free memory and call again, beta != 0 included.
  const bool after = !beside && has_overflow_product(a, b.cols);
  detail::Scratch own_tmp(after && overflow_tmp == nullptr ? overflow_tmp_bytes(a, b.cols) : 0, stream,
                          "twell::cuda::spmm (overflow)");
  if (after && overflow_tmp == nullptr) overflow_tmp = own_tmp.as<float>();
  const cublasHandle_t blas = after ? cublas_handle() : nullptr;
  if (beside) side->fork(stream);
  // The slice-reuse path queues them between its pre-pass and its product (the hook, which it
  // always calls); after the other kernels they run beside them. (A std::function is made only
  // when used: it allocates.)
  std::function<void()> before_product;
  if (beside && path_choice == SpmmAlgorithm::slice_reuse) before_product = overflow_on_side;
  const std::string path = hybrid_kernel_name(twell_none(a.twell, shadow, shadow != nullptr, b, c, alpha, beta, stream,
                                                         path_choice, workspace, staged_b, before_product));
  if (beside && !before_product) {
    overflow_on_side();
  } else if (!beside) {
    overflow_rows(a, b, c, alpha, beta, stream, overflow_tmp, blas);
  }
  return "cuda/spmm/hybrid/" + path + (a.overflow.rows > 0 ? "+cublas_overflow" : "");
}

// Checks shared by every format; true for op = transpose.
template <class T, class View>
bool check_spmm(Op op_a, View a, std::int64_t rows, std::int64_t cols, DenseView<const T> b, DenseView<T> c) {
  check_op(op_a);
  detail::check_device_operand(a, kWhere, "A");
  const bool t = op_a == Op::transpose;
  check_operands(t ? cols : rows, t ? rows : cols, b, c);
  return t;
}

// op = transpose for every format: A as CSR (`to_csr`), transposed, then the CSR kernel.
template <class T, class ToCsr>
void transposed(const char* format, ToCsr to_csr, DenseView<const T> b, DenseView<T> c, float alpha, float beta,
                const KernelOptions& options) {
  const CsrMatrix<T> csr = to_csr(ConvertOptions{.stream = options.stream});
  csr_transposed(csr.view(), b, c, alpha, beta, options);
  detail::report_path(options, (std::string("cuda/spmm/") + format + "/via_csr_transpose").c_str());
}

// op = transpose for 16-bit TwELL and Hybrid: A^T as a Hybrid in tiles of 256 (transpose_twell.cu),
// then the op-none Hybrid path on it, whose kernels are much faster than the CSR row kernels. A^T
// gets A's slots per 256 columns, at least 16; beyond 32 (layouts for ~2 % density and up, where
// A^T's storage would grow past A's CSR), or where the direct transpose's grid does not cover A,
// the CSR route is taken: transposed_layout says none.
template <class T>
std::optional<TwellLayout> transposed_layout(TwellLayout in, std::int64_t m, std::int64_t k) {
  constexpr std::int64_t kTile = 256, kMinSlots = 16, kMaxSlots = 32;
  const auto slots = std::max<std::int64_t>(
      kMinSlots, static_cast<std::int64_t>(std::bit_ceil(static_cast<std::uint64_t>(
                     (static_cast<std::int64_t>(in.slots()) * kTile + in.tile - 1) / in.tile))));
  if (slots > kMaxSlots) return std::nullopt;
  const TwellLayout layout{static_cast<std::int32_t>(kTile), static_cast<std::int32_t>(kTile / slots)};
  if (!detail::twell_transpose_applies<T>(in, m, k, layout)) return std::nullopt;
  return layout;
}

// 32-bit words of the transposed route's working storage for A (m x k), A^T in `layout`: A^T's
// slots first (the op-none kernels want them 16-byte aligned), its two maps, the count workspace
// (k counts and the transpose's structure flag), and R (8-byte aligned).
std::size_t transposed_words(std::int64_t m, std::int64_t k, TwellLayout layout) {
  const auto words = static_cast<std::size_t>(k);
  return (words * static_cast<std::size_t>(layout.packed_width(m)) + 3 * words + 2) / 2 * 2 + 2;
}

// A^T of the transposed route for A (m x k) in `layout`, in `work` (transposed_words): the
// constructor queues its groups and the read-back of its number R of dense rows, so that the
// host may queue the product on A^T's TwELL rows before finish() waits for R. Several A of one
// slot structure (value planes, SlotStructure::shared) transpose together: plane p's A^T in
// work[p] (its slots only; the maps, counts and R in work[0]), all of them with plane 0's groups
// and dense rows.
template <class T>
class TransposedA {
 public:
  // A^T's TwELL rows in `work`, before or after they are built.
  static TwellView<T> storage(detail::TwellRows<T> a, TwellLayout layout, std::uint32_t* work) {
    return {a.twell.cols, a.twell.rows, layout, work, nullptr, MemorySpace::device};
  }

  TransposedA(std::span<const detail::TwellRows<T>> planes, TwellLayout layout, std::span<std::uint32_t* const> work,
              cudaStream_t stream)
      : planes_(planes.size()), stream_(stream) {
    require(!planes.empty() && planes_ <= a_.size() && work.size() == planes_, ErrorCode::invalid_argument, kWhere,
            "A^T of 1 to ", a_.size(), " value planes, each with its storage");
    const std::int64_t k = planes.front().twell.cols, m = planes.front().twell.rows;
    for (std::size_t p = 0; p < planes_; ++p) {
      a_[p] = planes[p];
      at_[p] = storage(planes[p], layout, work[p]);
    }
    const auto words = static_cast<std::size_t>(k);
    const auto packed_words = words * static_cast<std::size_t>(layout.packed_width(m));
    row_to_overflow_ = reinterpret_cast<std::int32_t*>(work[0] + packed_words);
    overflow_to_row_ = row_to_overflow_ + words;
    auto* max_count = reinterpret_cast<std::uint32_t*>(overflow_to_row_ + words);
    auto* r_device = reinterpret_cast<std::int64_t*>(work[0] + transposed_words(m, k, layout) - 2);
    detail::twell_transpose_groups<T>(std::span(a_).first(planes_), std::span(at_).first(planes_), row_to_overflow_,
                                      overflow_to_row_, max_count, r_device, stream);
    r_back_.emplace(r_device, sizeof(std::int64_t), stream, kWhere);
  }
  TransposedA(detail::TwellRows<T> a, TwellLayout layout, std::uint32_t* work, cudaStream_t stream)
      : TransposedA({&a, 1}, layout, {&work, 1}, stream) {}

  // Plane p's A^T's TwELL rows, which the op-none kernels take with shadow() (A^T's dense rows
  // skipped).
  TwellView<const T> twell(std::size_t p = 0) const { return at_[p]; }
  const std::int32_t* shadow() const { return row_to_overflow_; }
  // Waits for R. Planes whose slot structures differ are refused here, once the transpose has run.
  std::int64_t dense_rows() const {
    const auto r = r_back_->get<std::int64_t>();
    // The products on the A^T were queued already: they must be done with the caller's memory
    // before the caller hears of the error.
    if (r < 0) detail::check_cuda(cudaStreamSynchronize(stream_), "twell::cuda::spmm (synchronize)");
    require(r >= 0, ErrorCode::invalid_argument, kWhere,
            "the products' A were given as sharing one slot structure (SlotStructure::shared), but their slot "
            "counts, slot columns or dense rows differ from A 0's; the results are unspecified");
    return r;
  }

  // Values all planes' dense rows take in finish()'s `dense`.
  std::int64_t dense_values() const { return static_cast<std::int64_t>(planes_) * dense_stride(dense_rows()); }

  // C_p += alpha times plane p's A^T's dense rows B_p for every plane, on `stream` (queued after
  // A^T is built): only C's rows that are A^T's dense rows, which the products on A^T's TwELL rows
  // skip. The planes' R dense rows go into `dense` (dense_values()) in one pass, then each
  // product by cuBLAS (`blas`, bound to `stream` here) in turn, in `overflow_tmp` (R x Nb floats,
  // or null: allocated). Nothing when R = 0.
  void finish(std::span<const DenseView<const T>> b, std::span<const DenseView<T>> c, float alpha, float beta,
              cudaStream_t stream, cublasHandle_t blas, T* dense, float* overflow_tmp) const {
    require(b.size() == planes_ && c.size() == planes_, ErrorCode::invalid_argument, kWhere, "the dense rows of ",
            planes_, " planes need as many products; given ", b.size());
    const std::int64_t r = dense_rows();
    if (r == 0) return;
    const std::int64_t m = a_[0].twell.rows, stride = dense_stride(r);
    std::array<HybridView<T>, detail::kMaxTransposePlanes> hybrid{};
    for (std::size_t p = 0; p < planes_; ++p)
      hybrid[p] = {at_[p], DenseView<T>{dense + static_cast<std::int64_t>(p) * stride, r, m, m, MemorySpace::device},
                   row_to_overflow_, overflow_to_row_};
    detail::twell_transpose_dense_rows<T>(std::span(a_).first(planes_), std::span(hybrid).first(planes_), stream);
    for (std::size_t p = 0; p < planes_; ++p)
      overflow_rows(HybridView<const T>(hybrid[p]), b[p], c[p], alpha, beta, stream, overflow_tmp, blas);
  }

 private:
  // Values a plane's R dense rows take in `dense`: R x m, rounded up to 16 bytes for the next
  // plane's.
  std::int64_t dense_stride(std::int64_t r) const { return (r * a_[0].twell.rows + 7) / 8 * 8; }

  std::array<detail::TwellRows<T>, detail::kMaxTransposePlanes> a_{};
  std::array<TwellView<T>, detail::kMaxTransposePlanes> at_{};
  std::size_t planes_ = 0;
  cudaStream_t stream_;
  std::int32_t* row_to_overflow_ = nullptr;
  std::int32_t* overflow_to_row_ = nullptr;
  std::optional<detail::ReadBack> r_back_;
};

// C_i = alpha A_i^T B_i + beta C_i through each A_i^T in `layout`, in work[i] (transposed_words
// each; A_i of one shape, B_i of one column count). Where every product takes the tile-streaming
// kernel, they take one launch: every A_i^T is built first, then the kernel is queued before the
// host waits for the numbers R_i of their dense rows, whose products follow in turn. Otherwise
// the products go one after another, each queued before the host waits for its R. With `shared`
// (SlotStructure::shared) the A_i are value planes of one slot structure, transposed together
// first (TransposedA), then the products (one launch where they all take the tile-streaming kernel,
// else one after another), then one wait for R. dense_room(V) gives room for V values (A^T's R x m
// dense values a plane, TransposedA::dense_values) and
// overflow_tmp(R) for R x Nb floats (or null: the overflow product allocates its own), and, should
// the products take the slice-reuse kernel, slice_buffers(j, A^T, B, copy) gives workspace and,
// with `copy`, a copy of B, set j (or nulls: stream-ordered scratch). Where every A_i^T is built
// first and `side` is given (an SpmmPlan's side streams), the dense rows' work goes on its side
// lane, beside the products, and slice-reuse products take a stream and set j = i each, so that
// their pre-passes run side by side; elsewhere the products use set 0 in turn. Returns the op-none
// path on A^T.
template <class T, class DenseRoom, class OverflowTmp, class SliceBuffers>
std::string transposed_products(std::span<const detail::TwellRows<T>> a, bool shared, TwellLayout layout,
                                std::span<const DenseView<const T>> b, std::span<const DenseView<T>> c, float alpha,
                                float beta, SpmmAlgorithm algorithm, cudaStream_t stream,
                                std::span<std::uint32_t* const> work, DenseRoom dense_room, OverflowTmp overflow_tmp,
                                SliceBuffers slice_buffers, detail::SpmmSideLane* side) {
  const std::size_t n = a.size();
  std::array<SpmmAlgorithm, detail::kMaxStreamBatch> kernels{};
  static_assert(detail::kMaxStreamBatch <= detail::kMaxTransposePlanes);
  require(n <= kernels.size(), ErrorCode::invalid_argument, kWhere, "at most ", kernels.size(),
          " products on A^T at once");
  bool batched = n > 1;
  for (std::size_t i = 0; i < n; ++i) {
    // What cuBLAS takes for A^T's dense rows, before any work is queued.
    require_int(b[i].cols, "B columns");
    require_int(a[i].twell.rows, "A^T columns");
    require_int(b[i].ld, "B leading dimension");
    // The kernel follows from A^T's shape and storage, known before A^T is built.
    kernels[i] =
        choose_twell_path(TwellView<const T>(TransposedA<T>::storage(a[i], layout, work[i])), b[i], c[i], algorithm);
    batched = batched && kernels[i] == SpmmAlgorithm::tile_stream;
  }
  // Product i's A^T counts as uneven (detail::StreamProduct::uneven_rows) where A_i has overflow
  // rows. A proxy: those are A^T's heavy columns, not its rows, but in the skewed workloads
  // measured A^T's rows (the units) were uneven too; A^T's own shadow is set either way.
  const auto uneven = [&](std::size_t i) { return a[i].shadow != nullptr; };
  // Taken before C is written (created at a thread's first use on a device: it may fail).
  const cublasHandle_t blas = cublas_handle();
  std::string path;
  // Product i on its own kernel, with A^T's TwELL rows at_i and its dense rows' shadow, queued on
  // `on` with slice-reuse buffers `slices`, `before_product` and `b_staged` as twell_none takes
  // them.
  const auto queue = [&](std::size_t i, TwellView<const T> at_i, const std::int32_t* shadow, cudaStream_t on,
                         std::pair<void*, void*> slices, const std::function<void()>& before_product, bool b_staged) {
    path = hybrid_kernel_name(twell_none(at_i, shadow, uneven(i), b[i], c[i], alpha, beta, on, kernels[i], slices.first,
                                         slices.second, before_product, b_staged));
  };
  // Product i on the plan's stream, with slice-reuse buffer set 0.
  const auto product = [&](std::size_t i, TwellView<const T> at_i, const std::int32_t* shadow) {
    queue(i, at_i, shadow, stream,
          kernels[i] == SpmmAlgorithm::slice_reuse ? slice_buffers(0, at_i, b[i], true) : std::pair<void*, void*>{}, {},
          false);
  };
  if (!batched && !shared) {  // each A^T built just before its product
    bool dense = false;
    for (std::size_t i = 0; i < n; ++i) {
      const TransposedA<T> at(a[i], layout, work[i], stream);
      product(i, at.twell(), at.shadow());
      const std::int64_t r = at.dense_rows();
      if (r > 0)
        at.finish(b.subspan(i, 1), c.subspan(i, 1), alpha, beta, stream, blas, dense_room(at.dense_values()),
                  overflow_tmp(r));
      dense = dense || r > 0;
    }
    return dense ? path + "+cublas_overflow" : path;
  }
  // Every A^T first: one per product, or one for all planes. Product i's A^T is plane(i) of
  // transposed(i).
  std::array<std::optional<TransposedA<T>>, detail::kMaxStreamBatch> at;
  if (shared) {
    at[0].emplace(a, layout, work, stream);
  } else {
    for (std::size_t i = 0; i < n; ++i) at[i].emplace(a[i], layout, work[i], stream);
  }
  // A^T's dense rows go on the side lane where there is one, beside the products, which skip
  // their rows of C.
  if (side != nullptr) side->fork(stream);
  const auto transposed = [&](std::size_t i) -> const TransposedA<T>& { return shared ? *at[0] : *at[i]; };
  const auto plane = [&](std::size_t i) { return shared ? i : std::size_t{0}; };
  if (batched) {
    std::array<detail::StreamProduct<T>, detail::kMaxStreamBatch> products{};
    for (std::size_t i = 0; i < n; ++i)
      products[i] = {transposed(i).twell(plane(i)), transposed(i).shadow(), b[i], c[i], uneven(i)};
    // dg^T x and du^T x of the training backward: two planes of one structure times one B.
    const bool pair = shared && n == 3 && b[1].data == b[2].data && b[1].ld == b[2].ld;
    detail::spmm_twell_stream<T>(std::span(products).first(n), alpha, beta, stream, pair);
    path = std::string(kStreamPath) + (pair ? "_batched_paired" : "_batched");
  } else if (side != nullptr && n > 1 &&
             std::all_of(kernels.begin(), kernels.begin() + static_cast<std::ptrdiff_t>(n),
                         [](SpmmAlgorithm k) { return k == SpmmAlgorithm::slice_reuse; })) {
    // Slice-reuse products whose pre-passes run side by side: product i > 0 on side stream i - 1
    // with buffers of its own, its pre-pass beside product 0's, its product after product i - 1's.
    // Each pre-pass's fill is latency-bound on a CTA per 256 rows of A^T.
    // Every set of buffers first: growing one waits for the device. Where B_i is B_{i-1} (the
    // backward's dg^T x and du^T x), product i reads product i - 1's copy of it, written before
    // product i - 1's product, after which product i's runs.
    std::array<std::pair<void*, void*>, detail::kMaxStreamBatch> slices{};
    std::array<bool, detail::kMaxStreamBatch> b_staged{};
    for (std::size_t i = 0; i < n; ++i) {
      b_staged[i] = i > 0 && b[i].data == b[i - 1].data && b[i].ld == b[i - 1].ld && b[i].cols == b[i - 1].cols;
      slices[i] = slice_buffers(i, transposed(i).twell(plane(i)), b[i], !b_staged[i]);
      if (b_staged[i]) slices[i].second = slices[i - 1].second;
    }
    const auto& lanes = side->products;
    for (std::size_t i = 1; i < n; ++i) lanes[i - 1].fork(stream);
    try {
      queue(0, transposed(0).twell(plane(0)), transposed(0).shadow(), stream, slices[0], {}, false);
      for (std::size_t i = 1; i < n; ++i) {
        const cudaStream_t previous = i == 1 ? stream : lanes[i - 2].stream();
        queue(
            i, transposed(i).twell(plane(i)), transposed(i).shadow(), lanes[i - 1].stream(), slices[i],
            [&] { lanes[i - 1].fork(previous); }, b_staged[i]);
      }
    } catch (...) {
      for (std::size_t i = 1; i < n; ++i) lanes[i - 1].join(stream);
      throw;
    }
    for (std::size_t i = 1; i < n; ++i) lanes[i - 1].join(stream);
  } else {
    for (std::size_t i = 0; i < n; ++i) product(i, transposed(i).twell(plane(i)), transposed(i).shadow());
  }
  // The dense rows: one pass for all planes, or one a product, then their products by cuBLAS.
  const std::size_t sets = shared ? 1 : n;
  std::int64_t r = 0, values = 0;
  for (std::size_t j = 0; j < sets; ++j) {
    r = std::max(r, at[j]->dense_rows());
    values = std::max(values, at[j]->dense_values());
  }
  if (r > 0) {
    T* const dense = dense_room(values);
    float* const tmp = overflow_tmp(r);
    const auto finish = [&](cudaStream_t on, cublasHandle_t handle) {
      for (std::size_t j = 0; j < sets; ++j)
        at[j]->finish(shared ? b : b.subspan(j, 1), shared ? c : c.subspan(j, 1), alpha, beta, on, handle, dense, tmp);
    };
    if (side != nullptr) {
      side->run(finish, stream);
    } else {
      finish(stream, blas);
    }
  }
  return r > 0 ? path + "+cublas_overflow" : path;
}

// The free function's transposed route for TwELL and Hybrid A: its storage in stream-ordered
// scratch for the call. Returns false where the route does not apply.
template <class T, class View>
bool via_transpose(View a, const char* format, DenseView<const T> b, DenseView<T> c, float alpha, float beta,
                   const KernelOptions& options) {
  const detail::TwellRows<T> rows = detail::twell_rows<T>(a);
  const std::optional<TwellLayout> layout = transposed_layout<T>(rows.twell.layout, rows.twell.rows, rows.twell.cols);
  if (!layout) return false;
  const cudaStream_t stream = detail::stream_of(options);
  const std::int64_t m = rows.twell.rows;
  detail::Scratch work(transposed_words(m, rows.twell.cols, *layout) * sizeof(std::uint32_t), stream, kWhere);
  std::optional<detail::Scratch> dense;  // kept to the end: freed in stream order after its last use
  std::uint32_t* const work_words = work.as<std::uint32_t>();
  const std::string path = transposed_products<T>(
      {&rows, 1}, false, *layout, {&b, 1}, {&c, 1}, alpha, beta, options.spmm_algorithm, stream, {&work_words, 1},
      [&](std::int64_t values) {
        dense.emplace(static_cast<std::size_t>(values) * sizeof(T), stream, kWhere);
        return dense->as<T>();
      },
      [](std::int64_t) { return static_cast<float*>(nullptr); },
      [](std::size_t, TwellView<const T>, DenseView<const T>, bool) { return std::pair<void*, void*>{}; }, nullptr);
  detail::report_path(options, (std::string("cuda/spmm/") + format + "/via_transpose+" + path).c_str());
  return true;
}

}  // namespace

template <Value T>
void spmm(Op op_a, CsrView<const T> a, DenseView<const T> b, DenseView<T> c, float alpha, float beta,
          const KernelOptions& options) {
  twell::detail::check_spmm_algorithm(options.spmm_algorithm, kWhere);  // ignored here, refused when invalid
  if (check_spmm(op_a, a, a.rows, a.cols, b, c)) {
    csr_transposed(a, b, c, alpha, beta, options);
    detail::report_path(options, "cuda/spmm/csr/via_csr_transpose");
  } else {
    csr_none(a, b, c, alpha, beta, detail::stream_of(options));
    detail::report_path(options, "cuda/spmm/csr/warp_per_row");
  }
}

template <Value T>
void spmm(Op op_a, EllView<const T> a, DenseView<const T> b, DenseView<T> c, float alpha, float beta,
          const KernelOptions& options) {
  twell::detail::check_spmm_algorithm(options.spmm_algorithm, kWhere);  // ignored here, refused when invalid
  if (check_spmm(op_a, a, a.rows, a.cols, b, c)) {
    // Stored zeros stay entries of A^T (0 x Inf is NaN, as in the reference and op = none).
    transposed<T>(
        "ell", [&](const ConvertOptions& o) { return detail::ell_entries_to_csr<T>(a, o.stream, kWhere); }, b, c, alpha,
        beta, options);
    return;
  }
  if (a.cols == 0) {
    launch_scale(c, beta, detail::stream_of(options));
  } else {
    launch_rows<T>(a.rows, nullptr, a.row_count, a.width, a.col_idx, a.values, a.cols, b, c, alpha, beta,
                   detail::stream_of(options), true);
  }
  detail::report_path(options, "cuda/spmm/ell/warp_per_row");
}

template <Value T>
void spmm(Op op_a, TwellView<const T> a, DenseView<const T> b, DenseView<T> c, float alpha, float beta,
          const KernelOptions& options) {
  // Before any route, the transposed ones included.
  twell::detail::check_spmm_algorithm(options.spmm_algorithm, kWhere);
  if (check_spmm(op_a, a, a.rows, a.cols, b, c)) {
    if (via_transpose<T>(a, "twell", b, c, alpha, beta, options)) return;
    transposed<T>("twell", [&](const ConvertOptions& o) { return cuda::twell_to_csr(a, o); }, b, c, alpha, beta,
                  options);
    return;
  }
  const char* path = twell_none(a, nullptr, false, b, c, alpha, beta, detail::stream_of(options),
                                choose_twell_path(a, b, c, options.spmm_algorithm), nullptr, nullptr);
  detail::report_path(options, (std::string("cuda/spmm/twell/") + path).c_str());
}

template <Value T>
void spmm(Op op_a, HybridView<const T> a, DenseView<const T> b, DenseView<T> c, float alpha, float beta,
          const KernelOptions& options) {
  // Before any route, the transposed ones included.
  twell::detail::check_spmm_algorithm(options.spmm_algorithm, kWhere);
  if (check_spmm(op_a, a, a.rows(), a.cols(), b, c)) {
    if (via_transpose<T>(a, "hybrid", b, c, alpha, beta, options)) return;
    transposed<T>("hybrid", [&](const ConvertOptions& o) { return cuda::hybrid_to_csr(a, o); }, b, c, alpha, beta,
                  options);
    return;
  }
  const std::string path = hybrid_none(a, b, c, alpha, beta, detail::stream_of(options),
                                       choose_hybrid_path(a, b, c, options.spmm_algorithm), nullptr, nullptr,
                                       nullptr, nullptr);
  detail::report_path(options, path.c_str());
}

static_assert(SpmmPlan<bf16>::kMaxTransposedBatch <= detail::kMaxStreamBatch);
// A batch holds a read-back per product while the host queues it; one slot stays for the caller
// (a gate's count read back around the call).
static_assert(detail::kMaxStreamBatch < detail::ReadBack::kSlots);

namespace {
// A TwELL as the Hybrid of no overflow rows that the transposed route takes.
template <class T>
HybridView<const T> as_hybrid(TwellView<const T> a) {
  return {a, DenseView<const T>{}, nullptr, nullptr};
}
template <class T>
HybridView<const T> as_hybrid(HybridView<const T> a) {
  return a;
}
}  // namespace

// ---- SpmmPlan ------------------------------------------------------------------------------------

template <Value T>
SpmmPlan<T>::SpmmPlan(std::int64_t m, std::int64_t k, TwellLayout layout, Stream stream, SpmmAlgorithm algorithm)
    : m_(m), k_(k), layout_(layout), stream_(stream), algorithm_(algorithm) {
  constexpr const char* where = "twell::cuda::SpmmPlan";
  require(m >= 0 && k >= 0, ErrorCode::invalid_argument, where, "shape ", detail::shape(m, k), " is negative");
  check_layout(layout, where);
  twell::detail::check_spmm_algorithm(algorithm, where);
}

template <Value T>
void SpmmPlan<T>::check_a(std::int64_t rows, std::int64_t cols, TwellLayout layout, const char* where) const {
  twell::detail::require_plan_device(device_, where);
  require(rows == m_ && cols == k_ && layout.tile == layout_.tile && layout.compression == layout_.compression,
          ErrorCode::shape_mismatch, where, "A is ", detail::shape(rows, cols), " in tiles of ", layout.tile,
          " (C = ", layout.compression, ") but the plan was made for ", detail::shape(m_, k_), " in tiles of ",
          layout_.tile, " (C = ", layout_.compression, ")");
}

template <Value T>
void SpmmPlan<T>::reserve_overflow(std::int64_t rows, std::int64_t b_cols) {
  twell::detail::require_plan_device(device_, "twell::cuda::SpmmPlan::reserve_overflow");
  const auto need = static_cast<std::size_t>(std::max<std::int64_t>(rows, 0) * std::max<std::int64_t>(b_cols, 0));
  if (need > overflow_.size()) overflow_ = Buffer<float>(need, MemorySpace::device, Uninitialized{});
}

namespace {
// A plan's byte buffer grown to at least `bytes` (8-byte elements, 256-byte aligned blocks); its data.
void* grow_bytes(Buffer<std::uint64_t>& buffer, std::size_t bytes) {
  if (bytes > buffer.bytes()) buffer = Buffer<std::uint64_t>((bytes + 7) / 8, MemorySpace::device, Uninitialized{});
  return buffer.data();
}
}  // namespace

template <Value T>
void SpmmPlan<T>::reserve_b_cols(std::int64_t b_cols) {
  twell::detail::require_plan_device(device_, "twell::cuda::SpmmPlan::reserve_b_cols");
  if constexpr (sizeof(T) != 2) return;  // the slice-reuse path takes 16-bit values only
  if (m_ > 0 && k_ > 0) grow_bytes(workspace_, detail::spmm_slices_workspace_bytes(m_, k_, layout_));
  grow_bytes(staged_b_, detail::spmm_slices_staged_b_bytes(k_, std::max<std::int64_t>(b_cols, 0)));
}

template <Value T>
void SpmmPlan<T>::run(TwellView<const T> a, DenseView<const T> b, DenseView<T> c, float alpha, float beta) {
  check_spmm(Op::none, a, a.rows, a.cols, b, c);
  check_a(a.rows, a.cols, a.layout, "twell::cuda::SpmmPlan::run");
  const SpmmAlgorithm path = choose_twell_path(a, b, c, algorithm_);
  if (path == SpmmAlgorithm::slice_reuse) reserve_b_cols(b.cols);
  const auto stream = static_cast<cudaStream_t>(stream_.handle);
  path_ = std::string("cuda/spmm/twell/") +
          twell_none(a, nullptr, false, b, c, alpha, beta, stream, path, workspace_.data(), staged_b_.data());
}

template <Value T>
void SpmmPlan<T>::run(HybridView<const T> a, DenseView<const T> b, DenseView<T> c, float alpha, float beta) {
  check_spmm(Op::none, a, a.rows(), a.cols(), b, c);
  check_a(a.rows(), a.cols(), a.twell.layout, "twell::cuda::SpmmPlan::run");
  reserve_overflow(a.overflow.rows, b.cols);
  const SpmmAlgorithm path = choose_hybrid_path(a, b, c, algorithm_);
  if (path == SpmmAlgorithm::slice_reuse) reserve_b_cols(b.cols);
  const auto stream = static_cast<cudaStream_t>(stream_.handle);
  if (!side_ && has_overflow_product(a, b.cols)) side_.reset(new detail::SpmmSideLane(stream));
  path_ = hybrid_none(a, b, c, alpha, beta, stream, path, workspace_.data(), staged_b_.data(), overflow_.data(),
                      side_.get());
}

template <Value T>
template <class View>
void SpmmPlan<T>::run_transposed(View a, const char* format, DenseView<const T> b, DenseView<T> c, float alpha,
                                 float beta) {
  const HybridView<const T> hybrid = as_hybrid(a);
  check_a(hybrid.rows(), hybrid.cols(), hybrid.twell.layout, "twell::cuda::SpmmPlan::run");
  if (!transposed_layout<T>(layout_, m_, k_)) {  // the CSR route, as spmm()
    KernelReport report;
    cuda::spmm<T>(Op::transpose, a, b, c, alpha, beta, KernelOptions{stream_, &report, false, algorithm_});
    path_ = report.path;
    return;
  }
  path_ = std::string("cuda/spmm/") + format + "/via_transpose+" +
          transposed_batch({&hybrid, 1}, {&b, 1}, {&c, 1}, alpha, beta, SlotStructure::separate);
}

template <Value T>
std::string SpmmPlan<T>::transposed_batch(std::span<const HybridView<const T>> a, std::span<const DenseView<const T>> b,
                                          std::span<const DenseView<T>> c, float alpha, float beta,
                                          SlotStructure structure) {
  const TwellLayout layout = *transposed_layout<T>(layout_, m_, k_);
  const std::size_t words = transposed_words(m_, k_, layout);
  std::array<detail::TwellRows<T>, kMaxTransposedBatch> rows{};
  std::array<std::uint32_t*, kMaxTransposedBatch> work{};
  for (std::size_t i = 0; i < a.size(); ++i) {
    rows[i] = detail::twell_rows<T>(a[i]);
    if (words > transposed_[i].size())
      transposed_[i] = Buffer<std::uint32_t>(words, MemorySpace::device, Uninitialized{});
    work[i] = transposed_[i].data();
  }
  const auto stream = static_cast<cudaStream_t>(stream_.handle);
  // Several products take the side streams (where every A^T is built first): their slice-reuse
  // pre-passes side by side, A^T's dense rows beside them.
  if (!side_ && a.size() > 1) side_.reset(new detail::SpmmSideLane(stream));
  return transposed_products<T>(
      std::span(rows).first(a.size()), structure == SlotStructure::shared, layout, b, c, alpha, beta, algorithm_,
      stream, std::span(work).first(a.size()),
      [&](std::int64_t values) {
        const auto need = static_cast<std::size_t>(values);
        if (need > transposed_dense_.size())
          transposed_dense_ = Buffer<T>(need, MemorySpace::device, Uninitialized{});
        return transposed_dense_.data();
      },
      [&](std::int64_t r) {
        reserve_overflow(r, b.front().cols);
        return overflow_.data();
      },
      [&](std::size_t i, TwellView<const T> at, DenseView<const T> bt, bool copy) {
        return std::pair<void*, void*>{
            grow_bytes(transposed_workspace_[i], detail::spmm_slices_workspace_bytes(at.rows, at.cols, at.layout)),
            copy ? grow_bytes(transposed_staged_b_[i], detail::spmm_slices_staged_b_bytes(at.cols, bt.cols)) : nullptr};
      },
      side_.get());
}

template <Value T>
void SpmmPlan<T>::run_transposed(std::span<const HybridView<const T>> a, std::span<const DenseView<const T>> b,
                                 std::span<const DenseView<T>> c, float alpha, float beta, SlotStructure structure) {
  constexpr const char* where = "twell::cuda::SpmmPlan::run_transposed";
  const std::size_t n = a.size();
  require(n >= 1 && n <= kMaxTransposedBatch && b.size() == n && c.size() == n, ErrorCode::invalid_argument, where,
          "takes 1 to ", kMaxTransposedBatch, " products, each with its B and C; given ", n, " A, ", b.size(),
          " B and ", c.size(), " C");
  for (std::size_t i = 0; i < n; ++i) {
    check_spmm(Op::transpose, a[i], a[i].rows(), a[i].cols(), b[i], c[i]);
    check_a(a[i].rows(), a[i].cols(), a[i].twell.layout, where);
    require(b[i].cols == b[0].cols, ErrorCode::shape_mismatch, where, "B ", i, " has ", b[i].cols,
            " columns but B 0 has ", b[0].cols, "; the products of one call share B's column count");
    for (std::size_t j = 0; j < n; ++j)
      require(j == i || (!twell::detail::byte_range(c[i]).overlaps(twell::detail::byte_range(c[j])) &&
                         !twell::detail::byte_range(c[i]).overlaps(twell::detail::byte_range(b[j]))),
              ErrorCode::invalid_argument, where, "C ", i, " overlaps C or B ", j,
              "; the products of one call run together, so none may write another's operand");
  }
  if (!transposed_layout<T>(layout_, m_, k_)) {  // the CSR route: the products in turn
    for (std::size_t i = 0; i < n; ++i) run_transposed(a[i], "hybrid", b[i], c[i], alpha, beta);
    return;
  }
  path_ = "cuda/spmm/hybrid/via_transpose+" + transposed_batch(a, b, c, alpha, beta, structure);
}

template <Value T>
void SpmmPlan<T>::run(Op op_a, TwellView<const T> a, DenseView<const T> b, DenseView<T> c, float alpha, float beta) {
  if (!check_spmm(op_a, a, a.rows, a.cols, b, c)) return run(a, b, c, alpha, beta);
  run_transposed(a, "twell", b, c, alpha, beta);
}

template <Value T>
void SpmmPlan<T>::run(Op op_a, HybridView<const T> a, DenseView<const T> b, DenseView<T> c, float alpha, float beta) {
  if (!check_spmm(op_a, a, a.rows(), a.cols(), b, c)) return run(a, b, c, alpha, beta);
  run_transposed(a, "hybrid", b, c, alpha, beta);
}

#define TWELL_INSTANTIATE(T)                                                                                           \
  template void spmm<T>(Op, CsrView<const T>, DenseView<const T>, DenseView<T>, float, float, const KernelOptions&);   \
  template void spmm<T>(Op, EllView<const T>, DenseView<const T>, DenseView<T>, float, float, const KernelOptions&);   \
  template void spmm<T>(Op, TwellView<const T>, DenseView<const T>, DenseView<T>, float, float, const KernelOptions&); \
  template void spmm<T>(Op, HybridView<const T>, DenseView<const T>, DenseView<T>, float, float, const KernelOptions&); \
  template class SpmmPlan<T>;
TWELL_FOR_EACH_VALUE_TYPE(TWELL_INSTANTIATE)
#undef TWELL_INSTANTIATE

}  // namespace twell::cuda
