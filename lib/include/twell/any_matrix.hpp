// AnyMatrix: an owning matrix of any format and value type, chosen at run time (files, the CLI).
#pragma once

#include <bit>
#include <charconv>
#include <cmath>
#include <concepts>
#include <cstdint>
#include <limits>
#include <string>
#include <string_view>
#include <utility>
#include <variant>

#include <twell/convert.hpp>
#include <twell/error.hpp>
#include <twell/formats/csr.hpp>
#include <twell/formats/dense.hpp>
#include <twell/formats/ell.hpp>
#include <twell/formats/hybrid.hpp>
#include <twell/formats/twell_matrix.hpp>
#include <twell/types.hpp>

namespace twell {

enum class Format : std::uint8_t { dense, csr, ell, twell, hybrid };

constexpr std::string_view to_string(Format f) {
  switch (f) {
    case Format::dense: return "dense";
    case Format::csr: return "csr";
    case Format::ell: return "ell";
    case Format::twell: return "twell";
    case Format::hybrid: return "hybrid";
  }
  return "?";
}

// "dense", "csr", "ell", "twell", "hybrid"; anything else is ErrorCode::invalid_argument.
inline Format parse_format(std::string_view name) {
  for (Format f : {Format::dense, Format::csr, Format::ell, Format::twell, Format::hybrid}) {
    if (name == to_string(f)) return f;
  }
  fail(ErrorCode::invalid_argument, "twell::parse_format", "format '", name,
       "' is not one of dense, csr, ell, twell, hybrid");
}

// "bf16", "fp16", "fp32" (also "float32"/"float16"/"bfloat16"); else ErrorCode::invalid_argument.
inline DType parse_dtype(std::string_view name) {
  if (name == "bf16" || name == "bfloat16") return DType::bf16;
  if (name == "fp16" || name == "float16") return DType::fp16;
  if (name == "fp32" || name == "float32") return DType::fp32;
  fail(ErrorCode::invalid_argument, "twell::parse_dtype", "dtype '", name, "' is not one of bf16, fp16, fp32");
}

// f's shortest decimal that reads back as f.
inline std::string shortest_decimal(float f) {
  char buf[32];
  return std::string(buf, std::to_chars(buf, buf + sizeof buf, f).ptr);
}

// f as a double, exactly, whatever the host's denormals-are-zero mode: the hardware's widening
// reads a subnormal float as 0 under it (torch's set_flush_denormal), so a subnormal is rebuilt
// from its bits, by arithmetic on normal doubles only.
inline double exact_double(float f) {
  const std::uint32_t bits = float_bits(f);
  if ((bits & 0x7f800000u) != 0u) return static_cast<double>(f);
  const double magnitude = static_cast<double>(bits & 0x007fffffu) * 0x1p-149;
  return (bits & 0x80000000u) != 0u ? -magnitude : magnitude;
}

// v rounded to T (nearest even), for values that come from outside T (fp64 text, another value
// type): rounding may change them, nothing else may unnoticed. A finite v that rounds past T's
// largest finite value is ErrorCode::unsupported, "where: <element()> is outside the finite range
// of <T> (largest <max>)": element(), called only then, names the element and its value. Inf and
// NaN pass as they are. A nonzero v that rounds to zero returns +-0 with rounded_to_zero set, for
// the caller to drop and count (twell stores no zeros). The result does not depend on the host's
// flush-to-zero mode: fp32's subnormal range is rounded on an integer significand.
template <Value T, class Element>
T narrow(double v, std::string_view where, Element&& element, bool& rounded_to_zero) {
  // From FLT_MAX plus half an ulp on, fp32 rounds to Inf (the cast of such a double is undefined).
  constexpr double kFp32Overflow = 0x1.ffffffp+127;
  constexpr double kFp32Normal = 0x1p-126;
  constexpr float kInf = std::numeric_limits<float>::infinity();
  // A 16-bit type is reached through fp32 rounded to odd: rounding to nearest twice can put a
  // value just past a 16-bit tie onto the tie, which then goes to even (65519.9999999 to fp16
  // would be Inf); an odd last bit on every inexact fp32 leaves the second rounding no such tie.
  constexpr bool kToOdd = !std::is_same_v<T, float>;
  const bool finite = std::isfinite(v);
  const double magnitude = std::fabs(v);
  float wide = 0.0f;
  if (finite && magnitude >= kFp32Overflow) {
    wide = v < 0 ? -kInf : kInf;
  } else if (finite && magnitude < kFp32Normal) {
    const double scaled = magnitude * 0x1p149;  // the fp32 significand, exact (a double denormal reads 0)
    double significand = std::nearbyint(scaled);
    if (kToOdd && significand != scaled && std::fmod(significand, 2.0) == 0.0)
      significand += significand < scaled ? 1.0 : -1.0;
    wide = bits_float((std::signbit(v) ? 0x80000000u : 0u) | static_cast<std::uint32_t>(significand));
  } else {
    wide = static_cast<float>(v);
    if (kToOdd && finite && static_cast<double>(wide) != v && (float_bits(wide) & 1u) == 0)
      wide = std::nextafter(wide, v < static_cast<double>(wide) ? -kInf : kInf);
  }
  const T out = from_float<T>(wide);
  if (finite && std::isinf(to_float(out))) {
    constexpr float kLargest = std::is_same_v<T, float> ? std::numeric_limits<float>::max()
                               : std::is_same_v<T, fp16> ? 65504.0f
                                                         : 0x1.fep+127f;
    fail(ErrorCode::unsupported, where, element(), " is outside the finite range of ", to_string(dtype_of<T>),
         " (largest ", shortest_decimal(kLargest), ")");
  }
  const bool nonzero = (std::bit_cast<std::uint64_t>(v) << 1) != 0u;  // on the bits, as is_stored
  rounded_to_zero = nonzero && !is_stored(out);
  return out;
}
// A float source: widened exactly first (only a float: other arithmetic types take the double one).
template <Value T, class Element, std::same_as<float> F>
T narrow(F v, std::string_view where, Element&& element, bool& rounded_to_zero) {
  return narrow<T>(exact_double(v), where, std::forward<Element>(element), rounded_to_zero);
}

// The Format of each owning matrix type.
template <class M>
struct FormatOf;
template <Value T>
struct FormatOf<DenseMatrix<T>> : std::integral_constant<Format, Format::dense> {};
template <Value T>
struct FormatOf<CsrMatrix<T>> : std::integral_constant<Format, Format::csr> {};
template <Value T>
struct FormatOf<EllMatrix<T>> : std::integral_constant<Format, Format::ell> {};
template <Value T>
struct FormatOf<TwellMatrix<T>> : std::integral_constant<Format, Format::twell> {};
template <Value T>
struct FormatOf<HybridMatrix<T>> : std::integral_constant<Format, Format::hybrid> {};

using AnyMatrix = std::variant<                                                      //
    DenseMatrix<bf16>, DenseMatrix<fp16>, DenseMatrix<float>,                       //
    CsrMatrix<bf16>, CsrMatrix<fp16>, CsrMatrix<float>,                             //
    EllMatrix<bf16>, EllMatrix<fp16>, EllMatrix<float>,                             //
    TwellMatrix<bf16>, TwellMatrix<fp16>, TwellMatrix<float>,                       //
    HybridMatrix<bf16>, HybridMatrix<fp16>, HybridMatrix<float>>;

namespace detail {
template <class M>
struct ValueOf;
template <template <class> class M, Value T>
struct ValueOf<M<T>> {
  using type = T;
};
}  // namespace detail

// The value type of an owning matrix type: ValueOfMatrix<CsrMatrix<fp16>> is fp16.
template <class M>
using ValueOfMatrix = typename detail::ValueOf<std::remove_cvref_t<M>>::type;

inline Format format(const AnyMatrix& m) {
  return std::visit([](const auto& x) { return FormatOf<std::remove_cvref_t<decltype(x)>>::value; }, m);
}
inline DType dtype(const AnyMatrix& m) {
  return std::visit([](const auto& x) { return dtype_of<ValueOfMatrix<decltype(x)>>; }, m);
}
inline std::int64_t rows(const AnyMatrix& m) {
  return std::visit([](const auto& x) { return x.rows(); }, m);
}
inline std::int64_t cols(const AnyMatrix& m) {
  return std::visit([](const auto& x) { return x.cols(); }, m);
}
inline MemorySpace space(const AnyMatrix& m) {
  return std::visit([](const auto& x) { return x.space(); }, m);
}

namespace detail {
template <class M>
void require_holds(const AnyMatrix& m) {
  constexpr Format want_format = FormatOf<M>::value;
  constexpr DType want_dtype = dtype_of<ValueOfMatrix<M>>;
  require(format(m) == want_format, ErrorCode::invalid_argument, "twell::matrix_as", "the matrix is ",
          to_string(format(m)), " (", to_string(dtype(m)), "), not ", to_string(want_format));
  require(dtype(m) == want_dtype, ErrorCode::dtype_mismatch, "twell::matrix_as", "the matrix holds ",
          to_string(dtype(m)), " values, not ", to_string(want_dtype));
}
}  // namespace detail

// The matrix held, as the owning type M: twell::matrix_as<CsrMatrix<bf16>>(read_matrix(path)).
// Another value type is a twell::Error of dtype_mismatch, another format one of invalid_argument,
// each naming what is held (std::get would throw a bare std::bad_variant_access).
template <class M>
const M& matrix_as(const AnyMatrix& m) {
  detail::require_holds<M>(m);
  return std::get<M>(m);
}
template <class M>
M& matrix_as(AnyMatrix& m) {
  detail::require_holds<M>(m);
  return std::get<M>(m);
}
template <class M>
M matrix_as(AnyMatrix&& m) {
  detail::require_holds<M>(m);
  return std::get<M>(std::move(m));
}

// Any format to any other (twell::to_dense ... to_hybrid on the matrix held); `layout` is used
// by TwELL and Hybrid targets only.
inline AnyMatrix convert(const AnyMatrix& m, Format to, TwellLayout layout = {}, const ConvertOptions& options = {}) {
  return std::visit(
      [&](const auto& x) -> AnyMatrix {
        switch (to) {
          case Format::dense: return to_dense(x, options);
          case Format::csr: return to_csr(x, options);
          case Format::ell: return to_ell(x, options);
          case Format::twell: return to_twell(x, layout, options);
          case Format::hybrid:
            return to_hybrid(x, layout, options);
        }
        fail(ErrorCode::invalid_argument, "twell::convert", "format ", static_cast<int>(to),
             " is none of dense, csr, ell, twell, hybrid");
      },
      m);
}

}  // namespace twell
