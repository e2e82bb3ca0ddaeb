// cuda sddmm: out(i, j) = alpha * (A op(B))(i, j) + beta * out(i, j) at the stored entries of a
// CSR, ELL, TwELL or Hybrid pattern. Work is balanced by entries, not rows: the pattern's entry
// positions (CSR entries, a row's ELL slots, a row's TwELL slots across its tiles, the columns of a
// Hybrid overflow row) are cut into chunks of 32, a warp owns one chunk at a time (lane u owns
// position u: it reads it, and writes it back, coalesced) and computes the dot products of the
// chunk's entries one after another; each is split over the lanes by k (16-byte loads when
// aligned) and reduced by a fixed shuffle tree. An entry's value depends on its own dot product
// alone, whose order is fixed, so results are deterministic and the same bits whichever warp
// computes them (CSR, ELL, TwELL and Hybrid agree bit for bit on the same entry).
// Why chunks of positions: at the paper's shape (K = 2048, bf16) a dot product reads a 4 KB row of
// A and a 4 KB column of op(B) (Wd, 23 MB, stays in L2). A warp per row serialised a token with
// 800 nonzeros on one warp (800 dot products, 6.4 MB of loads; in a Hybrid also a walk over all
// 5632 columns) while the mean token has 28, and its CTA waited for it. A chunk caps a warp at 32
// dot products (256 KB) like a scan-built list of 32-entry work items would, without its pass
// and workspace; chunks with few or no entries cost their 128 B of words, read and written once,
// which is the copy of counts and unused slots the output needs anyway. M = 2048 rows of
// TwELL(256, 16) make 22.5 K chunks (11 a row; an overflow row makes 176), about five per
// resident warp of an H100 (60 registers on sm_90a: 4 CTAs an SM). Consecutive chunks go to the
// warps of one CTA, so a row's 11 chunks fetch its A row from L2 at most 3 times (12 KB, against
// 4 KB of op(B) per entry, 112 KB for the mean row); the chunk's other entries read it from L1.
// op(B) = B, whose columns are strided, is first transposed into stream-ordered scratch so that
// every dot product reads two contiguous rows. Results keep the pattern's structure (values may
// come out exactly zero). Benchmark: bench/suites/sddmm.cpp (dh = dy Wd^T at the hidden pattern).
#include <cstdint>

#include <twell/kernels/backends.hpp>
#include <twell/kernels/detail/per_format.hpp>

#include "cuda_launch.cuh"
#include "dense_transpose.cuh"
#include "hybrid_shadow.cuh"
#include "sparse_common.cuh"
#include "vec16.cuh"

