// Dense baselines: the Handles holder, cuBLAS GEMM, cuBLASLt GEMM with the ReLU epilogue, the
// dense gated FFN forward and training step (the baselines of the ffn and training suites).
#include <algorithm>
#include <cstdint>
#include <utility>

#include <twell/instantiate.hpp>
#include <twell/kernels/baselines.hpp>

#include "cuda_launch.cuh"
#include "handles.cuh"

namespace twell::baseline {

namespace {
constexpr std::size_t kLtWorkspaceBytes = std::size_t{32} << 20;  // cuBLASLt's advice for Hopper
}

Handles::Handles(Stream stream) : impl_(std::make_unique<Impl>()) {
  constexpr const char* where = "twell::baseline::Handles";
  Impl& h = *impl_;
  h.stream = static_cast<cudaStream_t>(stream.handle);
  try {
    // The workspace first: taken from what the pool keeps before a handle's retry could trim it.
    h.lt_workspace = Buffer<std::byte>(kLtWorkspaceBytes, MemorySpace::device, Uninitialized{});
    h.lt_workspace_bytes = kLtWorkspaceBytes;
    using twell::detail::retry_after_trim;
    detail::check_cusparse(
        retry_after_trim([&] { return cusparseCreate(&h.sparse); }, CUSPARSE_STATUS_ALLOC_FAILED, where), where);
    detail::check_cublas(retry_after_trim([&] { return cublasCreate(&h.blas); }, CUBLAS_STATUS_ALLOC_FAILED, where),
                         where);
    detail::check_cublas(retry_after_trim([&] { return cublasLtCreate(&h.lt); }, CUBLAS_STATUS_ALLOC_FAILED, where),
                         where);
    detail::check_cusparse(cusparseSetStream(h.sparse, h.stream), where);
    detail::check_cublas(cublasSetStream(h.blas, h.stream), where);
    detail::check_cublas(cublasSetWorkspace(h.blas, h.lt_workspace.data(), h.lt_workspace_bytes), where);
  } catch (...) {
    if (h.lt != nullptr) cublasLtDestroy(h.lt);
    if (h.blas != nullptr) cublasDestroy(h.blas);
    if (h.sparse != nullptr) cusparseDestroy(h.sparse);
    throw;
  }
}

// cuBLAS and cuBLASLt share the workspace: their calls are ordered on the one stream.
Handles::~Handles() {
  if (!impl_) return;
  cudaStreamSynchronize(impl_->stream);  // failures cannot be reported from a destructor
  if (impl_->lt != nullptr) cublasLtDestroy(impl_->lt);
  if (impl_->blas != nullptr) cublasDestroy(impl_->blas);
  if (impl_->sparse != nullptr) cusparseDestroy(impl_->sparse);
}

Handles::Handles(Handles&&) noexcept = default;
Handles& Handles::operator=(Handles&& o) noexcept {
  if (this != &o) {
    Handles old(std::move(*this));
    impl_ = std::move(o.impl_);
  }
  return *this;
}

void Handles::set_stream(Stream stream) {
  constexpr const char* where = "twell::baseline::Handles::set_stream";
  impl_->stream = static_cast<cudaStream_t>(stream.handle);
  detail::check_cusparse(cusparseSetStream(impl_->sparse, impl_->stream), where);
  detail::check_cublas(cublasSetStream(impl_->blas, impl_->stream), where);
  // cublasSetStream puts cuBLAS back on its own default workspace: give it twell's again.
  detail::check_cublas(cublasSetWorkspace(impl_->blas, impl_->lt_workspace.data(), impl_->lt_workspace_bytes), where);
}

Stream Handles::stream() const { return Stream{impl_->stream}; }

namespace {

template <class T>
void gemm_impl(Handles& handles, Op op_a, DenseView<const T> a, Op op_b, DenseView<const T> b, DenseView<T> c,
               float alpha, float beta, const char* where) {
  detail::check_operand(a, where, "A");
  detail::check_operand(b, where, "B");
  detail::check_operand(c, where, "C");
  const bool ta = op_a == Op::transpose, tb = op_b == Op::transpose;
  const std::int64_t m = ta ? a.cols : a.rows, k = ta ? a.rows : a.cols;
  const std::int64_t kb = tb ? b.cols : b.rows, n = tb ? b.rows : b.cols;
  require(k == kb && c.rows == m && c.cols == n, ErrorCode::shape_mismatch, where, "op(A) is ", detail::shape(m, k),
          ", op(B) is ", detail::shape(kb, n), " and C is ", detail::shape(c.rows, c.cols));
  const std::int64_t dims[] = {m, n, k, a.ld, b.ld, c.ld};
  for (std::int64_t v : dims) detail::require_int32(v, where, "a GEMM dimension");
  if (m == 0 || n == 0) return;
  Handles::Impl& h = handles.impl();
  // Row-major C (m x n) is column-major C^T (n x m) = op(B)^T op(A)^T: B first, A second.
  detail::check_cublas(
      cublasGemmEx(h.blas, tb ? CUBLAS_OP_T : CUBLAS_OP_N, ta ? CUBLAS_OP_T : CUBLAS_OP_N, static_cast<int>(n),
                   static_cast<int>(m), static_cast<int>(k), &alpha, b.data, detail::cuda_type<T>(),
                   static_cast<int>(std::max<std::int64_t>(b.ld, 1)), a.data, detail::cuda_type<T>(),
                   static_cast<int>(std::max<std::int64_t>(a.ld, 1)), &beta, c.data, detail::cuda_type<T>(),
                   static_cast<int>(std::max<std::int64_t>(c.ld, 1)), CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT),
      where);
}

template <class T>
void gemm_relu_impl(Handles& handles, DenseView<const T> a, DenseView<const T> b, DenseView<T> c) {
  constexpr const char* where = "twell::baseline::gemm_relu";
  detail::check_operand(a, where, "A");
  detail::check_operand(b, where, "B");
  detail::check_operand(c, where, "C");
  require(a.cols == b.rows && c.rows == a.rows && c.cols == b.cols, ErrorCode::shape_mismatch, where, "A is ",
          detail::shape(a.rows, a.cols), ", B is ", detail::shape(b.rows, b.cols), " and C is ",
          detail::shape(c.rows, c.cols));
  if (c.rows == 0 || c.cols == 0) return;
  Handles::Impl& h = handles.impl();
  const cudaDataType_t type = detail::cuda_type<T>();
  if (!h.relu_plan || !h.relu_plan->matches(type, a.rows, b.cols, a.cols, a.ld, b.ld, c.ld)) {
    h.relu_plan.reset();
    auto plan = std::make_unique<LtReluPlan>();
    LtReluPlan& p = *plan;
    p.type = type;
    p.m = a.rows;
    p.n = b.cols;
    p.k = a.cols;
    p.lda = a.ld;
    p.ldb = b.ld;
    p.ldc = c.ld;
    detail::check_cublas(cublasLtMatmulDescCreate(&p.desc, CUBLAS_COMPUTE_32F, CUDA_R_32F), where);
    const cublasOperation_t op_n = CUBLAS_OP_N;
    detail::check_cublas(cublasLtMatmulDescSetAttribute(p.desc, CUBLASLT_MATMUL_DESC_TRANSA, &op_n, sizeof op_n),
                         where);
    detail::check_cublas(cublasLtMatmulDescSetAttribute(p.desc, CUBLASLT_MATMUL_DESC_TRANSB, &op_n, sizeof op_n),
                         where);
    const cublasLtEpilogue_t epilogue = CUBLASLT_EPILOGUE_RELU;
    detail::check_cublas(
        cublasLtMatmulDescSetAttribute(p.desc, CUBLASLT_MATMUL_DESC_EPILOGUE, &epilogue, sizeof epilogue), where);
    // Column-major view: C^T (n x m) = B^T (n x k) A^T (k x m).
    const auto m = static_cast<std::uint64_t>(a.rows), k = static_cast<std::uint64_t>(a.cols),
               n = static_cast<std::uint64_t>(b.cols);
    detail::check_cublas(cublasLtMatrixLayoutCreate(&p.la, type, n, k, std::max<std::int64_t>(b.ld, 1)), where);
    detail::check_cublas(cublasLtMatrixLayoutCreate(&p.lb, type, k, m, std::max<std::int64_t>(a.ld, 1)), where);
    detail::check_cublas(cublasLtMatrixLayoutCreate(&p.lc, type, n, m, std::max<std::int64_t>(c.ld, 1)), where);
    cublasLtMatmulPreference_t pref = nullptr;
    detail::check_cublas(cublasLtMatmulPreferenceCreate(&pref), where);
    cublasLtMatmulHeuristicResult_t result{};
    int found = 0;
    const cublasStatus_t set = cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES,
                                                                    &h.lt_workspace_bytes, sizeof h.lt_workspace_bytes);
    const cublasStatus_t query =
        set != CUBLAS_STATUS_SUCCESS
            ? set
            : cublasLtMatmulAlgoGetHeuristic(h.lt, p.desc, p.la, p.lb, p.lc, p.lc, pref, 1, &result, &found);
    cublasLtMatmulPreferenceDestroy(pref);
    detail::check_cublas(query, where);
    require(found > 0, ErrorCode::unsupported, where, "cuBLASLt has no algorithm for ", detail::shape(a.rows, b.cols),
            " x ", k, " with the ReLU epilogue");
    p.algo = result.algo;
    h.relu_plan = std::move(plan);
  }
  const LtReluPlan& p = *h.relu_plan;
  const float alpha = 1.0f, beta = 0.0f;
  detail::check_cublas(cublasLtMatmul(h.lt, p.desc, &alpha, b.data, p.la, a.data, p.lb, &beta, c.data, p.lc, c.data,
                                      p.lc, &p.algo, h.lt_workspace.data(), h.lt_workspace_bytes, h.stream),
                       where);
}

// Elementwise maps over rows x cols views of one shape: f(in[kIn]) -> out[kOut] per element, in
// fp32, rounded to T once. A thread owns 8 (16-bit) or 4 (fp32) consecutive elements with 16-byte
// accesses when every operand is aligned with a leading dimension that keeps its rows aligned,
// else one. An output may alias an input (each element is read before it is written).
template <class T, int kIn, int kOut>
struct MapOperands {
  const T* in[kIn];
  std::int64_t ld_in[kIn];
  T* out[kOut];
  std::int64_t ld_out[kOut];
  std::int64_t rows, cols;
};

template <class T, bool kVec, int kIn, int kOut, class F>
__global__ void map_kernel(MapOperands<T, kIn, kOut> o, F f) {
  ::twell::detail::wait_for_prior_grids();
  constexpr int kPer = kVec ? 16 / static_cast<int>(sizeof(T)) : 1;
  const std::int64_t chunks_per_row = (o.cols + kPer - 1) / kPer;
  const std::int64_t n = o.rows * chunks_per_row;
  for (std::int64_t idx = blockIdx.x * static_cast<std::int64_t>(blockDim.x) + threadIdx.x; idx < n;
       idx += static_cast<std::int64_t>(gridDim.x) * blockDim.x) {
    const std::int64_t r = idx / chunks_per_row, j = (idx - r * chunks_per_row) * kPer;
    alignas(16) T in[kIn][kPer];  // viewed as uint4 when kVec
    alignas(16) T out[kOut][kPer];
#pragma unroll
    for (int p = 0; p < kIn; ++p) {
      const T* src = o.in[p] + r * o.ld_in[p] + j;
      if constexpr (kVec) {
        *reinterpret_cast<uint4*>(in[p]) = *reinterpret_cast<const uint4*>(src);
      } else {
        in[p][0] = *src;
      }
    }
#pragma unroll
    for (int q = 0; q < kPer; ++q) {
      float v[kIn], w[kOut];
#pragma unroll
      for (int p = 0; p < kIn; ++p) v[p] = to_float(in[p][q]);
      f(v, w);
#pragma unroll
      for (int p = 0; p < kOut; ++p) out[p][q] = from_float<T>(w[p]);
    }
#pragma unroll
    for (int p = 0; p < kOut; ++p) {
      T* dst = o.out[p] + r * o.ld_out[p] + j;
      if constexpr (kVec) {
        *reinterpret_cast<uint4*>(dst) = *reinterpret_cast<const uint4*>(out[p]);
      } else {
        *dst = out[p][0];
      }
    }
  }
}

template <class T, int kIn, int kOut, class F>
void map(const MapOperands<T, kIn, kOut>& o, F f, cudaStream_t stream, const char* where) {
  if (o.rows == 0 || o.cols == 0) return;
  constexpr std::int64_t v = 16 / sizeof(T);
  const auto aligned = [](const void* p, std::int64_t ld) {
    return reinterpret_cast<std::uintptr_t>(p) % 16 == 0 && ld % v == 0;
  };
  bool vec = o.cols % v == 0;
  for (int p = 0; p < kIn; ++p) vec = vec && aligned(o.in[p], o.ld_in[p]);
  for (int p = 0; p < kOut; ++p) vec = vec && aligned(o.out[p], o.ld_out[p]);
  const std::int64_t items = vec ? o.rows * (o.cols / v) : o.rows * o.cols;
  const auto blocks = static_cast<unsigned>(std::min<std::int64_t>((items + 255) / 256, std::int64_t{1} << 20));
  ::twell::detail::launch_kernel(where, vec ? map_kernel<T, true, kIn, kOut, F> : map_kernel<T, false, kIn, kOut, F>,
                                 blocks, 256, 0, stream, o, f);
}

// h = a * u (the gated product).
struct GatedProduct {
  __device__ void operator()(const float (&in)[2], float (&out)[1]) const { out[0] = in[0] * in[1]; }
};

// From (dh, h, u, a): t = dh + s sign(h) (the L1 gradient; sign(0) = 0, NaN propagates), then
// dg = t * u where a > 0 (ReLU's derivative) and du = t * a.
struct GatedBackward {
  float s;
  __device__ void operator()(const float (&in)[4], float (&out)[2]) const {
    const float h = in[1];
    const float t = in[0] + s * (isnan(h) ? h : (h > 0.0f ? 1.0f : (h < 0.0f ? -1.0f : 0.0f)));
    out[0] = in[3] > 0.0f ? t * in[2] : 0.0f;
    out[1] = t * in[3];
  }
};

template <class T>
void require_ffn_shapes(const char* where, DenseView<const T> x, DenseView<const T> wg, DenseView<const T> wu,
                        DenseView<const T> wd, std::int64_t workspace_rows, std::int64_t workspace_cols) {
  require(workspace_rows == x.rows && workspace_cols == wg.cols && wg.rows == x.cols, ErrorCode::shape_mismatch, where,
          "the workspace holds ", detail::shape(workspace_rows, workspace_cols), " but x wg is ",
          detail::shape(x.rows, x.cols), " x ", detail::shape(wg.rows, wg.cols));
  require(wu.rows == wg.rows && wu.cols == wg.cols && wd.rows == wg.cols && wd.cols == x.cols,
          ErrorCode::shape_mismatch, where, "wg is ", detail::shape(wg.rows, wg.cols), ", wu is ",
          detail::shape(wu.rows, wu.cols), " and wd is ", detail::shape(wd.rows, wd.cols));
}

// The gated forward on the given buffers: a = relu(x wg), u = x wu, h = a * u (h may be a), y = h wd.
template <class T>
void gated_forward(Handles& handles, DenseView<const T> x, DenseView<const T> wg, DenseView<const T> wu,
                   DenseView<const T> wd, DenseView<T> y, DenseView<T> a, DenseView<T> u, DenseView<T> h,
                   const char* where) {
  gemm_relu_impl<T>(handles, x, wg, a);
  gemm_impl<T>(handles, Op::none, x, Op::none, wu, u, 1.0f, 0.0f, where);
  map<T, 2, 1>({{a.data, u.data}, {a.ld, u.ld}, {h.data}, {h.ld}, h.rows, h.cols}, GatedProduct{},
               handles.impl().stream, where);
  gemm_impl<T>(handles, Op::none, DenseView<const T>(h), Op::none, wd, y, 1.0f, 0.0f, where);
}

}  // namespace

