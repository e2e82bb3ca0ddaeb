// twell::cuda fused FFN inference forward: the gate through gemm_to_sparse (Hybrid), then one
// kernel that walks each token's gate nonzeros, computes the up projection only there, and
// accumulates h Wd without writing h to global memory (docs/gemm_to_sparse.md, "FFN").
#include <cstdint>
#include <string>
#include <type_traits>

#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <twell/converters/options.hpp>
#include <twell/instantiate.hpp>
#include <twell/kernels/backends.hpp>
#include <twell/kernels/ffn_cuda.hpp>

#include "cuda_check.hpp"

namespace twell::cuda {
namespace {

constexpr int kThreads = 256;
constexpr std::int64_t kMaxK = 8192;  // y accumulators live in registers: K / 256 per thread

struct FfnArgs {
  const void* x = nullptr;
  std::int64_t ldx = 0;
  const void* wu_t = nullptr;  // N x K; null for the non-gated FFN (h = gate)
  std::int64_t ldwu_t = 0;
  const void* wd = nullptr;  // N x K
  std::int64_t ldwd = 0;
  void* y = nullptr;  // M x K
  std::int64_t ldy = 0;
  std::int64_t k = 0;
  // The gate, a Hybrid M x N.
  std::int64_t n = 0;
  TwellLayout layout{};
  const std::uint32_t* packed = nullptr;
  const void* value_plane = nullptr;  // fp32 only
  const std::int32_t* row_to_overflow = nullptr;
  const void* overflow = nullptr;
  std::int64_t ld_overflow = 0;
};

// Hardware conversions (the portable ones in types.hpp round identically but cost registers).
template <class T>
__device__ __forceinline__ float bits_to_float(std::uint16_t b) {
  if constexpr (std::is_same_v<T, bf16>) {
    return __uint_as_float(static_cast<std::uint32_t>(b) << 16);
  } else {
    return __half2float(__ushort_as_half(b));
  }
}
template <class T>
__device__ __forceinline__ std::uint16_t float_to_bits(float f) {
  if constexpr (std::is_same_v<T, bf16>) {
    return float_to_bf16(f).bits;
  } else {
    return __half_as_ushort(__float2half_rn(f));
  }
}
template <class T>
__device__ __forceinline__ float dev_float(T v) {
  if constexpr (ValueTraits<T>::packs_in_slot) {
    return bits_to_float<T>(v.bits);
  } else {
    return v;
  }
}

// V consecutive values of T from p as floats (V == 8 reads 16 or 32 bytes, p suitably aligned).
template <class T, int V>
__device__ __forceinline__ void load_vec(const T* p, float (&out)[V]) {
  if constexpr (V == 8 && ValueTraits<T>::packs_in_slot) {
    const uint4 raw = *reinterpret_cast<const uint4*>(p);
    const std::uint32_t words[4] = {raw.x, raw.y, raw.z, raw.w};
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      out[2 * i] = bits_to_float<T>(static_cast<std::uint16_t>(words[i] & 0xffffu));
      out[2 * i + 1] = bits_to_float<T>(static_cast<std::uint16_t>(words[i] >> 16));
    }
  } else if constexpr (V == 8) {
    const float4 a = reinterpret_cast<const float4*>(p)[0];
    const float4 b = reinterpret_cast<const float4*>(p)[1];
    out[0] = a.x, out[1] = a.y, out[2] = a.z, out[3] = a.w;
    out[4] = b.x, out[5] = b.y, out[6] = b.z, out[7] = b.w;
  } else {
#pragma unroll
    for (int e = 0; e < V; ++e) out[e] = dev_float(p[e]);
  }
}

template <class T, int V>
__device__ __forceinline__ void store_vec(T* p, const float (&v)[V]) {
  if constexpr (V == 8 && ValueTraits<T>::packs_in_slot) {
    std::uint32_t words[4];
#pragma unroll
    for (int i = 0; i < 4; ++i)
      words[i] = static_cast<std::uint32_t>(float_to_bits<T>(v[2 * i])) |
                 (static_cast<std::uint32_t>(float_to_bits<T>(v[2 * i + 1])) << 16);
    *reinterpret_cast<uint4*>(p) = make_uint4(words[0], words[1], words[2], words[3]);
  } else if constexpr (V == 8) {
    reinterpret_cast<float4*>(p)[0] = make_float4(v[0], v[1], v[2], v[3]);
    reinterpret_cast<float4*>(p)[1] = make_float4(v[4], v[5], v[6], v[7]);
  } else {
#pragma unroll
    for (int e = 0; e < V; ++e) {
      if constexpr (ValueTraits<T>::packs_in_slot) {
        p[e] = ValueTraits<T>::from_bits(float_to_bits<T>(v[e]));
      } else {
        p[e] = v[e];
      }
    }
  }
}

// Sparse up and down projection of one token. CTA: one row of the gate (blockIdx.x) and the
// whole output row y(row, :); a thread owns the output columns tid*V + c*256*V in registers.
// The row's nonzeros are enumerated in column order, 256 candidates at a time (TwELL slots, or
// the dense overflow row for a Hybrid overflow row), compacted in order into shared memory by
// ballots; for the gated FFN each warp then takes nonzeros j and reduces x . Wu^T(j, :) over
// K (x staged in shared memory as fp32), h_j = gate_j * u_j stays in shared memory; finally
// every thread adds h_j * Wd(j, own columns) for each j. Deterministic: fixed order throughout.
// Preconditions: K <= kMaxK; V == 8 needs K, every leading dimension and every pointer aligned
// to 8 elements (16 bytes for 16-bit types). Benchmark: bench/ (gated FFN forward).
template <class T, int V>
__global__ void __launch_bounds__(kThreads) ffn_rows_kernel(FfnArgs a) {
  extern __shared__ float smem[];
  const bool gated = a.wu_t != nullptr;
  float* xs = smem;                                                    // K floats (gated only)
  auto* list_col = reinterpret_cast<std::int32_t*>(smem + (gated ? a.k : 0));  // kThreads
  float* list_val = reinterpret_cast<float*>(list_col + kThreads);     // kThreads
  __shared__ std::int32_t warp_count[kThreads / 32];

  const std::int64_t row = blockIdx.x;
  const int tid = static_cast<int>(threadIdx.x);
  const int lane = tid & 31, warp = tid >> 5;
  const T* x = static_cast<const T*>(a.x) + row * a.ldx;
  if (gated)
    for (std::int64_t k = tid; k < a.k; k += kThreads) xs[k] = dev_float(x[k]);

  constexpr int kChunks = static_cast<int>(kMaxK / (kThreads * V));
  float acc[kChunks][V];
#pragma unroll
  for (int c = 0; c < kChunks; ++c)
#pragma unroll
    for (int e = 0; e < V; ++e) acc[c][e] = 0.0f;

  const std::int32_t orow = a.row_to_overflow[row];
  const std::int64_t pw = a.layout.packed_width(a.n);
  const int slots = a.layout.slots();
  const std::int64_t candidates = orow >= 0 ? a.n : pw;
  const std::uint32_t* packed_row = a.packed + row * pw;

  for (std::int64_t c0 = 0; c0 < candidates; c0 += kThreads) {
    const std::int64_t v = c0 + tid;
    bool here = false;
    std::int32_t col = 0;
    float val = 0.0f;
    if (v < candidates) {
      if (orow >= 0) {
        const T g = static_cast<const T*>(a.overflow)[orow * a.ld_overflow + v];
        here = is_stored(g);
        col = static_cast<std::int32_t>(v);
        val = dev_float(g);
      } else {
        const std::int64_t t = v / slots;
        const auto p = static_cast<std::uint32_t>(v % slots);
        if (p != 0 && p <= packed_row[t * slots]) {
          const std::uint32_t word = packed_row[v];
          here = true;
          col = static_cast<std::int32_t>(a.layout.tile_begin(t) + TwellLayout::slot_column(word));
          if constexpr (ValueTraits<T>::packs_in_slot) {
            val = bits_to_float<T>(TwellLayout::slot_value_bits(word));
          } else {
            val = static_cast<const float*>(a.value_plane)[row * pw + v];
          }
        }
      }
    }
    const std::uint32_t mask = __ballot_sync(0xffffffffu, here);
    if (lane == 0) warp_count[warp] = __popc(mask);
    __syncthreads();  // also orders the previous chunk's reads of the list before these writes
    int offset = 0, total = 0;
#pragma unroll
    for (int w = 0; w < kThreads / 32; ++w) {
      offset += w < warp ? warp_count[w] : 0;
      total += warp_count[w];
    }
    if (here) {
      const int at = offset + __popc(mask & ((1u << lane) - 1u));
      list_col[at] = col;
      list_val[at] = val;
    }
    __syncthreads();

    if (gated) {
      for (int e = warp; e < total; e += kThreads / 32) {
        const T* wrow = static_cast<const T*>(a.wu_t) + std::int64_t{list_col[e]} * a.ldwu_t;
        float s = 0.0f;
        for (std::int64_t k0 = std::int64_t{lane} * V; k0 < a.k; k0 += 32 * V) {
          float w[V];
          load_vec<T, V>(wrow + k0, w);
#pragma unroll
          for (int i = 0; i < V; ++i) s = fmaf(xs[k0 + i], w[i], s);
        }
#pragma unroll
        for (int d = 16; d > 0; d >>= 1) s += __shfl_xor_sync(0xffffffffu, s, d);
        if (lane == 0) list_val[e] *= s;
      }
      __syncthreads();
    }

    for (int e = 0; e < total; ++e) {
      const float h = list_val[e];
      const T* drow = static_cast<const T*>(a.wd) + std::int64_t{list_col[e]} * a.ldwd;
#pragma unroll
      for (int c = 0; c < kChunks; ++c) {
        const std::int64_t k0 = (std::int64_t{c} * kThreads + tid) * V;
        if (k0 < a.k) {
          float w[V];
          load_vec<T, V>(drow + k0, w);
#pragma unroll
          for (int i = 0; i < V; ++i) acc[c][i] = fmaf(h, w[i], acc[c][i]);
        }
      }
    }
  }

  T* y = static_cast<T*>(a.y) + row * a.ldy;
#pragma unroll
  for (int c = 0; c < kChunks; ++c) {
    const std::int64_t k0 = (std::int64_t{c} * kThreads + tid) * V;
    if (k0 < a.k) store_vec<T, V>(y + k0, acc[c]);
  }
}

// out (cols x rows) = in (rows x cols)^T through 32 x 32 shared tiles; CTA 32 x 8 threads.
template <class T>
__global__ void transpose_kernel(const T* in, std::int64_t rows, std::int64_t cols, std::int64_t ld_in, T* out,
                                 std::int64_t ld_out) {
  __shared__ T tile[32][33];
  const std::int64_t c0 = std::int64_t{blockIdx.x} * 32, r0 = std::int64_t{blockIdx.y} * 32;
  for (int i = static_cast<int>(threadIdx.y); i < 32; i += 8) {
    const std::int64_t r = r0 + i, c = c0 + threadIdx.x;
    if (r < rows && c < cols) tile[i][threadIdx.x] = in[r * ld_in + c];
  }
  __syncthreads();
  for (int i = static_cast<int>(threadIdx.y); i < 32; i += 8) {
    const std::int64_t oc = c0 + i, orow_col = r0 + threadIdx.x;
    if (oc < cols && orow_col < rows) out[oc * ld_out + orow_col] = tile[threadIdx.x][i];
  }
}

bool aligned16(const void* p) { return reinterpret_cast<std::uintptr_t>(p) % 16 == 0; }

template <class T>
void check_device(DenseView<T> v, const char* where, const char* name) {
  require(v.space == MemorySpace::device, ErrorCode::space_mismatch, where, name,
          " lives in host memory; the cuda backend takes device operands only");
  require(v.rows >= 0 && v.cols >= 0, ErrorCode::invalid_argument, where, name, " has negative shape ", v.rows,
          " x ", v.cols);
  require(v.rows == 0 || v.ld >= v.cols, ErrorCode::invalid_argument, where, name, " has leading dimension ", v.ld,
          " below its ", v.cols, " columns");
  require(v.rows * v.cols == 0 || v.data != nullptr, ErrorCode::invalid_argument, where, name, " is null with shape ",
          v.rows, " x ", v.cols);
}

// w_in (wg or wu) is K x N, wd is N x K.
template <class T>
void check_weights(DenseView<const T> w_in, DenseView<const T> wd, const char* where) {
  check_device(w_in, where, "wu");
  check_device(wd, where, "wd");
  require(wd.rows == w_in.cols && wd.cols == w_in.rows, ErrorCode::shape_mismatch, where, "wd is ", wd.rows, " x ",
          wd.cols, " but wu is ", w_in.rows, " x ", w_in.cols, " (wd must be ", w_in.cols, " x ", w_in.rows, ")");
  require(w_in.rows <= kMaxK, ErrorCode::unsupported, where, "K = ", w_in.rows,
          " exceeds the fused FFN kernel's limit of ", kMaxK);
}

template <class T>
void check_io(DenseView<const T> x, DenseView<T> y, std::int64_t k, const char* where) {
  check_device(x, where, "x");
  check_device(y, where, "y");
  require(x.cols == k, ErrorCode::shape_mismatch, where, "x is ", x.rows, " x ", x.cols, " but the weights need ", k,
          " columns");
  require(y.rows == x.rows && y.cols == k, ErrorCode::shape_mismatch, where, "y is ", y.rows, " x ", y.cols,
          " but x needs ", x.rows, " x ", k);
  require(x.rows <= INT32_MAX, ErrorCode::unsupported, where, "M = ", x.rows, " exceeds 2^31 - 1 rows");
}

// Runs ffn_rows_kernel on a gate Hybrid; wu_t null for the non-gated FFN. Returns the path name.
template <class T>
std::string sparse_rows(DenseView<const T> x, const HybridMatrix<T>& gate, const T* wu_t, std::int64_t ldwu_t,
                        DenseView<const T> wd, DenseView<T> y, cudaStream_t stream, const char* where) {
  FfnArgs a;
  a.x = x.data;
  a.ldx = x.ld;
  a.wu_t = wu_t;
  a.ldwu_t = ldwu_t;
  a.wd = wd.data;
  a.ldwd = wd.ld;
  a.y = y.data;
  a.ldy = y.ld;
  a.k = x.cols;
  a.n = gate.cols();
  a.layout = gate.layout();
  a.packed = gate.twell().packed().data();
  a.value_plane = gate.twell().value_plane().data();
  a.row_to_overflow = gate.row_to_overflow().data();
  a.overflow = gate.overflow().values().data();
  a.ld_overflow = gate.overflow().ld();
  if (x.rows == 0 || x.cols == 0) return "empty";

  const bool vec = x.cols % 8 == 0 && x.ld % 8 == 0 && wd.ld % 8 == 0 && y.ld % 8 == 0 && aligned16(x.data) &&
                   aligned16(wd.data) && aligned16(y.data) && (wu_t == nullptr || (ldwu_t % 8 == 0 && aligned16(wu_t)));
  const std::size_t smem = (wu_t != nullptr ? static_cast<std::size_t>(x.cols) : 0) * sizeof(float) +
                           2 * kThreads * sizeof(std::int32_t);
  const auto grid = static_cast<unsigned>(x.rows);
  if (vec) {
    ffn_rows_kernel<T, 8><<<grid, kThreads, smem, stream>>>(a);
  } else {
    ffn_rows_kernel<T, 1><<<grid, kThreads, smem, stream>>>(a);
  }
  ::twell::detail::check_launch(where);
  return vec ? "ffn_rows_v8" : "ffn_rows_v1";
}

ConvertOptions hybrid_convert(const KernelOptions& options) {
  ConvertOptions c;
  c.overflow = OverflowPolicy::hybrid;
  c.stream = options.stream;
  return c;
}

}  // namespace

