// cuda reductions over stored values: l1_norm (sum |v| in fp64) and l0_norm (count of v != 0).
// Deterministic: a grid whose size depends only on the problem (its size, and for TwELL whether
// the four-word source applies: the layout and the slot array's 16-byte alignment), each thread
// summing a fixed strided sequence, a fixed shared-memory tree per block, and one block adding
// the block partials in index order. The same input gives the same bits; the same values at
// another alignment may differ in the last bits of the fp64 sum. Counts are integers, so their
// order never matters.
#include <cstdint>

#include <twell/kernels/backends.hpp>
#include <twell/kernels/detail/per_format.hpp>

#include "cuda_launch.cuh"
#include "read_back.cuh"
#include "sparse_common.cuh"
#include "vec16.cuh"

namespace twell::cuda {
namespace {

constexpr int kThreads = 256;
constexpr std::int64_t kMaxBlocks = 1024;

// Adds a stored value v to a thread's sum of |v| and its count of v != 0.
__device__ __forceinline__ void add_value(float v, double& sum, unsigned long long& count) {
  sum += fabs(static_cast<double>(v));
  count += v != 0.0f ? 1 : 0;
}

// Each source adds the stored values at a flat index (one value, or a TwELL quad's four words).
template <class T>
struct CsrSource {
  const T* values;
  __device__ void add(std::int64_t idx, double& sum, unsigned long long& count) const {
    add_value(detail::load_f(values + idx), sum, count);
  }
};
template <class T>
struct EllSource {
  const T* values;
  const std::int32_t* count;
  std::int64_t width;
  __device__ void add(std::int64_t idx, double& sum, unsigned long long& n) const {
    const std::int64_t i = idx / width;
    if (idx - i * width < count[i]) add_value(detail::load_f(values + idx), sum, n);
  }
};
// TwELL slots, one word per index; rows with shadow[row] >= 0 (Hybrid overflow rows) are skipped.
template <class T>
struct TwellSource {
  const std::uint32_t* packed;
  const T* plane;
  const std::int32_t* shadow;
  TwellLayout layout;
  std::int64_t pw;
  __device__ void add(std::int64_t idx, double& sum, unsigned long long& count) const {
    const std::int64_t s = idx % layout.slots();
    if (s == 0) return;
    if (shadow != nullptr && shadow[idx / pw] >= 0) return;
    if (s > min(packed[idx - s], static_cast<std::uint32_t>(layout.capacity()))) return;
    add_value(detail::twell_value<T>(packed[idx], plane, idx), sum, count);
  }
};
// TwELL slots of 16-bit values four words per index, where detail::quad_words holds.
template <class T>
struct TwellQuadSource {
  const uint4* packed;
  const std::int32_t* shadow;
  std::uint32_t slot_mask;
  std::uint32_t capacity;
  std::int64_t pw_quads;
  __device__ void add(std::int64_t q, double& sum, unsigned long long& count) const {
    if (shadow != nullptr && shadow[q / pw_quads] >= 0) return;
    const uint4 w = packed[q];
    const detail::QuadSlots slots = detail::quad_slots(packed, q, w, slot_mask, capacity);
    const std::uint32_t words[4] = {w.x, w.y, w.z, w.w};
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const std::uint32_t s = slots.first + i;
      if (s != 0 && s <= slots.entries) add_value(detail::bits_to_f<T>(words[i] >> 16), sum, count);
    }
  }
};
template <class T>
struct DenseSource {
  const T* data;
  std::int64_t cols;
  std::int64_t ld;
  __device__ void add(std::int64_t idx, double& sum, unsigned long long& count) const {
    const std::int64_t r = idx / cols;
    const float v = detail::load_f(data + r * ld + (idx - r * cols));
    if (!(fabsf(v) <= 0.0f)) add_value(v, sum, count);
  }
};

// Adds every thread's (sum, count) into s_sum[0] and s_count[0] by a fixed shared-memory tree.
// All kThreads threads of the block call it; the result is visible to all of them on return.
__device__ __forceinline__ void tree_reduce(double* s_sum, unsigned long long* s_count, double sum,
                                            unsigned long long count) {
  s_sum[threadIdx.x] = sum;
  s_count[threadIdx.x] = count;
  __syncthreads();
  for (int d = kThreads / 2; d > 0; d >>= 1) {
    if (threadIdx.x < d) {
      s_sum[threadIdx.x] += s_sum[threadIdx.x + d];
      s_count[threadIdx.x] += s_count[threadIdx.x + d];
    }
    __syncthreads();
  }
}

// A block owns the indices blockIdx.x + j * gridDim.x (in units of kThreads); thread partials are
// reduced by a fixed tree. Precondition: the source's view is valid. One memory-bound pass; no
// dedicated bench/ case (it runs inside the FFN training step's L1 term).
template <class Source>
__global__ void __launch_bounds__(kThreads)
    partial_kernel(Source src, std::int64_t n, double* sums, unsigned long long* counts) {
  ::twell::detail::wait_for_prior_grids();
  __shared__ double s_sum[kThreads];
  __shared__ unsigned long long s_count[kThreads];
  double sum = 0.0;
  unsigned long long count = 0;
  for (std::int64_t idx = blockIdx.x * static_cast<std::int64_t>(kThreads) + threadIdx.x; idx < n;
       idx += static_cast<std::int64_t>(gridDim.x) * kThreads)
    src.add(idx, sum, count);
  tree_reduce(s_sum, s_count, sum, count);
  if (threadIdx.x == 0) {
    sums[blockIdx.x] += s_sum[0];
    counts[blockIdx.x] += s_count[0];
  }
}

// One block adds `parts` partials: thread t sums t, t + kThreads, ..., then the same fixed tree.
__global__ void __launch_bounds__(kThreads) final_kernel(const double* sums, const unsigned long long* counts,
                                                         int parts, double* sum_out, unsigned long long* count_out) {
  ::twell::detail::wait_for_prior_grids();
  __shared__ double s_sum[kThreads];
  __shared__ unsigned long long s_count[kThreads];
  double sum = 0.0;
  unsigned long long count = 0;
  for (int i = threadIdx.x; i < parts; i += kThreads) {
    sum += sums[i];
    count += counts[i];
  }
  tree_reduce(s_sum, s_count, sum, count);
  if (threadIdx.x == 0) {
    *sum_out = s_sum[0];
    *count_out = s_count[0];
  }
}

struct Totals {
  double l1 = 0.0;
  std::int64_t l0 = 0;
};

// Runs the partial kernel once per (source, n) in `launches` into shared per-block partials
// (a Hybrid adds its overflow block to the same partials), then the final kernel.
class Reducer {
 public:
  Reducer(cudaStream_t stream, const char* where)
      : stream_(stream), where_(where), scratch_(kMaxBlocks * 16 + 16, stream, where) {
    ::twell::detail::fill_bytes_async(scratch_.as<void>(), 0, kMaxBlocks * 16 + 16, stream, where);
  }
  template <class Source>
  void add(Source src, std::int64_t n) {
    if (n <= 0) return;
    const unsigned grid = detail::grid_for(n, kThreads, kMaxBlocks);
    blocks_ = std::max<int>(blocks_, static_cast<int>(grid));
    ::twell::detail::launch_kernel(where_, partial_kernel<Source>, grid, kThreads, 0, stream_, src, n, sums(),
                                   counts());
  }
  Totals finish() {
    Totals t;
    if (blocks_ == 0) return t;
    double* sum_out = reinterpret_cast<double*>(counts() + kMaxBlocks);
    auto* count_out = reinterpret_cast<unsigned long long*>(sum_out + 1);
    ::twell::detail::launch_kernel(where_, final_kernel, 1, kThreads, 0, stream_, sums(), counts(), blocks_, sum_out,
                                   count_out);
    // The sum and the count side by side: one read-back of both.
    static_assert(sizeof(double) == sizeof(unsigned long long));
    const detail::ReadBack totals(sum_out, 2 * sizeof(double), stream_, where_);
    t.l1 = totals.get<double>();
    t.l0 = static_cast<std::int64_t>(totals.get<unsigned long long>(sizeof(double)));
    return t;
  }

