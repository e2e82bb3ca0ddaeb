// Reference elementwise kernels on one structure: out = x * y, out = x + s * sign(y) (y = x too), and
// out = x * act'(g).
#include <cmath>

#include <twell/kernels/backends.hpp>
#include <twell/kernels/detail/per_format.hpp>

#include "visit.hpp"

namespace twell::reference {
namespace {

// out = f(x(e), y(e)) at x's entries: the checks, the write and the report every operation shares
// (`where` names it in errors, `path` in the report, `y_name` its second operand). either_stored:
// a Hybrid's dense rows also take y's stored elements (signatures.inc, add_scaled_sign).
template <class View, class Out, class F>
void elementwise(const char* where, const char* path, View x, View y, const char* y_name, Out out, F f,
                 bool either_stored, const KernelOptions& options, const char* format) {
  detail::check_host_operand(x, where, "x");
  detail::check_host_operand(y, where, y_name);
  detail::check_host_operand(out, where, "out");
  detail::require_same_structure(x, y, where, "x", y_name);
  const auto value = [&](const detail::Entry& e) { return f(detail::load(x, e), detail::load(y, e)); };
  if constexpr (requires { x.overflow; }) {
    detail::write_on_pattern(x, out, where, "x", value, either_stored ? &y : nullptr);
  } else {
    detail::write_on_pattern(x, out, where, "x", value);
  }
  detail::report_format_path(options, path, format);
}

template <class View, class Out>
void multiply_impl(View x, View y, Out out, const KernelOptions& options, const char* format) {
  elementwise(
      "twell::reference::multiply_on_pattern", "reference/multiply_on_pattern", x, y, "y", out,
      [](float a, float b) { return a * b; }, false, options, format);
}

// sign(0) = sign(-0) = 0, so zeros stay zero; sign(NaN) = NaN, so NaN propagates.
inline float sign(float v) {
  if (std::isnan(v)) return v;
  return v > 0.0f ? 1.0f : (v < 0.0f ? -1.0f : 0.0f);
}

// out = x + s * sign(y); the one-operand form passes y = x.
template <class View, class Out>
void add_scaled_sign_impl(View x, float s, View y, Out out, const KernelOptions& options, const char* format) {
  elementwise(
      "twell::reference::add_scaled_sign", "reference/add_scaled_sign", x, y, "y", out,
      [s](float a, float b) { return a + s * sign(b); }, true, options, format);
}

template <class View, class Out>
void activation_derivative_impl(View x, View g, Activation act, Out out, const KernelOptions& options,
                                const char* format) {
  twell::detail::check_activation_kind(act, "twell::reference::multiply_by_activation_derivative");
  elementwise(
      "twell::reference::multiply_by_activation_derivative", "reference/multiply_by_activation_derivative", x, g,
      "g", out, [act](float a, float b) { return a * detail::activate_derivative(act, b); }, false, options, format);
}

}  // namespace

TWELL_FOR_EACH_SPARSE_VIEW(TWELL_DEFINE_ELEMENTWISE)
TWELL_FOR_EACH_VALUE_TYPE(TWELL_INSTANTIATE_ELEMENTWISE)

}  // namespace twell::reference