namespace twell::cuda {
namespace {

constexpr const char* kWhere = "twell::cuda::sddmm";
constexpr int kThreads = 256;
constexpr int kChunk = 32;  // entry positions of a work item: one per lane

struct Operands {
  std::int64_t k = 0;  // inner dimension
  std::int64_t n = 0;  // columns of op(B)
  std::int64_t lda = 0;
  std::int64_t ldb = 0;
  bool b_transposed = false;  // op(B) = B^T: column j of op(B) is row j of B, contiguous
  bool vec = false;           // rows of A and B^T 16-byte aligned with k a multiple of 16 / sizeof(T)
};

// Dot product of row `a_row` of A with column j of op(B); every lane returns lane 0's total.
template <class T>
__device__ __forceinline__ float warp_dot(const T* a_row, const T* b, const Operands& o, std::int64_t j, int lane) {
  float s = 0.0f;
  if (o.vec) {
    constexpr int kV = 16 / sizeof(T);
    const uint4* ar = reinterpret_cast<const uint4*>(a_row);
    const uint4* br = reinterpret_cast<const uint4*>(b + j * o.ldb);
    for (std::int64_t q = lane; q < o.k / kV; q += 32) {
      float x[kV], y[kV];
      detail::unpack16<T>(__ldg(ar + q), x);
      detail::unpack16<T>(__ldg(br + q), y);
#pragma unroll
      for (int u = 0; u < kV; ++u) s = fmaf(x[u], y[u], s);
    }
  } else if (o.b_transposed) {
    const T* col = b + j * o.ldb;
    for (std::int64_t k = lane; k < o.k; k += 32) s = fmaf(detail::load_f(a_row + k), detail::load_f(col + k), s);
  } else {
    for (std::int64_t k = lane; k < o.k; k += 32)
      s = fmaf(detail::load_f(a_row + k), detail::load_f(b + k * o.ldb + j), s);
  }
#pragma unroll
  for (int d = 16; d > 0; d >>= 1) s += __shfl_down_sync(0xffffffffu, s, d);
  return __shfl_sync(0xffffffffu, s, 0);
}

// The dot products of a chunk: each lane with `flag` set names one entry (row, col); the warp
// computes them in lane order and every flagged lane gets its own (the others get 0). All 32 lanes
// must call it together.
template <class T>
__device__ __forceinline__ float chunk_dots(bool flag, std::int64_t row, std::int64_t col, const T* a, const T* b,
                                            const Operands& o, int lane) {
  float mine = 0.0f;
  for (unsigned mask = __ballot_sync(0xffffffffu, flag); mask != 0; mask &= mask - 1) {
    const int u = __ffs(static_cast<int>(mask)) - 1;
    const std::int64_t i = __shfl_sync(0xffffffffu, row, u);
    const std::int64_t j = __shfl_sync(0xffffffffu, col, u);
    const float d = warp_dot(a + i * o.lda, b, o, j, lane);
    if (lane == u) mine = d;
  }
  return mine;
}

// *p = alpha * d + beta * *p; beta == 0 never reads *p.
template <class T>
__device__ __forceinline__ void store_scaled(T* p, float d, float alpha, float beta) {
  float v = alpha * d;
  if (beta != 0.0f) v += beta * detail::load_f(p);
  detail::store_f(p, v);
}

__device__ __forceinline__ std::int64_t warp_id() {
  return (blockIdx.x * static_cast<std::int64_t>(kThreads) + threadIdx.x) / 32;
}
__device__ __forceinline__ std::int64_t warp_count() { return static_cast<std::int64_t>(gridDim.x) * (kThreads / 32); }

// CSR pattern: a warp owns the 32 entries [32 w, 32 w + 32) of the entry arrays, whatever rows they
// belong to; a lane finds its entry's row by binary search in row_ptr (its top levels stay in L1)
// and writes the entry's value. Preconditions: out shares the pattern's index arrays; row_ptr
// monotone with row_ptr[rows] <= nnz (entries outside [row_ptr[0], row_ptr[rows]) and
// out-of-range columns are skipped).
template <class T>
__global__ void __launch_bounds__(kThreads)
    csr_sddmm_kernel(std::int64_t rows, std::int64_t nnz, const std::int64_t* row_ptr, const std::int32_t* col_idx,
                     T* out_values, const T* a, const T* b, Operands o, float alpha, float beta) {
  ::twell::detail::wait_for_prior_grids();
  const int lane = threadIdx.x & 31;
  const std::int64_t first = row_ptr[0], last = min(row_ptr[rows], nnz);
  const std::int64_t chunks = (nnz + kChunk - 1) / kChunk;
  for (std::int64_t w = warp_id(); w < chunks; w += warp_count()) {
    const std::int64_t e = w * kChunk + lane;
    const bool in = e >= first && e < last;
    std::int64_t i = 0, j = -1;
    if (in) {
      std::int64_t hi = rows;  // row_ptr[i] <= e < row_ptr[hi]
      while (hi - i > 1) {
        const std::int64_t mid = i + (hi - i) / 2;
        if (row_ptr[mid] <= e) {
          i = mid;
        } else {
          hi = mid;
        }
      }
      j = col_idx[e];
    }
    const bool flag = in && j >= 0 && j < o.n;
    const float d = chunk_dots(flag, i, j, a, b, o, lane);
    if (flag) store_scaled(out_values + e, d, alpha, beta);
  }
}

// ELL pattern: a warp owns 32 consecutive slots of one row (chunks of a row beyond its count do
// nothing); a lane writes its slot's value. Preconditions: out shares the pattern's index arrays
// (out-of-range columns are skipped).
template <class T>
__global__ void __launch_bounds__(kThreads)
    ell_sddmm_kernel(std::int64_t rows, const std::int32_t* row_count, std::int64_t width, const std::int32_t* col_idx,
                     T* out_values, const T* a, const T* b, Operands o, float alpha, float beta) {
  ::twell::detail::wait_for_prior_grids();
  const int lane = threadIdx.x & 31;
  const std::int64_t per_row = (width + kChunk - 1) / kChunk;
  for (std::int64_t w = warp_id(); w < rows * per_row; w += warp_count()) {
    const std::int64_t i = w / per_row;
    const std::int64_t s = (w % per_row) * kChunk + lane;
    const std::int64_t n = min(max(static_cast<std::int64_t>(row_count[i]), std::int64_t{0}), width);
    const std::int64_t e = i * width + s;
    const std::int64_t j = s < n ? col_idx[e] : -1;
    const bool flag = j >= 0 && j < o.n;
    const float d = chunk_dots(flag, i, j, a, b, o, lane);
    if (flag) store_scaled(out_values + e, d, alpha, beta);
  }
}

// TwELL pattern (all rows of a Hybrid's TwELL part too, shadows included): a warp owns 32
// consecutive slots of a row's packed words, across tile boundaries when S < 32 (so at most 31
// entries); a lane copies its slot when it is a count or unused (zeroing the fp32 value plane
// there) and otherwise writes the entry's value with the pattern's column. Preconditions: out has
// the pattern's shape and layout (it may alias the pattern: a slot is read and written by one lane
// only, and a count is only ever rewritten with itself).
template <class T>
__global__ void __launch_bounds__(kThreads)
    twell_sddmm_kernel(std::int64_t rows, std::int64_t cols, TwellLayout layout, const std::uint32_t* pattern,
                       std::uint32_t* out, T* out_plane, const T* a, const T* b, Operands o, float alpha, float beta) {
  ::twell::detail::wait_for_prior_grids();
  const int lane = threadIdx.x & 31;
  const int slots = layout.slots();
  const std::int64_t width = layout.packed_width(cols);
  const std::int64_t per_row = (width + kChunk - 1) / kChunk;
  for (std::int64_t w = warp_id(); w < rows * per_row; w += warp_count()) {
    const std::int64_t i = w / per_row;
    const std::int64_t first = (w - i * per_row) * kChunk;  // the chunk's first slot in the row
    const std::int64_t t0 = first / slots;
    // Per lane only a 32-bit division: the chunk starts less than one tile's slots into tile t0.
    const int from_t0 = static_cast<int>(first - t0 * slots) + lane;
    const bool in = first + lane < width;
    const std::int64_t t = in ? t0 + from_t0 / slots : 0;
    const int s = in ? from_t0 % slots : 0;
    const std::int64_t base = layout.slot_offset(i, t, cols);
    std::uint32_t word = 0;
    int n = 0;
    if (in) {
      word = pattern[base + s];
      n = static_cast<int>(min(pattern[base], static_cast<std::uint32_t>(layout.capacity())));
    }
    const bool entry = in && s >= 1 && s <= n;
    const std::int64_t j = layout.tile_begin(t) + TwellLayout::slot_column(word);
    const float d = chunk_dots(entry && j < o.n, i, j, a, b, o, lane);
    if (entry) {
      float v = alpha * d;
      if constexpr (std::is_same_v<T, float>) {
        if (beta != 0.0f) v += beta * out_plane[base + s];
        out[base + s] = word;
        out_plane[base + s] = v;
      } else {
        if (beta != 0.0f) v += beta * detail::bits_to_f<T>(out[base + s] >> 16);
        out[base + s] = TwellLayout::pack(detail::bits_of<T>(v), TwellLayout::slot_column(word));
      }
    } else if (in) {
      out[base + s] = word;
      if constexpr (std::is_same_v<T, float>) out_plane[base + s] = 0.0f;
    }
  }
}

// Hybrid overflow rows: a warp owns 32 consecutive columns of one overflow row and samples those
// where the pattern's dense row stores a value; a lane writes its column (+0 where nothing is
// stored). Preconditions: overflow_to_row names rows of A (others are skipped); out may alias the
// pattern's block.
template <class T>
__global__ void __launch_bounds__(kThreads)
    overflow_sddmm_kernel(std::int64_t r_rows, std::int64_t cols, const std::int32_t* overflow_to_row, std::int64_t m,
                          const T* pattern, std::int64_t ldp, T* out, std::int64_t ldo, const T* a, const T* b,
                          Operands o, float alpha, float beta) {
  ::twell::detail::wait_for_prior_grids();
  const int lane = threadIdx.x & 31;
  const std::int64_t per_row = (cols + kChunk - 1) / kChunk;
  for (std::int64_t w = warp_id(); w < r_rows * per_row; w += warp_count()) {
    const std::int64_t r = w / per_row;
    const std::int64_t j = (w % per_row) * kChunk + lane;
    const std::int64_t i = overflow_to_row[r];
    if (i < 0 || i >= m) continue;  // uniform across the warp
    const bool in = j < cols;
    const float p = in ? detail::load_f(pattern + r * ldp + j) : 0.0f;
    const bool stored = in && !(fabsf(p) <= 0.0f);
    const float d = chunk_dots(stored, i, j, a, b, o, lane);
    if (in) {
      float v = 0.0f;
      if (stored) {
        v = alpha * d;
        if (beta != 0.0f) v += beta * detail::load_f(out + r * ldo + j);
      }
      detail::store_f(out + r * ldo + j, v);
    }
  }
}

template <class T>
void set_vec(DenseView<const T> a, const T* b, Operands& o) {
  constexpr std::int64_t v = 16 / sizeof(T);
  o.vec = o.b_transposed && detail::aligned16(a.data) && detail::aligned16(b) && o.k % v == 0 && o.lda % v == 0 &&
          o.ldb % v == 0;
}

// Checks the pattern, out, A and B (in that order) against each other.
template <class T, class Pattern, class Out>
Operands check_operands(DenseView<const T> a, Op op_b, DenseView<const T> b, Pattern pattern, Out out) {
  detail::check_device_operand(pattern, kWhere, "pattern");
  detail::check_device_operand(out, kWhere, "out");
  detail::check_device_operand(a, kWhere, "A");
  detail::check_device_operand(b, kWhere, "B");
  twell::detail::check_sddmm_operands(a, op_b, b, pattern, out, kWhere);
  const bool t = op_b == Op::transpose;
  const std::int64_t n = twell::detail::cols_of(pattern);
  return Operands{a.cols, n, a.ld, b.ld, t};
}

// The checked operands of one call, with op(B)'s columns as contiguous rows (for op_b = none, B^T
// in stream-ordered scratch that lives as long as this object) and the 16-byte path chosen.
template <class T>
class Prepared {
 public:
  template <class Pattern, class Out>
  Prepared(DenseView<const T> a, Op op_b, DenseView<const T> b, Pattern pattern, Out out, cudaStream_t stream)
      : o_(check_operands(a, op_b, b, pattern, out)),
        scratch_(o_.b_transposed ? 0 : static_cast<std::size_t>(b.rows * b.cols) * sizeof(T), stream, kWhere),
        b_(b.data) {
    if (!o_.b_transposed && b.rows * b.cols != 0) {
      detail::transpose_dense<T>(b.data, b.rows, b.cols, b.ld, scratch_.as<T>(), b.rows, stream,
                                 "twell::cuda::sddmm (transpose B)");
      b_ = scratch_.as<T>();
      o_.b_transposed = true;
      o_.ldb = b.rows;
    }
    set_vec(a, b_, o_);
  }
  const Operands& operands() const { return o_; }
  const T* b() const { return b_; }