template <Value T>
GatedFfnPlan<T>::GatedFfnPlan(DenseView<const T> wg, DenseView<const T> wu, DenseView<const T> wd, TwellLayout layout,
                              const KernelOptions& options)
    : wg_(wg), wu_(wu), wd_(wd), layout_(layout) {
  constexpr const char* kWhere = "twell::cuda::GatedFfnPlan";
  check_weights<T>(wu, wd, kWhere);
  check_device(wg, kWhere, "wg");
  require(wg.rows == wu.rows && wg.cols == wu.cols, ErrorCode::shape_mismatch, kWhere, "wg is ", wg.rows, " x ",
          wg.cols, " but wu is ", wu.rows, " x ", wu.cols);
  check_layout(layout, kWhere);
  wu_t_ = DenseMatrix<T>(wu.cols, wu.rows, MemorySpace::device);
  if (wu.rows > 0 && wu.cols > 0) {
    const dim3 grid(static_cast<unsigned>((wu.cols + 31) / 32), static_cast<unsigned>((wu.rows + 31) / 32));
    transpose_kernel<T><<<grid, dim3(32, 8), 0, static_cast<cudaStream_t>(options.stream.handle)>>>(
        wu.data, wu.rows, wu.cols, wu.ld, wu_t_.values().data(), wu_t_.ld());
    ::twell::detail::check_launch(kWhere);
  }
}

