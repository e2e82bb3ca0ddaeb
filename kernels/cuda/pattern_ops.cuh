// Internal to the cuda kernels: the fp32 formulas of the elementwise operations on a pattern that
// the up/down kernel's backward pass (ffn.cu) also applies per entry, shared so that both give
// the same bits. sign(+-0) = 0 and NaN propagates, as in the reference. Not installed.
#pragma once

#include <cuda_runtime.h>

#include <twell/kernels/options.hpp>

namespace twell::cuda::detail {

// x + s * sign(y) (add_scaled_sign).
__device__ __forceinline__ float plus_scaled_sign(float x, float s, float y) {
  return x + s * (isnan(y) ? y : (y > 0.0f ? 1.0f : (y < 0.0f ? -1.0f : 0.0f)));
}

// x * act'(g) (multiply_by_activation_derivative), the reference's derivative formulas.
__device__ __forceinline__ float times_activation_derivative(float x, float g, Activation act) {
  switch (act) {
    case Activation::relu:
      return g > 0.0f ? x : x * 0.0f;
    case Activation::silu: {
      const float s = 1.0f / (1.0f + expf(-g));
      return x * (s * (1.0f + g * (1.0f - s)));
    }
    case Activation::gelu: {
      const float pdf = 0.39894228040143268f * expf(-0.5f * g * g);
      return x * (0.5f * (1.0f + erff(g * 0.70710678118654752f)) + g * pdf);
    }
  }
  return x;
}

}  // namespace twell::cuda::detail
