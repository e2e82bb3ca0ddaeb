// Reference sddmm: out = alpha * (A op(B)) + beta * out at the stored entries of a pattern.
#include <twell/kernels/backends.hpp>
#include <twell/kernels/detail/per_format.hpp>

#include "visit.hpp"

namespace twell::reference {
namespace {

template <class T, class Pattern, class Out>
void sddmm_impl(DenseView<const T> a, Op op_b, DenseView<const T> b, Pattern pattern, Out out, float alpha, float beta,
                const KernelOptions& options, const char* format) {
  constexpr const char* where = "twell::reference::sddmm";
  detail::check_host_operand(a, where, "A");
  detail::check_host_operand(b, where, "B");
  detail::check_host_operand(pattern, where, "pattern");
  detail::check_host_operand(out, where, "out");
  twell::detail::check_sddmm_operands(a, op_b, b, pattern, out, where);
  const bool transposed = op_b == Op::transpose;
  // beta reads the old values of out at the pattern's places, so out must have that structure.
  if (beta != 0.0f) detail::require_same_structure(pattern, Out(out), where, "pattern", "out (beta != 0)");

  const detail::MatrixF af = detail::to_matrix(a);
  // Rows of bt are the columns of op(B), so each sampled entry is one contiguous dot product.
  detail::MatrixF bt = detail::to_matrix(b);
  if (!transposed) bt.transposeInPlace();
  detail::write_on_pattern(pattern, out, where, "the pattern", [&](const detail::Entry& e) {
    float v = alpha * af.row(e.row).dot(bt.row(e.col));
    if (beta != 0.0f) v += beta * detail::load(out, e);
    return v;
  });
  detail::report_format_path(options, "reference/sddmm", format);
}

}  // namespace

TWELL_FOR_EACH_SPARSE_VIEW(TWELL_DEFINE_SDDMM)
TWELL_FOR_EACH_VALUE_TYPE(TWELL_INSTANTIATE_SDDMM)

}  // namespace twell::reference
