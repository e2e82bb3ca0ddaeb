// Fused FFN inference forward on the GPU (twell::cuda), the twin of the dense reference in
// <twell/kernels/ffn.hpp>: same signatures, device operands. The gate goes through a
// GemmToSparsePlan into a Hybrid; one kernel then computes, for a block of tokens, the up
// projection only at the gate's nonzeros (each Wu^T row once per block), h = gate * u, and
// y = h Wd, with h kept on chip (docs/gemm_to_sparse.md, "Fused FFN forward"). The same kernel
// also serves a training forward that keeps u and h (GatedUpDownPlan, below).
// Shapes: x is M x K; wg and wu are K x N; wd is N x K; y is M x K.
// Available when TWELL_HAS_CUDA; host-includable (no CUDA headers).
#pragma once

#include <cstdint>
#include <string>

#include <twell/formats/dense.hpp>
#include <twell/formats/hybrid.hpp>
#include <twell/formats/layout.hpp>
#include <twell/kernels/ffn.hpp>
#include <twell/kernels/gemm_to_sparse_plan.hpp>
#include <twell/kernels/options.hpp>
#include <twell/memory.hpp>

namespace twell::cuda {

// The largest K (hidden size) the plans below take: the up/down kernels keep a token's output row
// in registers, K / 256 values per thread. Construction throws ErrorCode::unsupported above it;
// twell::GatedFfn / twell::Ffn then run the composed forward on the device instead.
inline constexpr std::int64_t kFusedFfnMaxK = 8192;

namespace detail {
// The up/down kernel's device memory for M tokens, allocated once by the plan that runs it: the
// per-token gate counts, the order of the token blocks, and, where the block kernel takes K, its
// state and split-row buffers (docs/gemm_to_sparse.md, "Heavy tokens"); with `decode` (an
// inference plan of 16-bit T, M <= 256 and the default capacity), the decode path's entry lists
// ("Decode path").
template <Value T>
struct UpDownBuffers {
  UpDownBuffers(std::int64_t m, std::int64_t k, std::int64_t n, const TwellLayout& layout, bool decode,
                const char* where);
  Buffer<std::int32_t> row_nnz;      // M
  Buffer<std::int32_t> block_order;  // the token blocks, heaviest weight class first
  Buffer<std::int32_t> block_class;  // 2 words per token block: its weight class and rank in it
  Buffer<std::int32_t> block_state;  // counters, the split threshold and the split rows
  // Rows split at once: min(M, CTAs the device runs at once); 0 turns splitting off.
  std::int64_t split_capacity = 0;
  Buffer<std::int32_t> split_candidates;  // 2 M: (row, entries) of the rows over 64 entries
  Buffer<std::int32_t> split_turn;        // split_capacity
  Buffer<float> split_sum;                // split_capacity x K, fp32 partial sums of y
  Buffer<std::int32_t> decode_col;        // M x N (decode path): each token's entries' columns
  Buffer<float> decode_h;                 // M x N (decode path): their h = gate * u
  Buffer<std::int32_t> decode_over;       // M (decode path on the gate's own rows): 1 where a row overflowed
};
}  // namespace detail

// The part the gated and non-gated plans share: bound to M tokens, the weights (device views that
// must outlive the plan), the activation, the gate layout and an overflow capacity; owns the
// gate's GemmToSparsePlan (its TwELL part and overflow block), Wu^T (gated only), the per-token
// nonzero counts and the up/down kernel's block order and split-row buffers, all allocated by the
// constructor.
//
// forward(x, y) queues, on the plan's stream, the gate GEMM (TwELL epilogue, ranking of overflow
// rows, dense recompute of the overflow rows that fit the block; on the decode path with the
// split gate, the gate kernel alone, storing every row densely into the block: path
// "..._own_rows", docs/gemm_to_sparse.md "Decode path") and the up/down kernel, and
// returns: no allocation, no host wait (on the fused gate path; where the gate plan runs its
// generic path, path() "gate:generic...", each call allocates and waits). The kernel reads the
// gate's row_to_overflow on the device (with the gate's own rows, each row's tile counts): TwELL
// rows from their slots, overflow rows inside the block from their dense rows, and overflow rows
// past the block's capacity (unknown to the host) by recomputing the gate row densely itself
// (act(x Wg) in fp32, the same threshold and rounding), so y is exact whatever the overflow count.
// With stats, forward() then waits for the device: it reads the overflow count (with the gate's
// own rows, from the up kernel's per-row flags; the gate plan grows its block when the count
// exceeded it, so later calls stay on the fast path) and the per-token counts. x must stay
// unchanged until the queued work has run. Deterministic: same inputs, the same constructor
// arguments and the same gate block capacity, same bits (a forward with stats may grow the block:
// rows past the old block then take another kernel's summation order; at M <= 256 a plan built
// with the default capacity and one given M rows take different up/down kernels:
// gate_capacity()).
template <Value T>
class FfnPlanBase {
 public:
  static constexpr std::int64_t kDefaultCapacity = GemmToSparsePlan<T>::kDefaultCapacity;
  // The overflow capacity a plan of M tokens built with `overflow_capacity` gives its gate: M rows
  // where the up/down projections take the decode path (16-bit T, M <= 256, the default capacity;
  // docs/gemm_to_sparse.md, "Decode path"), else `overflow_capacity` itself.
  static std::int64_t gate_capacity(std::int64_t m, std::int64_t overflow_capacity);

