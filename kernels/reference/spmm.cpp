// Reference spmm: C = alpha * op(A) * B + beta * C for every sparse format, one walker each.
#include <twell/kernels/backends.hpp>
#include <twell/kernels/detail/per_format.hpp>

#include "visit.hpp"

namespace twell::reference {
namespace {

template <class T, class View>
void spmm_impl(Op op_a, View a, DenseView<const T> b, DenseView<T> c, float alpha, float beta,
               const KernelOptions& options, const char* format) {
  constexpr const char* where = "twell::reference::spmm";
  detail::check_host_operand(a, where, "A");
  detail::check_host_operand(b, where, "B");
  detail::check_host_operand(c, where, "C");
  require(op_a == Op::none || op_a == Op::transpose, ErrorCode::invalid_argument, where, "op_a ",
          static_cast<int>(op_a), " is unknown");
  twell::detail::check_spmm_algorithm(options.spmm_algorithm, where);
  const bool transposed = op_a == Op::transpose;
  const std::int64_t m = transposed ? detail::cols_of(a) : detail::rows_of(a);
  const std::int64_t k = transposed ? detail::rows_of(a) : detail::cols_of(a);
  require(b.rows == k, ErrorCode::shape_mismatch, where, "op(A) is ", detail::shape(m, k), " but B is ",
          detail::shape(b.rows, b.cols));
  require(c.rows == m && c.cols == b.cols, ErrorCode::shape_mismatch, where, "C is ", detail::shape(c.rows, c.cols),
          " but op(A) B is ", detail::shape(m, b.cols));
  twell::detail::check_apart(c, "C", {{"B", b}}, where);  // the GPU reads B while it writes C

  const detail::MatrixF bf = detail::to_matrix(b);
  detail::MatrixF acc = detail::MatrixF::Zero(m, b.cols);
  detail::for_each_entry(a, where, [&](const detail::Entry& e) {
    const float v = detail::load(a, e);
    if (transposed) {
      acc.row(e.col) += v * bf.row(e.row);
    } else {
      acc.row(e.row) += v * bf.row(e.col);
    }
  });
  acc *= alpha;
  if (beta != 0.0f) acc += beta * detail::to_matrix(DenseView<const T>(c));
  detail::store_matrix(acc, c);
  detail::report_format_path(options, "reference/spmm", format);
}

}  // namespace

TWELL_FOR_EACH_SPARSE_VIEW(TWELL_DEFINE_SPMM)
TWELL_FOR_EACH_VALUE_TYPE(TWELL_INSTANTIATE_SPMM)

}  // namespace twell::reference
