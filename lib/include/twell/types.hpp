// Value types, memory spaces and the 16-bit float storage types shared by both backends.
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>
#include <string_view>
#include <type_traits>

#include <twell/error.hpp>

#if defined(__CUDACC__)
#define TWELL_HD __host__ __device__
#else
#define TWELL_HD
#endif

namespace twell {

enum class DType : std::uint8_t { bf16, fp16, fp32 };
enum class MemorySpace : std::uint8_t { host, device };

// False for a value cast from outside the enum, which every operation refuses.
constexpr bool is_memory_space(MemorySpace s) { return s == MemorySpace::host || s == MemorySpace::device; }

constexpr std::string_view to_string(DType t) {
  switch (t) {
    case DType::bf16: return "bf16";
    case DType::fp16: return "fp16";
    case DType::fp32: return "fp32";
  }
  return "?";
}

constexpr std::string_view to_string(MemorySpace s) {
  switch (s) {
    case MemorySpace::host:
      return "host";
    case MemorySpace::device:
      return "device";
  }
  return "?";
}

// bfloat16 storage: bit-compatible with __nv_bfloat16, so device code can reinterpret it.
struct bf16 {
  std::uint16_t bits = 0;
};
// IEEE binary16 storage: bit-compatible with __half.
struct fp16 {
  std::uint16_t bits = 0;
};

TWELL_HD inline std::uint32_t float_bits(float f) {
#if defined(__CUDA_ARCH__)
  return __float_as_uint(f);
#else
  std::uint32_t u;
  std::memcpy(&u, &f, sizeof u);
  return u;
#endif
}

TWELL_HD inline float bits_float(std::uint32_t u) {
#if defined(__CUDA_ARCH__)
  return __uint_as_float(u);
#else
  float f;
  std::memcpy(&f, &u, sizeof f);
  return f;
#endif
}

// Round to nearest even; NaN stays a (quiet) NaN with its sign.
TWELL_HD inline bf16 float_to_bf16(float f) {
  std::uint32_t u = float_bits(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) return bf16{static_cast<std::uint16_t>((u >> 16) | 0x40u)};
  u += 0x7fffu + ((u >> 16) & 1u);
  return bf16{static_cast<std::uint16_t>(u >> 16)};
}

TWELL_HD inline float bf16_to_float(bf16 h) { return bits_float(static_cast<std::uint32_t>(h.bits) << 16); }

// Round to nearest even, with subnormals, overflow to Inf, NaN kept.
TWELL_HD inline fp16 float_to_fp16(float f) {
  const std::uint32_t u = float_bits(f);
  const std::uint16_t sign = static_cast<std::uint16_t>((u >> 16) & 0x8000u);
  const std::uint32_t abs = u & 0x7fffffffu;
  if (abs > 0x7f800000u) return fp16{static_cast<std::uint16_t>(sign | 0x7e00u | ((abs >> 13) & 0x1ffu))};
  if (abs >= 0x477ff000u) return fp16{static_cast<std::uint16_t>(sign | 0x7c00u)};  // rounds past 65504
  if (abs < 0x38800000u) {  // below the smallest normal half: subnormal or zero
    if (abs < 0x33000000u) return fp16{sign};
    const std::uint32_t mant = (abs & 0x7fffffu) | 0x800000u;
    const int shift = 126 - static_cast<int>(abs >> 23);  // 14..24 for this range
    const std::uint32_t half_ulp = 1u << (shift - 1);
    std::uint32_t r = mant >> shift;
    const std::uint32_t rem = mant & ((1u << shift) - 1u);
    if (rem > half_ulp || (rem == half_ulp && (r & 1u))) ++r;
    return fp16{static_cast<std::uint16_t>(sign | r)};
  }
  std::uint32_t r = abs - 0x38000000u;  // rebias exponent 127 -> 15
  r += 0xfffu + ((r >> 13) & 1u);
  return fp16{static_cast<std::uint16_t>(sign | (r >> 13))};
}

TWELL_HD inline float fp16_to_float(fp16 h) {
  const std::uint32_t sign = static_cast<std::uint32_t>(h.bits & 0x8000u) << 16;
  const std::uint32_t exp = (h.bits >> 10) & 0x1fu;
  const std::uint32_t mant = h.bits & 0x3ffu;
  if (exp == 0x1fu) return bits_float(sign | 0x7f800000u | (mant << 13));
  if (exp != 0) return bits_float(sign | ((exp + 112u) << 23) | (mant << 13));
  if (mant == 0) return bits_float(sign);
  // Subnormal half: value = mant * 2^-24, exact in float.
  const float v = static_cast<float>(mant) * 5.9604644775390625e-8f;
  return sign ? -v : v;
}

// Compile-time facts about each value type: its DType, and whether TwELL packs it into the
// high half of a slot (16-bit types) or keeps it in a separate value plane (fp32).
template <class T>
struct ValueTraits;

template <>
struct ValueTraits<bf16> {
  static constexpr DType dtype = DType::bf16;
  static constexpr bool packs_in_slot = true;
  TWELL_HD static float to_float(bf16 v) { return bf16_to_float(v); }
  TWELL_HD static bf16 from_float(float f) { return float_to_bf16(f); }
  TWELL_HD static std::uint16_t to_bits(bf16 v) { return v.bits; }
  TWELL_HD static bf16 from_bits(std::uint16_t b) { return bf16{b}; }
};

template <>
struct ValueTraits<fp16> {
  static constexpr DType dtype = DType::fp16;
  static constexpr bool packs_in_slot = true;
  TWELL_HD static float to_float(fp16 v) { return fp16_to_float(v); }
  TWELL_HD static fp16 from_float(float f) { return float_to_fp16(f); }
  TWELL_HD static std::uint16_t to_bits(fp16 v) { return v.bits; }
  TWELL_HD static fp16 from_bits(std::uint16_t b) { return fp16{b}; }
};

template <>
struct ValueTraits<float> {
  static constexpr DType dtype = DType::fp32;
  static constexpr bool packs_in_slot = false;
  TWELL_HD static float to_float(float v) { return v; }
  TWELL_HD static float from_float(float f) { return f; }
};

template <class T>
concept Value = requires { ValueTraits<std::remove_const_t<T>>::dtype; };

template <Value T>
TWELL_HD inline float to_float(T v) {
  return ValueTraits<std::remove_const_t<T>>::to_float(v);
}

template <Value T>
TWELL_HD inline T from_float(float f) {
  return ValueTraits<T>::from_float(f);
}

template <Value T>
constexpr DType dtype_of = ValueTraits<std::remove_const_t<T>>::dtype;

// The single rule for "is this value stored": stored iff !(|v| <= threshold).
// With threshold 0 that means v != 0, so -0.0 is not stored and NaN always is.
template <Value T>
TWELL_HD inline bool is_stored(T v, float threshold = 0.0f) {
#if !defined(__CUDA_ARCH__)
  // A host process may run with subnormals flushed to zero (-ffast-math, torch's
  // set_flush_denormal), where a subnormal compared as a float reads as 0 and was dropped: at
  // threshold 0 the rule is decided on the bits (the device code keeps subnormals).
  if ((float_bits(threshold) & 0x7fffffffu) == 0u) {
    if constexpr (std::is_same_v<std::remove_const_t<T>, float>)
      return (float_bits(v) & 0x7fffffffu) != 0u;
    else
      return (ValueTraits<std::remove_const_t<T>>::to_bits(v) & 0x7fffu) != 0u;
  }
#endif
  return !(std::fabs(to_float(v)) <= threshold);
}

// Calls f.template operator()<T>() with the C++ type that matches a runtime dtype; a value cast
// from anything else is ErrorCode::invalid_argument (it would otherwise read as one of them).
template <class F>
decltype(auto) dispatch_dtype(DType t, F&& f) {
  switch (t) {
    case DType::bf16: return f.template operator()<bf16>();
    case DType::fp16: return f.template operator()<fp16>();
    case DType::fp32:
      return f.template operator()<float>();
  }
  fail(ErrorCode::invalid_argument, "twell::dispatch_dtype", "dtype ", static_cast<int>(t),
       " is none of bf16, fp16, fp32");
}

}  // namespace twell
