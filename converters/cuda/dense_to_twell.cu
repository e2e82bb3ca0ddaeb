// cuda dense -> twell: the performance path, one pass of dense_to_twell_kernel (twell_pack.cuh).
// dense_to_twell (and dense_to_twell_as, which names its caller) is an allocation (not
// zero-filled: the kernel writes every slot) plus dense_to_twell_into.
#include <twell/converters/destination.hpp>
#include <twell/instantiate.hpp>

#include "twell_pack.cuh"

namespace twell::cuda {
namespace {

template <class T>
void convert_into(DenseView<const T> src, TwellView<T> dst, const ConvertOptions& options, const char* where) {
  detail::check_device_operand(src, where, "src");
  twell::detail::check_twell_destination(src, dst, MemorySpace::device, where);
  check_convert_options(options, where);
  detail::require_twell_policy(options, where);
  detail::pack_twell_into<T>(dst, options, where, [&](TwellView<T> out, detail::OverflowTarget target) {
    detail::launch_dense_to_twell(src, out, options.threshold, target, detail::stream_of(options), where);
  });
}

}  // namespace

template <Value T>
TwellMatrix<T> detail::dense_to_twell_as(DenseView<const T> src, TwellLayout layout, const ConvertOptions& options,
                                         const char* where) {
  detail::check_device_operand(src, where, "src");
  check_convert_options(options, where);
  check_layout(layout, where);
  detail::require_twell_policy(options, where);
  TwellMatrix<T> out(src.rows, src.cols, layout, MemorySpace::device, Uninitialized{});
  convert_into(src, out.view(), options, where);
  return out;
}

template <Value T>
TwellMatrix<T> dense_to_twell(DenseView<const T> src, TwellLayout layout, const ConvertOptions& options) {
  return detail::dense_to_twell_as<T>(src, layout, options, "twell::cuda::dense_to_twell");
}

template <Value T>
void dense_to_twell_into(DenseView<const T> src, TwellView<T> dst, const ConvertOptions& options) {
  convert_into(src, dst, options, "twell::cuda::dense_to_twell_into");
}

#define TWELL_INSTANTIATE(T)                                                                                   \
  template TwellMatrix<T> detail::dense_to_twell_as<T>(DenseView<const T>, TwellLayout, const ConvertOptions&, \
                                                       const char*);                                           \
  template TwellMatrix<T> dense_to_twell<T>(DenseView<const T>, TwellLayout, const ConvertOptions&);           \
  template void dense_to_twell_into<T>(DenseView<const T>, TwellView<T>, const ConvertOptions&);
TWELL_FOR_EACH_VALUE_TYPE(TWELL_INSTANTIATE)
#undef TWELL_INSTANTIATE

}  // namespace twell::cuda
