#include <twell/convert.hpp>

#include <cstring>

#include <twell/config.hpp>
#include <twell/converters/backends.hpp>
#include <twell/formats/copy.hpp>
#include <twell/formats/dense_checks.hpp>
#include <twell/formats/validate.hpp>

namespace twell {
namespace {

// Static forwarders to one backend's converters, so that the composition rules below are
// written once for both backends.
#define TWELL_BACKEND_FORWARDERS(ns)                                                                     \
  template <class T>                                                                                     \
  static CsrMatrix<T> dense_to_csr(DenseView<const T> s, const ConvertOptions& o) {                      \
    return ns::dense_to_csr<T>(s, o);                                                                    \
  }                                                                                                      \
  template <class T>                                                                                     \
  static DenseMatrix<T> csr_to_dense(CsrView<const T> s, const ConvertOptions& o) {                      \
    return ns::csr_to_dense<T>(s, o);                                                                    \
  }                                                                                                      \
  template <class T>                                                                                     \
  static EllMatrix<T> dense_to_ell(DenseView<const T> s, const ConvertOptions& o) {                      \
    return ns::dense_to_ell<T>(s, o);                                                                    \
  }                                                                                                      \
  template <class T>                                                                                     \
  static DenseMatrix<T> ell_to_dense(EllView<const T> s, const ConvertOptions& o) {                      \
    return ns::ell_to_dense<T>(s, o);                                                                    \
  }                                                                                                      \
  template <class T>                                                                                     \
  static EllMatrix<T> csr_to_ell(CsrView<const T> s, const ConvertOptions& o) {                          \
    return ns::csr_to_ell<T>(s, o);                                                                      \
  }                                                                                                      \
  template <class T>                                                                                     \
  static CsrMatrix<T> ell_to_csr(EllView<const T> s, const ConvertOptions& o) {                          \
    return ns::ell_to_csr<T>(s, o);                                                                      \
  }                                                                                                      \
  template <class T>                                                                                     \
  static CsrMatrix<T> csr_to_csr(CsrView<const T> s, const ConvertOptions& o) {                          \
    return ns::csr_to_csr<T>(s, o);                                                                      \
  }                                                                                                      \
  template <class T>                                                                                     \
  static TwellMatrix<T> dense_to_twell(DenseView<const T> s, TwellLayout l, const ConvertOptions& o) {   \
    return ns::dense_to_twell<T>(s, l, o);                                                               \
  }                                                                                                      \
  template <class T>                                                                                     \
  static DenseMatrix<T> twell_to_dense(TwellView<const T> s, const ConvertOptions& o) {                  \
    return ns::twell_to_dense<T>(s, o);                                                                  \
  }                                                                                                      \
  template <class T>                                                                                     \
  static TwellMatrix<T> csr_to_twell(CsrView<const T> s, TwellLayout l, const ConvertOptions& o) {       \
    return ns::csr_to_twell<T>(s, l, o);                                                                 \
  }                                                                                                      \
  template <class T>                                                                                     \
  static CsrMatrix<T> twell_to_csr(TwellView<const T> s, const ConvertOptions& o) {                      \
    return ns::twell_to_csr<T>(s, o);                                                                    \
  }                                                                                                      \
  template <class T>                                                                                     \
  static HybridMatrix<T> dense_to_hybrid(DenseView<const T> s, TwellLayout l, const ConvertOptions& o) { \
    return ns::dense_to_hybrid<T>(s, l, o);                                                              \
  }                                                                                                      \
  template <class T>                                                                                     \
  static DenseMatrix<T> hybrid_to_dense(HybridView<const T> s, const ConvertOptions& o) {                \
    return ns::hybrid_to_dense<T>(s, o);                                                                 \
  }                                                                                                      \
  template <class T>                                                                                     \
  static HybridMatrix<T> csr_to_hybrid(CsrView<const T> s, TwellLayout l, const ConvertOptions& o) {     \
    return ns::csr_to_hybrid<T>(s, l, o);                                                                \
  }                                                                                                      \
  template <class T>                                                                                     \
  static CsrMatrix<T> hybrid_to_csr(HybridView<const T> s, const ConvertOptions& o) {                    \
    return ns::hybrid_to_csr<T>(s, o);                                                                   \
  }                                                                                                      \
  template <class T>                                                                                     \
  static HybridMatrix<T> twell_to_hybrid(TwellView<const T> s, TwellLayout l, const ConvertOptions& o) { \
    return ns::twell_to_hybrid<T>(s, l, o);                                                              \
  }                                                                                                      \
  template <class T>                                                                                     \
  static TwellMatrix<T> hybrid_to_twell(HybridView<const T> s, TwellLayout l, const ConvertOptions& o) { \
    return ns::hybrid_to_twell<T>(s, l, o);                                                              \
  }

struct ReferenceBackend {
  TWELL_BACKEND_FORWARDERS(reference)
};
#if TWELL_HAS_CUDA
struct CudaBackend {
  TWELL_BACKEND_FORWARDERS(cuda)
};
#endif
#undef TWELL_BACKEND_FORWARDERS

template <class T>
constexpr T kZero{};

MemorySpace space_of(const auto& view) {
  if constexpr (requires { view.space(); }) {
    return view.space();
  } else {
    return view.space;
  }
}

// Runs f with the backend of `space` (f takes the backend type as a tag argument).
template <class F>
auto on_backend(MemorySpace space, [[maybe_unused]] const char* where, F&& f) {
  if (detail::checked_space(space, where) == MemorySpace::host)
    return detail::map_host_allocation_failure(where, [&] { return f(ReferenceBackend{}); });
#if TWELL_HAS_CUDA
  require_cuda_device(where);
  return f(CudaBackend{});
#else
  fail(ErrorCode::no_device, where, "the source lives in device memory, but twell was built without the cuda backend");
#endif
}

// The options of the first step of a composed conversion: its threshold and stream only (the
// overflow policy, ELL width and report belong to the final step).
ConvertOptions first_step(const ConvertOptions& o) {
  ConvertOptions f;
  f.threshold = o.threshold;
  f.stream = o.stream;
  return f;
}

// Dense holds no invariant beyond its shape, but its converted form is canonical: every value
// that is not stored (-0.0 included) comes out as +0, as it does from every other format. So a
// host dense source is copied only when it is already canonical, and a device one is re-built.
template <class T>
bool unstored_are_plus_zero(DenseView<const T> src) {
  for (std::int64_t i = 0; i < src.rows; ++i)
    for (std::int64_t j = 0; j < src.cols; ++j) {
      const T v = src.at(i, j);
      if (!is_stored(v) && std::memcmp(&v, &kZero<T>, sizeof(T)) != 0) return false;
    }
  return true;
}

template <class T>
bool plain_dense_copy(DenseView<const T> src, const ConvertOptions& o) {
  if (o.threshold != 0.0f || o.report != nullptr || src.space != MemorySpace::host || !find_violation(src).empty())
    return false;
  return unstored_are_plus_zero(src);
}

// The composition rules: one direct converter where the backend has it, CSR in between where
// it does not. A same-format request is re-built like any other (a plain copy kept a source's
// explicit zeros and -0.0 bits on the device, which the host dropped, and ran on the legacy
// stream); only a canonical host dense source is copied, as dense -> dense re-built goes through
// CSR's 32-bit column indices.
template <class B>
struct Compose {
  template <class T>
  static DenseMatrix<T> to_dense(DenseView<const T> s, const ConvertOptions& o) {
    detail::check_value_boundary(s, "twell::to_dense", "source");  // before plain_dense_copy reads it
    if (plain_dense_copy(s, o)) return copy_to(s, s.space);
    const auto csr = B::dense_to_csr(s, first_step(o));
    return B::csr_to_dense(csr.view(), o);
  }
  template <class T>
  static DenseMatrix<T> to_dense(CsrView<const T> s, const ConvertOptions& o) {
    return B::csr_to_dense(s, o);
  }
  template <class T>
  static DenseMatrix<T> to_dense(EllView<const T> s, const ConvertOptions& o) {
    return B::ell_to_dense(s, o);
  }
  template <class T>
  static DenseMatrix<T> to_dense(TwellView<const T> s, const ConvertOptions& o) {
    return B::twell_to_dense(s, o);
  }
  template <class T>
  static DenseMatrix<T> to_dense(HybridView<const T> s, const ConvertOptions& o) {
    return B::hybrid_to_dense(s, o);
  }

