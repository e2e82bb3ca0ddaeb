// cuda DenseToHybridPlan: dense_to_hybrid's kernels (packing with per-row flags, scan, maps, dense
// block) on storage the plan owns.
#include <algorithm>
#include <optional>

#include <twell/converters/hybrid_plan.hpp>
#include <twell/instantiate.hpp>

#include "cuda_launch.cuh"
#include "twell_pack.cuh"

namespace twell::cuda {

namespace {
constexpr const char* kWhere = "twell::cuda::DenseToHybridPlan";
}  // namespace

template <Value T>
DenseToHybridPlan<T>::DenseToHybridPlan(std::int64_t rows, std::int64_t cols, TwellLayout layout,
                                        std::int64_t overflow_capacity) {
  check_layout(layout, kWhere);
  detail::check_hybrid_rows(rows, kWhere);
  require(rows >= 0 && cols >= 0 && overflow_capacity >= 0, ErrorCode::invalid_argument, kWhere, "rows = ", rows,
          ", cols = ", cols, ", overflow_capacity = ", overflow_capacity, ": none may be negative");
  const auto n = static_cast<std::size_t>(rows);
  // Every buffer is written in full by each run before it is read (the flags are zeroed first).
  twell_ = TwellMatrix<T>(rows, cols, layout, MemorySpace::device, Uninitialized{});
  flags_ = Buffer<std::int32_t>(n, MemorySpace::device, Uninitialized{});
  ranks_ = Buffer<std::int32_t>(n, MemorySpace::device, Uninitialized{});
  scan_bytes_ = detail::inclusive_sum_bytes<const std::int32_t*, std::int32_t*>(rows);
  scan_storage_ = Buffer<std::uint64_t>((scan_bytes_ + 7) / 8, MemorySpace::device, Uninitialized{});
  row_to_overflow_ = Buffer<std::int32_t>(n, MemorySpace::device, Uninitialized{});
  hold_overflow_rows(std::min(overflow_capacity, rows));  // no more rows than the matrix can overflow
}

// The dense block and its map for `capacity` rows. Nothing is read from them before a run's
// kernels write it, so they are not zero-filled.
template <Value T>
void DenseToHybridPlan<T>::hold_overflow_rows(std::int64_t capacity) {
  overflow_to_row_ = Buffer<std::int32_t>(static_cast<std::size_t>(capacity), MemorySpace::device, Uninitialized{});
  overflow_ = Buffer<T>(static_cast<std::size_t>(capacity * cols()), MemorySpace::device, Uninitialized{});
  capacity_ = capacity;
}

template <Value T>
HybridView<T> DenseToHybridPlan<T>::run(DenseView<const T> src, const ConvertOptions& options) {
  twell::detail::require_plan_device(device_, kWhere);
  detail::check_device_operand(src, kWhere, "src");
  require(src.rows == rows() && src.cols == cols(), ErrorCode::shape_mismatch, kWhere, "src is ", src.rows, " x ",
          src.cols, " but the plan converts ", rows(), " x ", cols());
  check_convert_options(options, kWhere);
  const cudaStream_t stream = detail::stream_of(options);
  const std::int64_t n = rows();
  if (n > 0)
    ::twell::detail::fill_bytes_async(flags_.data(), 0, flags_.bytes(), stream, "twell::cuda::DenseToHybridPlan::run");
  std::optional<detail::DeviceCounters> counters;  // only when a report wants the entry count
  if (options.report != nullptr) counters.emplace(stream);
  detail::launch_dense_to_twell(
      src, twell_.view(), options.threshold,
      detail::OverflowTarget{OverflowPolicy::hybrid, counters ? counters->get() : nullptr, flags_.data()}, stream,
      kWhere);
  detail::inclusive_sum(flags_.data(), ranks_.data(), n, scan_storage_.data(), scan_bytes_, stream);
  const std::int64_t r = n == 0 ? 0 : detail::read_value(ranks_.data() + (n - 1), stream);
  if (r > capacity_) {
    // The old block is not in use: the host has waited for the stream. Doubling keeps a slowly
    // rising R from reallocating (and so synchronising the device) at every run.
    hold_overflow_rows(std::min(rows(), std::max(r, 2 * capacity_)));
    ++growths_;
  }
  const HybridView<T> out{twell_.view(),
                          DenseView<T>{r > 0 ? overflow_.data() : nullptr, r, cols(), cols(), MemorySpace::device},
                          row_to_overflow_.data(), r > 0 ? overflow_to_row_.data() : nullptr};
  detail::write_hybrid_rows<T>(flags_.data(), ranks_.data(), out, detail::DenseRows<T>(src), options.threshold, stream,
                               kWhere);
  if (options.report != nullptr) *options.report = ConvertReport{static_cast<std::int64_t>(counters->read().nnz), 0, r};
  return out;
}

#define TWELL_INSTANTIATE(T) template class DenseToHybridPlan<T>;
TWELL_FOR_EACH_VALUE_TYPE(TWELL_INSTANTIATE)
#undef TWELL_INSTANTIATE

}  // namespace twell::cuda