template <Value T>
void GatedFfnPlan<T>::forward(DenseView<const T> x, ActivationSpec act, DenseView<T> y,
                              const KernelOptions& options) const {
  constexpr const char* kWhere = "twell::cuda::gated_ffn_forward";
  check_io<T>(x, y, wu_.rows, kWhere);
  KernelReport gate_report;
  KernelOptions gate_options = options;
  gate_options.report = &gate_report;
  const HybridMatrix<T> gate = gemm_to_sparse<T>(x, wg_, act, layout_, hybrid_convert(options), gate_options);
  const std::string path = sparse_rows<T>(x, gate, wu_t_.values().data(), wu_t_.ld(), wd_, y,
                                          static_cast<cudaStream_t>(options.stream.handle), kWhere);
  if (options.report != nullptr) options.report->path = "gate:" + gate_report.path + "+" + path;
}

template <Value T>
void gated_ffn_forward(DenseView<const T> x, DenseView<const T> wg, DenseView<const T> wu, DenseView<const T> wd,
                       ActivationSpec act, DenseView<T> y, const KernelOptions& options) {
  const GatedFfnPlan<T> plan(wg, wu, wd, TwellLayout{}, options);
  plan.forward(x, act, y, options);
}

template <Value T>
void ffn_forward(DenseView<const T> x, DenseView<const T> wu, DenseView<const T> wd, ActivationSpec act,
                 DenseView<T> y, const KernelOptions& options) {
  constexpr const char* kWhere = "twell::cuda::ffn_forward";
  check_weights<T>(wu, wd, kWhere);
  check_io<T>(x, y, wu.rows, kWhere);
  KernelReport gate_report;
  KernelOptions gate_options = options;
  gate_options.report = &gate_report;
  const HybridMatrix<T> h = gemm_to_sparse<T>(x, wu, act, TwellLayout{}, hybrid_convert(options), gate_options);
  const std::string path =
      sparse_rows<T>(x, h, nullptr, 0, wd, y, static_cast<cudaStream_t>(options.stream.handle), kWhere);
  if (options.report != nullptr) options.report->path = "gate:" + gate_report.path + "+" + path;
}

#define TWELL_INSTANTIATE(T)                                                                                        \
  template class GatedFfnPlan<T>;                                                                                   \
  template void gated_ffn_forward<T>(DenseView<const T>, DenseView<const T>, DenseView<const T>, DenseView<const T>, \
                                     ActivationSpec, DenseView<T>, const KernelOptions&);                           \
  template void ffn_forward<T>(DenseView<const T>, DenseView<const T>, DenseView<const T>, ActivationSpec,          \
                               DenseView<T>, const KernelOptions&);
TWELL_FOR_EACH_VALUE_TYPE(TWELL_INSTANTIATE)
#undef TWELL_INSTANTIATE

}  // namespace twell::cuda