template <Value T>
void gemm(Handles& handles, Op op_a, DenseView<const T> a, Op op_b, DenseView<const T> b, DenseView<T> c, float alpha,
          float beta) {
  gemm_impl(handles, op_a, a, op_b, b, c, alpha, beta, "twell::baseline::gemm");
}

template <Value T>
void gemm_relu(Handles& handles, DenseView<const T> a, DenseView<const T> b, DenseView<T> c) {
  gemm_relu_impl(handles, a, b, c);
}

template <Value T>
DenseFfnWorkspace<T>::DenseFfnWorkspace(Handles& handles, std::int64_t tokens, std::int64_t hidden)
    : handles_(&handles), gate_(tokens, hidden, MemorySpace::device), up_(tokens, hidden, MemorySpace::device) {}

template <Value T>
void dense_gated_ffn_forward(DenseView<const T> x, DenseView<const T> wg, DenseView<const T> wu, DenseView<const T> wd,
                             DenseView<T> y, DenseFfnWorkspace<T>& workspace) {
  constexpr const char* where = "twell::baseline::dense_gated_ffn_forward";
  require_ffn_shapes(where, x, wg, wu, wd, workspace.gate().rows(), workspace.gate().cols());
  // h overwrites the gate: inference needs neither afterwards.
  const DenseView<T> g = workspace.gate().view();
  gated_forward<T>(workspace.handles(), x, wg, wu, wd, y, g, workspace.up().view(), g, where);
}

