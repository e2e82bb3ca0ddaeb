// Host steps of the row-wise conversions: any row source into CSR (count, scan, fill), ELL
// (count and max when the width is free, fill) or dense (zero and scatter).
#pragma once

#include <cstdint>
#include <limits>
#include <utility>

#include "common.cuh"
#include "cuda_launch.cuh"
#include "rows.cuh"

namespace twell::cuda::detail {

inline void check_index_range(std::int64_t cols, const char* where) {
  require(cols <= std::numeric_limits<std::int32_t>::max(), ErrorCode::invalid_argument, where, "cols = ", cols,
          " does not fit the 32-bit column indices of CSR and ELL");
}

// The cuda TwELL <-> Hybrid re-layouts go through CSR, so they share its column limit; the formats
// themselves (and the reference backend) have none, hence `unsupported` naming the route.
inline void check_relayout_range(std::int64_t cols, const char* where) {
  require(cols <= std::numeric_limits<std::int32_t>::max(), ErrorCode::unsupported, where, "cols = ", cols,
          " is past 2^31 - 1: the cuda backend re-lays TwELL and Hybrid out through CSR's 32-bit column indices "
          "(the reference backend has no such limit)");
}

// A threshold under zero stores every entry, exact zeros included (is_stored): for internal
// re-packings that must keep a matrix's entries as they are (the ELL transposes). The public
// options refuse it.
inline constexpr float kKeepEveryEntry = -1.0f;

template <class T, class Rows>
CsrMatrix<T> rows_to_csr(Rows rows, std::int64_t n_rows, std::int64_t cols, const ConvertOptions& options,
                         const char* where) {
  check_index_range(cols, where);
  const cudaStream_t stream = stream_of(options);
  const unsigned blocks = blocks_for_warps(n_rows);
  DeviceTemp<std::int64_t> counts(static_cast<std::size_t>(n_rows), stream);
  Buffer<std::int64_t> row_ptr(static_cast<std::size_t>(n_rows) + 1, MemorySpace::device);
  order_after_allocations(stream);
  ::twell::detail::fill_bytes_async(row_ptr.data(), 0, sizeof(std::int64_t), stream, where);
  if (blocks != 0) {
    ::twell::detail::launch_kernel(where, count_rows_kernel<T, Rows>, blocks, kBlockThreads, 0, stream, rows, n_rows,
                                   options.threshold, counts.get());
  }
  inclusive_sum(counts.get(), row_ptr.data() + 1, n_rows, stream);
  const std::int64_t nnz = read_value(row_ptr.data() + n_rows, stream);

  CsrMatrix<T> out(n_rows, cols, nnz, MemorySpace::device);
  out.row_ptr() = std::move(row_ptr);
  order_after_allocations(stream);
  if (blocks != 0 && nnz != 0) {
    ::twell::detail::launch_kernel(where, fill_csr_kernel<T, Rows>, blocks, kBlockThreads, 0, stream, rows, n_rows,
                                   options.threshold, out.row_ptr().data(), out.col_idx().data(), out.values().data());
  }
  if (options.report != nullptr) *options.report = ConvertReport{nnz, 0, 0};
  return out;
}

// An ELL's entries as CSR, stored zeros included (the public ell_to_csr drops them): what
// transpose() and spmm with op = transpose transpose, as the reference does.
template <class T>
CsrMatrix<T> ell_entries_to_csr(EllView<const T> a, Stream stream, const char* where) {
  const ConvertOptions every{.threshold = kKeepEveryEntry, .stream = stream};
  return rows_to_csr<T>(EllRows<T>(a), a.rows, a.cols, every, where);
}

template <class T, class Rows>
EllMatrix<T> rows_to_ell(Rows rows, std::int64_t n_rows, std::int64_t cols, const ConvertOptions& options,
                         const char* where) {
  check_index_range(cols, where);
  require(options.ell_width >= -1, ErrorCode::invalid_argument, where, "options.ell_width = ", options.ell_width,
          " must be -1 (the longest row) or a width >= 0");
  check_ell_overflow_policy(options, where);
  require(options.ell_width <= cols, ErrorCode::invalid_argument, where, "options.ell_width = ", options.ell_width,
          " exceeds cols = ", cols, ": a row holds at most one entry per column");
  const cudaStream_t stream = stream_of(options);
  const unsigned blocks = blocks_for_warps(n_rows);
  std::int64_t width = options.ell_width;
  if (width < 0) {
    width = 0;
    if (blocks != 0) {
      DeviceTemp<std::int64_t> counts(static_cast<std::size_t>(n_rows), stream);
      DeviceTemp<std::int64_t> longest(1, stream);
      ::twell::detail::launch_kernel(where, count_rows_kernel<T, Rows>, blocks, kBlockThreads, 0, stream, rows, n_rows,
                                     options.threshold, counts.get());
      maximum(counts.get(), longest.get(), n_rows, stream);
      width = read_value(longest.get(), stream);
    }
  }

  EllMatrix<T> out(n_rows, cols, width, MemorySpace::device);
  order_after_allocations(stream);
  DeviceCounters counters(stream);
  if (blocks != 0) {
    ::twell::detail::launch_kernel(where, fill_ell_kernel<T, Rows>, blocks, kBlockThreads, 0, stream, rows, n_rows,
                                   options.threshold, width, out.row_count().data(), out.col_idx().data(),
                                   out.values().data(), options.overflow, counters.get());
  }
  if (options.overflow == OverflowPolicy::error || options.report != nullptr) {
    const Counters c = counters.read();
    if (c.first_overflow != kNoOverflow) {
      const auto row = static_cast<std::int64_t>(c.first_overflow);
      const std::int32_t count = read_value(out.row_count().data() + row, stream);  // the true count under error
      fail(ErrorCode::overflow, where, "row ", row, " holds ", count, " nonzeros but options.ell_width = ", width,
           "; use ell_width = -1 (the longest row) or OverflowPolicy::drop");
    }
    if (options.report != nullptr)
      *options.report = ConvertReport{static_cast<std::int64_t>(c.nnz), static_cast<std::int64_t>(c.dropped), 0};
  }
  return out;
}

template <class T, class Rows>
DenseMatrix<T> rows_to_dense(Rows rows, std::int64_t n_rows, std::int64_t cols, const ConvertOptions& options,
                             const char* where) {
  const cudaStream_t stream = stream_of(options);
  DenseMatrix<T> out(n_rows, cols, MemorySpace::device);
  order_after_allocations(stream);
  DeviceCounters counters(stream);
  if (const unsigned blocks = blocks_for_warps(n_rows); blocks != 0 && cols != 0) {
    ::twell::detail::launch_kernel(where, to_dense_kernel<T, Rows>, blocks, kBlockThreads, 0, stream, rows, n_rows,
                                   nullptr, options.threshold, out.values().data(), cols, counters.get());
  }
  if (options.report != nullptr)
    *options.report = ConvertReport{static_cast<std::int64_t>(counters.read().nnz), 0, 0};
  return out;
}

}  // namespace twell::cuda::detail
