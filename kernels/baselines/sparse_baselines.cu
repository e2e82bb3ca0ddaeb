// cuSPARSE baselines: SpMM (CSR and COO, every algorithm cuSPARSE offers for them), SDDMM and
// DenseToSparse, each behind a plan (buffer size -> allocate once -> preprocess -> compute).
#include <algorithm>
#include <cstdint>
#include <utility>

#include <twell/instantiate.hpp>
#include <twell/kernels/baselines.hpp>

#include "cuda_launch.cuh"
#include "handles.cuh"

namespace twell::baseline {

std::string_view to_string(SpmmAlgorithm alg) {
  switch (alg) {
    case SpmmAlgorithm::default_alg:
      return "CUSPARSE_SPMM_ALG_DEFAULT";
    case SpmmAlgorithm::csr_alg1:
      return "CUSPARSE_SPMM_CSR_ALG1";
    case SpmmAlgorithm::csr_alg2:
      return "CUSPARSE_SPMM_CSR_ALG2";
    case SpmmAlgorithm::csr_alg3:
      return "CUSPARSE_SPMM_CSR_ALG3";
    case SpmmAlgorithm::coo_alg1:
      return "CUSPARSE_SPMM_COO_ALG1";
    case SpmmAlgorithm::coo_alg2:
      return "CUSPARSE_SPMM_COO_ALG2";
    case SpmmAlgorithm::coo_alg3:
      return "CUSPARSE_SPMM_COO_ALG3";
    case SpmmAlgorithm::coo_alg4:
      return "CUSPARSE_SPMM_COO_ALG4";
  }
  return "?";
}

std::vector<SpmmAlgorithm> spmm_algorithms(SparseStorage storage) {
  if (storage == SparseStorage::csr)
    return {SpmmAlgorithm::default_alg, SpmmAlgorithm::csr_alg1, SpmmAlgorithm::csr_alg2, SpmmAlgorithm::csr_alg3};
  return {SpmmAlgorithm::default_alg, SpmmAlgorithm::coo_alg1, SpmmAlgorithm::coo_alg2, SpmmAlgorithm::coo_alg3,
          SpmmAlgorithm::coo_alg4};
}

namespace {

cusparseSpMMAlg_t to_cusparse(SpmmAlgorithm alg) {
  switch (alg) {
    case SpmmAlgorithm::default_alg:
      return CUSPARSE_SPMM_ALG_DEFAULT;
    case SpmmAlgorithm::csr_alg1:
      return CUSPARSE_SPMM_CSR_ALG1;
    case SpmmAlgorithm::csr_alg2:
      return CUSPARSE_SPMM_CSR_ALG2;
    case SpmmAlgorithm::csr_alg3:
      return CUSPARSE_SPMM_CSR_ALG3;
    case SpmmAlgorithm::coo_alg1:
      return CUSPARSE_SPMM_COO_ALG1;
    case SpmmAlgorithm::coo_alg2:
      return CUSPARSE_SPMM_COO_ALG2;
    case SpmmAlgorithm::coo_alg3:
      return CUSPARSE_SPMM_COO_ALG3;
    case SpmmAlgorithm::coo_alg4:
      return CUSPARSE_SPMM_COO_ALG4;
  }
  return CUSPARSE_SPMM_ALG_DEFAULT;
}

// Device memory owned by a plan, from twell's pool like every twell allocation (an allocation
// that finds the device out of memory trims the pool first), not zero-filled.
class DeviceBytes {
 public:
  DeviceBytes() = default;
  explicit DeviceBytes(std::size_t bytes) : buffer_(bytes, MemorySpace::device, Uninitialized{}) {}
  void* get() const { return const_cast<unsigned char*>(buffer_.data()); }  // device bytes the plan writes
  std::size_t bytes() const { return buffer_.bytes(); }

