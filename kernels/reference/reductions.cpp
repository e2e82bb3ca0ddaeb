// Reference reductions over stored values: L1 in fp64 (deterministic row-major order) and L0.
#include <cmath>

#include <twell/instantiate.hpp>
#include <twell/kernels/backends.hpp>

#include "visit.hpp"

namespace twell::reference {
namespace {

template <class View>
double l1_impl(View x, const KernelOptions& options, const char* path) {
  constexpr const char* where = "twell::reference::l1_norm";
  detail::check_view(x, where, "x");
  double sum = 0.0;
  detail::for_each_entry(x, where, [&](const detail::Entry& e) { sum += std::fabs(double{detail::load(x, e)}); });
  detail::report_path(options, path);
  return sum;
}

// Explicit zeros (sampled results may hold them) are stored but not counted; NaN is counted.
template <class View>
std::int64_t l0_impl(View x, const KernelOptions& options, const char* path) {
  constexpr const char* where = "twell::reference::l0_norm";
  detail::check_view(x, where, "x");
  std::int64_t count = 0;
  detail::for_each_entry(x, where, [&](const detail::Entry& e) { count += detail::load(x, e) != 0.0f ? 1 : 0; });
  detail::report_path(options, path);
  return count;
}

}  // namespace

template <Value T>
double l1_norm(CsrView<const T> x, const KernelOptions& options) {
  return l1_impl(x, options, "reference/l1_norm/csr");
}
template <Value T>
double l1_norm(EllView<const T> x, const KernelOptions& options) {
  return l1_impl(x, options, "reference/l1_norm/ell");
}
template <Value T>
double l1_norm(TwellView<const T> x, const KernelOptions& options) {
  return l1_impl(x, options, "reference/l1_norm/twell");
}
template <Value T>
double l1_norm(HybridView<const T> x, const KernelOptions& options) {
  return l1_impl(x, options, "reference/l1_norm/hybrid");
}
template <Value T>
std::int64_t l0_norm(CsrView<const T> x, const KernelOptions& options) {
  return l0_impl(x, options, "reference/l0_norm/csr");
}
template <Value T>
std::int64_t l0_norm(EllView<const T> x, const KernelOptions& options) {
  return l0_impl(x, options, "reference/l0_norm/ell");
}
template <Value T>
std::int64_t l0_norm(TwellView<const T> x, const KernelOptions& options) {
  return l0_impl(x, options, "reference/l0_norm/twell");
}
template <Value T>
std::int64_t l0_norm(HybridView<const T> x, const KernelOptions& options) {
  return l0_impl(x, options, "reference/l0_norm/hybrid");
}

#define TWELL_INSTANTIATE(T)                                                  \
  template double l1_norm<T>(CsrView<const T>, const KernelOptions&);         \
  template double l1_norm<T>(EllView<const T>, const KernelOptions&);         \
  template double l1_norm<T>(TwellView<const T>, const KernelOptions&);       \
  template double l1_norm<T>(HybridView<const T>, const KernelOptions&);      \
  template std::int64_t l0_norm<T>(CsrView<const T>, const KernelOptions&);   \
  template std::int64_t l0_norm<T>(EllView<const T>, const KernelOptions&);   \
  template std::int64_t l0_norm<T>(TwellView<const T>, const KernelOptions&); \
  template std::int64_t l0_norm<T>(HybridView<const T>, const KernelOptions&);
TWELL_FOR_EACH_VALUE_TYPE(TWELL_INSTANTIATE)
#undef TWELL_INSTANTIATE

}  // namespace twell::reference
