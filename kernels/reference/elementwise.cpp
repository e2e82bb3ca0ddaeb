// Reference elementwise kernels on one structure: out = x * y, out = x + s * sign(y) (y = x too), and
// out = x * act'(g).
#include <cmath>

#include <twell/kernels/backends.hpp>
#include <twell/kernels/detail/per_format.hpp>

#include "visit.hpp"

namespace twell::reference {
namespace {

template <class View, class Out>
void multiply_impl(View x, View y, Out out, const KernelOptions& options, const char* format) {
  constexpr const char* where = "twell::reference::multiply_on_pattern";
  detail::check_view(x, where, "x");
  detail::check_view(y, where, "y");
  detail::check_view(out, where, "out");
  detail::require_same_structure(x, y, where, "x", "y");
  detail::write_on_pattern(x, out, where,
                           [&](const detail::Entry& e) { return detail::load(x, e) * detail::load(y, e); });
  detail::report_format_path(options, "reference/multiply_on_pattern", format);
}

// sign(0) = sign(-0) = 0, so zeros stay zero; sign(NaN) = NaN, so NaN propagates.
inline float sign(float v) {
  if (std::isnan(v)) return v;
  return v > 0.0f ? 1.0f : (v < 0.0f ? -1.0f : 0.0f);
}

// out = x + s * sign(y); the one-operand form passes y = x.
template <class View, class Out>
void add_scaled_sign_impl(View x, float s, View y, Out out, const KernelOptions& options, const char* format) {
  constexpr const char* where = "twell::reference::add_scaled_sign";
  detail::check_view(x, where, "x");
  detail::check_view(y, where, "y");
  detail::check_view(out, where, "out");
  detail::require_same_structure(x, y, where, "x", "y");
  const auto value = [&](const detail::Entry& e) { return detail::load(x, e) + s * sign(detail::load(y, e)); };
  if constexpr (requires { x.overflow; }) {
    detail::write_on_pattern(x, out, where, value, &y);
  } else {
    detail::write_on_pattern(x, out, where, value);
  }
  detail::report_format_path(options, "reference/add_scaled_sign", format);
}

template <class View, class Out>
void activation_derivative_impl(View x, View g, Activation act, Out out, const KernelOptions& options,
                                const char* format) {
  constexpr const char* where = "twell::reference::multiply_by_activation_derivative";
  detail::check_view(x, where, "x");
  detail::check_view(g, where, "g");
  detail::check_view(out, where, "out");
  detail::require_same_structure(x, g, where, "x", "g");
  detail::write_on_pattern(x, out, where, [&](const detail::Entry& e) {
    return detail::load(x, e) * detail::activate_derivative(act, detail::load(g, e));
  });
  detail::report_format_path(options, "reference/multiply_by_activation_derivative", format);
}

}  // namespace

TWELL_FOR_EACH_SPARSE_VIEW(TWELL_DEFINE_ELEMENTWISE)
TWELL_FOR_EACH_VALUE_TYPE(TWELL_INSTANTIATE_ELEMENTWISE)

}  // namespace twell::reference
