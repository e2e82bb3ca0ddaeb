// Reference transpose: sparse M x N to sparse N x M. Every format is walked once into a CSR of
// the transpose (values moved bit for bit, explicit zeros kept); ELL packs that CSR at its
// longest row; TwELL and Hybrid go through the reference CSR -> Hybrid converter, which does not
// store zeros, so explicit zeros (from sddmm or elementwise results) do not survive into a Hybrid.
#include <algorithm>
#include <cstdint>
#include <vector>

#include <twell/converters/backends.hpp>
#include <twell/kernels/backends.hpp>
#include <twell/kernels/detail/per_format.hpp>

#include "visit.hpp"

namespace twell::reference {
namespace {

// Walking A row by row fills each row of the transpose in increasing column order.
template <class T, class View>
CsrMatrix<T> transposed_csr(View a, const char* where) {
  const std::int64_t rows = detail::rows_of(a), cols = detail::cols_of(a);
  require(rows <= INT32_MAX, ErrorCode::unsupported, where, "A has ", rows,
          " rows, more than the 32-bit column indices of its transpose's CSR hold");
  detail::check_host_operand(a, where, "A");
  std::vector<std::int64_t> count(static_cast<std::size_t>(cols) + 1, 0);
  detail::for_each_entry(a, where, [&](const detail::Entry& e) { ++count[static_cast<std::size_t>(e.col) + 1]; });
  for (std::size_t j = 1; j < count.size(); ++j) count[j] += count[j - 1];
  CsrMatrix<T> out(cols, rows, count.back());
  std::copy(count.begin(), count.end(), out.row_ptr().data());
  std::int32_t* col_idx = out.col_idx().data();
  T* values = out.values().data();
  detail::for_each_entry(a, where, [&](const detail::Entry& e) {
    const auto k = static_cast<std::size_t>(count[static_cast<std::size_t>(e.col)]++);
    col_idx[k] = static_cast<std::int32_t>(e.row);
    values[k] = detail::load_value(a, e);
  });
  return out;
}

template <class T, class View>
HybridMatrix<T> transpose_to_hybrid(View a, TwellLayout layout, const KernelOptions& options, const char* path) {
  constexpr const char* where = "twell::reference::transpose";
  check_layout(layout, where);
  const CsrMatrix<T> csr = transposed_csr<T>(a, where);
  ConvertOptions convert;
  convert.overflow = OverflowPolicy::hybrid;
  HybridMatrix<T> out = csr_to_hybrid<T>(csr.view(), layout, convert);
  detail::report_path(options, path);
  return out;
}

}  // namespace

template <Value T>
CsrMatrix<T> transpose(CsrView<const T> a, const KernelOptions& options) {
  CsrMatrix<T> out = transposed_csr<T>(a, "twell::reference::transpose");
  detail::report_path(options, "reference/transpose/csr");
  return out;
}

template <Value T>
EllMatrix<T> transpose(EllView<const T> a, const KernelOptions& options) {
  const CsrMatrix<T> csr = transposed_csr<T>(a, "twell::reference::transpose");
  const std::int64_t* row_ptr = csr.row_ptr().data();
  std::int64_t width = 0;
  for (std::int64_t i = 0; i < csr.rows(); ++i) width = std::max(width, row_ptr[i + 1] - row_ptr[i]);
  EllMatrix<T> out(csr.rows(), csr.cols(), width);
  for (std::int64_t i = 0; i < csr.rows(); ++i) {
    out.row_count().data()[i] = static_cast<std::int32_t>(row_ptr[i + 1] - row_ptr[i]);
    for (std::int64_t k = row_ptr[i]; k < row_ptr[i + 1]; ++k) {
      out.col_idx().data()[i * width + (k - row_ptr[i])] = csr.col_idx().data()[k];
      out.values().data()[i * width + (k - row_ptr[i])] = csr.values().data()[k];
    }
  }
  detail::report_path(options, "reference/transpose/ell");
  return out;
}

template <Value T>
HybridMatrix<T> transpose(TwellView<const T> a, TwellLayout layout, const KernelOptions& options) {
  return transpose_to_hybrid<T>(a, layout, options, "reference/transpose/twell");
}

template <Value T>
HybridMatrix<T> transpose(HybridView<const T> a, TwellLayout layout, const KernelOptions& options) {
  return transpose_to_hybrid<T>(a, layout, options, "reference/transpose/hybrid");
}

template <Value T>
void transpose(DenseView<const T> a, DenseView<T> out, const KernelOptions& options) {
  constexpr const char* where = "twell::reference::transpose";
  detail::check_host_operand(a, where, "a");
  detail::check_host_operand(out, where, "out");
  twell::detail::check_dense_transpose(a, out, where);
  for (std::int64_t i = 0; i < a.rows; ++i)
    for (std::int64_t j = 0; j < a.cols; ++j) out.data[j * out.ld + i] = a.data[i * a.ld + j];
  detail::report_path(options, "reference/transpose/dense");
}

TWELL_FOR_EACH_VALUE_TYPE(TWELL_INSTANTIATE_TRANSPOSE)

}  // namespace twell::reference
