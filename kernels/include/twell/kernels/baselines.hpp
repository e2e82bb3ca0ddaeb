// Baselines: cuSPARSE and cuBLAS(Lt) behind twell-like signatures (views in, views out,
// alpha/beta, a stream), so that benchmarks and tests time and check twell against the
// strongest library path a C++ user would write. Built only with the cuda backend
// (TWELL_HAS_CUDA); every operand lives in device memory. The header needs no CUDA headers.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string_view>
#include <vector>

#include <twell/formats/csr.hpp>
#include <twell/formats/dense.hpp>
#include <twell/kernels/options.hpp>
#include <twell/memory.hpp>

namespace twell::baseline {

// Owns one cuSPARSE handle, one cuBLAS handle, one cuBLASLt handle and the cuBLASLt workspace,
// all bound to one stream; create it once and reuse it across calls (creation costs milliseconds).
class Handles {
 public:
  explicit Handles(Stream stream = {});
  ~Handles();
  Handles(Handles&&) noexcept;
  Handles& operator=(Handles&&) noexcept;
  Handles(const Handles&) = delete;
  Handles& operator=(const Handles&) = delete;

  void set_stream(Stream stream);
  Stream stream() const;

  struct Impl;
  Impl& impl() const { return *impl_; }

 private:
  std::unique_ptr<Impl> impl_;
};

// How the sparse operand is handed to cuSPARSE: CSR as is, or COO (row indices expanded once).
enum class SparseStorage : std::uint8_t { csr, coo };

// cuSPARSE's SpMM algorithms for CSR and COO (CUSPARSE_SPMM_*).
enum class SpmmAlgorithm : std::uint8_t {
  default_alg,
  csr_alg1,
  csr_alg2,
  csr_alg3,
  coo_alg1,
  coo_alg2,
  coo_alg3,
  coo_alg4
};
std::string_view to_string(SpmmAlgorithm alg);
// The algorithms cuSPARSE offers for a storage (default_alg included).
std::vector<SpmmAlgorithm> spmm_algorithms(SparseStorage storage);

// C = alpha * op(A) * B + beta * C through cusparseSpMM, bf16/fp16 values with fp32 compute.
// The constructor binds A, B and C, asks cuSPARSE for the buffer size, allocates it once and runs
// cusparseSpMM_preprocess; run() is the timed part. Throws Error(unsupported) when cuSPARSE
// refuses the (storage, algorithm, type, op) combination. A's 64-bit row_ptr is narrowed once
// to 32 bits (cuSPARSE wants one index type), so nnz must stay below 2^31.
template <Value T>
class SpmmPlan {
 public:
  SpmmPlan(Handles& handles, Op op_a, CsrView<const T> a, SparseStorage storage, SpmmAlgorithm alg,
           DenseView<const T> b, DenseView<T> c, float alpha, float beta);
  ~SpmmPlan();
  SpmmPlan(SpmmPlan&&) noexcept;
  SpmmPlan& operator=(SpmmPlan&&) noexcept;

  void run();
  std::size_t workspace_bytes() const;

  struct Impl;

 private:
  std::unique_ptr<Impl> impl_;
};

// The algorithms for which a plan of this problem can be built (each one tried).
template <Value T>
std::vector<SpmmAlgorithm> supported_spmm_algorithms(Handles& handles, Op op_a, CsrView<const T> a,
                                                     SparseStorage storage, DenseView<const T> b, DenseView<T> c);

// When a plan whose cuSPARSE refuses 16-bit operands makes fp32 copies of A and B: at every run
// (what a user holding 16-bit data pays), or once, at construction, followed by
// cusparseSDDMM_preprocess on them (a user who keeps fp32 copies of the dense operands; the plan
// then reads a and b only there).
enum class Fp32Copies { every_run, once };

// out = alpha * (A op(B)) at the pattern of `out` + beta * out through cusparseSDDMM (CSR).
// `out` holds the pattern (row_ptr, col_idx) and receives the values. cuSPARSE documents SDDMM
// for fp32/fp64 only: 16-bit operands are tried natively and, when refused, converted to fp32
// copies owned by the plan (native() says which ran; `copies` says when A and B are converted;
// out's values are rounded back at every run, and read into fp32 first where beta != 0).
template <Value T>
class SddmmPlan {
 public:
  SddmmPlan(Handles& handles, DenseView<const T> a, Op op_b, DenseView<const T> b, CsrView<T> out, float alpha,
            float beta, Fp32Copies copies = Fp32Copies::every_run);
  ~SddmmPlan();
  SddmmPlan(SddmmPlan&&) noexcept;
  SddmmPlan& operator=(SddmmPlan&&) noexcept;

  void run();
  bool native() const;

  struct Impl;