  template <class T>
  static CsrMatrix<T> to_csr(DenseView<const T> s, const ConvertOptions& o) {
    return B::dense_to_csr(s, o);
  }
  template <class T>
  static CsrMatrix<T> to_csr(CsrView<const T> s, const ConvertOptions& o) {
    return B::csr_to_csr(s, o);
  }
  template <class T>
  static CsrMatrix<T> to_csr(EllView<const T> s, const ConvertOptions& o) {
    return B::ell_to_csr(s, o);
  }
  template <class T>
  static CsrMatrix<T> to_csr(TwellView<const T> s, const ConvertOptions& o) {
    return B::twell_to_csr(s, o);
  }
  template <class T>
  static CsrMatrix<T> to_csr(HybridView<const T> s, const ConvertOptions& o) {
    return B::hybrid_to_csr(s, o);
  }

  template <class T>
  static EllMatrix<T> to_ell(DenseView<const T> s, const ConvertOptions& o) {
    return B::dense_to_ell(s, o);
  }
  template <class T>
  static EllMatrix<T> to_ell(CsrView<const T> s, const ConvertOptions& o) {
    return B::csr_to_ell(s, o);
  }
  template <class T>
  static EllMatrix<T> to_ell(EllView<const T> s, const ConvertOptions& o) {
    const auto csr = B::ell_to_csr(s, first_step(o));
    return B::csr_to_ell(csr.view(), o);
  }
  template <class T>
  static EllMatrix<T> to_ell(TwellView<const T> s, const ConvertOptions& o) {
    const auto csr = B::twell_to_csr(s, first_step(o));
    return B::csr_to_ell(csr.view(), o);
  }
  template <class T>
  static EllMatrix<T> to_ell(HybridView<const T> s, const ConvertOptions& o) {
    const auto csr = B::hybrid_to_csr(s, first_step(o));
    return B::csr_to_ell(csr.view(), o);
  }