template <Value T>
DenseFfnTrainingWorkspace<T>::DenseFfnTrainingWorkspace(Handles& handles, std::int64_t tokens,
                                                        std::int64_t intermediate)
    : handles_(&handles), a_(tokens, intermediate, MemorySpace::device), u_(tokens, intermediate, MemorySpace::device),
      h_(tokens, intermediate, MemorySpace::device), dh_(tokens, intermediate, MemorySpace::device),
      du_(tokens, intermediate, MemorySpace::device) {}

template <Value T>
void dense_gated_ffn_training_forward(DenseView<const T> x, DenseView<const T> wg, DenseView<const T> wu,
                                      DenseView<const T> wd, DenseView<T> y, DenseFfnTrainingWorkspace<T>& workspace) {
  constexpr const char* where = "twell::baseline::dense_gated_ffn_training_forward";
  require_ffn_shapes(where, x, wg, wu, wd, workspace.a().rows(), workspace.a().cols());
  gated_forward<T>(workspace.handles(), x, wg, wu, wd, y, workspace.a().view(), workspace.u().view(),
                   workspace.h().view(), where);
}

template <Value T>
void dense_gated_ffn_backward(DenseView<const T> x, DenseView<const T> wg, DenseView<const T> wu, DenseView<const T> wd,
                              DenseView<const T> dy, float l1_scale, DenseView<T> dx, DenseView<T> dwg,
                              DenseView<T> dwu, DenseView<T> dwd, DenseFfnTrainingWorkspace<T>& workspace) {
  constexpr const char* where = "twell::baseline::dense_gated_ffn_backward";
  require_ffn_shapes(where, x, wg, wu, wd, workspace.a().rows(), workspace.a().cols());
  Handles& handles = workspace.handles();
  const DenseView<T> a = workspace.a().view(), u = workspace.u().view(), h = workspace.h().view();
  const DenseView<T> dh = workspace.dh().view(), du_out = workspace.du().view();
  gemm_impl<T>(handles, Op::none, dy, Op::transpose, wd, dh, 1.0f, 0.0f, where);
  gemm_impl<T>(handles, Op::transpose, DenseView<const T>(h), Op::none, dy, dwd, 1.0f, 0.0f, where);
  // dg overwrites dh.
  map<T, 4, 2>({{dh.data, h.data, u.data, a.data}, {dh.ld, h.ld, u.ld, a.ld}, {dh.data, du_out.data},
                {dh.ld, du_out.ld}, dh.rows, dh.cols},
               GatedBackward{l1_scale}, handles.impl().stream, where);
  const DenseView<const T> dg = dh, du = du_out;
  gemm_impl<T>(handles, Op::none, dg, Op::transpose, wg, dx, 1.0f, 0.0f, where);
  gemm_impl<T>(handles, Op::none, du, Op::transpose, wu, dx, 1.0f, 1.0f, where);
  gemm_impl<T>(handles, Op::transpose, x, Op::none, dg, dwg, 1.0f, 0.0f, where);
  gemm_impl<T>(handles, Op::transpose, x, Op::none, du, dwu, 1.0f, 0.0f, where);
}