 private:
  std::unique_ptr<Impl> impl_;
};

// Dense -> CSR through cusparseDenseToSparse, bound to one source. Values equal to +-0 are
// dropped, as twell's is_stored rule; cuSPARSE does not promise sorted columns within a row.
// The constructor allocates cuSPARSE's buffer and CSR arrays the plan owns for `capacity` entries
// (at most rows x cols). Both runs start with the analysis, which counts the entries (cuSPARSE
// reads the count back: the host waits), and end with cuSPARSE's 32-bit row offsets widened into
// a 64-bit row_ptr.
//   run(): converts into the plan's arrays: what a caller converting every step keeps, and the
//     counterpart of twell's DenseToHybridPlan. A count beyond the arrays enlarges them to
//     max(nnz, twice their size), at most rows x cols (growths() counts it: the column and value
//     arrays are allocated anew, the old ones freed); nothing else is allocated. The view stays valid until the next run() or the
//     plan's destruction.
//   run_allocating(): converts into a new CsrMatrix (its allocation from twell's device pool and
//     zero fill, and the device syncs around them, included): what a caller without a plan pays,
//     with the same allocator as twell's allocating converters.
template <Value T>
class DenseToCsrPlan {
 public:
  DenseToCsrPlan(Handles& handles, DenseView<const T> src, std::int64_t capacity = 0);
  ~DenseToCsrPlan();
  DenseToCsrPlan(DenseToCsrPlan&&) noexcept;
  DenseToCsrPlan& operator=(DenseToCsrPlan&&) noexcept;

  CsrView<const T> run();
  CsrMatrix<T> run_allocating();
  std::int64_t capacity() const;
  std::int64_t growths() const;

  struct Impl;

 private:
  std::unique_ptr<Impl> impl_;
};

// C = alpha * op(A) op(B) + beta * C, row-major, cuBLAS with fp32 accumulation (fp32 operands
// without TF32). Row-major is handled by computing C^T = op(B)^T op(A)^T in column-major.
template <Value T>
void gemm(Handles& handles, Op op_a, DenseView<const T> a, Op op_b, DenseView<const T> b, DenseView<T> c, float alpha,
          float beta);

// C = relu(A B), row-major, cuBLASLt with CUBLASLT_EPILOGUE_RELU (the dense FFN's gate GEMM).
template <Value T>
void gemm_relu(Handles& handles, DenseView<const T> a, DenseView<const T> b, DenseView<T> c);

// Buffers of the dense gated FFN for one token count: gate and up activations (M x N).
template <Value T>
class DenseFfnWorkspace {
 public:
  DenseFfnWorkspace(Handles& handles, std::int64_t tokens, std::int64_t hidden);
  Handles& handles() const { return *handles_; }
  DenseMatrix<T>& gate() { return gate_; }
  DenseMatrix<T>& up() { return up_; }

 private:
  Handles* handles_;
  DenseMatrix<T> gate_;
  DenseMatrix<T> up_;
};

// y = (relu(x wg) * (x wu)) wd, x: M x K, wg and wu: K x N, wd: N x K, y: M x K. cuBLASLt GEMM with
// the ReLU fused into the gate GEMM, cuBLAS up GEMM, one fused elementwise product (h overwrites
// the gate buffer), cuBLAS down GEMM.
template <Value T>
void dense_gated_ffn_forward(DenseView<const T> x, DenseView<const T> wg, DenseView<const T> wu, DenseView<const T> wd,
                             DenseView<T> y, DenseFfnWorkspace<T>& workspace);

// Buffers of the dense gated FFN training step for one token count: a = relu(x wg), u = x wu,
// h = a * u, dh (turned into dg in place) and du, M x N each. The backward leaves a, u and h as the
// forward wrote them, so it may run again with another dy.
template <Value T>
class DenseFfnTrainingWorkspace {
 public:
  DenseFfnTrainingWorkspace(Handles& handles, std::int64_t tokens, std::int64_t intermediate);
  Handles& handles() const { return *handles_; }
  DenseMatrix<T>& a() { return a_; }
  DenseMatrix<T>& u() { return u_; }
  DenseMatrix<T>& h() { return h_; }
  DenseMatrix<T>& dh() { return dh_; }
  DenseMatrix<T>& du() { return du_; }

 private:
  Handles* handles_;
  DenseMatrix<T> a_, u_, h_, dh_, du_;
};

// The dense training step a user would write with cuBLAS: the forward keeps a, u, h in the
// workspace (cuBLASLt ReLU gate GEMM, up GEMM, one product kernel, down GEMM); the backward of
// reference::gated_ffn_backward for ReLU gates with the L1 gradient l1_scale * sign(h)
// (l1_scale = lambda / Z): dh = dy wd^T, dwd = h^T dy, one kernel for dg = (dh + l1_scale sign(h))
// * u * [a > 0] and du = (...) * a, then dx = dg wg^T + du wu^T, dwg = x^T dg, dwu = x^T du: nine
// GEMMs in all. The L1 term's value (sum |h|) is not computed. dwg, dwu: K x N; dwd: N x K.
template <Value T>
void dense_gated_ffn_training_forward(DenseView<const T> x, DenseView<const T> wg, DenseView<const T> wu,
                                      DenseView<const T> wd, DenseView<T> y, DenseFfnTrainingWorkspace<T>& workspace);
template <Value T>
void dense_gated_ffn_backward(DenseView<const T> x, DenseView<const T> wg, DenseView<const T> wu, DenseView<const T> wd,
                              DenseView<const T> dy, float l1_scale, DenseView<T> dx, DenseView<T> dwg,
                              DenseView<T> dwu, DenseView<T> dwd, DenseFfnTrainingWorkspace<T>& workspace);

}  // namespace twell::baseline
