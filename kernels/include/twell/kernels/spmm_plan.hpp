// twell::cuda::SpmmPlan: spmm of a TwELL or Hybrid A (M x K, one layout) bound to its shape,
// owning the workspaces of the slice-reuse path, of Hybrid overflow rows and of op transpose's
// A^T, so that a steady state of run() allocates nothing. Host-includable: no CUDA headers. Available when
// TWELL_HAS_CUDA.
#pragma once

#include <array>
#include <cstdint>
#include <memory>
#include <span>
#include <string>

#include <twell/formats/dense.hpp>
#include <twell/formats/hybrid.hpp>
#include <twell/formats/layout.hpp>
#include <twell/formats/twell_matrix.hpp>
#include <twell/kernels/options.hpp>
#include <twell/memory.hpp>

namespace twell::cuda {

namespace detail {
struct SpmmSideLane;  // the plan's second stream, its events and cuBLAS handle (spmm.cu)
struct SpmmSideLaneDeleter {
  void operator()(SpmmSideLane* lane) const noexcept;
};
}  // namespace detail

// How the A_i of one SpmmPlan::run_transposed call relate.
enum class SlotStructure {
  separate,  // each A_i its own entries
  // Value planes of one sparsity structure, as the training backward's h, dg and du: every A_i
  // holds its values in A_0's slots (the same counts and columns in every (row, tile) group) and
  // has A_0's dense rows; the values differ, +-0 included.
  shared,
};

// C = alpha * op(A) B + beta * C, exactly what twell::cuda::spmm computes (same paths, same bits),
// with A of m rows, k columns and `layout`.
//
// Storage: the constructor allocates nothing. Buffers are allocated by the first run that needs
// more than the plan holds and kept (so a steady state allocates nothing): for slice-reuse runs
// (bf16 and fp16 plans) the pre-pass workspace, which regroups A's entries into chunks of at most
// 32 per lane (about the size of A's packed slots: per row, room for the ceil(capacity x tiles /
// 32) lanes its capacity allows, 136 bytes each, plus tiles + 4 bytes), and the slice-major copy
// of B that the path stages from (Nb x (K + 2) bf16/fp16 values), both allocated up front by
// reserve_b_cols(); for Hybrids with overflow rows the fp32 buffer of R x Nb into which cuBLAS
// computes them (reserve_overflow()). Plans whose runs take the pair-balanced or tile-streaming
// kernel hold no slice buffers. Runs with op transpose that transpose A hold A^T (its slots, about
// A's packed size, and its maps) and A^T's dense rows (R x m values a product, or a value plane of
// a shared structure, for the columns of A too busy for A^T's groups), and, should their product
// on A^T take the slice-reuse kernel, that kernel's workspace and slice-major copy of B (m + 2
// rows of Nb values; one of each a product of a run_transposed() batch), where spmm() takes them
// from stream-ordered scratch per call. All grow to the largest run seen and stay.
//
// run() with op none queues on the plan's stream and, once its buffers have grown, neither
// allocates nor waits for the device; op transpose waits once for A^T's dense-row count (and its
// CSR route, for layouts it does not transpose directly, synchronises). It picks its kernel as spmm()
// does for KernelOptions::spmm_algorithm = `algorithm` (automatic: by rows and layout, and for a
// Hybrid with overflow rows by B's columns and the SM count too, docs/api.md; a forced kernel
// that does not take the operands raises unsupported), so only slice-reuse runs use the workspace
// and the copy of B. The buffers are reused by every run: two runs of one plan must not execute
// concurrently on different streams.
// Overflow rows of op-none runs go through a second stream the plan creates at the first such run
// (with the plan stream's priority, and a cuBLAS handle bound to it): forked from the plan's stream
// after the work queued there, joined back before anything queued later (before the product, on
// the slice-reuse kernel), so they run beside the kernel or its pre-pass (docs/api.md, "spmm
// paths"). run_transposed() of several products creates it too, with a stream for each product
// past the first: where it builds every A^T first, A^T's dense rows go on the side stream beside
// the products, and slice-reuse products' pre-passes run side by side, each product on its own
// workspace and copy of B (one copy for products of one B).
// Errors: A's rows, columns or layout differ from the plan's, or the spmm argument checks
// (shape_mismatch, space_mismatch, invalid_argument).
template <Value T>
class SpmmPlan {
 public:
  SpmmPlan(std::int64_t m, std::int64_t k, TwellLayout layout, Stream stream = {},
           SpmmAlgorithm algorithm = SpmmAlgorithm::automatic);
  SpmmPlan(const SpmmPlan&) = delete;
  SpmmPlan& operator=(const SpmmPlan&) = delete;
  SpmmPlan(SpmmPlan&&) noexcept = default;
  SpmmPlan& operator=(SpmmPlan&&) noexcept = default;
  ~SpmmPlan() = default;

