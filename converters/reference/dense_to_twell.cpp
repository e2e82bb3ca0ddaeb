#include <twell/converters/destination.hpp>

#include "packing.hpp"

namespace twell::reference {

template <Value T>
TwellMatrix<T> detail::dense_to_twell_as(DenseView<const T> src, TwellLayout layout, const ConvertOptions& options,
                                         const char* where) {
  packing::check_source(src, options, where);
  const packing::DenseSource<T> source{src, options.threshold};
  return packing::build_twell<T>(source, layout, options, where);
}

template <Value T>
TwellMatrix<T> dense_to_twell(DenseView<const T> src, TwellLayout layout, const ConvertOptions& options) {
  return detail::dense_to_twell_as<T>(src, layout, options, "twell::reference::dense_to_twell");
}

template <Value T>
void dense_to_twell_into(DenseView<const T> src, TwellView<T> dst, const ConvertOptions& options) {
  constexpr const char* kWhere = "twell::reference::dense_to_twell_into";
  packing::check_source(src, options, kWhere);
  twell::detail::check_twell_destination(src, dst, MemorySpace::host, kWhere);
  const packing::DenseSource<T> source{src, options.threshold};
  packing::build_twell_into<T>(source, dst, options, kWhere);
}

#define TWELL_INSTANTIATE(T)                                                                                   \
  template TwellMatrix<T> detail::dense_to_twell_as<T>(DenseView<const T>, TwellLayout, const ConvertOptions&, \
                                                       const char*);                                           \
  template TwellMatrix<T> dense_to_twell<T>(DenseView<const T>, TwellLayout, const ConvertOptions&);           \
  template void dense_to_twell_into<T>(DenseView<const T>, TwellView<T>, const ConvertOptions&);
TWELL_FOR_EACH_VALUE_TYPE(TWELL_INSTANTIATE)
#undef TWELL_INSTANTIATE

}  // namespace twell::reference
