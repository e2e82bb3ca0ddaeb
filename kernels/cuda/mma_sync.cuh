// Internal to the cuda kernels: the warp-level tensor-core product mma.sync m16n8k16 with 16-bit
// inputs and fp32 accumulation (sm_80+). Not installed.
#pragma once

#include <cstdint>
#include <type_traits>

#include <twell/types.hpp>

namespace twell::cuda::detail {

// d += a b for one 16 x 8 x 16 tile; T is bf16 or half. Fragments as PTX lays them out for lane
// (g, q) = (lane / 4, lane % 4): a = A(g, 2q..2q+1), A(g+8, 2q..), A(g, 2q+8..), A(g+8, 2q+8..);
// b0 = B(2q..2q+1, g), b1 = B(2q+8..2q+9, g); d = D(g, 2q), D(g, 2q+1), D(g+8, 2q), D(g+8, 2q+1).
template <class T>
__device__ __forceinline__ void mma16816(float (&d)[4], const std::uint32_t (&a)[4], std::uint32_t b0,
                                         std::uint32_t b1) {
  if constexpr (std::is_same_v<T, bf16>) {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
        "{%0, %1, %2, %3};\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
  } else {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
        "{%0, %1, %2, %3};\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
  }
}

}  // namespace twell::cuda::detail
