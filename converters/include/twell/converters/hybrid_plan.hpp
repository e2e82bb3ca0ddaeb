// twell::cuda::DenseToHybridPlan: dense -> Hybrid on the GPU into storage the plan owns, so that a
// steady state of conversions allocates nothing (cuda::dense_to_hybrid allocates its result, the
// maps and its scan on every call). Host-includable: no CUDA headers. Available when TWELL_HAS_CUDA.
#pragma once

#include <cstddef>
#include <cstdint>

#include <twell/converters/options.hpp>
#include <twell/formats/dense.hpp>
#include <twell/formats/hybrid.hpp>
#include <twell/formats/layout.hpp>
#include <twell/formats/twell_matrix.hpp>
#include <twell/memory.hpp>

namespace twell::cuda {

// Converts device dense matrices of `rows` x `cols` into Hybrids of `layout`: the same result as
// cuda::dense_to_hybrid, word for word (slots, both maps, the dense block).
//
// Storage: the constructor allocates the TwELL part, the per-row flags, their scan and its
// temporary storage, row_to_overflow, and a dense block with its map for `overflow_capacity` rows
// (at most `rows`). A run whose matrix has more overflow rows than the block holds enlarges it to
// max(R, twice the block), at most `rows` (growths() counts these; each reallocates the block and
// its map: up to two Buffer allocations and two frees, which synchronise the device), and keeps
// it. With options.report set, a run also takes a small stream-ordered block for the entry count
// (scratch from twell's pool).
//
// run() queues on options.stream and waits once, for R (a 4-byte read-back), plus once more for
// the entry count when options.report is set. It returns a view of the result that stays valid
// until the next run() or the plan's destruction (a view with R = 0 has null overflow pointers, as
// dense_to_hybrid's result). Runs reuse the storage: two runs of one plan must not execute
// concurrently on different streams; a moved-from plan refuses to run (invalid_argument). options.threshold and
// options.report mean what they mean for dense_to_hybrid; options.overflow is not consulted (a
// Hybrid holds every row). Errors: the constructor refuses a layout dense_to_hybrid refuses, more
// rows than the 32-bit row maps index, and negative sizes (invalid_argument); run() a source not
// in device memory (space_mismatch), not rows x cols (shape_mismatch) or with a leading dimension
// or alignment the dense checks refuse, and a negative or NaN threshold (invalid_argument).
template <Value T>
class DenseToHybridPlan {
 public:
  DenseToHybridPlan(std::int64_t rows, std::int64_t cols, TwellLayout layout, std::int64_t overflow_capacity = 0);
  DenseToHybridPlan(const DenseToHybridPlan&) = delete;
  DenseToHybridPlan& operator=(const DenseToHybridPlan&) = delete;
  DenseToHybridPlan(DenseToHybridPlan&&) noexcept = default;
  DenseToHybridPlan& operator=(DenseToHybridPlan&&) noexcept = default;
  ~DenseToHybridPlan() = default;

  HybridView<T> run(DenseView<const T> src, const ConvertOptions& options = {});

  std::int64_t rows() const { return twell_.rows(); }
  std::int64_t cols() const { return twell_.cols(); }
  const TwellLayout& layout() const { return twell_.layout(); }
  std::int64_t overflow_capacity() const { return capacity_; }
  std::int64_t growths() const { return growths_; }

 private:
  void hold_overflow_rows(std::int64_t capacity);

  TwellMatrix<T> twell_;
  Buffer<std::int32_t> flags_;          // 1 for a row with an overflowed tile
  Buffer<std::int32_t> ranks_;          // inclusive scan of the flags
  Buffer<std::uint64_t> scan_storage_;  // the scan's temporary storage
  std::size_t scan_bytes_ = 0;
  Buffer<std::int32_t> row_to_overflow_;  // rows entries
  Buffer<std::int32_t> overflow_to_row_;  // capacity entries
  Buffer<T> overflow_;                    // capacity x cols values
  std::int64_t capacity_ = 0;
  std::int64_t growths_ = 0;
  twell::detail::PlanDevice device_ = twell::detail::plan_device("twell::cuda::DenseToHybridPlan");
};

}  // namespace twell::cuda