 private:
  Buffer<unsigned char> buffer_;
};

// row_ptr (64-bit) -> 32-bit offsets, and, for COO, the row index of each entry.
__global__ void narrow_row_ptr_kernel(std::int64_t rows, const std::int64_t* row_ptr, std::int32_t* out) {
  ::twell::detail::wait_for_prior_grids();
  for (std::int64_t i = blockIdx.x * static_cast<std::int64_t>(blockDim.x) + threadIdx.x; i <= rows;
       i += static_cast<std::int64_t>(gridDim.x) * blockDim.x)
    out[i] = static_cast<std::int32_t>(row_ptr[i]);
}
__global__ void expand_rows_kernel(std::int64_t rows, const std::int64_t* row_ptr, std::int32_t* row_idx) {
  ::twell::detail::wait_for_prior_grids();
  const std::int64_t warps = static_cast<std::int64_t>(gridDim.x) * (blockDim.x / 32);
  for (std::int64_t i = (blockIdx.x * static_cast<std::int64_t>(blockDim.x) + threadIdx.x) / 32; i < rows; i += warps)
    for (std::int64_t e = row_ptr[i] + (threadIdx.x & 31); e < row_ptr[i + 1]; e += 32)
      row_idx[e] = static_cast<std::int32_t>(i);
}
__global__ void widen_row_ptr_kernel(std::int64_t rows, const std::int32_t* in, std::int64_t* out) {
  ::twell::detail::wait_for_prior_grids();
  for (std::int64_t i = blockIdx.x * static_cast<std::int64_t>(blockDim.x) + threadIdx.x; i <= rows;
       i += static_cast<std::int64_t>(gridDim.x) * blockDim.x)
    out[i] = in[i];
}
template <class From, class To>
__global__ void convert_kernel(const From* in, To* out, std::int64_t rows, std::int64_t cols, std::int64_t ld_in,
                               std::int64_t ld_out) {
  ::twell::detail::wait_for_prior_grids();
  for (std::int64_t idx = blockIdx.x * static_cast<std::int64_t>(blockDim.x) + threadIdx.x; idx < rows * cols;
       idx += static_cast<std::int64_t>(gridDim.x) * blockDim.x) {
    const std::int64_t r = idx / cols, j = idx - r * cols;
    out[r * ld_out + j] = from_float<To>(to_float(in[r * ld_in + j]));
  }
}

unsigned blocks_for(std::int64_t n) {
  return static_cast<unsigned>(std::clamp<std::int64_t>((n + 255) / 256, 1, std::int64_t{1} << 20));
}

// Refusals of a combination are "unsupported", anything else is a CUDA error.
void check_supported(cusparseStatus_t status, const char* where, const char* what) {
  if (status == CUSPARSE_STATUS_NOT_SUPPORTED || status == CUSPARSE_STATUS_INVALID_VALUE)
    fail(ErrorCode::unsupported, where, what, " refused by cuSPARSE (", cusparseGetErrorString(status), ")");
  detail::check_cusparse(status, where);
}

}  // namespace

// ---- SpMM -----------------------------------------------------------------------------------------

template <Value T>
struct SpmmPlan<T>::Impl {
  Handles* handles = nullptr;
  cusparseSpMatDescr_t a = nullptr;
  cusparseDnMatDescr_t b = nullptr, c = nullptr;
  cusparseOperation_t op = CUSPARSE_OPERATION_NON_TRANSPOSE;
  cusparseSpMMAlg_t alg = CUSPARSE_SPMM_ALG_DEFAULT;
  float alpha = 1.0f, beta = 0.0f;
  DeviceBytes indices;  // 32-bit row offsets (CSR) or row indices (COO)
  DeviceBytes buffer;
  ~Impl() {
    if (c != nullptr) cusparseDestroyDnMat(c);
    if (b != nullptr) cusparseDestroyDnMat(b);
    if (a != nullptr) cusparseDestroySpMat(a);
  }
};

template <Value T>
SpmmPlan<T>::SpmmPlan(Handles& handles, Op op_a, CsrView<const T> a, SparseStorage storage, SpmmAlgorithm alg,
                      DenseView<const T> b, DenseView<T> c, float alpha, float beta)
    : impl_(std::make_unique<Impl>()) {
  constexpr const char* where = "twell::baseline::SpmmPlan";
  detail::check_operand(a, where, "A");
  detail::check_operand(b, where, "B");
  detail::check_operand(c, where, "C");
  const bool t = op_a == Op::transpose;
  const std::int64_t m = t ? a.cols : a.rows, k = t ? a.rows : a.cols;
  require(b.rows == k && c.rows == m && c.cols == b.cols, ErrorCode::shape_mismatch, where, "op(A) is ",
          detail::shape(m, k), ", B is ", detail::shape(b.rows, b.cols), " and C is ", detail::shape(c.rows, c.cols));
  detail::require_int32(a.nnz, where, "nnz");
  const bool csr_alg =
      alg == SpmmAlgorithm::csr_alg1 || alg == SpmmAlgorithm::csr_alg2 || alg == SpmmAlgorithm::csr_alg3;
  const bool coo_alg = !csr_alg && alg != SpmmAlgorithm::default_alg;
  require(!(storage == SparseStorage::csr && coo_alg) && !(storage == SparseStorage::coo && csr_alg),
          ErrorCode::invalid_argument, where, to_string(alg), " does not apply to this storage");

  Impl& p = *impl_;
  p.handles = &handles;
  p.op = t ? CUSPARSE_OPERATION_TRANSPOSE : CUSPARSE_OPERATION_NON_TRANSPOSE;
  p.alg = to_cusparse(alg);
  p.alpha = alpha;
  p.beta = beta;
  const cudaStream_t stream = handles.impl().stream;
  const cudaDataType_t type = detail::cuda_type<T>();
  if (storage == SparseStorage::csr) {
    p.indices = DeviceBytes(static_cast<std::size_t>(a.rows + 1) * 4);
    ::twell::detail::launch_kernel(where, narrow_row_ptr_kernel, blocks_for(a.rows + 1), 256, 0, stream, a.rows,
                                   a.row_ptr, static_cast<std::int32_t*>(p.indices.get()));
    detail::check_cusparse(cusparseCreateCsr(&p.a, a.rows, a.cols, a.nnz, p.indices.get(),
                                             const_cast<std::int32_t*>(a.col_idx), const_cast<T*>(a.values),
                                             CUSPARSE_INDEX_32I, CUSPARSE_INDEX_32I, CUSPARSE_INDEX_BASE_ZERO, type),
                           where);
  } else {
    p.indices = DeviceBytes(static_cast<std::size_t>(std::max<std::int64_t>(a.nnz, 1)) * 4);
    if (a.rows > 0) {
      ::twell::detail::launch_kernel(where, expand_rows_kernel, blocks_for(a.rows * 32), 256, 0, stream, a.rows,
                                     a.row_ptr, static_cast<std::int32_t*>(p.indices.get()));
    }
    detail::check_cusparse(
        cusparseCreateCoo(&p.a, a.rows, a.cols, a.nnz, p.indices.get(), const_cast<std::int32_t*>(a.col_idx),
                          const_cast<T*>(a.values), CUSPARSE_INDEX_32I, CUSPARSE_INDEX_BASE_ZERO, type),
        where);
  }
  detail::check_cusparse(
      cusparseCreateDnMat(&p.b, b.rows, b.cols, b.ld, const_cast<T*>(b.data), type, CUSPARSE_ORDER_ROW), where);
  detail::check_cusparse(cusparseCreateDnMat(&p.c, c.rows, c.cols, c.ld, c.data, type, CUSPARSE_ORDER_ROW), where);
  cusparseHandle_t h = handles.impl().sparse;
  std::size_t bytes = 0;
  check_supported(cusparseSpMM_bufferSize(h, p.op, CUSPARSE_OPERATION_NON_TRANSPOSE, &p.alpha, p.a, p.b, &p.beta, p.c,
                                          CUDA_R_32F, p.alg, &bytes),
                  where, "cusparseSpMM_bufferSize");
  p.buffer = DeviceBytes(bytes);
  check_supported(cusparseSpMM_preprocess(h, p.op, CUSPARSE_OPERATION_NON_TRANSPOSE, &p.alpha, p.a, p.b, &p.beta, p.c,
                                          CUDA_R_32F, p.alg, p.buffer.get()),
                  where, "cusparseSpMM_preprocess");
}

template <Value T>
SpmmPlan<T>::~SpmmPlan() = default;
template <Value T>
SpmmPlan<T>::SpmmPlan(SpmmPlan&&) noexcept = default;
template <Value T>
SpmmPlan<T>& SpmmPlan<T>::operator=(SpmmPlan&&) noexcept = default;

template <Value T>
void SpmmPlan<T>::run() {
  Impl& p = *impl_;
  check_supported(cusparseSpMM(p.handles->impl().sparse, p.op, CUSPARSE_OPERATION_NON_TRANSPOSE, &p.alpha, p.a, p.b,
                               &p.beta, p.c, CUDA_R_32F, p.alg, p.buffer.get()),
                  "twell::baseline::SpmmPlan::run", "cusparseSpMM");
}

template <Value T>
std::size_t SpmmPlan<T>::workspace_bytes() const {
  return impl_->buffer.bytes();
}

template <Value T>
std::vector<SpmmAlgorithm> supported_spmm_algorithms(Handles& handles, Op op_a, CsrView<const T> a,
                                                     SparseStorage storage, DenseView<const T> b, DenseView<T> c) {
  std::vector<SpmmAlgorithm> ok;
  for (SpmmAlgorithm alg : spmm_algorithms(storage)) {
    try {
      SpmmPlan<T> plan(handles, op_a, a, storage, alg, b, c, 1.0f, 0.0f);
      ok.push_back(alg);
    } catch (const Error& e) {
      if (e.code() != ErrorCode::unsupported) throw;
    }
  }
  return ok;
}

// ---- SDDMM ----------------------------------------------------------------------------------------

template <Value T>
struct SddmmPlan<T>::Impl {
  Handles* handles = nullptr;
  cusparseDnMatDescr_t a = nullptr, b = nullptr;
  cusparseSpMatDescr_t out = nullptr;
  cusparseOperation_t op_b = CUSPARSE_OPERATION_NON_TRANSPOSE;
  float alpha = 1.0f, beta = 0.0f;
  bool native = true;
  Fp32Copies copies = Fp32Copies::every_run;
  CsrView<T> target;
  DeviceBytes offsets;             // 32-bit row offsets
  DeviceBytes a32, b32, values32;  // fp32 copies when cuSPARSE refuses 16-bit operands
  std::int64_t lda32 = 0, ldb32 = 0;
  DenseView<const T> a_src, b_src;
  DeviceBytes buffer;
  // A and B into their fp32 copies, on `stream`.
  void convert_inputs(cudaStream_t stream, const char* where) {
    ::twell::detail::launch_kernel(where, convert_kernel<T, float>, blocks_for(a_src.rows * a_src.cols), 256, 0, stream,
                                   a_src.data, static_cast<float*>(a32.get()), a_src.rows, a_src.cols, a_src.ld, lda32);
    ::twell::detail::launch_kernel(where, convert_kernel<T, float>, blocks_for(b_src.rows * b_src.cols), 256, 0, stream,
                                   b_src.data, static_cast<float*>(b32.get()), b_src.rows, b_src.cols, b_src.ld, ldb32);
  }
  // The fp32 values are ours: cleared so that a cuSPARSE read of C under beta = 0 sees zeros, not
  // whatever the allocation held. With copies made once they are cleared once, at construction:
  // later runs find the previous finite result there, as a user keeping fp32 buffers would.
  void clear_values32(cudaStream_t stream, const char* where) {
    if (target.nnz > 0)
      detail::check_cuda(cudaMemsetAsync(values32.get(), 0, static_cast<std::size_t>(target.nnz) * 4, stream), where);
  }
  void destroy() {
    if (out != nullptr) cusparseDestroySpMat(out);
    if (b != nullptr) cusparseDestroyDnMat(b);
    if (a != nullptr) cusparseDestroyDnMat(a);
    out = nullptr;
    a = b = nullptr;
  }
  ~Impl() { destroy(); }
};

namespace {

// Builds the descriptors with values of `type` (T's own, or fp32 copies) and asks the buffer size.
template <class T>
cusparseStatus_t sddmm_setup(typename SddmmPlan<T>::Impl& p, cudaDataType_t type, const void* a, std::int64_t lda,
                             const void* b, std::int64_t ldb, void* values, std::size_t& bytes, const char* where) {
  const CsrView<T>& o = p.target;
  detail::check_cusparse(
      cusparseCreateDnMat(&p.a, p.a_src.rows, p.a_src.cols, lda, const_cast<void*>(a), type, CUSPARSE_ORDER_ROW),
      where);
  detail::check_cusparse(
      cusparseCreateDnMat(&p.b, p.b_src.rows, p.b_src.cols, ldb, const_cast<void*>(b), type, CUSPARSE_ORDER_ROW),
      where);
  detail::check_cusparse(cusparseCreateCsr(&p.out, o.rows, o.cols, o.nnz, p.offsets.get(), o.col_idx, values,
                                           CUSPARSE_INDEX_32I, CUSPARSE_INDEX_32I, CUSPARSE_INDEX_BASE_ZERO, type),
                         where);
  return cusparseSDDMM_bufferSize(p.handles->impl().sparse, CUSPARSE_OPERATION_NON_TRANSPOSE, p.op_b, &p.alpha, p.a,
                                  p.b, &p.beta, p.out, CUDA_R_32F, CUSPARSE_SDDMM_ALG_DEFAULT, &bytes);
}

}  // namespace

template <Value T>
SddmmPlan<T>::SddmmPlan(Handles& handles, DenseView<const T> a, Op op_b, DenseView<const T> b, CsrView<T> out,
                        float alpha, float beta, Fp32Copies copies)
    : impl_(std::make_unique<Impl>()) {
  constexpr const char* where = "twell::baseline::SddmmPlan";
  detail::check_operand(a, where, "A");
  detail::check_operand(b, where, "B");
  detail::check_operand(out, where, "out");
  const bool t = op_b == Op::transpose;
  const std::int64_t bk = t ? b.cols : b.rows, bn = t ? b.rows : b.cols;
  require(a.rows == out.rows && bn == out.cols && a.cols == bk, ErrorCode::shape_mismatch, where, "A is ",
          detail::shape(a.rows, a.cols), " and op(B) is ", detail::shape(bk, bn), " but out is ",
          detail::shape(out.rows, out.cols));
  detail::require_int32(out.nnz, where, "nnz");
  Impl& p = *impl_;
  p.handles = &handles;
  p.op_b = t ? CUSPARSE_OPERATION_TRANSPOSE : CUSPARSE_OPERATION_NON_TRANSPOSE;
  p.alpha = alpha;
  p.beta = beta;
  p.copies = copies;
  p.target = out;
  p.a_src = a;
  p.b_src = b;
  const cudaStream_t stream = handles.impl().stream;
  p.offsets = DeviceBytes(static_cast<std::size_t>(out.rows + 1) * 4);
  ::twell::detail::launch_kernel(where, narrow_row_ptr_kernel, blocks_for(out.rows + 1), 256, 0, stream, out.rows,
                                 out.row_ptr, static_cast<std::int32_t*>(p.offsets.get()));
  std::size_t bytes = 0;
  cusparseStatus_t status =
      sddmm_setup<T>(p, detail::cuda_type<T>(), a.data, a.ld, b.data, b.ld, out.values, bytes, where);
  if constexpr (!std::is_same_v<T, float>) {
    if (status == CUSPARSE_STATUS_NOT_SUPPORTED || status == CUSPARSE_STATUS_INVALID_VALUE) {
      p.destroy();
      p.native = false;
      p.lda32 = std::max<std::int64_t>(a.cols, 1);
      p.ldb32 = std::max<std::int64_t>(b.cols, 1);
      p.a32 = DeviceBytes(static_cast<std::size_t>(a.rows * p.lda32) * 4);
      p.b32 = DeviceBytes(static_cast<std::size_t>(b.rows * p.ldb32) * 4);
      p.values32 = DeviceBytes(static_cast<std::size_t>(std::max<std::int64_t>(out.nnz, 1)) * 4);
      status =
          sddmm_setup<T>(p, CUDA_R_32F, p.a32.get(), p.lda32, p.b32.get(), p.ldb32, p.values32.get(), bytes, where);
    }
  }
  check_supported(status, where, "cusparseSDDMM_bufferSize");
  p.buffer = DeviceBytes(bytes);
  // Preprocessed on operands that stay: the native ones, or fp32 copies made once.
  if (!p.native && p.copies == Fp32Copies::once) {
    p.convert_inputs(stream, where);
    p.clear_values32(stream, where);
  }
  if (p.native || p.copies == Fp32Copies::once) {
    check_supported(
        cusparseSDDMM_preprocess(handles.impl().sparse, CUSPARSE_OPERATION_NON_TRANSPOSE, p.op_b, &p.alpha, p.a, p.b,
                                 &p.beta, p.out, CUDA_R_32F, CUSPARSE_SDDMM_ALG_DEFAULT, p.buffer.get()),
        where, "cusparseSDDMM_preprocess");
  }
}

template <Value T>
SddmmPlan<T>::~SddmmPlan() = default;
template <Value T>
SddmmPlan<T>::SddmmPlan(SddmmPlan&&) noexcept = default;
template <Value T>
SddmmPlan<T>& SddmmPlan<T>::operator=(SddmmPlan&&) noexcept = default;

template <Value T>
bool SddmmPlan<T>::native() const {
  return impl_->native;
}

// Converted runs copy A and B to fp32 (each time, or once at construction: Fp32Copies) and, under
// beta != 0, out's values each time; run SDDMM; and round the values back once.
template <Value T>
void SddmmPlan<T>::run() {
  constexpr const char* where = "twell::baseline::SddmmPlan::run";
  Impl& p = *impl_;
  const cudaStream_t stream = p.handles->impl().stream;
  if (!p.native) {
    if (p.copies == Fp32Copies::every_run) {
      p.convert_inputs(stream, where);
      if (p.beta == 0.0f) p.clear_values32(stream, where);
    }
    if (p.beta != 0.0f) {
      ::twell::detail::launch_kernel(where, convert_kernel<T, float>, blocks_for(p.target.nnz), 256, 0, stream,
                                     p.target.values, static_cast<float*>(p.values32.get()), 1, p.target.nnz,
                                     p.target.nnz, p.target.nnz);
    }
  }
  check_supported(cusparseSDDMM(p.handles->impl().sparse, CUSPARSE_OPERATION_NON_TRANSPOSE, p.op_b, &p.alpha, p.a, p.b,
                                &p.beta, p.out, CUDA_R_32F, CUSPARSE_SDDMM_ALG_DEFAULT, p.buffer.get()),
                  where, "cusparseSDDMM");
  if (!p.native && p.target.nnz > 0) {
    ::twell::detail::launch_kernel(where, convert_kernel<float, T>, blocks_for(p.target.nnz), 256, 0, stream,
                                   static_cast<const float*>(p.values32.get()), p.target.values, 1, p.target.nnz,
                                   p.target.nnz, p.target.nnz);
  }
}

// ---- DenseToSparse --------------------------------------------------------------------------------

template <Value T>
struct DenseToCsrPlan<T>::Impl {
  Handles* handles = nullptr;
  DenseView<const T> src;
  cusparseDnMatDescr_t dense = nullptr;
  cusparseSpMatDescr_t csr = nullptr;
  DeviceBytes offsets;  // cuSPARSE's 32-bit row offsets, widened into a 64-bit row_ptr
  DeviceBytes buffer;
  // run()'s result: row_ptr for rows + 1, column indices and values for `capacity` entries.
  DeviceBytes row_ptr, col_idx, values;
  std::int64_t capacity = 0;
  std::int64_t growths = 0;
  ~Impl() {
    if (csr != nullptr) cusparseDestroySpMat(csr);
    if (dense != nullptr) cusparseDestroyDnMat(dense);
  }