  void run(TwellView<const T> a, DenseView<const T> b, DenseView<T> c, float alpha = 1.0f, float beta = 0.0f);
  void run(HybridView<const T> a, DenseView<const T> b, DenseView<T> c, float alpha = 1.0f, float beta = 0.0f);
  // C = alpha * op(A) B + beta * C: op none as above; op transpose (B: m x Nb, C: k x Nb, training's
  // dWd = h^T dy) as spmm(Op::transpose, ...) computes it (same paths, same bits), with A^T's
  // storage held by the plan where that route transposes A (docs/api.md).
  void run(Op op_a, TwellView<const T> a, DenseView<const T> b, DenseView<T> c, float alpha = 1.0f,
           float beta = 0.0f);
  void run(Op op_a, HybridView<const T> a, DenseView<const T> b, DenseView<T> c, float alpha = 1.0f,
           float beta = 0.0f);
  // The most products one run_transposed call takes.
  static constexpr int kMaxTransposedBatch = 3;
  // C_i = alpha * A_i^T B_i + beta * C_i for i < a.size() (1 to kMaxTransposedBatch products; every
  // A_i of the plan's shape and layout, b and c of a's size, every B_i of one column count): the
  // bits of run(Op::transpose, a[i], b[i], c[i], alpha, beta) for each i in turn, but where every
  // product on A^T takes the tile-streaming kernel, every A_i^T is built first and one launch runs
  // them all, so that a product's last wave of CTAs does not leave SMs idle (the training step's
  // dWd and its N x K dWg and dWu, docs/api.md); otherwise one after another, as run() would
  // (with SlotStructure::shared, slice-reuse products run their pre-passes side by side on the
  // plan's side streams, each product after the one before it: the same kernels and bits). No
  // C_i shares a byte (from its first element to its last) with another C_j or any B_j: a C
  // written by one product cannot feed another in the same call. Precondition, not checked (run()
  // does not check it either): no C_i overlaps any A_j's arrays. The plan then holds an A^T per
  // product. Errors: as run(), and invalid_argument for spans of other sizes or overlapping
  // operands, shape_mismatch for B of different column counts; all checked for every product
  // before any work is queued (all but SlotStructure::shared's promise, below). An error after
  // that (an allocation, cuBLAS) leaves every C_i unspecified. SlotStructure::shared (where this
  // route transposes A; the CSR route runs as separate) builds every A_i^T in one transpose of all
  // the A_i together: an entry of each A_i^T is then a slot or dense-row column where any A_j
  // holds a value other than +-0, so a product adds its own +-0 there (0 x Inf is NaN, as in the
  // dense rows of A^T, multiplied by cuBLAS), a row of A^T is dense where the union of the entries
  // overflows its group, and the slice-reuse kernel orders a row's sums by its entries: where no
  // A_i holds +-0 at another's entry the bits are those of separate, elsewhere the rounding may
  // differ. A_i whose slot counts, columns or dense rows differ from A_0's are refused
  // (invalid_argument) once the transpose has run: the call waits for the work it queued, then
  // throws, every C_i unspecified.
  void run_transposed(std::span<const HybridView<const T>> a, std::span<const DenseView<const T>> b,
                      std::span<const DenseView<T>> c, float alpha = 1.0f, float beta = 0.0f,
                      SlotStructure structure = SlotStructure::separate);
  // Holds an overflow buffer for `rows` overflow rows times `b_cols` columns of B.
  void reserve_overflow(std::int64_t rows, std::int64_t b_cols);
  // Holds the slice-reuse path's buffers for a B of `b_cols` columns: the pre-pass workspace and
  // the slice-major copy of B.
  void reserve_b_cols(std::int64_t b_cols);

  const std::string& path() const { return path_; }  // the path of the latest run
  std::int64_t rows() const { return m_; }
  std::int64_t cols() const { return k_; }
  const TwellLayout& layout() const { return layout_; }
  Stream stream() const { return stream_; }
  SpmmAlgorithm algorithm() const { return algorithm_; }

 private:
  void check_a(std::int64_t rows, std::int64_t cols, TwellLayout layout, const char* where) const;
  // op transpose: through A^T on the plan's buffers where spmm() transposes A, else as spmm().
  template <class View>
  void run_transposed(View a, const char* format, DenseView<const T> b, DenseView<T> c, float alpha, float beta);
  // The products through A^T on the plan's buffers (transposed_layout applies); returns the path.
  std::string transposed_batch(std::span<const HybridView<const T>> a, std::span<const DenseView<const T>> b,
                               std::span<const DenseView<T>> c, float alpha, float beta, SlotStructure structure);

  std::int64_t m_ = 0, k_ = 0;
  TwellLayout layout_{};
  Stream stream_{};
  SpmmAlgorithm algorithm_ = SpmmAlgorithm::automatic;
  Buffer<std::uint64_t> workspace_;  // 8-byte elements (blocks 256-byte aligned; the kernels need 16)
  Buffer<std::uint64_t> staged_b_;   // B slice-major
  Buffer<float> overflow_;           // R x Nb products of the overflow rows
  std::array<Buffer<std::uint32_t>, kMaxTransposedBatch> transposed_;  // op transpose: each A^T's slots and maps
  Buffer<T> transposed_dense_;        // op transpose: A^T's dense rows
  // op transpose: the slice-reuse kernel's workspace on A^T and B slice-major, one a product
  // (their pre-passes run side by side).
  std::array<Buffer<std::uint64_t>, kMaxTransposedBatch> transposed_workspace_;
  std::array<Buffer<std::uint64_t>, kMaxTransposedBatch> transposed_staged_b_;
  std::string path_;
  twell::detail::PlanDevice device_ = twell::detail::plan_device("twell::cuda::SpmmPlan");
  std::unique_ptr<detail::SpmmSideLane, detail::SpmmSideLaneDeleter> side_;  // last: destroyed first
};

}  // namespace twell::cuda