  FfnPlanBase(const FfnPlanBase&) = delete;
  FfnPlanBase& operator=(const FfnPlanBase&) = delete;
  FfnPlanBase(FfnPlanBase&&) noexcept = default;
  FfnPlanBase& operator=(FfnPlanBase&&) noexcept = default;
  ~FfnPlanBase() = default;

  // x: M x K, y: M x K, device-resident; M must be the plan's.
  void forward(DenseView<const T> x, DenseView<T> y, FfnStats* stats = nullptr);

  std::int64_t rows() const { return m_; }
  std::int64_t hidden() const { return k_; }        // K
  std::int64_t intermediate() const { return n_; }  // N
  const TwellLayout& layout() const { return gate_.layout(); }
  // Rows of the gate's preallocated overflow block (grows after a forward() with stats found more).
  std::int64_t overflow_capacity() const { return gate_.overflow_capacity(); }
  // "gate:<gemm_to_sparse path>+<up/down kernel>" of the latest forward() (ffn_decode_v8 at M <= 256
  // in a plan built with the default capacity, ffn_block_v8_t<b>, ffn_block_wide_v8_t<b> with b tokens
  // per block, ffn_rows_v8 or ffn_rows_v1; docs/gemm_to_sparse.md).
  const std::string& path() const { return path_; }
  Stream stream() const { return stream_; }

 protected:
  // Non-gated (gated false): w_gate is Wu, h = act(x Wu), and wu is not read.
  FfnPlanBase(std::int64_t m, bool gated, DenseView<const T> w_gate, DenseView<const T> wu, DenseView<const T> wd,
              ActivationSpec act, TwellLayout layout, std::int64_t overflow_capacity, const KernelOptions& options,
              const char* where);