  template <class T>
  static TwellMatrix<T> to_twell(DenseView<const T> s, TwellLayout l, const ConvertOptions& o) {
    return B::dense_to_twell(s, l, o);
  }
  template <class T>
  static TwellMatrix<T> to_twell(CsrView<const T> s, TwellLayout l, const ConvertOptions& o) {
    return B::csr_to_twell(s, l, o);
  }
  template <class T>
  static TwellMatrix<T> to_twell(EllView<const T> s, TwellLayout l, const ConvertOptions& o) {
    const auto csr = B::ell_to_csr(s, first_step(o));
    return B::csr_to_twell(csr.view(), l, o);
  }
  template <class T>
  static TwellMatrix<T> to_twell(TwellView<const T> s, TwellLayout l, const ConvertOptions& o) {
    const auto csr = B::twell_to_csr(s, first_step(o));
    return B::csr_to_twell(csr.view(), l, o);
  }
  template <class T>
  static TwellMatrix<T> to_twell(HybridView<const T> s, TwellLayout l, const ConvertOptions& o) {
    return B::hybrid_to_twell(s, l, o);
  }

  template <class T>
  static HybridMatrix<T> to_hybrid(DenseView<const T> s, TwellLayout l, const ConvertOptions& o) {
    return B::dense_to_hybrid(s, l, o);
  }
  template <class T>
  static HybridMatrix<T> to_hybrid(CsrView<const T> s, TwellLayout l, const ConvertOptions& o) {
    return B::csr_to_hybrid(s, l, o);
  }
  template <class T>
  static HybridMatrix<T> to_hybrid(EllView<const T> s, TwellLayout l, const ConvertOptions& o) {
    const auto csr = B::ell_to_csr(s, first_step(o));
    return B::csr_to_hybrid(csr.view(), l, o);
  }
  template <class T>
  static HybridMatrix<T> to_hybrid(TwellView<const T> s, TwellLayout l, const ConvertOptions& o) {
    return B::twell_to_hybrid(s, l, o);
  }
  template <class T>
  static HybridMatrix<T> to_hybrid(HybridView<const T> s, TwellLayout l, const ConvertOptions& o) {
    const auto csr = B::hybrid_to_csr(s, first_step(o));
    return B::csr_to_hybrid(csr.view(), l, o);
  }
};

void refuse_hybrid_policy(const ConvertOptions& o) {
  require(o.overflow != OverflowPolicy::hybrid, ErrorCode::invalid_argument, "twell::to_twell",
          "options.overflow = hybrid cannot produce a plain TwELL matrix; use twell::to_hybrid, which routes "
          "overflowed rows to a dense block");
}

template <class T>
void to_twell_into_device([[maybe_unused]] DenseView<const T> src, [[maybe_unused]] TwellView<T> dst,
                          [[maybe_unused]] const ConvertOptions& o, [[maybe_unused]] const char* where) {
#if TWELL_HAS_CUDA
  require_cuda_device(where);
  cuda::dense_to_twell_into<T>(src, dst, o);
#else
  fail(ErrorCode::no_device, where, "the source lives in device memory, but twell was built without the cuda backend");
#endif
}

}  // namespace

// Every entry point checks the policy itself: a dense -> dense copy reaches no backend converter.
#define TWELL_DEFINE_CONVERT_FROM(T, View)                                                                           \
  DenseMatrix<T> to_dense(View<const T> src, const ConvertOptions& o) {                                              \
    check_overflow_policy(o.overflow, "twell::to_dense");                                                            \
    return on_backend(space_of(src), "twell::to_dense",                                                              \
                      [&](auto b) { return Compose<decltype(b)>::to_dense(src, o); });                               \
  }                                                                                                                  \
  CsrMatrix<T> to_csr(View<const T> src, const ConvertOptions& o) {                                                  \
    check_overflow_policy(o.overflow, "twell::to_csr");                                                              \
    return on_backend(space_of(src), "twell::to_csr", [&](auto b) { return Compose<decltype(b)>::to_csr(src, o); }); \
  }                                                                                                                  \
  EllMatrix<T> to_ell(View<const T> src, const ConvertOptions& o) {                                                  \
    check_overflow_policy(o.overflow, "twell::to_ell");                                                              \
    check_ell_overflow_policy(o, "twell::to_ell");                                                                   \
    return on_backend(space_of(src), "twell::to_ell", [&](auto b) { return Compose<decltype(b)>::to_ell(src, o); }); \
  }                                                                                                                  \
  TwellMatrix<T> to_twell(View<const T> src, TwellLayout layout, const ConvertOptions& o) {                          \
    check_overflow_policy(o.overflow, "twell::to_twell");                                                            \
    refuse_hybrid_policy(o);                                                                                         \
    return on_backend(space_of(src), "twell::to_twell",                                                              \
                      [&](auto b) { return Compose<decltype(b)>::to_twell(src, layout, o); });                       \
  }                                                                                                                  \
  HybridMatrix<T> to_hybrid(View<const T> src, TwellLayout layout, const ConvertOptions& o) {                        \
    check_overflow_policy(o.overflow, "twell::to_hybrid");                                                           \
    return on_backend(space_of(src), "twell::to_hybrid",                                                             \
                      [&](auto b) { return Compose<decltype(b)>::to_hybrid(src, layout, o); });                      \
  }

#define TWELL_DEFINE_CONVERT_INTO(T)                                                                               \
  void to_twell_into(DenseView<const T> src, TwellView<T> dst, const ConvertOptions& o) {                          \
    constexpr const char* kWhere = "twell::to_twell_into";                                                         \
    check_overflow_policy(o.overflow, kWhere);                                                                     \
    require(src.space == dst.space, ErrorCode::space_mismatch, kWhere,                                             \
            "src and dst live in different memory "                                                                \
            "spaces; copy one of them first");                                                                     \
    if (detail::checked_space(src.space, kWhere) == MemorySpace::host)                                             \
      return detail::map_host_allocation_failure(kWhere, [&] { reference::dense_to_twell_into<T>(src, dst, o); }); \
    to_twell_into_device(src, dst, o, kWhere);                                                                     \
  }
TWELL_FOR_EACH_VALUE_TYPE(TWELL_DEFINE_CONVERT_INTO)
#undef TWELL_DEFINE_CONVERT_INTO

#define TWELL_DEFINE_CONVERT(T)              \
  TWELL_DEFINE_CONVERT_FROM(T, DenseView)    \
  TWELL_DEFINE_CONVERT_FROM(T, CsrView)      \
  TWELL_DEFINE_CONVERT_FROM(T, EllView)      \
  TWELL_DEFINE_CONVERT_FROM(T, TwellView)    \
  TWELL_DEFINE_CONVERT_FROM(T, HybridView)

TWELL_FOR_EACH_VALUE_TYPE(TWELL_DEFINE_CONVERT)
#undef TWELL_DEFINE_CONVERT
#undef TWELL_DEFINE_CONVERT_FROM

}  // namespace twell
