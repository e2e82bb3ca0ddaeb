// twell::cuda::GemmToSparsePlan: gemm_to_sparse bound to one shape and layout, owning its output
// and workspace, so that the hot path allocates nothing and does not wait for the device
// (docs/gemm_to_sparse.md, "The plan"). Host-includable: no CUDA headers. Available when
// TWELL_HAS_CUDA.
#pragma once

#include <cstdint>
#include <functional>
#include <string>

#include <twell/converters/options.hpp>
#include <twell/formats/dense.hpp>
#include <twell/formats/hybrid.hpp>
#include <twell/formats/layout.hpp>
#include <twell/kernels/backends.hpp>
#include <twell/kernels/options.hpp>
#include <twell/memory.hpp>

namespace twell::cuda {

// What sync_overflow_count() found for the latest run().
struct OverflowCount {
  std::int64_t rows = 0;           // R: rows in the overflow block (0 unless the policy is hybrid)
  bool exceeded_capacity = false;  // R was larger than the block the run had
  bool second_pass = false;        // so the block was grown and rows capacity .. R-1 computed now
  std::int64_t nnz = 0;            // entries stored (drop: after dropping)
  std::int64_t dropped = 0;        // entries removed by OverflowPolicy::drop
};

// Which mainloop the fused kernel may use. best: on a compute capability 9.0 device whose loaded
// image is the sm_90a one, 16-bit operands that also suit TMA (M, N, K > 0) run the wgmma + TMA
// kernel (path "fused_wgmma_tma_tile256" / "..._tile128", with "_rows64" appended where its CTA
// tiles are 64 rows, at decode-sized M; the bits are the same); everything else the fused kernel
// takes runs the portable mma.sync one ("fused_mma_sync_tile256" / "..._tile128"). Both share
// the epilogue and write the same bits. portable: always the mma.sync kernel (so that tests
// cover both on Hopper). best_decode_split (opt-in; the FFN inference plans take it): as best,
// and where M <= 64, K > 448, the tile's clusters of 4 CTAs fit the device at once, and every
// dense overflow row comes from the gate itself (drop or error, or a hybrid block of at least M
// rows), the wgmma kernel sums each TwELL tile's K in 4 contiguous ranges (K steps of 64,
// ceil(K / 64) r / 4 .. ceil(K / 64) (r + 1) / 4) on a cluster of 4 CTAs and adds them in K
// order, ((P0 + P1) + P2) + P3 (path suffix "_ksplit4"). Its values then differ from best's in
// the last bits, and so may whether a value near the threshold is stored; for a given row they
// do not depend on the other rows, on M within [1, 64] or on scheduling. The choice is made
// once, by the constructor, from the shape, the policy, the capacity and the kind of GPU; a run
// whose operands the wgmma kernel cannot take (alignment, leading dimensions) runs unsplit on the
// portable kernel, as under best. The portable mainloop never splits (docs/gemm_to_sparse.md,
// "Split-K decode variant").
enum class FusedMainloop : std::uint8_t { best, portable, best_decode_split };

template <Value T>
class FfnPlanBase;

// Y = act(X W) as a Hybrid of `layout`, X: M x K, W: K x N, all device-resident.
//
// Storage, allocated once by the constructor: the TwELL part (M x packed width), an overflow
// block of `overflow_capacity` dense rows, both row maps, per-row flags, a 64-bit device status
// (overflow row count R, first overflowed row, nnz and excess totals, how the block is made), a
// pool for the GEMM's spilled overflow segments, and on Hopper a capacity x K matrix for overflow
// rows of x to recompute (see size_overflow_buffers).
//
// run(x, w) queues on the plan's stream, allocating nothing and never waiting for the device:
// the fused GEMM with the TwELL epilogue (which flags rows with an overflowed tile), one kernel
// that ranks the flagged rows in increasing row order into row_to_overflow / overflow_to_row
// and the device count R, and (hybrid policy) the dense recompute of overflow rows 0 ..
// min(R, capacity)-1 into the block. Then:
//   - in stream order after run(): the TwELL part and row_to_overflow are final, and so are
//     overflow rows r < min(R, capacity) and overflow_to_row[r]; device_overflow_count() holds R
//     (hybrid; see it below for the other policies and the generic path).
//   - R on the host is known only after sync_overflow_count() (a 40-byte read-back the host waits
//     for; its `meanwhile` lets the caller queue more work before that wait).
//     If R > capacity (hybrid), that call grows the block and the map to min(M, max(R,
//     2 * capacity)) rows (an allocation, off the hot path) and computes rows capacity .. R-1 by a second pass,
//     and says so; the grown block stays for later runs. Under OverflowPolicy::error it throws
//     ErrorCode::overflow naming the first overflowed row and tile; under drop, R is 0 and slot 0
//     holds min(count, S-1).
//   - result() is valid only between sync_overflow_count() and the next run(); it throws
//     ErrorCode::invalid_argument otherwise. Its overflow view has exactly R rows.
// x and w must stay alive and unchanged from run() until the work sync_overflow_count() queues
// has run, in the plan's stream order (its second pass reads them after the call returns). run() while a previous
// result is still read by queued work on another stream is the caller's race to avoid, as with any output buffer.
//
// Paths: the fused kernel needs a 16-bit T, layout.tile 128 or 256, K and N multiples of 8 and
// (checked at each run) 16-byte aligned x, w and leading dimensions multiple of 8. Otherwise
// run() takes the generic path (dense GEMM into a temporary, then the converter): it allocates
// and synchronises inside run(), which then also throws the overflow error; fused() and path()
// say which ran. The calling sequence and validity rules are the same on both paths.
// Deterministic: same inputs, same bits, on either path. Grids of at most 65535 row blocks bound M:
// 128-row blocks (~8.4 M rows) for the portable fused kernel, the dense GEMM of the generic path
// and the second pass (over R - capacity rows), 64-row blocks (~4.2 M) for fp32 or unaligned
// operands; the Hopper kernel itself has none. A run past a bound throws unsupported. `mainloop` picks the fused
// kernel's mainloop (FusedMainloop above).
template <Value T>
class GemmToSparsePlan {
 public:
  static constexpr std::int64_t kDefaultCapacity = -1;  // max(64, M / 64) rows
  static std::int64_t default_capacity(std::int64_t m) { return m / 64 > 64 ? m / 64 : 64; }