 private:
  double* sums() const { return scratch_.as<double>(); }
  unsigned long long* counts() const { return reinterpret_cast<unsigned long long*>(sums() + kMaxBlocks); }

  cudaStream_t stream_;
  const char* where_;
  detail::Scratch scratch_;
  int blocks_ = 0;
};

// The sources of each format, added to one Reducer (a Hybrid adds its overflow block too).
template <class T>
void add_sources(Reducer& r, CsrView<const T> x) {
  r.add(CsrSource<T>{x.values}, x.nnz);
}
template <class T>
void add_sources(Reducer& r, EllView<const T> x) {
  r.add(EllSource<T>{x.values, x.row_count, x.width}, x.rows * x.width);
}
// TwELL slots, skipping the rows with shadow[row] >= 0 (null: none).
template <class T>
void add_twell(Reducer& r, TwellView<const T> x, const std::int32_t* shadow) {
  const std::int64_t pw = x.packed_width();
  if constexpr (ValueTraits<T>::packs_in_slot) {
    if (detail::quad_words(x.layout, x.packed)) {
      r.add(TwellQuadSource<T>{reinterpret_cast<const uint4*>(x.packed), shadow,
                               static_cast<std::uint32_t>(x.layout.slots() - 1),
                               static_cast<std::uint32_t>(x.layout.capacity()), pw / 4},
            x.rows * pw / 4);
      return;
    }
  }
  r.add(TwellSource<T>{x.packed, x.value_plane, shadow, x.layout, pw}, x.rows * pw);
}

template <class T>
void add_sources(Reducer& r, TwellView<const T> x) {
  add_twell(r, x, nullptr);
}
template <class T>
void add_sources(Reducer& r, HybridView<const T> x) {
  add_twell(r, x.twell, x.overflow.rows > 0 ? x.row_to_overflow : nullptr);
  if (x.cols() > 0) r.add(DenseSource<T>{x.overflow.data, x.cols(), x.overflow.ld}, x.overflow.rows * x.cols());
}

template <class View>
Totals reduce(View x, const KernelOptions& options, const char* where) {
  detail::check_device_operand(x, where, "x");
  Reducer r(detail::stream_of(options), where);
  add_sources(r, x);
  return r.finish();
}

template <class View>
double l1_impl(View x, const KernelOptions& options, const char* format) {
  const double v = reduce(x, options, "twell::cuda::l1_norm").l1;
  twell::detail::report_format_path(options, "cuda/l1_norm", format, "tree");
  return v;
}
template <class View>
std::int64_t l0_impl(View x, const KernelOptions& options, const char* format) {
  const std::int64_t v = reduce(x, options, "twell::cuda::l0_norm").l0;
  twell::detail::report_format_path(options, "cuda/l0_norm", format, "tree");
  return v;
}

}  // namespace

TWELL_FOR_EACH_SPARSE_VIEW(TWELL_DEFINE_NORMS)
TWELL_FOR_EACH_VALUE_TYPE(TWELL_INSTANTIATE_NORMS)

}  // namespace twell::cuda
