// Conversions between every pair of formats, exact (values copied bit for bit).
//
// The backend follows the source: a host source is converted by the reference backend, a
// device source by the cuda backend (ErrorCode::no_device in a build without it); the result
// lives where the source lives. Pairs without a direct converter (ELL <-> TwELL, ELL <-> Hybrid)
// go through CSR. A same-format conversion is re-built like any other (explicit zeros removed,
// CSR row by row, the other formats through CSR), so both backends agree; only a canonical host
// dense source is copied.
// Every result is canonical: a value that is not stored (-0.0 included) reads back as +0, so
// conversions commute (A -> B -> C equals A -> C), and to_dense of a dense matrix holding -0.0
// is re-built rather than copied.
//
// Options (ConvertOptions): threshold, overflow policy for TwELL (error throws
// ErrorCode::overflow naming the first overflowed row and tile; drop keeps the first S-1 entries
// of each (row, tile) and counts the rest in report->dropped; hybrid is refused by to_twell:
// use to_hybrid), ell_width (-1: the longest row; a smaller width follows the overflow policy),
// the stream, and an optional report (nnz, dropped, overflow rows).
#pragma once

#include <twell/converters/options.hpp>
#include <twell/formats/csr.hpp>
#include <twell/formats/dense.hpp>
#include <twell/formats/ell.hpp>
#include <twell/formats/hybrid.hpp>
#include <twell/formats/twell_matrix.hpp>
#include <twell/instantiate.hpp>

namespace twell {

// The owning matrix types (DenseMatrix, CsrMatrix, EllMatrix, TwellMatrix, HybridMatrix).
template <class M>
concept OwningMatrix = requires(const M& m) {
  m.view();
  m.to(MemorySpace::host);
};

#define TWELL_DECLARE_CONVERT_FROM(T, View)                                                              \
  DenseMatrix<T> to_dense(View<const T> src, const ConvertOptions& options = {});                        \
  CsrMatrix<T> to_csr(View<const T> src, const ConvertOptions& options = {});                            \
  EllMatrix<T> to_ell(View<const T> src, const ConvertOptions& options = {});                            \
  TwellMatrix<T> to_twell(View<const T> src, TwellLayout layout = {}, const ConvertOptions& options = {}); \
  HybridMatrix<T> to_hybrid(View<const T> src, TwellLayout layout = {}, const ConvertOptions& options = {});

#define TWELL_DECLARE_CONVERT(T)              \
  TWELL_DECLARE_CONVERT_FROM(T, DenseView)    \
  TWELL_DECLARE_CONVERT_FROM(T, CsrView)      \
  TWELL_DECLARE_CONVERT_FROM(T, EllView)      \
  TWELL_DECLARE_CONVERT_FROM(T, TwellView)    \
  TWELL_DECLARE_CONVERT_FROM(T, HybridView)

TWELL_FOR_EACH_VALUE_TYPE(TWELL_DECLARE_CONVERT)
#undef TWELL_DECLARE_CONVERT
#undef TWELL_DECLARE_CONVERT_FROM

// Dense -> TwELL into a caller-owned TwELL: the hot path, nothing allocated for the result.
// dst has src's rows and cols (ErrorCode::shape_mismatch), a valid layout, which is the target
// (ErrorCode::invalid_argument), lies outside src's span (ErrorCode::invalid_argument) and lives
// where src lives (ErrorCode::space_mismatch); every slot of dst is written, so it needs no
// zeroing. Overflow policy error or drop as to_twell (hybrid is refused); an overflow under error
// throws and leaves dst all zeros (a valid TwELL without entries), never half written. On the
// device the work is queued on options.stream and the host waits only under
// OverflowPolicy::error or when a report is requested (one small read at the end).
#define TWELL_DECLARE_CONVERT_INTO(T) \
  void to_twell_into(DenseView<const T> src, TwellView<T> dst, const ConvertOptions& options = {});
TWELL_FOR_EACH_VALUE_TYPE(TWELL_DECLARE_CONVERT_INTO)
#undef TWELL_DECLARE_CONVERT_INTO

template <Value T>
void to_twell_into(const DenseMatrix<T>& src, TwellMatrix<T>& dst, const ConvertOptions& options = {}) {
  to_twell_into(src.view(), dst.view(), options);
}

// The same conversions from an owning matrix (through its const view).
template <OwningMatrix M>
auto to_dense(const M& src, const ConvertOptions& options = {}) {
  return to_dense(src.view(), options);
}
template <OwningMatrix M>
auto to_csr(const M& src, const ConvertOptions& options = {}) {
  return to_csr(src.view(), options);
}
template <OwningMatrix M>
auto to_ell(const M& src, const ConvertOptions& options = {}) {
  return to_ell(src.view(), options);
}
template <OwningMatrix M>
auto to_twell(const M& src, TwellLayout layout = {}, const ConvertOptions& options = {}) {
  return to_twell(src.view(), layout, options);
}
template <OwningMatrix M>
auto to_hybrid(const M& src, TwellLayout layout = {}, const ConvertOptions& options = {}) {
  return to_hybrid(src.view(), layout, options);
}

}  // namespace twell