 private:
  std::int64_t m_ = 0, k_ = 0, n_ = 0;
  bool gated_ = false;
  DenseView<const T> w_gate_{}, wd_{};
  ActivationSpec act_{};
  Stream stream_{};
  const char* where_ = "";
  twell::detail::PlanDevice device_ = twell::detail::plan_device(where_);
  GemmToSparsePlan<T> gate_;
  DenseMatrix<T> wu_t_;  // N x K, gated only
  detail::UpDownBuffers<T> buffers_;
  std::string path_;
};

// y = (act(x wg) * (x wu)) wd. Wu^T is made once by the constructor (on options.stream), so the
// up projection at a nonzero reads a contiguous row.
template <Value T>
class GatedFfnPlan : public FfnPlanBase<T> {
 public:
  GatedFfnPlan(std::int64_t m, DenseView<const T> wg, DenseView<const T> wu, DenseView<const T> wd,
               ActivationSpec act = {}, TwellLayout layout = {},
               std::int64_t overflow_capacity = FfnPlanBase<T>::kDefaultCapacity, const KernelOptions& options = {});
};

// y = act(x wu) wd: the gate is the hidden state, the kernel skips the up projection.
template <Value T>
class FfnPlan : public FfnPlanBase<T> {
 public:
  FfnPlan(std::int64_t m, DenseView<const T> wu, DenseView<const T> wd, ActivationSpec act = {},
          TwellLayout layout = {}, std::int64_t overflow_capacity = FfnPlanBase<T>::kDefaultCapacity,
          const KernelOptions& options = {});
};

// The operands of a gated backward's sparse rows (GatedUpDownPlan::backward), all device-resident:
// the forward's complete gate a and its kept u and h (as GatedUpDownPlan::run made them), and for
// SiLU and GELU g = x wg on a's pattern (unread for ReLU), all M x N on a's structure; dy and dx
// M x K; the forward's weights wg, wu (K x N) and wd (N x K); l1_scale = lambda / Z (finite).
// One kernel computes, at each entry of a, rounded to T step by step as the composition of sddmm,
// add_scaled_sign, multiply_on_pattern (and multiply_by_activation_derivative) rounds them:
//   dh = (dy wd^T)(i, j) + l1_scale sign(h), dg = dh * u (* act'(g)), du = dh * a,
// writes dg and du (given a's structure here; a's layout and overflow rows, slot arrays and dense
// blocks of their own: separate allocations, or views that do not overlap the other operands) and
// dx = dg wg^T + du wu^T, summed in fp32 and rounded once (the composition's two spmm round
// twice). Up to the order of the fp32 sums of dh and dx, the composition's results, its rules for
// zeros in dense rows included.
// reuse_run_wu_t (GatedUpDownPlan::backward only; gated_up_down_backward refuses it): the caller
// promises that wu holds the values it held at the plan's latest run(), as a training step's
// backward does with its forward's weights; where that run's wu is the same view (data, shape and
// leading dimension) the backward then takes the Wu^T that run made instead of transposing wu
// again, and otherwise transposes it as usual.
template <Value T>
struct GatedBackwardOperands {
  DenseView<const T> dy;
  HybridView<const T> a, u, h, g;
  ActivationSpec act{};
  DenseView<const T> wg, wu, wd;
  float l1_scale = 0.0f;
  HybridView<T> dg, du;
  DenseView<T> dx;
  bool reuse_run_wu_t = false;
};

// The sparse half of a gated forward that keeps its intermediates, for training: given a complete
// gate a = act(x wg) (an M x N Hybrid whose block holds all its overflow rows), one kernel writes
// u = x wu and h = a * u on a's pattern into u and h, rounded to T as sddmm and
// multiply_on_pattern round them (h = a * round(u)), and y = h wd from those h, the same results
// as that composition followed by spmm up to the order of the fp32 sums of u and y. u and h get
// a's structure (slot counts and columns, maps, shadow slots), copied here; they must have a's
// layout and overflow rows and hold slot arrays and dense blocks of their own (their maps may be
// a's). a must be a valid Hybrid (every row_to_overflow entry below its R). wu is transposed
// into the plan's N x K buffer at every run (training changes the weights between steps); a
// backward whose operands set reuse_run_wu_t may take it from there. 16-bit T only (applies()).
// backward() runs the same kernel on the backward's operands (GatedBackwardOperands).
// Asynchronous on the plan's stream, no allocation, no host wait.
template <Value T>
class GatedUpDownPlan {
 public:
  GatedUpDownPlan(std::int64_t m, std::int64_t k, std::int64_t n, TwellLayout layout,
                  const KernelOptions& options = {});

  // Whether the plan takes T and a hidden size K (16-bit T, K <= kFusedFfnMaxK).
  static bool applies(std::int64_t k);