#define TWELL_INSTANTIATE(T)                                                                                   \
  template void gemm<T>(Handles&, Op, DenseView<const T>, Op, DenseView<const T>, DenseView<T>, float, float); \
  template void gemm_relu<T>(Handles&, DenseView<const T>, DenseView<const T>, DenseView<T>);                  \
  template class DenseFfnWorkspace<T>;                                                                         \
  template void dense_gated_ffn_forward<T>(DenseView<const T>, DenseView<const T>, DenseView<const T>,         \
                                           DenseView<const T>, DenseView<T>, DenseFfnWorkspace<T>&);           \
  template class DenseFfnTrainingWorkspace<T>;                                                                 \
  template void dense_gated_ffn_training_forward<T>(DenseView<const T>, DenseView<const T>, DenseView<const T>, \
                                                    DenseView<const T>, DenseView<T>,                          \
                                                    DenseFfnTrainingWorkspace<T>&);                            \
  template void dense_gated_ffn_backward<T>(DenseView<const T>, DenseView<const T>, DenseView<const T>,        \
                                            DenseView<const T>, DenseView<const T>, float, DenseView<T>,       \
                                            DenseView<T>, DenseView<T>, DenseView<T>,                          \
                                            DenseFfnTrainingWorkspace<T>&);
TWELL_FOR_EACH_VALUE_TYPE(TWELL_INSTANTIATE)
#undef TWELL_INSTANTIATE

}  // namespace twell::baseline
