// cuda transpose: sparse M x N to sparse N x M. CSR is transposed directly by a stable radix
// sort of (column, entry) pairs, so each new row keeps its entries in increasing old-row order
// and the result is deterministic; 16-bit TwELL and Hybrid with tiles of at most 256 columns by
// the direct kernels of transpose_twell.cu; ELL and the other TwELL and Hybrid operands go through
// CSR with the cuda converters.
#include <cstdint>
#include <string>

#include <cub/device/device_radix_sort.cuh>

#include <twell/converters/backends.hpp>
#include <twell/kernels/backends.hpp>
#include <twell/kernels/detail/per_format.hpp>

#include "../../converters/cuda/row_builders.cuh"
#include "cuda_launch.cuh"
#include "dense_transpose.cuh"
#include "read_back.cuh"
#include "sparse_common.cuh"
#include "transpose_twell.cuh"

namespace twell::cuda {
namespace {

constexpr const char* kWhere = "twell::cuda::transpose";

// A warp owns a row: it writes the row index at each of the row's entries and the entry's own
// index as the sort payload. Precondition: row_ptr monotone within [0, nnz]. Timed through
// spmm(op = transpose) in bench/suites/spmm.cpp when that suite runs the transposed case.
__global__ void expand_rows_kernel(std::int64_t rows, const std::int64_t* row_ptr, const std::int32_t* col_idx,
                                   std::int32_t* row_of, std::int64_t* entry, std::uint32_t* key) {
  ::twell::detail::wait_for_prior_grids();
  const int lane = threadIdx.x & 31;
  const std::int64_t warps = static_cast<std::int64_t>(gridDim.x) * (blockDim.x / 32);
  for (std::int64_t i = (blockIdx.x * static_cast<std::int64_t>(blockDim.x) + threadIdx.x) / 32; i < rows; i += warps) {
    for (std::int64_t e = row_ptr[i] + lane; e < row_ptr[i + 1]; e += 32) {
      row_of[e] = static_cast<std::int32_t>(i);
      entry[e] = e;
      key[e] = static_cast<std::uint32_t>(col_idx[e]);
    }
  }
}

// A thread owns one output entry p: its column is the old row, its value the old value.
template <class T>
__global__ void gather_kernel(std::int64_t nnz, const std::int64_t* perm, const std::int32_t* row_of, const T* values,
                              std::int32_t* out_col, T* out_values) {
  ::twell::detail::wait_for_prior_grids();
  for (std::int64_t p = blockIdx.x * static_cast<std::int64_t>(blockDim.x) + threadIdx.x; p < nnz;
       p += static_cast<std::int64_t>(gridDim.x) * blockDim.x) {
    const std::int64_t e = perm[p];
    out_col[p] = row_of[e];
    out_values[p] = values[e];
  }
}

// A thread owns new row j: row_ptr[j] = number of sorted keys below j (binary search).
__global__ void row_ptr_kernel(std::int64_t new_rows, std::int64_t nnz, const std::uint32_t* sorted_key,
                               std::int64_t* row_ptr) {
  ::twell::detail::wait_for_prior_grids();
  for (std::int64_t j = blockIdx.x * static_cast<std::int64_t>(blockDim.x) + threadIdx.x; j <= new_rows;
       j += static_cast<std::int64_t>(gridDim.x) * blockDim.x) {
    std::int64_t lo = 0, hi = nnz;
    while (lo < hi) {
      const std::int64_t mid = (lo + hi) / 2;
      if (sorted_key[mid] < static_cast<std::uint32_t>(j)) {
        lo = mid + 1;
      } else {
        hi = mid;
      }
    }
    row_ptr[j] = lo;
  }
}

int key_bits(std::int64_t cols) {
  int bits = 1;
  while (bits < 32 && (std::int64_t{1} << bits) < cols) ++bits;
  return bits;
}

// TwELL and Hybrid: directly (transpose_twell.cu) for 16-bit values and tiles of at most 256
// columns on both sides, else to CSR with `to_csr`, transposed, and into a Hybrid of the given
// layout; only the outer path is reported. The result is host-synchronous, as the CSR transpose's.
template <class T, class View, class ToCsr>
HybridMatrix<T> transpose_to_hybrid(View a, TwellLayout layout, const KernelOptions& options, ToCsr to_csr,
                                    const char* format) {
  detail::check_device_operand(a, kWhere, "A");
  const detail::TwellRows<T> rows = detail::twell_rows<T>(a);
  check_layout(layout, kWhere);
  const cudaStream_t stream = detail::stream_of(options);
  if (detail::twell_transpose_applies<T>(rows.twell.layout, rows.twell.rows, rows.twell.cols, layout)) {
    const std::int64_t k = rows.twell.cols, m = rows.twell.rows;
    const auto words = static_cast<std::size_t>(k);
    HybridMatrix<T> out(k, m, layout, 0, MemorySpace::device);  // the dense block once R is known
    detail::Scratch work((2 * words + 1) * sizeof(std::int32_t) + sizeof(std::int64_t), stream, kWhere);
    auto* r_device = work.as<std::int64_t>();
    auto* overflow_to_row = reinterpret_cast<std::int32_t*>(r_device + 1);
    auto* max_count = reinterpret_cast<std::uint32_t*>(overflow_to_row + words);
    const TwellView<T> at = out.twell().view();
    detail::twell_transpose_groups<T>({&rows, 1}, {&at, 1}, out.row_to_overflow().data(), overflow_to_row, max_count,
                                      r_device, stream);
    const auto r = detail::ReadBack(r_device, sizeof(std::int64_t), stream, kWhere).get<std::int64_t>();
    if (r > 0) {
      out.overflow() = DenseMatrix<T>(r, m, MemorySpace::device);
      out.overflow_to_row() = Buffer<std::int32_t>(static_cast<std::size_t>(r), MemorySpace::device);
      detail::check_cuda(cudaMemcpyAsync(out.overflow_to_row().data(), overflow_to_row,
                                         static_cast<std::size_t>(r) * sizeof(std::int32_t), cudaMemcpyDeviceToDevice,
                                         stream),
                         "twell::cuda::transpose (copy)");
      const HybridView<T> view = out.view();
      detail::twell_transpose_dense_rows<T>({&rows, 1}, {&view, 1}, stream);
    }
    detail::check_cuda(cudaStreamSynchronize(stream), "twell::cuda::transpose (synchronize)");
    detail::report_path(options, (std::string("cuda/transpose/") + format + "/direct").c_str());
    return out;
  }
  KernelOptions inner = options;
  inner.report = nullptr;
  const ConvertOptions convert{.overflow = OverflowPolicy::hybrid, .stream = options.stream};
  const CsrMatrix<T> csr = to_csr(a, convert);
  const CsrMatrix<T> t = transpose(csr.view(), inner);
  HybridMatrix<T> out = cuda::csr_to_hybrid(t.view(), layout, convert);
  detail::report_path(options, (std::string("cuda/transpose/") + format + "/via_csr").c_str());
  return out;
}

}  // namespace

template <Value T>
CsrMatrix<T> transpose(CsrView<const T> a, const KernelOptions& options) {
  detail::check_device_operand(a, kWhere, "A");
  require(a.rows <= 0x7fffffffLL && a.cols <= 0x7fffffffLL, ErrorCode::unsupported, kWhere, "A is ",
          detail::shape(a.rows, a.cols), "; 32-bit column indices cannot hold the transpose");
  const cudaStream_t stream = detail::stream_of(options);
  CsrMatrix<T> out(a.cols, a.rows, a.nnz, MemorySpace::device);
  const std::int64_t nnz = a.nnz;
  if (nnz > 0) {
    require(nnz <= 0x7fffffffLL, ErrorCode::unsupported, kWhere, "nnz ", nnz, " exceeds the radix sort's int range");
    const std::size_t n = static_cast<std::size_t>(nnz);
    detail::Scratch row_of(n * 4, stream, kWhere), entry(n * 8, stream, kWhere), entry_sorted(n * 8, stream, kWhere),
        key(n * 4, stream, kWhere), key_sorted(n * 4, stream, kWhere);
    ::twell::detail::launch_kernel("twell::cuda::transpose (expand rows)", expand_rows_kernel,
                                   detail::grid_for(a.rows * 32, 256), 256, 0, stream, a.rows, a.row_ptr, a.col_idx,
                                   row_of.as<std::int32_t>(), entry.as<std::int64_t>(), key.as<std::uint32_t>());
    std::size_t temp_bytes = 0;
    const int bits = key_bits(a.cols);
    detail::check_cuda(
        cub::DeviceRadixSort::SortPairs(nullptr, temp_bytes, key.as<std::uint32_t>(), key_sorted.as<std::uint32_t>(),
                                        entry.as<std::int64_t>(), entry_sorted.as<std::int64_t>(),
                                        static_cast<int>(nnz), 0, bits, stream),
        "twell::cuda::transpose (radix sort size)");
    detail::Scratch temp(temp_bytes, stream, kWhere);
    detail::check_cuda(
        cub::DeviceRadixSort::SortPairs(temp.as<void>(), temp_bytes, key.as<std::uint32_t>(),
                                        key_sorted.as<std::uint32_t>(), entry.as<std::int64_t>(),
                                        entry_sorted.as<std::int64_t>(), static_cast<int>(nnz), 0, bits, stream),
        "twell::cuda::transpose (radix sort)");
    ::twell::detail::launch_kernel("twell::cuda::transpose (gather)", gather_kernel<T>, detail::grid_for(nnz, 256), 256,
                                   0, stream, nnz, entry_sorted.as<std::int64_t>(), row_of.as<std::int32_t>(), a.values,
                                   out.col_idx().data(), out.values().data());
    ::twell::detail::launch_kernel("twell::cuda::transpose (row_ptr)", row_ptr_kernel,
                                   detail::grid_for(a.cols + 1, 256), 256, 0, stream, a.cols, nnz,
                                   key_sorted.as<std::uint32_t>(), out.row_ptr().data());
  }
  // The buffers are host-synchronous from here on: the caller may read them at once.
  detail::check_cuda(cudaStreamSynchronize(stream), "twell::cuda::transpose (synchronize)");
  detail::report_path(options, "cuda/transpose/csr/radix_sort");
  return out;
}

template <Value T>
EllMatrix<T> transpose(EllView<const T> a, const KernelOptions& options) {
  detail::check_device_operand(a, kWhere, "A");
  KernelOptions inner = options;
  inner.report = nullptr;
  // Stored zeros are entries (an sddmm result may hold some): kept, as the reference keeps them,
  // where the public converters would drop them.
  const CsrMatrix<T> csr = detail::ell_entries_to_csr<T>(a, options.stream, kWhere);
  const CsrMatrix<T> t = transpose(csr.view(), inner);
  const ConvertOptions every{.threshold = detail::kKeepEveryEntry, .stream = options.stream};
  EllMatrix<T> out = detail::rows_to_ell<T>(detail::CsrRows<T>(t.view()), t.rows(), t.cols(), every, kWhere);
  detail::report_path(options, "cuda/transpose/ell/via_csr");
  return out;
}

template <Value T>
HybridMatrix<T> transpose(TwellView<const T> a, TwellLayout layout, const KernelOptions& options) {
  return transpose_to_hybrid<T>(a, layout, options, &cuda::twell_to_csr<T>, "twell");
}

template <Value T>
HybridMatrix<T> transpose(HybridView<const T> a, TwellLayout layout, const KernelOptions& options) {
  return transpose_to_hybrid<T>(a, layout, options, &cuda::hybrid_to_csr<T>, "hybrid");
}

template <Value T>
void transpose(DenseView<const T> a, DenseView<T> out, const KernelOptions& options) {
  detail::check_device_operand(a, kWhere, "a");
  detail::check_device_operand(out, kWhere, "out");
  twell::detail::check_dense_transpose(a, out, kWhere);
  detail::transpose_dense<T>(a.data, a.rows, a.cols, a.ld, out.data, out.ld, detail::stream_of(options), kWhere);
  detail::report_path(options, "cuda/transpose/dense");
}

TWELL_FOR_EACH_VALUE_TYPE(TWELL_INSTANTIATE_TRANSPOSE)

}  // namespace twell::cuda
