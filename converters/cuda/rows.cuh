// Row sources and the row-wise kernels built on them. A source enumerates the candidate entries
// of one row in increasing column order, in warp-wide chunks (lane l holds the l-th candidate of
// the chunk); for_each_stored filters them with is_stored and ranks the kept ones. The kernels
// then count rows, fill CSR / ELL rows or write dense rows from any source.
#pragma once

#include <cstdint>

#include <twell/formats/csr.hpp>
#include <twell/formats/dense.hpp>
#include <twell/formats/ell.hpp>
#include <twell/formats/hybrid.hpp>
#include <twell/formats/twell_matrix.hpp>

#include "common.cuh"
#include "cuda_launch.cuh"

namespace twell::cuda::detail {

// Sorted entries of a row that live in one array (CSR, ELL): what csr_to_twell binary-searches.
template <class T>
struct RowSpan {
  const std::int32_t* cols;
  const T* values;
  std::int64_t size;

  // The span's entries in warp-wide chunks, as a row source hands them out.
  template <class F>
  __device__ void for_each_chunk(F&& f) const {
    for (std::int64_t i0 = 0; i0 < size; i0 += kWarpSize) {
      const std::int64_t i = i0 + lane_id();
      const bool ok = i < size;
      f(ok, ok ? static_cast<std::int64_t>(cols[i]) : 0, ok ? values[i] : T{});
    }
  }
};

template <class T>
struct DenseRows {
  const T* data;
  std::int64_t ld;
  std::int64_t cols;

  explicit DenseRows(DenseView<const T> v) : data(v.data), ld(v.ld), cols(v.cols) {}
  template <class F>
  __device__ void for_each_chunk(std::int64_t row, F&& f) const {
    const T* r = data + row * ld;
    for (std::int64_t c0 = 0; c0 < cols; c0 += kWarpSize) {
      const std::int64_t j = c0 + lane_id();
      const bool ok = j < cols;
      f(ok, j, ok ? r[j] : T{});
    }
  }
};

template <class T>
struct CsrRows {
  const std::int64_t* row_ptr;
  const std::int32_t* col_idx;
  const T* values;

  explicit CsrRows(CsrView<const T> v) : row_ptr(v.row_ptr), col_idx(v.col_idx), values(v.values) {}
  __device__ RowSpan<T> span(std::int64_t row) const {
    const std::int64_t begin = row_ptr[row];
    const std::int64_t end = row_ptr[row + 1];
    return {col_idx + begin, values + begin, end > begin ? end - begin : 0};
  }
  template <class F>
  __device__ void for_each_chunk(std::int64_t row, F&& f) const {
    span(row).for_each_chunk(f);
  }
};

template <class T>
struct EllRows {
  std::int64_t width;
  const std::int32_t* row_count;
  const std::int32_t* col_idx;
  const T* values;

  explicit EllRows(EllView<const T> v) : width(v.width), row_count(v.row_count), col_idx(v.col_idx), values(v.values) {}
  __device__ RowSpan<T> span(std::int64_t row) const {
    // A count outside [0, width] is malformed; clamping keeps every read inside the row.
    const std::int64_t n = row_count[row];
    const std::int64_t size = n < 0 ? 0 : (n > width ? width : n);
    return {col_idx + row * width, values + row * width, size};
  }
  template <class F>
  __device__ void for_each_chunk(std::int64_t row, F&& f) const {
    span(row).for_each_chunk(f);
  }
};

template <class T>
struct TwellSlotRows {
  std::int64_t cols;
  TwellLayout layout;
  const std::uint32_t* packed;
  const T* value_plane;

