// Dispatch of the public operations by memory space: host -> twell::reference, device ->
// twell::cuda (when built with it).
#include <twell/config.hpp>
#include <twell/instantiate.hpp>
#include <twell/kernels/backends.hpp>
#include <twell/ops.hpp>

namespace twell {
namespace {

struct Operand {
  const char* name;
  MemorySpace space;
};

template <class T>
Operand operand(const char* name, const DenseView<T>& v) {
  return {name, v.space};
}
template <class T>
Operand operand(const char* name, const CsrView<T>& v) {
  return {name, v.space};
}
template <class T>
Operand operand(const char* name, const EllView<T>& v) {
  return {name, v.space};
}
template <class T>
Operand operand(const char* name, const TwellView<T>& v) {
  return {name, v.space};
}
template <class T>
Operand operand(const char* name, const HybridView<T>& v) {
  return {name, v.twell.space};
}

// The one space all operands share; throws space_mismatch naming the first operand that differs.
template <class... Ops>
MemorySpace common_space(const char* where, const Operand& first, const Ops&... rest) {
  for (const Operand& o : {rest...})
    require(o.space == first.space, ErrorCode::space_mismatch, where, first.name, " is in ", to_string(first.space),
            " memory but ", o.name, " is in ", to_string(o.space), " memory");
  return first.space;
}

}  // namespace

// Runs `call` on the backend of `space`: twell::reference for host (a std::bad_alloc inside it
// is out_of_memory), twell::cuda for device. `call` must hold no unparenthesised comma.
#define TWELL_ON_HOST(where, call) detail::map_host_allocation_failure(where, [&] { return reference::call; })
#if TWELL_HAS_CUDA
#define TWELL_DISPATCH(space, where, call)                                                           \
  do {                                                                                               \
    if (detail::checked_space(space, where) == MemorySpace::host) return TWELL_ON_HOST(where, call); \
    require_cuda_device(where);                                                                      \
    return cuda::call;                                                                               \
  } while (false)
#else
#define TWELL_DISPATCH(space, where, call)                                                                           \
  do {                                                                                                               \
    if (detail::checked_space(space, where) == MemorySpace::host) return TWELL_ON_HOST(where, call);                 \
    fail(ErrorCode::no_device, where, "operands live in device memory but this build of twell has no cuda backend"); \
  } while (false)
#endif

#define TWELL_SPMM(View)                                                                                     \
  template <Value T>                                                                                         \
  void spmm(Op op_a, In<View<const T>> a, In<DenseView<const T>> b, DenseView<T> c, float alpha, float beta, \
            const KernelOptions& options) {                                                                  \
    constexpr const char* where = "twell::spmm";                                                             \
    const MemorySpace s = common_space(where, operand("A", a), operand("B", b), operand("C", c));            \
    TWELL_DISPATCH(s, where, spmm<T>(op_a, a, b, c, alpha, beta, options));                                  \
  }
TWELL_SPMM(CsrView)
TWELL_SPMM(EllView)
TWELL_SPMM(TwellView)
TWELL_SPMM(HybridView)
#undef TWELL_SPMM

#define TWELL_SDDMM(View)                                                                                         \
  template <Value T>                                                                                              \
  void sddmm(In<DenseView<const T>> a, Op op_b, In<DenseView<const T>> b, In<View<const T>> pattern, View<T> out, \
             float alpha, float beta, const KernelOptions& options) {                                             \
    constexpr const char* where = "twell::sddmm";                                                                 \
    const MemorySpace s =                                                                                         \
        common_space(where, operand("A", a), operand("B", b), operand("pattern", pattern), operand("out", out));  \
    TWELL_DISPATCH(s, where, sddmm<T>(a, op_b, b, pattern, out, alpha, beta, options));                           \
  }
TWELL_SDDMM(CsrView)
TWELL_SDDMM(EllView)
TWELL_SDDMM(TwellView)
TWELL_SDDMM(HybridView)
#undef TWELL_SDDMM

template <Value T>
CsrMatrix<T> transpose(CsrView<const T> a, const KernelOptions& options) {
  TWELL_DISPATCH(a.space, "twell::transpose", transpose<T>(a, options));
}
template <Value T>
EllMatrix<T> transpose(EllView<const T> a, const KernelOptions& options) {
  TWELL_DISPATCH(a.space, "twell::transpose", transpose<T>(a, options));
}
template <Value T>
HybridMatrix<T> transpose(TwellView<const T> a, TwellLayout layout, const KernelOptions& options) {
  TWELL_DISPATCH(a.space, "twell::transpose", transpose<T>(a, layout, options));
}
template <Value T>
HybridMatrix<T> transpose(HybridView<const T> a, TwellLayout layout, const KernelOptions& options) {
  TWELL_DISPATCH(a.space(), "twell::transpose", transpose<T>(a, layout, options));
}
template <Value T>
void transpose(In<DenseView<const T>> a, DenseView<T> out, const KernelOptions& options) {
  constexpr const char* where = "twell::transpose";
  TWELL_DISPATCH(common_space(where, operand("a", a), operand("out", out)), where, transpose<T>(a, out, options));
}

#define TWELL_ELEMENTWISE(View)                                                                                   \
  template <Value T>                                                                                              \
  void multiply_on_pattern(In<View<const T>> x, In<View<const T>> y, View<T> out, const KernelOptions& options) { \
    constexpr const char* where = "twell::multiply_on_pattern";                                                   \
    const MemorySpace s = common_space(where, operand("x", x), operand("y", y), operand("out", out));             \
    TWELL_DISPATCH(s, where, multiply_on_pattern<T>(x, y, out, options));                                         \
  }                                                                                                               \
  template <Value T>                                                                                              \
  void add_scaled_sign(In<View<const T>> x, float s, View<T> out, const KernelOptions& options) {                 \
    constexpr const char* where = "twell::add_scaled_sign";                                                       \
    const MemorySpace space = common_space(where, operand("x", x), operand("out", out));                          \
    TWELL_DISPATCH(space, where, add_scaled_sign<T>(x, s, out, options));                                         \
  }                                                                                                               \
  template <Value T>                                                                                              \
  void add_scaled_sign(In<View<const T>> x, float s, In<View<const T>> y, View<T> out,                            \
                       const KernelOptions& options) {                                                            \
    constexpr const char* where = "twell::add_scaled_sign";                                                       \
    const MemorySpace space = common_space(where, operand("x", x), operand("y", y), operand("out", out));         \
    TWELL_DISPATCH(space, where, add_scaled_sign<T>(x, s, y, out, options));                                      \
  }                                                                                                               \
  template <Value T>                                                                                              \
  void multiply_by_activation_derivative(In<View<const T>> x, In<View<const T>> g, Activation act, View<T> out,   \
                                         const KernelOptions& options) {                                          \
    constexpr const char* where = "twell::multiply_by_activation_derivative";                                     \
    const MemorySpace space = common_space(where, operand("x", x), operand("g", g), operand("out", out));         \
    TWELL_DISPATCH(space, where, multiply_by_activation_derivative<T>(x, g, act, out, options));                  \
  }                                                                                                               \
  template <Value T>                                                                                              \
  double l1_norm(View<const T> x, const KernelOptions& options) {                                                 \
    TWELL_DISPATCH(operand("x", x).space, "twell::l1_norm", l1_norm<T>(x, options));                              \
  }                                                                                                               \
  template <Value T>                                                                                              \
  std::int64_t l0_norm(View<const T> x, const KernelOptions& options) {                                           \
    TWELL_DISPATCH(operand("x", x).space, "twell::l0_norm", l0_norm<T>(x, options));                              \
  }
TWELL_ELEMENTWISE(CsrView)
TWELL_ELEMENTWISE(EllView)
TWELL_ELEMENTWISE(TwellView)
TWELL_ELEMENTWISE(HybridView)
#undef TWELL_ELEMENTWISE

template <Value T>
HybridMatrix<T> gemm_to_sparse(DenseView<const T> x, In<DenseView<const T>> w, ActivationSpec act, TwellLayout layout,
                               const ConvertOptions& convert, const KernelOptions& options) {
  constexpr const char* where = "twell::gemm_to_sparse";
  const MemorySpace s = common_space(where, operand("X", x), operand("W", w));
  TWELL_DISPATCH(s, where, gemm_to_sparse<T>(x, w, act, layout, convert, options));
}

#undef TWELL_DISPATCH
#undef TWELL_ON_HOST

#define TWELL_INSTANTIATE_FORMAT(T, View)                                                                              \
  template void spmm<T>(Op, In<View<const T>>, In<DenseView<const T>>, DenseView<T>, float, float,                     \
                        const KernelOptions&);                                                                         \
  template void sddmm<T>(In<DenseView<const T>>, Op, In<DenseView<const T>>, In<View<const T>>, View<T>, float, float, \
                         const KernelOptions&);                                                                        \
  template void multiply_on_pattern<T>(In<View<const T>>, In<View<const T>>, View<T>, const KernelOptions&);           \
  template void add_scaled_sign<T>(In<View<const T>>, float, View<T>, const KernelOptions&);                           \
  template void add_scaled_sign<T>(In<View<const T>>, float, In<View<const T>>, View<T>, const KernelOptions&);      \
  template void multiply_by_activation_derivative<T>(In<View<const T>>, In<View<const T>>, Activation, View<T>,        \
                                                     const KernelOptions&);                                            \
  template double l1_norm<T>(View<const T>, const KernelOptions&);                                                     \
  template std::int64_t l0_norm<T>(View<const T>, const KernelOptions&);
#define TWELL_INSTANTIATE(T)                                                                                          \
  TWELL_INSTANTIATE_FORMAT(T, CsrView)                                                                                \
  TWELL_INSTANTIATE_FORMAT(T, EllView)                                                                                \
  TWELL_INSTANTIATE_FORMAT(T, TwellView)                                                                              \
  TWELL_INSTANTIATE_FORMAT(T, HybridView)                                                                             \
  template CsrMatrix<T> transpose<T>(CsrView<const T>, const KernelOptions&);                                         \
  template EllMatrix<T> transpose<T>(EllView<const T>, const KernelOptions&);                                         \
  template HybridMatrix<T> transpose<T>(TwellView<const T>, TwellLayout, const KernelOptions&);                       \
  template HybridMatrix<T> transpose<T>(HybridView<const T>, TwellLayout, const KernelOptions&);                      \
  template void transpose<T>(In<DenseView<const T>>, DenseView<T>, const KernelOptions&);                            \
  template HybridMatrix<T> gemm_to_sparse<T>(DenseView<const T>, In<DenseView<const T>>, ActivationSpec, TwellLayout, \
                                             const ConvertOptions&, const KernelOptions&);
TWELL_FOR_EACH_VALUE_TYPE(TWELL_INSTANTIATE)
#undef TWELL_INSTANTIATE
#undef TWELL_INSTANTIATE_FORMAT

}  // namespace twell
