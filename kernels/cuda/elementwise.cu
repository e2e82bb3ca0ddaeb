// cuda elementwise kernels on one structure: out = x * y, out = x + s * sign(y) (y = x too) and
// out = x * act'(g), per format.
// A thread per stored slot (four consecutive TwELL slot words where the layout and alignment
// allow); no reduction, so results are deterministic by construction.
#include <algorithm>
#include <cstdint>

#include <twell/kernels/backends.hpp>
#include <twell/kernels/detail/per_format.hpp>

#include "cuda_launch.cuh"
#include "hybrid_shadow.cuh"
#include "pattern_ops.cuh"
#include "sparse_common.cuh"
#include "vec16.cuh"

namespace twell::cuda {
namespace {

constexpr int kThreads = 256;

// The operations; sign(+-0) = 0 and NaN propagates (as the reference). kEitherStored: in a
// Hybrid's overflow rows, which store no explicit zeros, the operation also applies where only y
// stores a value (x + s sign(y) is not zero there; x * y is).
struct Multiply {
  static constexpr bool kEitherStored = false;
  __device__ float operator()(float x, float y) const { return x * y; }
};
// x * act'(g) (pattern_ops.cuh).
struct ActivationDerivative {
  static constexpr bool kEitherStored = false;
  Activation act = Activation::relu;
  __device__ float operator()(float x, float g) const { return detail::times_activation_derivative(x, g, act); }
};
struct AddScaledSign {
  static constexpr bool kEitherStored = true;
  float s = 0.0f;
  __device__ float operator()(float x, float y) const { return detail::plus_scaled_sign(x, s, y); }
};

#define TWELL_GRID_STRIDE(idx, n)                                                                      \
  for (std::int64_t idx = blockIdx.x * static_cast<std::int64_t>(blockDim.x) + threadIdx.x; idx < (n); \
       idx += static_cast<std::int64_t>(gridDim.x) * blockDim.x)

// CSR values: a thread owns value e. Precondition: x, y, out share one structure. These kernels
// are one memory-bound pass; bench/ has no dedicated case for them (they run inside the FFN
// training step).
template <class T, class F>
__global__ void values_kernel(std::int64_t n, const T* x, const T* y, T* out, F f) {
  ::twell::detail::wait_for_prior_grids();
  TWELL_GRID_STRIDE(e, n) {
    detail::store_f(out + e, f(detail::load_f(x + e), detail::load_f(y + e)));
  }
}

// ELL: a thread owns slot (i, s) and writes it only when s < row_count[i] (padding untouched).
template <class T, class F>
__global__ void ell_kernel(std::int64_t rows, std::int64_t width, const std::int32_t* count, const T* x, const T* y,
                           T* out, F f) {
  ::twell::detail::wait_for_prior_grids();
  TWELL_GRID_STRIDE(idx, rows * width) {
    const std::int64_t i = idx / width, s = idx - i * width;
    if (s < count[i])
      detail::store_f(out + idx, f(detail::load_f(x + idx), detail::load_f(y + idx)));
  }
}

// TwELL: a thread owns one slot word. Slot 0 and unused slots are copied from x (fp32: the value
// plane zeroed there); used slots get f(x, y) with x's column. out may alias x or y. (The packed
// width is a whole number of slot groups, so a word's slot is its index modulo S.)
template <class T, class F>
__global__ void twell_kernel(std::int64_t words, TwellLayout layout, const std::uint32_t* x, const T* x_plane,
                             const std::uint32_t* y, const T* y_plane, std::uint32_t* out, T* out_plane, F f) {
  ::twell::detail::wait_for_prior_grids();
  const int slots = layout.slots();
  TWELL_GRID_STRIDE(idx, words) {
    const std::int64_t s = idx % slots;
    const std::int64_t n = min(x[idx - s], static_cast<std::uint32_t>(layout.capacity()));
    const std::uint32_t word = x[idx];
    if (s == 0 || s > n) {
      out[idx] = word;
      if constexpr (std::is_same_v<T, float>) out_plane[idx] = 0.0f;
    } else if constexpr (std::is_same_v<T, float>) {
      const float v = f(x_plane[idx], y_plane[idx]);
      out[idx] = word;
      out_plane[idx] = v;
    } else {
      const float xv = detail::bits_to_f<T>(word >> 16);
      const float yv = detail::bits_to_f<T>(y[idx] >> 16);
      out[idx] = TwellLayout::pack(detail::bits_of<T>(f(xv, yv)), TwellLayout::slot_column(word));
    }
  }
}

// The same for 16-bit values when S is a power of two of at least 4 and the words are 16-byte
// aligned: a thread owns four consecutive words of one slot group (one 16-byte load of x and of
// y, one store), and the slot comes from a mask instead of a 64-bit remainder per word. Same
// results as twell_kernel; Nsight Compute, H100, 16384 x 5632 TwELL(256, 16): 21-25 us against
// the one-word kernel's 44-46 us (docs/benchmarks/history.md, "Where a training step's time goes").
template <class T, class F>
__global__ void twell_quad_kernel(std::int64_t quads, std::uint32_t slot_mask, std::uint32_t capacity,
                                  const uint4* x, const uint4* y, uint4* out, F f) {
  ::twell::detail::wait_for_prior_grids();
  TWELL_GRID_STRIDE(q, quads) {
    const uint4 xq = x[q], yq = y[q];
    const detail::QuadSlots slots = detail::quad_slots(x, q, xq, slot_mask, capacity);
    const std::uint32_t xw[4] = {xq.x, xq.y, xq.z, xq.w}, yw[4] = {yq.x, yq.y, yq.z, yq.w};
    std::uint32_t ow[4];
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const std::uint32_t s = slots.first + i;
      ow[i] = s == 0 || s > slots.entries ? xw[i]
                              : TwellLayout::pack(detail::bits_of<T>(f(detail::bits_to_f<T>(xw[i] >> 16),
                                                                       detail::bits_to_f<T>(yw[i] >> 16))),
                                                  TwellLayout::slot_column(xw[i]));
    }
    out[q] = make_uint4(ow[0], ow[1], ow[2], ow[3]);
  }
}

// Hybrid overflow block: a thread owns one element (CTA rows blockIdx.y + i gridDim.y, columns
// strided over blockIdx.x: no index division); f where x (or, for kEitherStored, y) stores a
// value, +0 elsewhere.
template <class T, class F>
__global__ void overflow_kernel(std::int64_t r_rows, std::int64_t cols, const T* x, std::int64_t ldx, const T* y,
                                std::int64_t ldy, T* out, std::int64_t ldo, F f) {
  ::twell::detail::wait_for_prior_grids();
  for (std::int64_t r = blockIdx.y; r < r_rows; r += gridDim.y) {
    for (std::int64_t j = blockIdx.x * static_cast<std::int64_t>(blockDim.x) + threadIdx.x; j < cols;
         j += static_cast<std::int64_t>(gridDim.x) * blockDim.x) {
      const float xv = detail::load_f(x + r * ldx + j);
      const float yv = detail::load_f(y + r * ldy + j);
      const bool stored = !(fabsf(xv) <= 0.0f) || (F::kEitherStored && !(fabsf(yv) <= 0.0f));
      detail::store_f(out + r * ldo + j, stored ? f(xv, yv) : 0.0f);
    }
  }
}

#undef TWELL_GRID_STRIDE

template <class T, class F>
void run(CsrView<const T> x, const T* y, CsrView<T> out, F f, const char* where, const KernelOptions& options) {
  if (x.nnz == 0) return;
  ::twell::detail::launch_kernel(where, values_kernel<T, F>, detail::grid_for(x.nnz, kThreads), kThreads, 0,
                                 detail::stream_of(options), x.nnz, x.values, y, out.values, f);
}

template <class T, class F>
void run(EllView<const T> x, const T* y, EllView<T> out, F f, const char* where, const KernelOptions& options) {
  if (x.rows * x.width == 0) return;
  ::twell::detail::launch_kernel(where, ell_kernel<T, F>, detail::grid_for(x.rows * x.width, kThreads), kThreads, 0,
                                 detail::stream_of(options), x.rows, x.width, x.row_count, x.values, y, out.values, f);
}

template <class T, class F>
void run(TwellView<const T> x, const TwellView<const T>* y, TwellView<T> out, F f, const char* where,
         const KernelOptions& options) {
  const std::int64_t words = x.rows * x.packed_width();
  if (words == 0) return;
  const cudaStream_t stream = detail::stream_of(options);
  if constexpr (ValueTraits<T>::packs_in_slot) {
    if (detail::quad_words(x.layout, x.packed, y->packed, out.packed)) {
      const std::int64_t quads = words / 4;
      ::twell::detail::launch_kernel(
          where, twell_quad_kernel<T, F>, detail::grid_for(quads, kThreads), kThreads, 0, stream, quads,
          static_cast<std::uint32_t>(x.layout.slots() - 1), static_cast<std::uint32_t>(x.layout.capacity()),
          reinterpret_cast<const uint4*>(x.packed), reinterpret_cast<const uint4*>(y->packed),
          reinterpret_cast<uint4*>(out.packed), f);
      return;
    }
  }
  ::twell::detail::launch_kernel(where, twell_kernel<T, F>, detail::grid_for(words, kThreads), kThreads, 0, stream,
                                 words, x.layout, x.packed, x.value_plane, y->packed, y->value_plane, out.packed,
                                 out.value_plane, f);
}

template <class T, class F>
void run(HybridView<const T> x, const HybridView<const T>* y, HybridView<T> out, F f, const char* where,
         const KernelOptions& options) {
  run(x.twell, &y->twell, out.twell, f, where, options);
  const cudaStream_t stream = detail::stream_of(options);
  const std::int64_t r = x.overflow.rows;
  if (r > 0 && x.cols() > 0) {
    const dim3 grid(detail::grid_for(x.cols(), kThreads), static_cast<unsigned>(std::min<std::int64_t>(r, 65535)));
    ::twell::detail::launch_kernel(where, overflow_kernel<T, F>, grid, kThreads, 0, stream, r, x.cols(),
                                   x.overflow.data, x.overflow.ld, y->overflow.data, y->overflow.ld, out.overflow.data,
                                   out.overflow.ld, f);
    detail::copy_dense_rows_into_shadows(x.twell, x.overflow_to_row, out, stream, where);
  }
  if (x.rows() > 0 && out.row_to_overflow != x.row_to_overflow)
    detail::check_cuda(
        cudaMemcpyAsync(out.row_to_overflow, x.row_to_overflow,
                        static_cast<std::size_t>(x.rows()) * sizeof(std::int32_t), cudaMemcpyDeviceToDevice, stream),
        where);
  if (r > 0 && out.overflow_to_row != x.overflow_to_row)
    detail::check_cuda(
        cudaMemcpyAsync(out.overflow_to_row, x.overflow_to_row, static_cast<std::size_t>(r) * sizeof(std::int32_t),
                        cudaMemcpyDeviceToDevice, stream),
        where);
}

// The kernels index y and out by x's structure, so each must match x's shape and the sizes that
// structure implies (CSR nnz, ELL width, TwELL layout, Hybrid overflow rows); the index arrays
// themselves are the caller's precondition (the reference compares them).
template <class View, class Other>
void check_pair(View x, Other o, const char* where, const char* name) {
  using twell::detail::cols_of;
  using twell::detail::rows_of;
  require(rows_of(x) == rows_of(o) && cols_of(x) == cols_of(o), ErrorCode::shape_mismatch, where, name, " is ",
          detail::shape(rows_of(o), cols_of(o)), " but x is ", detail::shape(rows_of(x), cols_of(x)));
  if constexpr (requires { x.nnz; }) {
    require(o.nnz == x.nnz, ErrorCode::shape_mismatch, where, name, " has nnz ", o.nnz, " but x has ", x.nnz);
  } else if constexpr (requires { x.width; }) {
    require(o.width == x.width, ErrorCode::shape_mismatch, where, name, " has width ", o.width, " but x has ",
            x.width);
  } else {
    const auto layout_of = [](const auto& v) -> const TwellLayout& {
      if constexpr (requires { v.twell; }) {
        return v.twell.layout;
      } else {
        return v.layout;
      }
    };
    const TwellLayout &xl = layout_of(x), &ol = layout_of(o);
    require(ol == xl, ErrorCode::shape_mismatch, where, name, " has tile ", ol.tile, ", C ", ol.compression,
            " but x has tile ", xl.tile, ", C ", xl.compression);
    if constexpr (requires { x.overflow; })
      require(o.overflow.rows == x.overflow.rows, ErrorCode::shape_mismatch, where, name, " has ", o.overflow.rows,
              " overflow rows but x has ", x.overflow.rows);
  }
}

// CSR/ELL kernels take y's value array, TwELL/Hybrid ones the view itself.
template <class View>
auto values_of(View& v) {
  if constexpr (requires { v.values; }) {
    return v.values;
  } else {
    return &v;
  }
}

// out = f(x, y) on x's structure: the checks, the launch and the report every operation shares
// (`where` names it in errors, `path` in the report, `y_name` its second operand).
template <class View, class Out, class F>
void elementwise(const char* where, const char* path, View x, View y, const char* y_name, Out out, F f,
                 const KernelOptions& options, const char* format) {
  detail::check_device_operand(x, where, "x");
  detail::check_device_operand(y, where, y_name);
  detail::check_device_operand(out, where, "out");
  check_pair(x, y, where, y_name);
  check_pair(x, out, where, "out");
  run(x, values_of(y), out, f, where, options);
  twell::detail::report_format_path(options, path, format);
}

template <class View, class Out>
void multiply_impl(View x, View y, Out out, const KernelOptions& options, const char* format) {
  elementwise("twell::cuda::multiply_on_pattern", "cuda/multiply_on_pattern", x, y, "y", out, Multiply{}, options,
              format);
}

// out = x + s * sign(y); the one-operand form passes y = x.
template <class View, class Out>
void add_scaled_sign_impl(View x, float s, View y, Out out, const KernelOptions& options, const char* format) {
  elementwise("twell::cuda::add_scaled_sign", "cuda/add_scaled_sign", x, y, "y", out, AddScaledSign{s}, options,
              format);
}

template <class View, class Out>
void activation_derivative_impl(View x, View g, Activation act, Out out, const KernelOptions& options,
                                const char* format) {
  twell::detail::check_activation_kind(act, "twell::cuda::multiply_by_activation_derivative");
  elementwise("twell::cuda::multiply_by_activation_derivative", "cuda/multiply_by_activation_derivative", x, g, "g",
              out, ActivationDerivative{act}, options, format);
}

}  // namespace

TWELL_FOR_EACH_SPARSE_VIEW(TWELL_DEFINE_ELEMENTWISE)
TWELL_FOR_EACH_VALUE_TYPE(TWELL_INSTANTIATE_ELEMENTWISE)

}  // namespace twell::cuda
