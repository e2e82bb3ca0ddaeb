// Reference reductions over stored values: L1 in fp64 (deterministic row-major order) and L0.
#include <cmath>

#include <twell/kernels/backends.hpp>
#include <twell/kernels/detail/per_format.hpp>

#include "visit.hpp"

namespace twell::reference {
namespace {

template <class View>
double l1_impl(View x, const KernelOptions& options, const char* format) {
  constexpr const char* where = "twell::reference::l1_norm";
  detail::check_host_operand(x, where, "x");
  double sum = 0.0;
  detail::for_each_entry(x, where, [&](const detail::Entry& e) { sum += std::fabs(double{detail::load(x, e)}); });
  detail::report_format_path(options, "reference/l1_norm", format);
  return sum;
}

// Explicit zeros (sampled results may hold them) are stored but not counted; NaN is counted.
template <class View>
std::int64_t l0_impl(View x, const KernelOptions& options, const char* format) {
  constexpr const char* where = "twell::reference::l0_norm";
  detail::check_host_operand(x, where, "x");
  std::int64_t count = 0;
  detail::for_each_entry(x, where, [&](const detail::Entry& e) { count += is_stored(detail::load(x, e)) ? 1 : 0; });
  detail::report_format_path(options, "reference/l0_norm", format);
  return count;
}

}  // namespace

TWELL_FOR_EACH_SPARSE_VIEW(TWELL_DEFINE_NORMS)
TWELL_FOR_EACH_VALUE_TYPE(TWELL_INSTANTIATE_NORMS)

}  // namespace twell::reference