  GemmToSparsePlan(std::int64_t m, std::int64_t k, std::int64_t n, ActivationSpec act, TwellLayout layout,
                   std::int64_t overflow_capacity = kDefaultCapacity, OverflowPolicy policy = OverflowPolicy::hybrid,
                   Stream stream = {}, FusedMainloop mainloop = FusedMainloop::best);
  GemmToSparsePlan(const GemmToSparsePlan&) = delete;
  GemmToSparsePlan& operator=(const GemmToSparsePlan&) = delete;
  GemmToSparsePlan(GemmToSparsePlan&&) noexcept = default;
  GemmToSparsePlan& operator=(GemmToSparsePlan&&) noexcept = default;
  ~GemmToSparsePlan() = default;

  void run(DenseView<const T> x, DenseView<const T> w);
  // `meanwhile`, where given, is called once the count's read-back is queued and before the host
  // waits for it: what it queues on the plan's stream (work that does not need R) keeps the GPU
  // busy while the host waits, and does not delay the count. Called also where there is nothing to
  // wait for; an exception from it leaves the plan as it was after run().
  OverflowCount sync_overflow_count(const std::function<void()>& meanwhile = {});
  HybridView<const T> result() const;
  // The result as the work queued by run() leaves it, for consumers queued after run() on the
  // plan's stream (the fused FFN reads its gate this way, without a host sync). Its overflow view
  // spans the block's rows: overflow row r is final iff r < min(R, overflow view rows); a row
  // whose row_to_overflow is at or past the view's rows is complete only after
  // sync_overflow_count(), so such a consumer must treat it itself. On the generic path this
  // equals result() (R rows, all final). Valid from run() until the next run(), take_result(),
  // or a sync_overflow_count() that grows the block (R past its rows; then use result()). Under
  // the error policy an overflowed tile is told only by sync_overflow_count(), which throws: until
  // then its row maps to no block row (-1) and a consumer reads its first `capacity` entries, so
  // what was queued on this view is to be discarded when the count throws. Under drop, the view
  // is the final result.
  HybridView<const T> queued_result() const {
    require(state_ == State::queued || state_ == State::synced, ErrorCode::invalid_argument,
            "twell::cuda::GemmToSparsePlan::queued_result",
            state_ == State::taken      ? kSpentPlan
            : state_ == State::own_rows ? kOwnRowsRun
                                        : "nothing queued: call run() first");
    return ran_fused_ ? plan_view() : generic_.view();
  }
  // The result as an owning matrix (overflow block trimmed to R rows); valid where result() is,
  // and leaves the plan empty (run() then throws). The trimmed block is allocated first: an
  // out_of_memory leaves the plan and its result as they were.
  HybridMatrix<T> take_result() &&;

  // The rows the latest fused run flagged, on the device, in stream order after run() (64-bit):
  // R under the hybrid policy; under drop and error the rows with an overflowing tile (the rows
  // that lost entries, or the count behind the overflow error). nullptr when the latest run took
  // the generic path (its count is R of result(), on the host).
  const std::uint64_t* device_overflow_count() const;
  // Rows of the preallocated block: min(M, the requested capacity), grown by a second pass; 0
  // for the error and drop policies and for plans without the fused path.
  std::int64_t overflow_capacity() const { return overflow_.rows(); }
  bool fused() const { return fused_; }        // the fused kernel serves aligned operands
  const std::string& path() const { return path_; }  // the path of the latest run (+ second pass)
  std::int64_t rows() const { return m_; }
  std::int64_t cols() const { return n_; }
  const TwellLayout& layout() const { return layout_; }
  Stream stream() const { return stream_; }