  explicit TwellSlotRows(TwellView<const T> v)
      : cols(v.cols), layout(v.layout), packed(v.packed), value_plane(v.value_plane) {}
  template <class F>
  __device__ void for_each_chunk(std::int64_t row, F&& f) const {
    const std::int64_t tiles = layout.tiles(cols);
    for (std::int64_t t = 0; t < tiles; ++t) {
      const std::int64_t off = layout.slot_offset(row, t, cols);
      // Slot 0 of a shadow row may exceed the capacity; only the slots that exist are read.
      const std::uint32_t count = packed[off];
      const int n = count < static_cast<std::uint32_t>(layout.capacity()) ? static_cast<int>(count) : layout.capacity();
      for (int k0 = 0; k0 < n; k0 += kWarpSize) {
        const int k = k0 + lane_id();
        const bool ok = k < n;
        const std::uint32_t word = ok ? packed[off + 1 + k] : 0u;
        const std::int64_t col = layout.tile_begin(t) + TwellLayout::slot_column(word);
        T v{};
        if (ok) {
          if constexpr (ValueTraits<T>::packs_in_slot) {
            v = ValueTraits<T>::from_bits(TwellLayout::slot_value_bits(word));
          } else {
            v = value_plane[off + 1 + k];
          }
        }
        f(ok, col, v);
      }
    }
  }
};

template <class T>
struct HybridRows {
  TwellSlotRows<T> twell;
  DenseRows<T> overflow;
  std::int64_t overflow_rows;
  const std::int32_t* row_to_overflow;

