// Host-side argument checks shared by the reference, cuda and baseline kernels, so that both
// backends word their errors alike. Plain host C++; each operand's memory space and geometry are
// checked by view_checks.hpp's check_view, which names the backend.
#pragma once

#include <array>
#include <cstdint>
#include <initializer_list>
#include <string>
#include <utility>

#include <twell/converters/options.hpp>
#include <twell/error.hpp>
#include <twell/formats/csr.hpp>
#include <twell/formats/dense.hpp>
#include <twell/formats/dense_checks.hpp>
#include <twell/formats/ell.hpp>
#include <twell/formats/hybrid.hpp>
#include <twell/formats/layout.hpp>
#include <twell/formats/twell_matrix.hpp>
#include <twell/formats/view_checks.hpp>
#include <twell/kernels/detail/per_format.hpp>
#include <twell/kernels/options.hpp>
#include <twell/types.hpp>

namespace twell::detail {

inline void report_path(const KernelOptions& options, const char* path) {
  if (options.report != nullptr) options.report->path = path;
}

// gemm_to_sparse's conversion options: a policy of the enum, and no threshold of their own: what
// is stored is decided by act.threshold, so a nonzero convert.threshold would go unheeded.
inline void check_gemm_convert_options(const ConvertOptions& convert, const char* where) {
  check_overflow_policy(convert.overflow, where);
  require(convert.threshold == 0.0f, ErrorCode::invalid_argument, where, "convert.threshold = ", convert.threshold,
          " has no effect here: act.threshold decides which values are stored; leave convert.threshold 0");
}

// KernelOptions::spmm_algorithm: a value of the enum, also where the backend or format ignores it
// (the reference backend, CSR and ELL operands), so that a call refused on one backend is refused
// on every one.
inline void check_spmm_algorithm(SpmmAlgorithm algorithm, const char* where) {
  require(algorithm <= SpmmAlgorithm::slice_reuse, ErrorCode::invalid_argument, where, "spmm algorithm ",
          static_cast<int>(algorithm), " is unknown");
}

inline void check_activation_kind(Activation kind, const char* where) {
  require(kind == Activation::relu || kind == Activation::silu || kind == Activation::gelu,
          ErrorCode::invalid_argument, where, "activation kind ", static_cast<int>(kind), " is unknown");
}

inline void check_activation(const ActivationSpec& act, const char* where) {
  check_activation_kind(act.kind, where);
  require(act.threshold >= 0.0f, ErrorCode::invalid_argument, where, "activation threshold ", act.threshold,
          " must be a non-negative number");
}

// A dense result shares no byte with the dense operands read while it is written (the GPU
// kernels read them while other blocks write it).
template <class T>
void check_apart(DenseView<T> out, const char* out_name,
                 std::initializer_list<std::pair<const char*, DenseView<const T>>> inputs, const char* where) {
  const ByteRange written = byte_range(out);
  for (const auto& [name, in] : inputs)
    require(!written.overlaps(byte_range(in)), ErrorCode::invalid_argument, where, out_name, " overlaps ", name,
            "; the result cannot be written over an operand");
}

// A dense transpose's out: N x M for an M x N a, and no byte shared with a (the kernels read a
// while writing out). Geometry of both is checked by the caller.
template <class T>
void check_dense_transpose(DenseView<const T> a, DenseView<T> out, const char* where) {
  require(out.rows == a.cols && out.cols == a.rows, ErrorCode::shape_mismatch, where, "out is ",
          shape(out.rows, out.cols), " but the transpose of a (", shape(a.rows, a.cols), ") is ",
          shape(a.cols, a.rows));
  check_apart(out, "out", {{"a", a}}, where);
}

// The bytes an sddmm rewrites in `out` (saturating, like byte_range): a CSR's or ELL's values; a
// TwELL's packed words (16-bit values live in them) and fp32 value plane; a Hybrid's also its
// overflow block. Unused entries are empty.
using WrittenRanges = std::array<ByteRange, 3>;
template <class T>
WrittenRanges written_ranges(CsrView<T> v) {
  return {byte_range(v.values, v.nnz)};
}
template <class T>
WrittenRanges written_ranges(EllView<T> v) {
  std::int64_t n = 0;
  return {byte_range(v.values, __builtin_mul_overflow(v.rows, v.width, &n) ? INT64_MAX : n)};
}
template <class T>
WrittenRanges written_ranges(TwellView<T> v) {
  std::int64_t n = 0;
  const std::int64_t words = __builtin_mul_overflow(v.rows, v.layout.packed_width(v.cols), &n) ? INT64_MAX : n;
  return {byte_range(v.packed, words), v.value_plane == nullptr ? ByteRange{} : byte_range(v.value_plane, words)};
}
template <class T>
WrittenRanges written_ranges(HybridView<T> v) {
  const WrittenRanges twell = written_ranges(v.twell);
  return {twell[0], twell[1], byte_range(v.overflow)};
}

// sddmm's op_b and shapes, and out's values apart from A and B: the GPU kernels read A and B
// while they write out (the reference, which computes every value first, refuses the same calls).
template <class T, class Pattern, class Out>
void check_sddmm_operands(DenseView<const T> a, Op op_b, DenseView<const T> b, Pattern pattern, Out out,
                          const char* where) {
  require(op_b == Op::none || op_b == Op::transpose, ErrorCode::invalid_argument, where, "op_b ",
          static_cast<int>(op_b), " is unknown");
  const std::int64_t m = rows_of(pattern), n = cols_of(pattern);
  const bool transposed = op_b == Op::transpose;
  const std::int64_t bk = transposed ? b.cols : b.rows, bn = transposed ? b.rows : b.cols;
  require(a.rows == m && bn == n && a.cols == bk, ErrorCode::shape_mismatch, where, "A is ", shape(a.rows, a.cols),
          " and op(B) is ", shape(bk, bn), " but the pattern is ", shape(m, n));
  const ByteRange ra = byte_range(a), rb = byte_range(b);
  for (const ByteRange written : written_ranges(out))
    require(!written.overlaps(ra) && !written.overlaps(rb), ErrorCode::invalid_argument, where,
            "out overlaps A or B; sddmm cannot write its result over an operand");
}

}  // namespace twell::detail
