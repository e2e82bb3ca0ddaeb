// Internal helper for explicit instantiation over the value types twell supports.
#pragma once

#include <twell/types.hpp>

// X(T) is expanded once per value type.
#define TWELL_FOR_EACH_VALUE_TYPE(X) \
  X(::twell::bf16)                   \
  X(::twell::fp16)                   \
  X(float)