  explicit HybridRows(HybridView<const T> v)
      : twell(v.twell), overflow(v.overflow), overflow_rows(v.overflow.rows), row_to_overflow(v.row_to_overflow) {}
  template <class F>
  __device__ void for_each_chunk(std::int64_t row, F&& f) const {
    const std::int32_t r = row_to_overflow[row];
    if (r >= 0 && r < overflow_rows) {
      overflow.for_each_chunk(r, f);
    } else {
      twell.for_each_chunk(row, f);
    }
  }
};

// Calls emit(rank, col, value) on the lane holding each stored entry of `row`, rank counting
// stored entries in column order; returns the row's stored count. Whole warp, uniform row.
template <class T, class Rows, class Emit>
__device__ std::int64_t for_each_stored(const Rows& rows, std::int64_t row, float threshold, Emit&& emit) {
  const unsigned below = (1u << lane_id()) - 1u;
  std::int64_t rank = 0;
  rows.for_each_chunk(row, [&](bool ok, std::int64_t col, T v) {
    const bool keep = ok && is_stored(v, threshold);
    const unsigned ballot = __ballot_sync(kFullMask, keep);
    if (keep) emit(rank + __popc(ballot & below), col, v);
    rank += __popc(ballot);
  });
  return rank;
}

// A warp owns whole rows (grid-stride) and writes counts[row] = its stored entries.
// Preconditions: a valid source on the device; counts has n_rows entries.
// Benchmark: bench/ conversion drivers (to CSR / ELL).
template <class T, class Rows>
__global__ void __launch_bounds__(kBlockThreads)
    count_rows_kernel(Rows rows, std::int64_t n_rows, float threshold, std::int64_t* counts) {
  ::twell::detail::wait_for_prior_grids();
  for (std::int64_t row = global_warp(); row < n_rows; row += warp_count()) {
    const std::int64_t n = for_each_stored<T>(rows, row, threshold, [](std::int64_t, std::int64_t, T) {});
    if (lane_id() == 0) counts[row] = n;
  }
}

// A warp owns whole rows (grid-stride) and writes each stored entry at row_ptr[row] + rank.
// Preconditions: row_ptr is the exclusive scan of count_rows_kernel's counts for the same
// source and threshold (so every write lands inside nnz). Benchmark: bench/ conversion drivers.
template <class T, class Rows>
__global__ void __launch_bounds__(kBlockThreads)
    fill_csr_kernel(Rows rows, std::int64_t n_rows, float threshold, const std::int64_t* row_ptr, std::int32_t* col_idx,
                    T* values) {
  ::twell::detail::wait_for_prior_grids();
  for (std::int64_t row = global_warp(); row < n_rows; row += warp_count()) {
    const std::int64_t base = row_ptr[row];
    for_each_stored<T>(rows, row, threshold, [&](std::int64_t rank, std::int64_t col, T v) {
      col_idx[base + rank] = static_cast<std::int32_t>(col);
      values[base + rank] = v;
    });
  }
}

// A warp owns whole rows (grid-stride): the first min(count, width) stored entries, zero padding
// up to width, row_count; a longer row is flagged by row number (error; row_count then keeps the
// true count for the message) or its surplus counted (drop, row_count = what is left).
// Preconditions: outputs of n_rows * width entries. Benchmark: bench/ conversion drivers.
template <class T, class Rows>
__global__ void __launch_bounds__(kBlockThreads)
    fill_ell_kernel(Rows rows, std::int64_t n_rows, float threshold, std::int64_t width, std::int32_t* row_count,
                    std::int32_t* col_idx, T* values, OverflowPolicy policy, Counters* counters) {
  ::twell::detail::wait_for_prior_grids();
  std::int64_t kept_total = 0;
  for (std::int64_t row = global_warp(); row < n_rows; row += warp_count()) {
    std::int32_t* cols_out = col_idx + row * width;
    T* values_out = values + row * width;
    const std::int64_t n = for_each_stored<T>(rows, row, threshold, [&](std::int64_t rank, std::int64_t col, T v) {
      if (rank < width) {
        cols_out[rank] = static_cast<std::int32_t>(col);
        values_out[rank] = v;
      }
    });
    const std::int64_t kept = n < width ? n : width;
    for (std::int64_t k = kept + lane_id(); k < width; k += kWarpSize) {
      cols_out[k] = 0;
      values_out[k] = T{};
    }
    if (lane_id() == 0) {
      row_count[row] = static_cast<std::int32_t>(policy == OverflowPolicy::drop ? kept : n);
      if (n > width) {
        if (policy == OverflowPolicy::drop) {
          atomicAdd(&counters->dropped, static_cast<unsigned long long>(n - width));
        } else {
          atomicMin(&counters->first_overflow, static_cast<unsigned long long>(row));
        }
      }
    }
    kept_total += kept;
  }
  add_count(&counters->nnz, kept_total);
}

// A warp owns whole output rows (grid-stride): output row r is source row map[r] (r when map is
// null); it writes the row's zeros, then, after __syncwarp orders them, the stored entries.
// Preconditions: out has n_out_rows * cols entries, leading dimension cols; map entries are
// valid source rows. counters may be null (nnz not wanted). Benchmark: bench/ conversion drivers.
template <class T, class Rows>
__global__ void __launch_bounds__(kBlockThreads)
    to_dense_kernel(Rows rows, std::int64_t n_out_rows, const std::int32_t* map, float threshold, T* out,
                    std::int64_t cols, Counters* counters) {
  ::twell::detail::wait_for_prior_grids();
  std::int64_t stored_total = 0;
  for (std::int64_t r = global_warp(); r < n_out_rows; r += warp_count()) {
    const std::int64_t src_row = map != nullptr ? map[r] : r;
    T* o = out + r * cols;
    for (std::int64_t j = lane_id(); j < cols; j += kWarpSize) o[j] = T{};
    __syncwarp();
    stored_total += for_each_stored<T>(rows, src_row, threshold, [&](std::int64_t, std::int64_t col, T v) {
      if (col >= 0 && col < cols) o[col] = v;  // a malformed column index must not write elsewhere
    });
  }
  if (counters != nullptr) add_count(&counters->nnz, stored_total);
}

// Output row r of `out` (leading dimension cols) is row map[r] of the dense source, its values
// that are not stored (is_stored) written as zeros: the same rows as to_dense_kernel from
// DenseRows, a thread per element instead of a warp per row, for the few long rows of a Hybrid's
// dense block (229 rows of 5632 took to_dense_kernel 79 us on an H100: 29 CTAs, each warp a chain
// of 2-byte stores).
template <class T>
__global__ void __launch_bounds__(kBlockThreads)
    gather_dense_rows_kernel(DenseRows<T> src, std::int64_t n_out_rows, const std::int32_t* map, float threshold,
                             T* out) {
  ::twell::detail::wait_for_prior_grids();
  for (std::int64_t r = blockIdx.y; r < n_out_rows; r += gridDim.y) {
    const T* row = src.data + static_cast<std::int64_t>(map[r]) * src.ld;
    T* o = out + r * src.cols;
    for (std::int64_t j = static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; j < src.cols;
         j += static_cast<std::int64_t>(gridDim.x) * blockDim.x) {
      const T v = row[j];
      o[j] = is_stored(v, threshold) ? v : T{};
    }
  }
}

}  // namespace twell::cuda::detail
