// The kernels that write TwELL (from dense rows, or from sorted CSR / ELL rows) and the host
// steps around them: overflow read-back under error / drop, and the assembly of a hybrid
// (scan of the per-row overflow flags, maps, dense overflow block).
#pragma once

#include <cstdint>
#include <limits>
#include <utility>

#include "common.cuh"
#include "packing.cuh"
#include "rows.cuh"

namespace twell::cuda::detail {

// dense -> TwELL, the performance path. A warp owns whole (row, tile) pairs, grid-stride in
// row-major order, so no two warps touch the same slots and nothing synchronises globally; per
// chunk of 32 * kPerLane columns a lane owns kPerLane consecutive columns, read with one 16-byte
// load (kVector) or scalar loads (ragged tail, or kVector false), ranked by ballot-free popc + warp
// scan in pack_chunk. Preconditions: device operands; kVector needs data and ld * sizeof(T)
// 16-byte aligned (tile_begin is then aligned too, as tile is a multiple of 8); value_plane is
// non-null exactly for fp32. Benchmark: bench/ dense -> TwELL conversion driver.
template <class T, bool kVector>
__global__ void __launch_bounds__(kBlockThreads) dense_to_twell_kernel(DenseView<const T> src, TwellLayout layout,
                                                                       std::int64_t tiles, std::uint32_t* packed,
                                                                       T* value_plane, float threshold,
                                                                       OverflowTarget overflow) {
  constexpr int kPerLane = 16 / static_cast<int>(sizeof(T));
  constexpr int kChunk = kWarpSize * kPerLane;
  const int lane = lane_id();
  const int slot_count = layout.slots();
  const int capacity = layout.capacity();
  const std::int64_t pairs = src.rows * tiles;
  std::int64_t held = 0;
  for (std::int64_t p = global_warp(); p < pairs; p += warp_count()) {
    const std::int64_t row = p / tiles;
    const std::int64_t t = p - row * tiles;
    const int n = layout.tile_cols(t, src.cols);
    const T* in = src.data + row * src.ld + layout.tile_begin(t);
    const std::int64_t off = layout.slot_offset(row, t, src.cols);
    const TileSlots<T> slots{packed + off, value_plane != nullptr ? value_plane + off : nullptr};
    int count = 0;
    for (int c0 = 0; c0 < n; c0 += kChunk) {
      const int j0 = c0 + lane * kPerLane;
      T v[kPerLane];
      if (kVector && j0 + kPerLane <= n) {
        const uint4 raw = __ldcs(reinterpret_cast<const uint4*>(in + j0));  // read once: evict first
        static_assert(sizeof raw == sizeof v);
        memcpy(&v, &raw, sizeof v);
      } else {
#pragma unroll
        for (int k = 0; k < kPerLane; ++k) v[k] = j0 + k < n ? in[j0 + k] : T{};
      }
      std::uint32_t local_col[kPerLane];
      unsigned stored = 0;
#pragma unroll
      for (int k = 0; k < kPerLane; ++k) {
        local_col[k] = static_cast<std::uint32_t>(j0 + k);
        if (j0 + k < n && is_stored(v[k], threshold)) stored |= 1u << k;
      }
      count = pack_chunk<T, kPerLane>(slots, capacity, count, stored, v, local_col);
    }
    held += finish_tile(slots, slot_count, capacity, count, row, p, overflow);
  }
  add_count(&overflow.counters->nnz, held);
}

// First index in [0, n) whose column is >= col (n when none).
__device__ inline std::int64_t lower_bound(const std::int32_t* cols, std::int64_t n, std::int64_t col) {
  std::int64_t lo = 0;
  std::int64_t hi = n;
  while (lo < hi) {
    const std::int64_t mid = lo + (hi - lo) / 2;
    if (cols[mid] < col) {
      lo = mid + 1;
    } else {
      hi = mid;
    }
  }
  return lo;
}

// CSR / ELL -> TwELL. A warp owns whole (row, tile) pairs, grid-stride in row-major order; every
// lane binary-searches the row's sorted columns for the tile's range (same addresses: broadcast),
// then a lane owns one candidate entry per chunk of 32. Preconditions: device operands, columns
// strictly increasing inside a row (a valid CSR / ELL). Benchmark: bench/ conversion drivers.
template <class T, class Rows>
__global__ void __launch_bounds__(kBlockThreads) sparse_to_twell_kernel(Rows rows, std::int64_t n_rows,
                                                                        std::int64_t cols, TwellLayout layout,
                                                                        std::int64_t tiles, std::uint32_t* packed,
                                                                        T* value_plane, float threshold,
                                                                        OverflowTarget overflow) {
  const int lane = lane_id();
  const int slot_count = layout.slots();
  const int capacity = layout.capacity();
  const std::int64_t pairs = n_rows * tiles;
  std::int64_t held = 0;
  for (std::int64_t p = global_warp(); p < pairs; p += warp_count()) {
    const std::int64_t row = p / tiles;
    const std::int64_t t = p - row * tiles;
    const RowSpan<T> s = rows.span(row);
    const std::int64_t begin = layout.tile_begin(t);
    const std::int64_t a = lower_bound(s.cols, s.size, begin);
    const std::int64_t b = lower_bound(s.cols, s.size, begin + layout.tile_cols(t, cols));
    const std::int64_t off = layout.slot_offset(row, t, cols);
    const TileSlots<T> slots{packed + off, value_plane != nullptr ? value_plane + off : nullptr};
    int count = 0;
    for (std::int64_t i0 = a; i0 < b; i0 += kWarpSize) {
      const std::int64_t i = i0 + lane;
      const bool ok = i < b;
      const T v[1] = {ok ? s.values[i] : T{}};
      const std::uint32_t local_col[1] = {ok ? static_cast<std::uint32_t>(s.cols[i] - begin) : 0u};
      const unsigned stored = ok && is_stored(v[0], threshold) ? 1u : 0u;
      count = pack_chunk<T, 1>(slots, capacity, count, stored, v, local_col);
    }
    held += finish_tile(slots, slot_count, capacity, count, row, p, overflow);
  }
  add_count(&overflow.counters->nnz, held);
}

// A thread owns one row: its overflow rank from the inclusive scan of the flags, both maps.
// Preconditions: ranks = inclusive scan of flags (0/1), overflow_to_row has ranks[n_rows-1] entries.
// static: a non-template kernel defined in a header gets one private copy per translation unit.
static __global__ void __launch_bounds__(kBlockThreads) map_overflow_rows_kernel(const std::int32_t* flags,
                                                                          const std::int32_t* ranks,
                                                                          std::int64_t n_rows,
                                                                          std::int32_t* row_to_overflow,
                                                                          std::int32_t* overflow_to_row) {
  const std::int64_t stride = static_cast<std::int64_t>(gridDim.x) * blockDim.x;
  for (std::int64_t row = static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; row < n_rows;
       row += stride) {
    if (flags[row] != 0) {
      const std::int32_t r = ranks[row] - 1;
      row_to_overflow[row] = r;
      overflow_to_row[r] = static_cast<std::int32_t>(row);
    } else {
      row_to_overflow[row] = -1;
    }
  }
}

// Launches dense -> TwELL into out (allocated, on the device), vectorised when alignment allows.
template <class T>
void launch_dense_to_twell(DenseView<const T> src, TwellMatrix<T>& out, float threshold, const OverflowTarget& overflow,
                           cudaStream_t stream, const char* where) {
  const TwellLayout layout = out.layout();
  const std::int64_t tiles = layout.tiles(src.cols);
  const unsigned blocks = blocks_for_warps(src.rows * tiles);
  if (blocks == 0) return;
  T* plane = TwellMatrix<T>::kHasValuePlane ? out.value_plane().data() : nullptr;
  const bool aligned = reinterpret_cast<std::uintptr_t>(src.data) % 16 == 0 &&
                       (static_cast<std::uint64_t>(src.ld) * sizeof(T)) % 16 == 0;
  if (aligned) {
    dense_to_twell_kernel<T, true><<<blocks, kBlockThreads, 0, stream>>>(src, layout, tiles, out.packed().data(), plane,
                                                                        threshold, overflow);
  } else {
    dense_to_twell_kernel<T, false><<<blocks, kBlockThreads, 0, stream>>>(src, layout, tiles, out.packed().data(),
                                                                         plane, threshold, overflow);
  }
  check_launch(where);
}

template <class T, class Rows>
void launch_sparse_to_twell(Rows rows, std::int64_t n_rows, std::int64_t cols, TwellMatrix<T>& out, float threshold,
                            const OverflowTarget& overflow, cudaStream_t stream, const char* where) {
  const TwellLayout layout = out.layout();
  const std::int64_t tiles = layout.tiles(cols);
  const unsigned blocks = blocks_for_warps(n_rows * tiles);
  if (blocks == 0) return;
  T* plane = TwellMatrix<T>::kHasValuePlane ? out.value_plane().data() : nullptr;
  sparse_to_twell_kernel<T, Rows><<<blocks, kBlockThreads, 0, stream>>>(rows, n_rows, cols, layout, tiles,
                                                                       out.packed().data(), plane, threshold, overflow);
  check_launch(where);
}

// Into TwELL, options.overflow is error or drop; the hybrid policy belongs to *_to_hybrid.
inline void require_twell_policy(const ConvertOptions& options, const char* where) {
  require(options.overflow != OverflowPolicy::hybrid, ErrorCode::invalid_argument, where,
          "options.overflow = hybrid cannot produce a plain TwELL matrix; convert to Hybrid instead "
          "(twell::to_hybrid / *_to_hybrid), which routes overflowed rows to a dense block");
}

// After a packing kernel under error / drop: throws on the first overflowed (row, tile), fills
// the report. Reads back only when something must come back (error policy, or a report).
template <class T>
void conclude_twell(const DeviceCounters& counters, const TwellMatrix<T>& out, const ConvertOptions& options,
                    const char* where) {
  if (options.overflow != OverflowPolicy::error && options.report == nullptr) return;
  const Counters c = counters.read();
  if (c.first_overflow != kNoOverflow) {
    const TwellLayout layout = out.layout();
    const std::int64_t tiles = layout.tiles(out.cols());
    const auto key = static_cast<std::int64_t>(c.first_overflow);
    const std::int64_t row = key / tiles;
    const std::int64_t tile = key % tiles;
    // Under the error policy slot 0 keeps the true count.
    const std::uint32_t count = read_value(out.packed().data() + layout.slot_offset(row, tile, out.cols()),
                                           stream_of(options));
    fail(ErrorCode::overflow, where, "row ", row, ", tile ", tile, " (columns ", layout.tile_begin(tile), "..",
         layout.tile_begin(tile) + layout.tile_cols(tile, out.cols()) - 1, ") holds ", count,
         " nonzeros but layout (tile ", layout.tile, ", C ", layout.compression, ") has capacity S-1 = ",
         layout.capacity(), "; convert to Hybrid (nothing lost), pick a smaller C, or use OverflowPolicy::drop");
  }
  if (options.report != nullptr)
    *options.report = ConvertReport{static_cast<std::int64_t>(c.nnz), static_cast<std::int64_t>(c.dropped), 0};
}

// The packing kernel has written `twell` (true counts: shadows) and flagged the rows with an
// overflowed tile; scans the flags into the row maps (increasing row order, no atomics), copies
// those rows whole from `rows` into the dense block and returns the hybrid.
template <class T, class Rows>
HybridMatrix<T> assemble_hybrid(TwellMatrix<T>&& twell, const std::int32_t* flags, Rows rows,
                                const DeviceCounters& counters, const ConvertOptions& options, const char* where) {
  const cudaStream_t stream = stream_of(options);
  const std::int64_t n_rows = twell.rows();
  const std::int64_t cols = twell.cols();
  DeviceTemp<std::int32_t> ranks(static_cast<std::size_t>(n_rows), stream);
  inclusive_sum(flags, ranks.get(), n_rows, stream);
  const std::int64_t overflow_rows = n_rows == 0 ? 0 : read_value(ranks.get() + (n_rows - 1), stream);

  HybridMatrix<T> out;
  out.twell() = std::move(twell);
  out.overflow() = DenseMatrix<T>(overflow_rows, cols, MemorySpace::device);
  out.row_to_overflow() = Buffer<std::int32_t>(static_cast<std::size_t>(n_rows), MemorySpace::device);
  out.overflow_to_row() = Buffer<std::int32_t>(static_cast<std::size_t>(overflow_rows), MemorySpace::device);
  order_after_allocations(stream);
  if (n_rows > 0) {
    const auto blocks = static_cast<unsigned>(std::min<std::int64_t>((n_rows + kBlockThreads - 1) / kBlockThreads,
                                                                     kMaxBlocks));
    map_overflow_rows_kernel<<<blocks, kBlockThreads, 0, stream>>>(flags, ranks.get(), n_rows,
                                                                   out.row_to_overflow().data(),
                                                                   out.overflow_to_row().data());
    check_launch(where);
  }
  if (const unsigned blocks = blocks_for_warps(overflow_rows); blocks != 0) {
    to_dense_kernel<T, Rows><<<blocks, kBlockThreads, 0, stream>>>(rows, overflow_rows, out.overflow_to_row().data(),
                                                                   options.threshold, out.overflow().values().data(),
                                                                   cols, nullptr);
    check_launch(where);
  }
  if (options.report != nullptr) {
    const Counters c = counters.read();
    *options.report = ConvertReport{static_cast<std::int64_t>(c.nnz), 0, overflow_rows};
  }
  return out;
}

inline void check_hybrid_rows(std::int64_t rows, const char* where) {
  require(rows <= std::numeric_limits<std::int32_t>::max(), ErrorCode::invalid_argument, where, "rows = ", rows,
          " does not fit the 32-bit row maps of a Hybrid");
}

// The whole of a conversion into TwELL (error / drop) once the source is known; `launch` runs
// the packing kernel for (out, overflow target).
template <class T, class Launch>
TwellMatrix<T> pack_twell(std::int64_t rows, std::int64_t cols, TwellLayout layout, const ConvertOptions& options,
                          const char* where, Launch&& launch) {
  check_threshold(options, where);
  check_layout(layout, where);
  require_twell_policy(options, where);
  const cudaStream_t stream = stream_of(options);
  TwellMatrix<T> out(rows, cols, layout, MemorySpace::device);
  order_after_allocations(stream);
  DeviceCounters counters(stream);
  launch(out, OverflowTarget{options.overflow, counters.get(), nullptr});
  conclude_twell(counters, out, options, where);
  return out;
}

// The whole of a conversion into Hybrid: packing with per-row flags, then assemble_hybrid with
// `rows` as the source of the dense block.
template <class T, class Rows, class Launch>
HybridMatrix<T> pack_hybrid(std::int64_t n_rows, std::int64_t cols, TwellLayout layout, Rows rows,
                            const ConvertOptions& options, const char* where, Launch&& launch) {
  check_threshold(options, where);
  check_layout(layout, where);
  check_hybrid_rows(n_rows, where);
  const cudaStream_t stream = stream_of(options);
  TwellMatrix<T> twell(n_rows, cols, layout, MemorySpace::device);
  DeviceTemp<std::int32_t> flags(static_cast<std::size_t>(n_rows), stream);
  order_after_allocations(stream);
  if (n_rows != 0)
    check_cuda(cudaMemsetAsync(flags.get(), 0, static_cast<std::size_t>(n_rows) * sizeof(std::int32_t), stream),
               where);
  DeviceCounters counters(stream);
  launch(twell, OverflowTarget{OverflowPolicy::hybrid, counters.get(), flags.get()});
  return assemble_hybrid(std::move(twell), flags.get(), rows, counters, options, where);
}

template <class T>
TwellMatrix<T> dense_to_twell_as(DenseView<const T> src, TwellLayout layout, const ConvertOptions& options,
                                 const char* where) {
  require_device(src.space, where);
  return pack_twell<T>(src.rows, src.cols, layout, options, where, [&](TwellMatrix<T>& out, OverflowTarget target) {
    launch_dense_to_twell(src, out, options.threshold, target, stream_of(options), where);
  });
}

template <class T>
TwellMatrix<T> csr_to_twell_as(CsrView<const T> src, TwellLayout layout, const ConvertOptions& options,
                               const char* where) {
  require_device(src.space, where);
  return pack_twell<T>(src.rows, src.cols, layout, options, where, [&](TwellMatrix<T>& out, OverflowTarget target) {
    launch_sparse_to_twell(CsrRows<T>(src), src.rows, src.cols, out, options.threshold, target, stream_of(options),
                           where);
  });
}

template <class T>
HybridMatrix<T> dense_to_hybrid_as(DenseView<const T> src, TwellLayout layout, const ConvertOptions& options,
                                   const char* where) {
  require_device(src.space, where);
  return pack_hybrid<T>(src.rows, src.cols, layout, DenseRows<T>(src), options, where,
                        [&](TwellMatrix<T>& out, OverflowTarget target) {
                          launch_dense_to_twell(src, out, options.threshold, target, stream_of(options), where);
                        });
}

template <class T>
HybridMatrix<T> csr_to_hybrid_as(CsrView<const T> src, TwellLayout layout, const ConvertOptions& options,
                                 const char* where) {
  require_device(src.space, where);
  return pack_hybrid<T>(src.rows, src.cols, layout, CsrRows<T>(src), options, where,
                        [&](TwellMatrix<T>& out, OverflowTarget target) {
                          launch_sparse_to_twell(CsrRows<T>(src), src.rows, src.cols, out, options.threshold, target,
                                                 stream_of(options), where);
                        });
}

}  // namespace twell::cuda::detail