 private:
  Operands o_;
  detail::Scratch scratch_;
  const T* b_;
};

// CSR and ELL: out shares the pattern's index arrays, so it has the pattern's shape and size
// (`what`: nnz or width).
template <class Out, class Pattern>
void require_index_shape(const Out& out, const Pattern& pattern, const char* what, std::int64_t out_size,
                         std::int64_t pattern_size) {
  require(out.rows == pattern.rows && out.cols == pattern.cols && out_size == pattern_size, ErrorCode::shape_mismatch,
          kWhere, "out is ", detail::shape(out.rows, out.cols), " with ", what, " ", out_size, " but the pattern is ",
          detail::shape(pattern.rows, pattern.cols), " with ", what, " ", pattern_size);
}

// Enough warps for one chunk each (grid-stride beyond 2^16 CTAs), so consecutive chunks share a CTA.
unsigned chunk_grid(std::int64_t chunks) { return detail::grid_for(chunks * 32, kThreads, 1 << 16); }
std::int64_t chunks_of(std::int64_t positions) { return (positions + kChunk - 1) / kChunk; }

template <class T>
void launch_twell(DenseView<const T> a, const T* b, TwellView<const T> pattern, TwellView<T> out, const Operands& o,
                  float alpha, float beta, cudaStream_t stream) {
  require(out.rows == pattern.rows && out.cols == pattern.cols && out.layout == pattern.layout,
          ErrorCode::shape_mismatch, kWhere, "out is ", detail::shape(out.rows, out.cols), " with tile ",
          out.layout.tile, ", C ", out.layout.compression, " but the pattern is ",
          detail::shape(pattern.rows, pattern.cols), " with tile ", pattern.layout.tile, ", C ",
          pattern.layout.compression);
  if (pattern.rows == 0 || pattern.cols == 0) return;
  const std::int64_t chunks = pattern.rows * chunks_of(pattern.layout.packed_width(pattern.cols));
  ::twell::detail::launch_kernel("twell::cuda::sddmm (TwELL kernel)", twell_sddmm_kernel<T>, chunk_grid(chunks),
                                 kThreads, 0, stream, pattern.rows, pattern.cols, pattern.layout, pattern.packed,
                                 out.packed, out.value_plane, a.data, b, o, alpha, beta);
}

}  // namespace

template <Value T>
void sddmm(DenseView<const T> a, Op op_b, DenseView<const T> b, CsrView<const T> pattern, CsrView<T> out, float alpha,
           float beta, const KernelOptions& options) {
  const cudaStream_t stream = detail::stream_of(options);
  const Prepared<T> p(a, op_b, b, pattern, out, stream);
  require_index_shape(out, pattern, "nnz", out.nnz, pattern.nnz);
  if (pattern.rows > 0 && pattern.nnz > 0) {
    ::twell::detail::launch_kernel("twell::cuda::sddmm (CSR kernel)", csr_sddmm_kernel<T>,
                                   chunk_grid(chunks_of(pattern.nnz)), kThreads, 0, stream, pattern.rows, pattern.nnz,
                                   pattern.row_ptr, pattern.col_idx, out.values, a.data, p.b(), p.operands(), alpha,
                                   beta);
  }
  detail::report_path(options, "cuda/sddmm/csr/entry_chunks");
}

template <Value T>
void sddmm(DenseView<const T> a, Op op_b, DenseView<const T> b, EllView<const T> pattern, EllView<T> out, float alpha,
           float beta, const KernelOptions& options) {
  const cudaStream_t stream = detail::stream_of(options);
  const Prepared<T> p(a, op_b, b, pattern, out, stream);
  require_index_shape(out, pattern, "width", out.width, pattern.width);
  if (pattern.rows > 0 && pattern.width > 0) {
    ::twell::detail::launch_kernel("twell::cuda::sddmm (ELL kernel)", ell_sddmm_kernel<T>,
                                   chunk_grid(pattern.rows * chunks_of(pattern.width)), kThreads, 0, stream,
                                   pattern.rows, pattern.row_count, pattern.width, pattern.col_idx, out.values, a.data,
                                   p.b(), p.operands(), alpha, beta);
  }
  detail::report_path(options, "cuda/sddmm/ell/slot_chunks");
}

template <Value T>
void sddmm(DenseView<const T> a, Op op_b, DenseView<const T> b, TwellView<const T> pattern, TwellView<T> out,
           float alpha, float beta, const KernelOptions& options) {
  const cudaStream_t stream = detail::stream_of(options);
  const Prepared<T> p(a, op_b, b, pattern, out, stream);
  launch_twell(a, p.b(), pattern, out, p.operands(), alpha, beta, stream);
  detail::report_path(options, "cuda/sddmm/twell/slot_chunks");
}

template <Value T>
void sddmm(DenseView<const T> a, Op op_b, DenseView<const T> b, HybridView<const T> pattern, HybridView<T> out,
           float alpha, float beta, const KernelOptions& options) {
  const cudaStream_t stream = detail::stream_of(options);
  const Prepared<T> p(a, op_b, b, pattern, out, stream);
  require(out.overflow.rows == pattern.overflow.rows, ErrorCode::shape_mismatch, kWhere, "out has ", out.overflow.rows,
          " overflow rows but the pattern has ", pattern.overflow.rows);
  launch_twell(a, p.b(), pattern.twell, out.twell, p.operands(), alpha, beta, stream);
  const std::int64_t r = pattern.overflow.rows;
  if (r > 0 && pattern.cols() > 0) {
    ::twell::detail::launch_kernel("twell::cuda::sddmm (overflow kernel)", overflow_sddmm_kernel<T>,
                                   chunk_grid(r * chunks_of(pattern.cols())), kThreads, 0, stream, r, pattern.cols(),
                                   pattern.overflow_to_row, pattern.rows(), pattern.overflow.data, pattern.overflow.ld,
                                   out.overflow.data, out.overflow.ld, a.data, p.b(), p.operands(), alpha, beta);
    detail::copy_dense_rows_into_shadows(pattern.twell, pattern.overflow_to_row, out, stream,
                                         "twell::cuda::sddmm (shadow slots)");
  }
  if (pattern.rows() > 0 && out.row_to_overflow != pattern.row_to_overflow)
    detail::check_cuda(cudaMemcpyAsync(out.row_to_overflow, pattern.row_to_overflow,
                                       static_cast<std::size_t>(pattern.rows()) * sizeof(std::int32_t),
                                       cudaMemcpyDeviceToDevice, stream),
                       "twell::cuda::sddmm (row_to_overflow)");
  if (r > 0 && out.overflow_to_row != pattern.overflow_to_row)
    detail::check_cuda(
        cudaMemcpyAsync(out.overflow_to_row, pattern.overflow_to_row,
                        static_cast<std::size_t>(r) * sizeof(std::int32_t), cudaMemcpyDeviceToDevice, stream),
        "twell::cuda::sddmm (overflow_to_row)");
  detail::report_path(options,
                      r > 0 ? "cuda/sddmm/hybrid/slot_chunks+overflow_chunks" : "cuda/sddmm/hybrid/slot_chunks");
}

TWELL_FOR_EACH_VALUE_TYPE(TWELL_INSTANTIATE_SDDMM)

}  // namespace twell::cuda