 private:
  // own_rows: the latest run was run_own_rows's; nothing public reads its result.
  enum class State : std::uint8_t { idle, queued, synced, taken, own_rows };
  // Why a spent plan refuses every call, whichever call it is.
  static constexpr const char* kSpentPlan =
      "the plan's storage was moved out (by take_result() or a move of the plan); build a new plan";
  static constexpr const char* kOwnRowsRun =
      "the latest run was the FFN decode path's (run_own_rows), which leaves no result or count here";

  // gemm_to_sparse runs a plan, but its caller called gemm_to_sparse: these name `where` in their
  // errors (the public run / sync_overflow_count name themselves).
  template <Value U>
  friend HybridMatrix<U> gemm_to_sparse(DenseView<const U> x, DenseView<const U> w, ActivationSpec act,
                                        TwellLayout layout, const ConvertOptions& convert,
                                        const KernelOptions& options);
  void check_run(DenseView<const T> x, DenseView<const T> w, const char* where) const;  // run()'s argument checks
  void run(DenseView<const T> x, DenseView<const T> w, const char* where);
  // The fused path's storage as a Hybrid view.
  HybridView<const T> plan_view() const {
    HybridView<const T> v;
    v.twell = twell_.view();
    v.overflow = overflow_.view();
    v.row_to_overflow = row_to_overflow_.data();
    v.overflow_to_row = overflow_to_row_.data();
    return v;
  }
  // The FFN decode path's gate (FfnPlanBase, never the public API): where this run takes the
  // split kernel and the block has all M rows, queues that kernel alone, which stores every row
  // i < M of the result densely into block row i besides writing the TwELL part, and sends its
  // flags and totals to sinks: no ranking, fill or recompute, so the maps, flags and status keep
  // what the latest run() left. Read with own_rows_view(): the TwELL part and the block, whose row
  // i is row i whether or not it overflowed (the consumer tells which from the tile counts);
  // the public reads throw (device_overflow_count() gives nullptr) until the next run().
  // Elsewhere runs run() and returns false.
  friend class FfnPlanBase<T>;
  bool run_own_rows(DenseView<const T> x, DenseView<const T> w, const char* where);
  HybridView<const T> own_rows_view() const;
  // for_later_runs false (the free function, which takes the result at once): a grown block gets
  // no spill pool or gathered rows, which only later runs would use.
  OverflowCount sync_overflow_count(const char* where, const std::function<void()>& meanwhile = {},
                                    bool for_later_runs = true);
  void run_generic(const char* where);
  void size_overflow_buffers(std::int64_t capacity);  // the spill pool (and gathered_x_) for a block

  std::int64_t m_ = 0, k_ = 0, n_ = 0;
  ActivationSpec act_{};
  TwellLayout layout_{};
  OverflowPolicy policy_ = OverflowPolicy::hybrid;
  Stream stream_{};
  bool fused_ = false;
  bool hopper_ = false;  // the wgmma kernel serves this plan's shape on this device
  bool split_ = false;   // ... as the split-K decode kernel (best_decode_split): decided once
  bool own_rows_ = false;  // ... and run_own_rows may take it (a block of M rows, the variant fits)

  TwellMatrix<T> twell_;
  DenseMatrix<T> overflow_;               // capacity x N
  Buffer<std::int32_t> row_to_overflow_;  // M
  Buffer<std::int32_t> overflow_to_row_;  // capacity
  Buffer<std::int32_t> flags_;            // M, zero between runs (the ranking kernel clears them)
  Buffer<std::int32_t> own_flags_;        // M, run_own_rows's flags: written, never read
  Buffer<std::uint64_t> status_;          // accumulators, R, first row + 1, totals, how the block is made
  // The packers' spilled segments (capacity x tiles of `tile` values) with their (row, tile)
  // pairs, and on Hopper the overflow rows of x for a recompute (capacity x K).
  Buffer<std::uint16_t> spill_values_;
  Buffer<std::int32_t> spill_where_;
  DenseMatrix<T> gathered_x_;

  // The latest run's operands (for the second pass) and outcome.
  DenseView<const T> x_{}, w_{};
  bool ran_fused_ = false;
  HybridMatrix<T> generic_;  // the generic path's result
  OverflowCount count_{};
  std::string path_;
  twell::detail::ResetOnMove<State, State::taken> state_ = State::idle;  // a moved-from plan reads as taken
  int device_ = twell::detail::plan_device("twell::cuda::GemmToSparsePlan");  // a spent plan is told by state_
};

}  // namespace twell::cuda