  void hold(std::int64_t entries) {
    col_idx = DeviceBytes(static_cast<std::size_t>(entries) * sizeof(std::int32_t));
    values = DeviceBytes(static_cast<std::size_t>(entries) * sizeof(T));
    capacity = entries;
  }
  // The analysis: cuSPARSE counts the entries and reads the count back.
  std::int64_t count_entries(const char* where) {
    check_supported(cusparseDenseToSparse_analysis(handles->impl().sparse, dense, csr,
                                                   CUSPARSE_DENSETOSPARSE_ALG_DEFAULT, buffer.get()),
                    where, "cusparseDenseToSparse_analysis");
    std::int64_t rows = 0, cols = 0, nnz = 0;
    detail::check_cusparse(cusparseSpMatGetSize(csr, &rows, &cols, &nnz), where);
    return nnz;
  }
  // The conversion into (col, val) and the widening of the row offsets into out_row_ptr.
  void convert_into(std::int64_t nnz, std::int32_t* col, T* val, std::int64_t* out_row_ptr, const char* where) {
    detail::check_cusparse(cusparseCsrSetPointers(csr, offsets.get(), nnz > 0 ? col : nullptr, nnz > 0 ? val : nullptr),
                           where);
    check_supported(cusparseDenseToSparse_convert(handles->impl().sparse, dense, csr,
                                                  CUSPARSE_DENSETOSPARSE_ALG_DEFAULT, buffer.get()),
                    where, "cusparseDenseToSparse_convert");
    ::twell::detail::launch_kernel(where, widen_row_ptr_kernel, blocks_for(src.rows + 1), 256, 0,
                                   handles->impl().stream, src.rows, static_cast<const std::int32_t*>(offsets.get()),
                                   out_row_ptr);
  }
};

template <Value T>
DenseToCsrPlan<T>::DenseToCsrPlan(Handles& handles, DenseView<const T> src, std::int64_t capacity)
    : impl_(std::make_unique<Impl>()) {
  constexpr const char* where = "twell::baseline::DenseToCsrPlan";
  detail::check_operand(src, where, "src");
  detail::require_int32(src.rows * src.cols, where, "rows * cols");
  require(capacity >= 0, ErrorCode::invalid_argument, where, "capacity = ", capacity, " is negative");
  Impl& p = *impl_;
  p.handles = &handles;
  p.src = src;
  const cudaDataType_t type = detail::cuda_type<T>();
  p.offsets = DeviceBytes(static_cast<std::size_t>(src.rows + 1) * 4);
  p.row_ptr = DeviceBytes(static_cast<std::size_t>(src.rows + 1) * 8);
  p.hold(std::min(capacity, src.rows * src.cols));
  detail::check_cusparse(cusparseCreateDnMat(&p.dense, src.rows, src.cols, std::max<std::int64_t>(src.ld, 1),
                                             const_cast<T*>(src.data), type, CUSPARSE_ORDER_ROW),
                         where);
  detail::check_cusparse(cusparseCreateCsr(&p.csr, src.rows, src.cols, 0, p.offsets.get(), nullptr, nullptr,
                                           CUSPARSE_INDEX_32I, CUSPARSE_INDEX_32I, CUSPARSE_INDEX_BASE_ZERO, type),
                         where);
  std::size_t bytes = 0;
  check_supported(cusparseDenseToSparse_bufferSize(handles.impl().sparse, p.dense, p.csr,
                                                   CUSPARSE_DENSETOSPARSE_ALG_DEFAULT, &bytes),
                  where, "cusparseDenseToSparse_bufferSize");
  p.buffer = DeviceBytes(bytes);
}

template <Value T>
DenseToCsrPlan<T>::~DenseToCsrPlan() = default;
template <Value T>
DenseToCsrPlan<T>::DenseToCsrPlan(DenseToCsrPlan&&) noexcept = default;
template <Value T>
DenseToCsrPlan<T>& DenseToCsrPlan<T>::operator=(DenseToCsrPlan&&) noexcept = default;

template <Value T>
CsrView<const T> DenseToCsrPlan<T>::run() {
  constexpr const char* where = "twell::baseline::DenseToCsrPlan::run";
  Impl& p = *impl_;
  const std::int64_t nnz = p.count_entries(where);
  if (nnz > p.capacity) {
    // The host has waited for the count, so the old arrays are not in use.
    p.hold(std::min(p.src.rows * p.src.cols, std::max(nnz, 2 * p.capacity)));
    ++p.growths;
  }
  auto* col = static_cast<std::int32_t*>(p.col_idx.get());
  auto* val = static_cast<T*>(p.values.get());
  auto* row_ptr = static_cast<std::int64_t*>(p.row_ptr.get());
  p.convert_into(nnz, col, val, row_ptr, where);
  return CsrView<const T>{p.src.rows, p.src.cols, nnz, row_ptr, col, val, MemorySpace::device};
}

template <Value T>
CsrMatrix<T> DenseToCsrPlan<T>::run_allocating() {
  constexpr const char* where = "twell::baseline::DenseToCsrPlan::run_allocating";
  Impl& p = *impl_;
  const std::int64_t nnz = p.count_entries(where);
  CsrMatrix<T> out(p.src.rows, p.src.cols, nnz, MemorySpace::device);
  detail::check_cuda(cudaDeviceSynchronize(), where);  // the result's zero-fill ran on the default stream
  p.convert_into(nnz, out.col_idx().data(), out.values().data(), out.row_ptr().data(), where);
  detail::check_cuda(cudaStreamSynchronize(p.handles->impl().stream), where);
  return out;
}

template <Value T>
std::int64_t DenseToCsrPlan<T>::capacity() const {
  return impl_->capacity;
}

template <Value T>
std::int64_t DenseToCsrPlan<T>::growths() const {
  return impl_->growths;
}

#define TWELL_INSTANTIATE(T)                                                                                      \
  template class SpmmPlan<T>;                                                                                     \
  template class SddmmPlan<T>;                                                                                    \
  template class DenseToCsrPlan<T>;                                                                               \
  template std::vector<SpmmAlgorithm> supported_spmm_algorithms<T>(Handles&, Op, CsrView<const T>, SparseStorage, \
                                                                   DenseView<const T>, DenseView<T>);
TWELL_FOR_EACH_VALUE_TYPE(TWELL_INSTANTIATE)
#undef TWELL_INSTANTIATE

}  // namespace twell::baseline