  // x: M x K; a, u, h: M x N; wu: K x N; wd: N x K; y: M x K; all device-resident.
  void run(DenseView<const T> x, HybridView<const T> a, DenseView<const T> wu, DenseView<const T> wd, HybridView<T> u,
           HybridView<T> h, DenseView<T> y);

  // Queues the part of run()'s work that does not depend on a's overflow rows: Wu^T, and a's slot
  // words and row map into u and h (the views' overflow rows are not read). For a caller that
  // waits for its gate's overflow count between the two (GatedFfnTraining::forward), so that the
  // GPU has this work while the host waits. The next run() skips it where its wu is the same view
  // and its a, u and h the same storage, whose contents the caller leaves as they are in between;
  // it queues everything itself otherwise, as it does after any other call of the plan. Checks
  // wu, a, u and h as run() does, but for their overflow rows, which it does not read.
  void queue_ahead(HybridView<const T> a, DenseView<const T> wu, HybridView<T> u, HybridView<T> h);

  // The backward's products on a's pattern and dx, in one kernel (GatedBackwardOperands).
  void backward(const GatedBackwardOperands<T>& operands);

  // The up/down kernel of the latest run() or backward(), as FfnPlanBase::path() names it (the
  // backward's with "_backward").
  const std::string& path() const { return path_; }

 private:
  std::int64_t m_ = 0, k_ = 0, n_ = 0;
  TwellLayout layout_{};
  Stream stream_{};
  twell::detail::PlanDevice device_ = twell::detail::plan_device("twell::cuda::GatedUpDownPlan");
  DenseMatrix<T> wu_t_;  // N x K
  DenseMatrix<T> wg_t_;  // N x K, the backward's
  // The wu of the latest run() or queue_ahead(), whose transpose wu_t_ holds; null before the
  // first, after a backward() that transposed wu itself, and from the start of a run() or
  // queue_ahead() (or, once its checks passed, of such a backward) until its transpose is queued:
  // one that throws leaves it null.
  DenseView<const T> wu_t_source_{};
  // What queue_ahead() queued, for the next run() only: Wu^T of wu_t_source_, and a's slot words
  // and row map into this storage (a's, u's, h's); not `queued` otherwise.
  struct Ahead {
    bool queued = false;
    const void* a_words = nullptr;
    const void* a_map = nullptr;
    const void* u_words = nullptr;
    const void* u_map = nullptr;
    const void* h_words = nullptr;
    const void* h_map = nullptr;
    bool operator==(const Ahead&) const = default;
  };
  Ahead ahead_{};
  detail::UpDownBuffers<T> buffers_;
  std::string path_;
};

// The one-shot form of GatedUpDownPlan::run (the free training forward's): M, K, N from x and
// wu, the layout a's; Wu^T and the kernel's buffers are stream-ordered scratch for this call
// (twell's pool, no device-wide wait), so the results are a plan's bit for bit. Reports the
// kernel in options.report.
template <Value T>
void gated_up_down(DenseView<const T> x, HybridView<const T> a, DenseView<const T> wu, DenseView<const T> wd,
                   HybridView<T> u, HybridView<T> h, DenseView<T> y, const KernelOptions& options = {});

// The one-shot form of GatedUpDownPlan::backward (the free training backward's), with stream-ordered
// scratch as gated_up_down; M, K, N from dy and wu, the layout a's.
template <Value T>
void gated_up_down_backward(const GatedBackwardOperands<T>& operands, const KernelOptions& options = {});

// One-shot forms: build the plan for x's M (default layout and capacity), run it once, and
// report its path in options.report. Reuse a plan when the weights are reused.
template <Value T>
void gated_ffn_forward(DenseView<const T> x, DenseView<const T> wg, DenseView<const T> wu, DenseView<const T> wd,
                       ActivationSpec act, DenseView<T> y, const KernelOptions& options = {});

template <Value T>
void ffn_forward(DenseView<const T> x, DenseView<const T> wu, DenseView<const T> wd, ActivationSpec act,
                 DenseView<T> y, const KernelOptions& options = {});

}  // namespace twell::cuda
