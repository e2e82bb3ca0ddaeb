// Reference elementwise kernels on one structure: out = x * y, and out = x + s * sign(x).
#include <cmath>

#include <twell/instantiate.hpp>
#include <twell/kernels/backends.hpp>

#include "visit.hpp"

namespace twell::reference {
namespace {

template <class View, class Out>
void multiply_impl(View x, View y, Out out, const KernelOptions& options, const char* path) {
  constexpr const char* where = "twell::reference::multiply_on_pattern";
  detail::check_view(x, where, "x");
  detail::check_view(y, where, "y");
  detail::check_view(out, where, "out");
  detail::require_same_structure(x, y, where, "x", "y");
  detail::write_on_pattern(x, out, where,
                           [&](const detail::Entry& e) { return detail::load(x, e) * detail::load(y, e); });
  detail::report_path(options, path);
}

// sign(0) = sign(-0) = 0, so zeros stay zero; sign(NaN) = NaN, so NaN propagates.
inline float sign(float v) {
  if (std::isnan(v)) return v;
  return v > 0.0f ? 1.0f : (v < 0.0f ? -1.0f : 0.0f);
}

template <class View, class Out>
void add_scaled_sign_impl(View x, float s, Out out, const KernelOptions& options, const char* path) {
  constexpr const char* where = "twell::reference::add_scaled_sign";
  detail::check_view(x, where, "x");
  detail::check_view(out, where, "out");
  detail::write_on_pattern(x, out, where, [&](const detail::Entry& e) {
    const float v = detail::load(x, e);
    return v + s * sign(v);
  });
  detail::report_path(options, path);
}

}  // namespace

template <Value T>
void multiply_on_pattern(CsrView<const T> x, CsrView<const T> y, CsrView<T> out, const KernelOptions& options) {
  multiply_impl(x, y, out, options, "reference/multiply_on_pattern/csr");
}
template <Value T>
void multiply_on_pattern(EllView<const T> x, EllView<const T> y, EllView<T> out, const KernelOptions& options) {
  multiply_impl(x, y, out, options, "reference/multiply_on_pattern/ell");
}
template <Value T>
void multiply_on_pattern(TwellView<const T> x, TwellView<const T> y, TwellView<T> out, const KernelOptions& options) {
  multiply_impl(x, y, out, options, "reference/multiply_on_pattern/twell");
}
template <Value T>
void multiply_on_pattern(HybridView<const T> x, HybridView<const T> y, HybridView<T> out,
                         const KernelOptions& options) {
  multiply_impl(x, y, out, options, "reference/multiply_on_pattern/hybrid");
}

template <Value T>
void add_scaled_sign(CsrView<const T> x, float s, CsrView<T> out, const KernelOptions& options) {
  add_scaled_sign_impl(x, s, out, options, "reference/add_scaled_sign/csr");
}
template <Value T>
void add_scaled_sign(EllView<const T> x, float s, EllView<T> out, const KernelOptions& options) {
  add_scaled_sign_impl(x, s, out, options, "reference/add_scaled_sign/ell");
}
template <Value T>
void add_scaled_sign(TwellView<const T> x, float s, TwellView<T> out, const KernelOptions& options) {
  add_scaled_sign_impl(x, s, out, options, "reference/add_scaled_sign/twell");
}
template <Value T>
void add_scaled_sign(HybridView<const T> x, float s, HybridView<T> out, const KernelOptions& options) {
  add_scaled_sign_impl(x, s, out, options, "reference/add_scaled_sign/hybrid");
}

#define TWELL_INSTANTIATE(T)                                                                                           \
  template void multiply_on_pattern<T>(CsrView<const T>, CsrView<const T>, CsrView<T>, const KernelOptions&);          \
  template void multiply_on_pattern<T>(EllView<const T>, EllView<const T>, EllView<T>, const KernelOptions&);          \
  template void multiply_on_pattern<T>(TwellView<const T>, TwellView<const T>, TwellView<T>, const KernelOptions&);    \
  template void multiply_on_pattern<T>(HybridView<const T>, HybridView<const T>, HybridView<T>, const KernelOptions&); \
  template void add_scaled_sign<T>(CsrView<const T>, float, CsrView<T>, const KernelOptions&);                         \
  template void add_scaled_sign<T>(EllView<const T>, float, EllView<T>, const KernelOptions&);                         \
  template void add_scaled_sign<T>(TwellView<const T>, float, TwellView<T>, const KernelOptions&);                     \
  template void add_scaled_sign<T>(HybridView<const T>, float, HybridView<T>, const KernelOptions&);
TWELL_FOR_EACH_VALUE_TYPE(TWELL_INSTANTIATE)
#undef TWELL_INSTANTIATE

}  // namespace twell::reference
