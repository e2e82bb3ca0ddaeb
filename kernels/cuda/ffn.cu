// twell::cuda fused FFN inference forward: the gate through gemm_to_sparse (Hybrid), then one
// kernel that walks each token's gate nonzeros, computes the up projection only there, and
// accumulates h Wd without writing h to global memory (docs/gemm_to_sparse.md, "FFN"). The same
// kernel serves training: its forward keeping u and h, and its backward pass (GatedUpDownPlan).
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <initializer_list>
#include <string>
#include <type_traits>
#include <utility>

#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <twell/converters/options.hpp>
#include <twell/formats/view_checks.hpp>
#include <twell/instantiate.hpp>
#include <twell/kernels/backends.hpp>
#include <twell/kernels/detail/checks.hpp>
#include <twell/kernels/ffn_cuda.hpp>

#include "../../converters/cuda/slot_group.cuh"
#include "../../converters/cuda/warp_scan.cuh"
#include "cuda_check.hpp"
#include "cuda_launch.cuh"
#include "hybrid_shadow.cuh"
#include "mma_sync.cuh"
#include "pattern_ops.cuh"

namespace twell::cuda {
namespace {

constexpr int kThreads = 256;

// A Hybrid of the gate's structure, read or written at a gate entry's place (value_at): its slot
// words and its dense block (its maps are the gate's).
struct PlacedPart {
  std::uint32_t* packed = nullptr;
  void* overflow = nullptr;
  std::int64_t ld = 0;
};

// Which products the up/down kernel runs (docs/gemm_to_sparse.md, "The backward's rows"):
//   forward: u = x . Wu^T(j, :) at each gate entry j, h = gate * u, y += h Wd(j, :);
//   backward: the same kernel on other operands (x is dy, Wu^T is Wd, y is dx):
//     dh = dy . Wd(j, :) + scale sign(h), dg = dh * u (* act'(g)), du = dh * gate,
//     dx += dg Wg^T(j, :) + du Wu^T(j, :) (backward_entry; Wd and Wd2 the two N x K row sources).
enum class Pass { forward, backward };

// What a training pass reads or writes at the gate's entries besides the gate:
//   forward: u and h written (keep_u_and_h); u.packed null (inference): nothing kept;
//   backward: u, h (and g for SiLU and GELU, else g.packed null) read; dg and du written.
struct EntryParts {
  PlacedPart u, h, g, dg, du;
  const void* wd2 = nullptr;  // backward: Wu^T, N x K, each entry's second row
  std::int64_t ldwd2 = 0;
  float l1_scale = 0.0f;  // backward: lambda / Z
};

struct FfnArgs {
  std::int64_t m = 0;
  const void* x = nullptr;
  std::int64_t ldx = 0;
  const void* wu_t = nullptr;  // N x K; null for the non-gated FFN (h = gate)
  std::int64_t ldwu_t = 0;
  // Whether each entry gets a dot product over K (the gated FFN and every training pass; set apart
  // from wu_t, which is null when K = 0, where the products are 0 and training still stores them).
  bool gated = false;
  const void* wd = nullptr;  // N x K
  std::int64_t ldwd = 0;
  void* y = nullptr;  // M x K
  std::int64_t ldy = 0;
  std::int64_t k = 0;
  // The gate, a Hybrid M x N whose overflow block holds the first `block_rows` ranks.
  std::int64_t n = 0;
  TwellLayout layout{};
  const std::uint32_t* packed = nullptr;
  const void* value_plane = nullptr;  // fp32 only
  const std::int32_t* row_to_overflow = nullptr;
  const void* overflow = nullptr;
  std::int64_t ld_overflow = 0;
  std::int64_t block_rows = 0;
  bool overflow_vec = false;  // block rows readable 16 bytes at a time (the block kernel lists them)
  // For overflow rows ranked at or past block_rows: the gate GEMM's weights (K x N) and activation.
  const void* w_gate = nullptr;
  std::int64_t ld_w_gate = 0;
  Activation act = Activation::relu;
  float threshold = 0.0f;
  std::int32_t* row_nnz = nullptr;  // M
  const std::int32_t* block_order = nullptr;  // block kernel: CTA b takes token block block_order[b]
  int2* block_class = nullptr;                // count_and_order_kernel: each block's class and rank in it
  // The block kernel's preparation (count_and_order_kernel): the kState* fields below, then the
  // split rows listed for its helpers (docs/gemm_to_sparse.md, "Heavy tokens").
  std::int32_t* block_state = nullptr;
  int2* split_candidates = nullptr;  // M: (row, entries) of rows over kSplitEntries
  // split_capacity 0 turns the split off.
  std::int32_t* split_turn = nullptr;  // per listed row: the next part to add (0 between calls)
  float* split_sum = nullptr;          // split_capacity x k: the sum of the row's parts so far
  std::int64_t split_capacity = 0;
  std::int64_t part_tiles = 0;  // gate tiles per part
  std::int32_t parts = 0;       // parts per split row
  std::int32_t helpers = 0;     // the block kernel's first CTAs, which run the parts
  std::int64_t resident = 0;    // CTAs of the block kernel the GPU runs at once
  std::int32_t block_tokens = 0;  // tokens per block of the block kernel (block_tokens_for)
  // The decode path (ffn_decode_up_kernel, ffn_decode_down_kernel), else null: each token's
  // entries in column order, M x N, row stride n: their columns and h.
  std::int32_t* decode_col = nullptr;
  float* decode_h = nullptr;
  // The decode path on a gate run by GemmToSparsePlan::run_own_rows: row i's dense values are
  // block row i, whatever row_to_overflow says, and its tile counts tell whether the TwELL row
  // lost entries (then the block row is listed); row_over[i] = 1 then, else 0.
  bool own_rows = false;
  std::int32_t* row_over = nullptr;
  // Training (16-bit T, gated, a complete gate: no row past block_rows), else empty: the Hybrids
  // read or written at the gate's entries (EntryParts).
  EntryParts entry_parts{};
};

// Hardware conversions (the portable ones in types.hpp round identically but cost registers).
template <class T>
__device__ __forceinline__ float bits_to_float(std::uint16_t b) {
  if constexpr (std::is_same_v<T, bf16>) {
    return __uint_as_float(static_cast<std::uint32_t>(b) << 16);
  } else {
    return __half2float(__ushort_as_half(b));
  }
}
template <class T>
__device__ __forceinline__ std::uint16_t float_to_bits(float f) {
  if constexpr (std::is_same_v<T, bf16>) {
    return float_to_bf16(f).bits;
  } else {
    return __half_as_ushort(__float2half_rn(f));
  }
}
template <class T>
__device__ __forceinline__ float dev_float(T v) {
  if constexpr (ValueTraits<T>::packs_in_slot) {
    return bits_to_float<T>(v.bits);
  } else {
    return v;
  }
}

// Eight 16-bit values of T packed in 16 bytes as floats, the first in the low half of raw.x.
template <class T>
__device__ __forceinline__ void unpack8(const uint4 raw, float (&out)[8]) {
  const std::uint32_t words[4] = {raw.x, raw.y, raw.z, raw.w};
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    out[2 * i] = bits_to_float<T>(static_cast<std::uint16_t>(words[i] & 0xffffu));
    out[2 * i + 1] = bits_to_float<T>(static_cast<std::uint16_t>(words[i] >> 16));
  }
}

// V consecutive values of T from p as floats (V == 8 reads 16 or 32 bytes, p suitably aligned).
template <class T, int V>
__device__ __forceinline__ void load_vec(const T* p, float (&out)[V]) {
  if constexpr (V == 8 && ValueTraits<T>::packs_in_slot) {
    unpack8<T>(*reinterpret_cast<const uint4*>(p), out);
  } else if constexpr (V == 8) {
    const float4 a = reinterpret_cast<const float4*>(p)[0];
    const float4 b = reinterpret_cast<const float4*>(p)[1];
    out[0] = a.x, out[1] = a.y, out[2] = a.z, out[3] = a.w;
    out[4] = b.x, out[5] = b.y, out[6] = b.z, out[7] = b.w;
  } else {
#pragma unroll
    for (int e = 0; e < V; ++e) out[e] = dev_float(p[e]);
  }
}

template <class T, int V>
__device__ __forceinline__ void store_vec(T* p, const float (&v)[V]) {
  if constexpr (V == 8 && ValueTraits<T>::packs_in_slot) {
    std::uint32_t words[4];
#pragma unroll
    for (int i = 0; i < 4; ++i)
      words[i] = static_cast<std::uint32_t>(float_to_bits<T>(v[2 * i])) |
                 (static_cast<std::uint32_t>(float_to_bits<T>(v[2 * i + 1])) << 16);
    *reinterpret_cast<uint4*>(p) = make_uint4(words[0], words[1], words[2], words[3]);
  } else if constexpr (V == 8) {
    reinterpret_cast<float4*>(p)[0] = make_float4(v[0], v[1], v[2], v[3]);
    reinterpret_cast<float4*>(p)[1] = make_float4(v[4], v[5], v[6], v[7]);
  } else {
#pragma unroll
    for (int e = 0; e < V; ++e) {
      if constexpr (ValueTraits<T>::packs_in_slot) {
        p[e] = ValueTraits<T>::from_bits(float_to_bits<T>(v[e]));
      } else {
        p[e] = v[e];
      }
    }
  }
}

// gemm_to_sparse's rule for one gate entry (docs/gemm_to_sparse.md, "What is stored"): the
// activation in fp32, |a| <= threshold becomes 0, one rounding to T. Returns the stored value as a
// float; +-0 means "not stored" (a value that rounds to -0 is not stored either).
template <class T>
__device__ __forceinline__ float gate_entry(float acc, Activation kind, float threshold) {
  float a = acc;
  switch (kind) {
    case Activation::relu: a = acc < 0.0f ? 0.0f : acc; break;
    case Activation::silu: a = acc / (1.0f + expf(-acc)); break;
    case Activation::gelu: a = 0.5f * acc * (1.0f + erff(acc * 0.70710678118654752f)); break;
  }
  if (fabsf(a) <= threshold) return 0.0f;
  if constexpr (ValueTraits<T>::packs_in_slot) {
    return bits_to_float<T>(float_to_bits<T>(a));
  } else {
    return a;
  }
}

// A gate entry's place in the Hybrids of EntryParts: its slot word in the row's packed words
// (>= 0), or -(column + 1) in the row's dense block row; kNowhere for a gate row recomputed here
// (past the block: never in training, whose gate is complete; not stored if it were).
constexpr std::int32_t kNowhere = INT32_MIN;
__device__ __forceinline__ std::int32_t slot_place(std::int64_t word) { return static_cast<std::int32_t>(word); }
__device__ __forceinline__ std::int32_t dense_place(std::int64_t column) {
  return static_cast<std::int32_t>(-column - 1);
}

// Entry `place` (not kNowhere) of gate row `row` in the Hybrids of EntryParts: its slot word's
// index (word >= 0), or its dense block row o and column.
struct EntryAt {
  std::int64_t word = -1, o = 0, column = 0;
};
__device__ __forceinline__ EntryAt entry_at(const FfnArgs& a, std::int64_t row, std::int32_t place) {
  EntryAt e;
  if (place >= 0) {
    e.word = row * a.layout.packed_width(a.n) + place;
  } else {
    e.o = a.row_to_overflow[row];
    e.column = -std::int64_t{place} - 1;
  }
  return e;
}

// The 16-bit value of `part` at entry e: the high half of its slot word
// (TwellLayout::slot_value_bits), or its element of the dense block.
__device__ __forceinline__ std::uint16_t& value_at(const PlacedPart& part, const EntryAt& e) {
  return e.word >= 0 ? reinterpret_cast<std::uint16_t*>(part.packed + e.word)[1]
                     : static_cast<std::uint16_t*>(part.overflow)[e.o * part.ld + e.column];
}

template <class T>
__device__ __forceinline__ float rounded(float v) {
  return bits_to_float<T>(float_to_bits<T>(v));
}

// Returns h = gate * u for entry `place` of gate row `row`: as the inference kernel takes it (u in
// fp32), or, where u and h are kept, rounded as the composed forward rounds them, after storing
// both.
template <class T>
__device__ __forceinline__ float keep_u_and_h(const FfnArgs& a, std::int64_t row, std::int32_t place, float gate,
                                              float u) {
  if constexpr (ValueTraits<T>::packs_in_slot) {
    if (a.entry_parts.u.packed == nullptr || place == kNowhere) return gate * u;
    const std::uint16_t ub = float_to_bits<T>(u);
    const std::uint16_t hb = float_to_bits<T>(gate * bits_to_float<T>(ub));
    const EntryAt e = entry_at(a, row, place);
    value_at(a.entry_parts.u, e) = ub;
    value_at(a.entry_parts.h, e) = hb;
    return bits_to_float<T>(hb);
  } else {
    return gate * u;  // the host keeps u and h for 16-bit T only
  }
}

// The backward pass at entry `place` of gate row `row` (a = gate, dot = dy . Wd(j, :)), rounded to T
// step by step as the composition of sddmm, add_scaled_sign and multiply_on_pattern (and
// multiply_by_activation_derivative) rounds it (pattern_ops.cuh):
//   dh = round(dot) + scale sign(h); dg = dh * u (* act'(g)); du = dh * a.
// In a slot every step applies; in a dense row, which stores no explicit zeros, a product applies
// where its first factor is stored (elementwise.cu, overflow_kernel), else gives +0. Stores dg
// and du, and returns them for the down step as the low and high halves of a float's bits
// (entry_coefficient). Every entry is a training entry: never kNowhere.
template <class T>
__device__ __forceinline__ float backward_entry(const FfnArgs& a, std::int64_t row, std::int32_t place, float gate,
                                                float dot) {
  if constexpr (ValueTraits<T>::packs_in_slot) {
    const EntryParts& p = a.entry_parts;
    const auto stored = [](float v) { return !(fabsf(v) <= 0.0f); };
    const bool slot = place >= 0;
    const EntryAt e = entry_at(a, row, place);
    const float h = bits_to_float<T>(value_at(p.h, e));
    const float dh = rounded<T>(detail::plus_scaled_sign(rounded<T>(dot), p.l1_scale, h));
    const bool applies = slot || stored(dh);
    float dg = applies ? rounded<T>(dh * bits_to_float<T>(value_at(p.u, e))) : 0.0f;
    if (p.g.packed != nullptr)
      dg = slot || stored(dg)
               ? rounded<T>(detail::times_activation_derivative(dg, bits_to_float<T>(value_at(p.g, e)), a.act))
               : 0.0f;
    const std::uint16_t dgb = float_to_bits<T>(dg), dub = float_to_bits<T>(applies ? dh * gate : 0.0f);
    value_at(p.dg, e) = dgb;
    value_at(p.du, e) = dub;
    return __uint_as_float(static_cast<std::uint32_t>(dgb) | (static_cast<std::uint32_t>(dub) << 16));
  } else {
    return 0.0f;  // the host runs the backward pass for 16-bit T only
  }
}

// The coefficient word of a listed entry once its dot product over K is known: h (forward) or
// dg and du packed (backward).
template <class T, Pass kPass>
__device__ __forceinline__ float entry_coefficient(const FfnArgs& a, std::int64_t row, std::int32_t place, float gate,
                                                   float dot) {
  if constexpr (kPass == Pass::forward) {
    return keep_u_and_h<T>(a, row, place, gate, dot);
  } else {
    return backward_entry<T>(a, row, place, gate, dot);
  }
}

// Rows of N x K weights that an entry's down step adds to y, scaled by its coefficient word: the
// forward's h Wd(j, :); the backward's dg Wg^T(j, :) + du Wu^T(j, :) (Wd, then EntryParts::wd2).
template <Pass kPass>
constexpr int kRowsPerEntry = kPass == Pass::forward ? 1 : 2;

template <class T, Pass kPass>
__device__ __forceinline__ float row_coefficient(float word, int r) {
  if constexpr (kPass == Pass::forward) {
    return word;
  } else {
    const std::uint32_t bits = __float_as_uint(word);
    return bits_to_float<T>(static_cast<std::uint16_t>(r == 0 ? bits & 0xffffu : bits >> 16));
  }
}

template <class T>
__device__ __forceinline__ const T* entry_row(const FfnArgs& a, int r, std::int32_t column) {
  return r == 0 ? static_cast<const T*>(a.wd) + std::int64_t{column} * a.ldwd
                : static_cast<const T*>(a.entry_parts.wd2) + std::int64_t{column} * a.entry_parts.ldwd2;
}

// Sparse up and down projection of one token. CTA: one row of the gate (blockIdx.x) and the
// whole output row y(row, :); a thread owns the output columns tid*V + c*256*V in registers.
// The row's nonzeros are enumerated in column order, 256 candidates at a time, from one of three
// sources chosen by row_to_overflow[row] = o: o < 0, the TwELL slots; 0 <= o < block_rows, the
// dense row o of the overflow block; o >= block_rows (an overflow row the preallocated block
// could not hold; the host does not know it happened), the gate row recomputed here, column by
// column, as gemm_to_sparse's rule applied to x . Wg(:, j) in fp32 (sequential over K, so
// deterministic). Candidates are compacted in order into shared memory by ballots; for the gated
// FFN each warp then takes nonzeros j and reduces x . Wu^T(j, :) over K (x staged in shared
// memory as fp32), h_j = gate_j * u_j stays in shared memory (keep_u_and_h: also stored, rounded,
// where u and h are kept); finally every thread adds
// h_j * Wd(j, own columns) for each j, and thread 0 writes the row's nonzero count to row_nnz.
// Deterministic: fixed order throughout. Preconditions: K <= kFusedFfnMaxK; V == 8 needs K, every leading
// dimension and every pointer aligned to 8 elements (16 bytes for 16-bit types); dynamic shared
// memory K floats + 3 x 256 words. The body is ffn_token (below), which the block kernel also
// runs for the tokens it routes here (rows over kListCap entries, overflow rows past the block,
// and all overflow rows when the block cannot be read 16 bytes at a time). Benchmark:
// bench/suites/ffn.cpp.
//
// The backward pass (kPass) runs the same steps on its operands (Pass): backward_entry in place of
// keep_u_and_h, two weight rows per entry in the down step.
//
// ffn_token: the whole CTA on one token; kChunks * 256 * V >= K; starts with a barrier so that a
// CTA may call it again (or after other work) on the same shared memory.
template <class T, int V, int kChunks, Pass kPass>
__device__ __forceinline__ void ffn_token(const FfnArgs& a, std::int64_t row, float* smem) {
  const bool gated = a.gated;
  float* xs = smem;                                                 // K floats
  auto* list_col = reinterpret_cast<std::int32_t*>(smem + a.k);     // kThreads
  float* list_val = reinterpret_cast<float*>(list_col + kThreads);  // kThreads
  std::int32_t* list_place = reinterpret_cast<std::int32_t*>(list_val + kThreads);  // kThreads: entry_coefficient's
  __shared__ std::int32_t warp_count[kThreads / 32];

  const int tid = static_cast<int>(threadIdx.x);
  const int lane = tid & 31, warp = tid >> 5;
  __syncthreads();
  const std::int32_t orow = a.row_to_overflow[row];
  const bool recompute = orow >= a.block_rows;
  const T* x = static_cast<const T*>(a.x) + row * a.ldx;
  if (gated || recompute) {
    for (std::int64_t k = tid; k < a.k; k += kThreads) xs[k] = dev_float(x[k]);
    __syncthreads();
  }

  float acc[kChunks][V];
#pragma unroll
  for (int c = 0; c < kChunks; ++c)
#pragma unroll
    for (int e = 0; e < V; ++e) acc[c][e] = 0.0f;

  const std::int64_t pw = a.layout.packed_width(a.n);
  const int slots = a.layout.slots();
  const std::int64_t candidates = orow >= 0 ? a.n : pw;
  const std::uint32_t* packed_row = a.packed + row * pw;

  std::int64_t nnz = 0;
  for (std::int64_t c0 = 0; c0 < candidates; c0 += kThreads) {
    const std::int64_t v = c0 + tid;
    bool here = false;
    std::int32_t col = 0, place = kNowhere;
    float val = 0.0f;
    if (v < candidates) {
      if (recompute) {
        const T* wcol = static_cast<const T*>(a.w_gate) + v;
        float dot = 0.0f;
        for (std::int64_t k = 0; k < a.k; ++k) dot = fmaf(xs[k], dev_float(wcol[k * a.ld_w_gate]), dot);
        col = static_cast<std::int32_t>(v);
        val = gate_entry<T>(dot, a.act, a.threshold);
        here = val != 0.0f;
      } else if (orow >= 0) {
        const T g = static_cast<const T*>(a.overflow)[orow * a.ld_overflow + v];
        here = is_stored(g);
        col = static_cast<std::int32_t>(v);
        place = dense_place(v);
        val = dev_float(g);
      } else {
        const std::int64_t t = v / slots;
        const auto p = static_cast<std::uint32_t>(v % slots);
        if (p != 0 && p <= packed_row[t * slots]) {
          const std::uint32_t word = packed_row[v];
          here = true;
          col = static_cast<std::int32_t>(a.layout.tile_begin(t) + TwellLayout::slot_column(word));
          place = slot_place(v);
          if constexpr (ValueTraits<T>::packs_in_slot) {
            val = bits_to_float<T>(TwellLayout::slot_value_bits(word));
          } else {
            val = static_cast<const float*>(a.value_plane)[row * pw + v];
          }
        }
      }
    }
    const std::uint32_t mask = __ballot_sync(0xffffffffu, here);
    if (lane == 0) warp_count[warp] = __popc(mask);
    __syncthreads();  // also orders the previous chunk's reads of the list before these writes
    int offset = 0, total = 0;
#pragma unroll
    for (int w = 0; w < kThreads / 32; ++w) {
      offset += w < warp ? warp_count[w] : 0;
      total += warp_count[w];
    }
    if (here) {
      const int at = offset + __popc(mask & ((1u << lane) - 1u));
      list_col[at] = col;
      list_val[at] = val;
      list_place[at] = place;
    }
    __syncthreads();
    nnz += total;

    if (gated) {
      for (int e = warp; e < total; e += kThreads / 32) {
        const T* wrow = static_cast<const T*>(a.wu_t) + std::int64_t{list_col[e]} * a.ldwu_t;
        float s = 0.0f;
        for (std::int64_t k0 = std::int64_t{lane} * V; k0 < a.k; k0 += 32 * V) {
          float w[V];
          load_vec<T, V>(wrow + k0, w);
#pragma unroll
          for (int i = 0; i < V; ++i) s = fmaf(xs[k0 + i], w[i], s);
        }
#pragma unroll
        for (int d = 16; d > 0; d >>= 1) s += __shfl_xor_sync(0xffffffffu, s, d);
        if (lane == 0) list_val[e] = entry_coefficient<T, kPass>(a, row, list_place[e], list_val[e], s);
      }
      __syncthreads();
    }

    for (int e = 0; e < total; ++e) {
#pragma unroll
      for (int r = 0; r < kRowsPerEntry<kPass>; ++r) {
        const float h = row_coefficient<T, kPass>(list_val[e], r);
        const T* drow = entry_row<T>(a, r, list_col[e]);
#pragma unroll
        for (int c = 0; c < kChunks; ++c) {
          const std::int64_t k0 = (std::int64_t{c} * kThreads + tid) * V;
          if (k0 < a.k) {
            float w[V];
            load_vec<T, V>(drow + k0, w);
#pragma unroll
            for (int i = 0; i < V; ++i) acc[c][i] = fmaf(h, w[i], acc[c][i]);
          }
        }
      }
    }
  }

  T* y = static_cast<T*>(a.y) + row * a.ldy;
#pragma unroll
  for (int c = 0; c < kChunks; ++c) {
    const std::int64_t k0 = (std::int64_t{c} * kThreads + tid) * V;
    if (k0 < a.k) store_vec<T, V>(y + k0, acc[c]);
  }
  if (tid == 0) a.row_nnz[row] = static_cast<std::int32_t>(nnz);
}

template <class T, int V, Pass kPass>
__global__ void __launch_bounds__(kThreads) ffn_rows_kernel(FfnArgs a) {
  ::twell::detail::wait_for_prior_grids();
  extern __shared__ float smem[];
  ffn_token<T, V, static_cast<int>(kFusedFfnMaxK / (kThreads * V)), kPass>(a, blockIdx.x, smem);
}

constexpr int kMaxBlockTokens = 8;  // tokens per CTA of the block kernel: 1, 2, 4 or 8 (block_tokens_for)
constexpr int kMinBlockTokens = 1;

// Tokens per block of the block kernel for M tokens on `resident` CTAs at once. With few waves of
// CTAs the last one sets the kernel's length whatever its share of the work, so the choice is the
// size with the fewest waves x CTA time, a CTA of b tokens taking (2 + b) / 10 the time of an
// 8-token one (a fixed chain of phases, then its entries); ties go to the larger block, which
// shares more Wu rows. H100, paper shape, 0.5 % uniform (docs/gemm_to_sparse.md, "Block size"):
// up/down part at M = 2048 0.117 ms (8) against 0.133 (4), M = 4096 0.218 against 0.198, M = 8192
// 0.334 against 0.367; at M = 16384 8 tokens by 2.6 %. H200, gated forward at M = 256 0.082 ms (1)
// against 0.093 (2) and 0.109 (4); at M = 512 0.095 (2) against 0.103 (1) and 0.107 (4).
std::int32_t block_tokens_for(std::int64_t m, std::int64_t resident) {
  const auto cost = [&](std::int64_t bt) { return ((m + bt - 1) / bt + resident - 1) / resident * (2 + bt); };
  std::int32_t best = kMaxBlockTokens;
  for (std::int32_t bt = kMaxBlockTokens / 2; bt >= kMinBlockTokens; bt /= 2)
    if (cost(bt) < cost(best)) best = bt;
  return best;
}
constexpr int kListCap = 1024;   // gate entries per round of the block kernel
constexpr int kBatchRows = 8;    // Wd rows per batch of the down projection (8 x kChunks loads of 16 bytes)

// Split rows: a token whose one chain of Wu and Wd rows would set the block kernel's length is
// not run by its block's CTA but cut into parts of part_tiles whole tiles, at most kPartColumns
// columns, which the block kernel's helper CTAs claim in order; the parts' partial sums of y are
// added in part order, so the result does not depend on which CTA ran which part. A row is split
// when its entries exceed all of: kSplitEntries (below, its parts' turns cost more than its
// chain), a resident CTA's share of all entries (a batch of many waves, where the chains of the
// other CTAs hide it) and kSplitOverMean times the batch's mean row, at most kSplitAlways (a
// batch of fewer blocks than CTAs, whose length is its longest chain: a sparse batch's ordinary
// rows stay whole, since splitting all of them queues every part behind its turn (a floor of 16
// alone: 3x slower at M = 256 and 0.5 %); but a row over kSplitAlways is always worth its
// parts: M = 64 at 20 % ran 2.8x slower with its ~1100-entry rows whole;
// docs/benchmarks/diagnostics/h200-2026-12-02c-ffn-split-rule.md).
// Such rows are fewer than the resident CTAs (each holds more than 1 / resident of the entries),
// so a split capacity of min(M, resident CTAs) always holds them (UpDownSizes: of either pass).
constexpr std::int32_t kSplitEntries = 64;
constexpr unsigned long long kSplitOverMean = 2;
constexpr unsigned long long kSplitAlways = 256;
constexpr std::int64_t kPartColumns = 1024;
static_assert(kPartColumns <= kListCap, "a part's entries fit one list");
// block_state: filled by count_and_order_kernel (its last CTA resets the counters for the next
// call), read by the block kernel.
enum : int {
  kStateListed = 0,      // split rows listed for the helpers
  kStateNextItem = 1,    // the helpers' item counter
  kStateThreshold = 2,   // a row with more entries than this is split
  kStateLongest = 3,     // the longest counted row
  kStateCandidates = 4,  // rows over kSplitEntries (split_candidates)
  kStateDone = 5,        // CTAs of count_and_order_kernel done
  kStateEntries = 6,     // entries of every counted row, 64 bits
  kStateCounted = 8,     // counted rows (the routed ones are left out of the mean row)
  kStateClasses = 9,     // token blocks per weight class (kWeightClasses words)
  kStateSplitRows = 41   // then the listed rows
};
// Token blocks are ordered by weight class, heaviest first: half octaves of the block's entries
// (class 2h - 1 for [2^h, 1.5 x 2^h), 2h for [1.5 x 2^h, 2^(h+1)), up to class 30 from 49152
// entries), the last class for a block with a row the kernel routes to its per-token body (a
// row whose gate it recomputes, past the overflow block, or an overflow row it cannot read 16
// bytes at a time: the costliest work).
constexpr int kWeightClasses = 32;
static_assert(kStateClasses + kWeightClasses == kStateSplitRows, "the classes' counters fit their place");
static_assert(kWeightClasses == 32, "one warp scans the classes' counts");

__device__ __forceinline__ int weight_class(std::int32_t entries) {
  if (entries < 2) return 0;
  const int h = 31 - __clz(entries);
  return min(kWeightClasses - 2, 2 * h - 1 + ((entries >> (h - 1)) & 1));
}

// Row o of the gate's overflow block as 16-byte vectors (FfnArgs::overflow_vec holds).
template <class T>
__device__ __forceinline__ const uint4* dense_gate_row(const FfnArgs& a, std::int32_t o) {
  return reinterpret_cast<const uint4*>(static_cast<const T*>(a.overflow) + std::int64_t{o} * a.ld_overflow);
}

// Stored flags of 8 consecutive 16-bit gate values (nonzero_flags: bits 15 and 31 of each word).
__device__ __forceinline__ void stored_flags(uint4 q, std::uint32_t (&flags)[4]) {
  detail::LaneChunk<8> c;
  c.w[0] = q.x, c.w[1] = q.y, c.w[2] = q.z, c.w[3] = q.w;
  detail::nonzero_flags<8>(c, flags);
}

__device__ __forceinline__ int flag_count(const std::uint32_t (&flags)[4]) {
  return __popc(flags[0]) + __popc(flags[1]) + __popc(flags[2]) + __popc(flags[3]);
}

__device__ __forceinline__ int stored_in(uint4 q) {
  std::uint32_t flags[4];
  stored_flags(q, flags);
  return flag_count(flags);
}

// Whether the block kernel leaves row o of the gate (row_to_overflow) to ffn_token: an overflow
// row past the block, or any overflow row when the block cannot be read 16 bytes at a time.
__device__ __forceinline__ bool routed_row(const FfnArgs& a, std::int32_t o) {
  return o >= 0 && !(a.overflow_vec && o < a.block_rows);
}

// A warp lists the stored entries of vectors [v_begin, v_end) (8 values each) of a dense gate row
// in column order at list positions base.., token t: a lane takes 8 consecutive columns, a warp
// scan of the lanes' counts places them. Returns the position after the last entry.
template <class T>
__device__ __forceinline__ int list_dense_row(const uint4* row, std::int64_t v_begin, std::int64_t v_end, int t,
                                              int base, int lane, std::int32_t* e_col, float* e_val,
                                              std::uint8_t* e_tok, std::int32_t* e_place) {
  for (std::int64_t v0 = v_begin; v0 < v_end; v0 += 32) {
    const std::int64_t v = v0 + lane;
    const uint4 q = v < v_end ? row[v] : make_uint4(0, 0, 0, 0);
    std::uint32_t flags[4];
    stored_flags(q, flags);
    const int c = flag_count(flags);
    const int inc = detail::warp_inclusive_sum(c, lane);
    int at = base + inc - c;
    const std::uint32_t words[4] = {q.x, q.y, q.z, q.w};
#pragma unroll
    for (int i = 0; i < 8; ++i) {
      if ((flags[i / 2] >> (i % 2 == 0 ? 15 : 31)) & 1u) {
        e_col[at] = static_cast<std::int32_t>(v * 8 + i);
        e_val[at] = bits_to_float<T>(static_cast<std::uint16_t>(words[i / 2] >> (16 * (i % 2))));
        e_tok[at] = static_cast<std::uint8_t>(t);
        e_place[at] = dense_place(v * 8 + i);
        ++at;
      }
    }
    base += __shfl_sync(0xffffffffu, inc, 31);
  }
  return base;
}

// A warp lists the slots of tiles [tau_begin, tau_end) of a TwELL row (pr: its packed words) in
// column order at list positions base.., token t: offsets by a warp scan of the slot-0 counts.
// Returns the position after the last entry.
template <class T>
__device__ __forceinline__ int list_twell_tiles(const std::uint32_t* pr, const TwellLayout& layout,
                                                std::int64_t tau_begin, std::int64_t tau_end, int t, int base, int lane,
                                                std::int32_t* e_col, float* e_val, std::uint8_t* e_tok,
                                                std::int32_t* e_place) {
  const int slots = layout.slots();
  for (std::int64_t tau0 = tau_begin; tau0 < tau_end; tau0 += 32) {
    const std::int64_t tau = tau0 + lane;
    const int c = tau < tau_end ? static_cast<int>(pr[tau * slots]) : 0;
    const int inc = detail::warp_inclusive_sum(c, lane);
    const int ex = inc - c;
    const int in_chunk = tau_end - tau0 < 32 ? static_cast<int>(tau_end - tau0) : 32;
    for (int i = 0; i < in_chunk; ++i) {
      const int ci = __shfl_sync(0xffffffffu, c, i), exi = __shfl_sync(0xffffffffu, ex, i);
      const std::int64_t ti = tau0 + i;
      for (int q = lane; q < ci; q += 32) {
        const std::uint32_t word = pr[ti * slots + 1 + q];
        const int at = base + exi + q;
        e_col[at] = static_cast<std::int32_t>(layout.tile_begin(ti) + TwellLayout::slot_column(word));
        e_val[at] = bits_to_float<T>(TwellLayout::slot_value_bits(word));
        e_tok[at] = static_cast<std::uint8_t>(t);
        e_place[at] = slot_place(ti * slots + 1 + q);
      }
    }
    base += __shfl_sync(0xffffffffu, inc, 31);
  }
  return base;
}

// Row stride of the block kernel's staged x, in elements: 16-bit rows g and g + 1 start 64 bytes
// apart modulo 128, so the 16-byte loads of up_products (4 lanes of 16 bytes per row, 2 rows per
// quarter warp) fall in distinct banks.
__host__ __device__ constexpr std::int64_t block_x_ld(std::int64_t k) { return (k + 63) / 64 * 64 + 32; }

// Dynamic shared memory of the block kernel: x of its tokens (at most kMaxBlockTokens) as T, then
// the round's entry list (column, gate value then its coefficient word, place, sorted position, group
// start, token).
__host__ __device__ constexpr std::size_t block_smem_bytes(std::int64_t k) {
  return static_cast<std::size_t>(kMaxBlockTokens) * static_cast<std::size_t>(block_x_ld(k)) * 2 +
         static_cast<std::size_t>(kListCap) * (4 + 4 + 4 + 2) + static_cast<std::size_t>(kListCap + 2) * 2 +
         static_cast<std::size_t>(kListCap);
}

// The up projection of a round on tensor cores, h = gate * u: u(t, j) = x_t . Wu^T(j, :) for the
// block's tokens (mma rows 0-7, those past a smaller block unread; rows 8-15 are zero) and 8
// distinct units per mma tile (columns); warp w takes tiles w, w + 8, ... mma's order over k is
// free as long as A and B follow the same one: lane (g, q) = (lane / 4, lane % 4) loads 8
// consecutive k, kk = k0 + 8q .. kk + 7, of x row g (a 16-byte shared load) and of Wu^T row j of
// unit g of the tile (a 16-byte global load), which feed two mmas, kk + 0..3 as mma k (2q, 2q+1,
// 2q+8, 2q+9) and then kk + 4..7.
// 32 k per step, kSteps steps of weight loads in flight (8 rows x 64 contiguous bytes per load
// instruction). Accumulator (g, 2q + i) is u of token g and unit 2q + i of the tile, so the lane
// holding it scales that entry's gate value (keep_u_and_h; token g is row row0 + g); tokens of the
// block outside the round (or absent: their shared rows are stale) only fill accumulators nobody
// reads.
template <class T, Pass kPass>
__device__ __forceinline__ void up_products(const FfnArgs& a, std::int64_t row0, const std::uint16_t* xs, int groups,
                                            const std::int16_t* g_start, const std::int16_t* s_pos,
                                            const std::int32_t* e_col, const std::uint8_t* e_tok,
                                            const std::int32_t* e_place, float* e_val, int warp, int lane) {
  const T* wu_t = static_cast<const T*>(a.wu_t);
  const std::int64_t ldwu_t = a.ldwu_t, k = a.k;
  constexpr int kSteps = 8;
  const int g = lane >> 2, q = lane & 3;
  const std::uint16_t* x_row = xs + g * block_x_ld(k);
  for (int tile = warp; tile * 8 < groups; tile += kThreads / 32) {
    const int unit = tile * 8 + g;
    const T* wrow = unit < groups ? wu_t + std::int64_t{e_col[s_pos[g_start[unit]]]} * ldwu_t : nullptr;
    float c[4] = {0.0f, 0.0f, 0.0f, 0.0f};
    for (std::int64_t k0 = 0; k0 < k; k0 += 32 * kSteps) {
      uint4 w[kSteps];
#pragma unroll
      for (int st = 0; st < kSteps; ++st) {
        const std::int64_t kk = k0 + 32 * st + 8 * q;
        w[st] = wrow != nullptr && kk < k ? __ldg(reinterpret_cast<const uint4*>(wrow + kk)) : make_uint4(0, 0, 0, 0);
      }
#pragma unroll
      for (int st = 0; st < kSteps; ++st) {
        const std::int64_t kk = k0 + 32 * st + 8 * q;
        const uint4 x = kk < k ? *reinterpret_cast<const uint4*>(x_row + kk) : make_uint4(0, 0, 0, 0);
        detail::mma16816<T>(c, {x.x, 0u, x.y, 0u}, w[st].x, w[st].y);
        detail::mma16816<T>(c, {x.z, 0u, x.w, 0u}, w[st].z, w[st].w);
      }
    }
#pragma unroll
    for (int i = 0; i < 2; ++i) {
      const int u = tile * 8 + 2 * q + i;
      if (u >= groups) break;
      for (int p = g_start[u]; p < g_start[u + 1]; ++p) {
        const int e = s_pos[p];
        if (e_tok[e] == g) e_val[e] = entry_coefficient<T, kPass>(a, row0 + g, e_place[e], e_val[e], c[i]);
      }
    }
  }
}

// Sparse up and down projection of a block of tokens (16-bit T, 16-byte aligned operands,
// K <= kChunks * 2048). CTAs 0 .. a.helpers - 1 run the parts of the split rows
// (run_split_parts); CTA a.helpers + b: the a.block_tokens tokens from r0 of block
// a.block_order[b] (count_and_order_kernel puts the heaviest blocks first) and their whole output rows;
// 8 warps.
//   1. x of the block staged in shared memory as T (16-byte copies). A token's gate entries were
//      counted by count_and_order_kernel: a split row is left to the helpers; a token with
//      at most kListCap entries is "listed"; a longer one, an overflow row past the block, or any
//      overflow row when !a.overflow_vec, is "routed" to ffn_token (the per-token body above, run
//      by the whole CTA after the rounds; it recomputes a gate row past the block).
//   2. Rounds: consecutive listed tokens whose entries fit kListCap. A warp per token copies its
//      slots, or its dense row's stored entries, into a token-major list (column order; offsets
//      by warp scans of the slot-0 words or of the lanes' counts). Gated: each entry's rank in
//      (unit, token) order is its index in its own token plus, for every other token, a binary
//      search in that token's sorted columns; the entries are placed by rank, group starts
//      (first entry of each unit) compacted by ballots. up_products (above) then computes u for 8
//      distinct units at a time on tensor cores, each Wu^T(j, :) loaded once per round, and
//      scales each entry: h = gate * u (keep_u_and_h).
//   3. Down projection token by token: a thread owns 8 consecutive output columns per 2048
//      (kChunks chunks) in registers and adds h_e * Wd(j_e, own columns) over the token's
//      entries in column order, kBatchRows rows (8 x kChunks loads of 16 bytes) in flight per
//      thread; y written once, rounded to T. At K <= 1024 (down_threads) the CTA's threads split
//      into groups, one token each, so fewer threads idle.
// Deterministic: every sum has a fixed order (no atomics; a split row's parts are added in part
// order). The up product's sums run in the tensor cores' order, so results equal ffn_token's up
// to fp32 rounding of u.
// Estimate at M = 16384, K = 2048, N = 5632, 0.5 % uniform (about 459k (token, unit) pairs):
// Wu^T rows fetched once per distinct (block, unit): N (1 - (1 - p)^8) = 221 per block against
// 225 pairs (2 % saved; neuron-skewed data shares far more), 1.86 GB; Wd rows 4 KB per pair,
// 1.88 GB; slot words 46 MB (read twice, the second from L2), x 64 MB, y 64 MB: about 3.9 GB
// from L2, 0.5 ms at 8 TB/s.
// Why this shape (Nsight Compute and A/B runs, H100, 2026-11-24): with 16 tokens per CTA, 2 CTAs
// per SM and the up product on CUDA cores the kernel took 0.72 ms with L2 60 % busy and the
// issue slots 56 % busy (421M warp-instructions: up product 45 %, down projection 42 %, the
// rank and group phase 9 %). The up product on tensor cores (per 8 units and 32 k: one LDG.128,
// one LDS.128 and two mma per lane) cut the instructions by 14 % but the time only to 0.70 ms:
// each CTA is a chain of dependent phases (counts, list, ranks, up loads, down loads), and two
// CTAs per SM leave the L2 idle while both sit in the short ones. 8 tokens per CTA (x: 33 KB)
// with 8 loads in flight per thread fit 3 CTAs per SM (80 registers): gated FFN 1.267 against
// 1.324 ms (-4.4 %), token-skewed 1.324 against 1.428 ms (-7 %); 4 CTAs per SM (64 registers,
// spills) lost (1.363 ms), and dropping the unit dedup (one mma column per entry, no rank phase)
// spilled at 80 registers and lost too (1.296 ms).
// Shared memory (block_smem_bytes): 33 KB of x + 17 KB of list = 50 KB (K = 2048).
// Benchmark: bench/suites/ffn.cpp.
// The block kernel's dynamic shared memory (block_smem_bytes): x of its tokens, then the list.
struct BlockLists {
  std::uint16_t* xs;       // kMaxBlockTokens rows of x as T, block_x_ld(k) apart
  std::int32_t* e_col;     // kListCap: the entries' columns
  float* e_val;            // kListCap: gate value, then its coefficient word (entry_coefficient)
  std::int32_t* e_place;   // kListCap: the entry's place for entry_coefficient
  std::int16_t* s_pos;     // kListCap: entries in (unit, token) order
  std::int16_t* g_start;   // kListCap + 1 used: first sorted position of each distinct unit
  std::uint8_t* e_tok;     // kListCap: the entry's token in the block
};

__device__ __forceinline__ BlockLists block_lists(unsigned char* smem, std::int64_t k) {
  BlockLists l;
  l.xs = reinterpret_cast<std::uint16_t*>(smem);
  l.e_col = reinterpret_cast<std::int32_t*>(smem + static_cast<std::size_t>(kMaxBlockTokens) * block_x_ld(k) * 2);
  l.e_val = reinterpret_cast<float*>(l.e_col + kListCap);
  l.e_place = reinterpret_cast<std::int32_t*>(l.e_val + kListCap);
  l.s_pos = reinterpret_cast<std::int16_t*>(l.e_place + kListCap);
  l.g_start = l.s_pos + kListCap;
  l.e_tok = reinterpret_cast<std::uint8_t*>(l.g_start + kListCap + 2);
  return l;
}

// x row `row` as T into staged row t (16-byte copies by the whole CTA).
template <class T>
__device__ __forceinline__ void stage_x_row(const FfnArgs& a, std::int64_t row, int t, std::uint16_t* xs) {
  const auto* src = reinterpret_cast<const uint4*>(static_cast<const T*>(a.x) + row * a.ldx);
  const int vecs = static_cast<int>(a.k / 8);
  for (int v = static_cast<int>(threadIdx.x); v < vecs; v += kThreads)
    reinterpret_cast<uint4*>(xs + t * block_x_ld(a.k))[v] = src[v];
}

// Threads per token in the block kernel's down projection: 8 columns each, whole warps, so that
// at K <= 1024 several tokens run side by side instead of leaving threads idle (between 1024 and
// 2048 some threads still idle).
__device__ __forceinline__ int down_threads(std::int64_t k) {
  int cts = kThreads;
  while (cts > 32 && std::int64_t{cts} * 4 >= k) cts /= 2;
  return cts;
}

// Down projection of list entries [e_begin, e_end) into acc by `cts` threads: thread ct of them
// owns the 8 consecutive output columns (c * cts + ct) * 8 of each chunk c and adds
// h_e * Wd(j_e, own columns) in list order (the backward: its two rows per entry, entry_row),
// kBatchRows rows (8 x kChunks loads of 16 bytes) in flight.
template <class T, int kChunks, Pass kPass>
__device__ __forceinline__ void down_entries(const FfnArgs& a, const std::int32_t* e_col, const float* e_val,
                                             int e_begin, int e_end, int ct, int cts, float (&acc)[kChunks][8]) {
  constexpr int kRows = kRowsPerEntry<kPass>;
  constexpr int kBatch = kBatchRows / kRows;  // entries per batch
  for (int e0 = e_begin; e0 < e_end; e0 += kBatch) {
    const int n = e_end - e0 < kBatch ? e_end - e0 : kBatch;
    uint4 wv[kBatch * kRows][kChunks];
#pragma unroll
    for (int b = 0; b < kBatch * kRows; ++b) {
      const T* drow = entry_row<T>(a, b % kRows, e_col[b / kRows < n ? e0 + b / kRows : e0]);
#pragma unroll
      for (int c = 0; c < kChunks; ++c) {
        const std::int64_t k0 = (std::int64_t{c} * cts + ct) * 8;
        wv[b][c] =
            b / kRows < n && k0 < a.k ? __ldg(reinterpret_cast<const uint4*>(drow + k0)) : make_uint4(0, 0, 0, 0);
      }
    }
#pragma unroll
    for (int b = 0; b < kBatch * kRows; ++b) {
      if (b / kRows < n) {
        const float h = row_coefficient<T, kPass>(e_val[e0 + b / kRows], b % kRows);
#pragma unroll
        for (int c = 0; c < kChunks; ++c) {
          const std::uint32_t words[4] = {wv[b][c].x, wv[b][c].y, wv[b][c].z, wv[b][c].w};
#pragma unroll
          for (int i = 0; i < 4; ++i) {
            const float lo = bits_to_float<T>(static_cast<std::uint16_t>(words[i] & 0xffffu));
            const float hi = bits_to_float<T>(static_cast<std::uint16_t>(words[i] >> 16));
            acc[c][2 * i] = fmaf(h, lo, acc[c][2 * i]);
            acc[c][2 * i + 1] = fmaf(h, hi, acc[c][2 * i + 1]);
          }
        }
      }
    }
  }
}

template <int kChunks>
__device__ __forceinline__ void zero(float (&acc)[kChunks][8]) {
#pragma unroll
  for (int c = 0; c < kChunks; ++c)
#pragma unroll
    for (int i = 0; i < 8; ++i) acc[c][i] = 0.0f;
}

// y row `row` = the down projection of list entries [e_begin, e_end) (down_entries), rounded to T.
template <class T, int kChunks, Pass kPass>
__device__ __forceinline__ void down_token(const FfnArgs& a, const std::int32_t* e_col, const float* e_val, int e_begin,
                                           int e_end, std::int64_t row, int ct, int cts) {
  float acc[kChunks][8];
  zero(acc);
  down_entries<T, kChunks, kPass>(a, e_col, e_val, e_begin, e_end, ct, cts, acc);
  T* y = static_cast<T*>(a.y) + row * a.ldy;
#pragma unroll
  for (int c = 0; c < kChunks; ++c) {
    const std::int64_t k0 = (std::int64_t{c} * cts + ct) * 8;
    if (k0 < a.k) store_vec<T, 8>(y + k0, acc[c]);
  }
}

__device__ __forceinline__ std::int32_t load_acquire(const std::int32_t* p) {
  std::int32_t v;
  asm volatile("ld.acquire.gpu.global.b32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
  return v;
}

__device__ __forceinline__ void store_release(std::int32_t* p, std::int32_t v) {
  asm volatile("st.release.gpu.global.b32 [%0], %1;" : : "l"(p), "r"(v) : "memory");
}

// Adds part p's partial sums acc to split row `slot` (y row `row`) after parts 0 .. p - 1: thread
// 0 waits until the row's turn is p, the CTA adds the running sum (in L2, written by the part
// before), and the last part writes y, rounded to T, and resets the turn for the next call. The
// sum runs in part order whichever CTA ran each part, so y does not depend on the schedule.
template <class T, int kChunks>
__device__ __forceinline__ void add_part(const FfnArgs& a, std::int64_t slot, std::int32_t p, std::int64_t row,
                                         float (&acc)[kChunks][8]) {
  const int tid = static_cast<int>(threadIdx.x);
  if (tid == 0)
    while (load_acquire(a.split_turn + slot) != p) __nanosleep(128);
  __syncthreads();
  const bool last = p == a.parts - 1;
  float* sum = a.split_sum + slot * a.k;
#pragma unroll
  for (int c = 0; c < kChunks; ++c) {
    const std::int64_t k0 = (std::int64_t{c} * kThreads + tid) * 8;
    if (k0 >= a.k) continue;
    auto* s4 = reinterpret_cast<float4*>(sum + k0);
    if (p > 0) {
      const float4 lo = __ldcg(s4), hi = __ldcg(s4 + 1);
      const float before[8] = {lo.x, lo.y, lo.z, lo.w, hi.x, hi.y, hi.z, hi.w};
#pragma unroll
      for (int i = 0; i < 8; ++i) acc[c][i] = before[i] + acc[c][i];
    }
    if (last) {
      store_vec<T, 8>(static_cast<T*>(a.y) + row * a.ldy + k0, acc[c]);
    } else {
      __stcg(s4, make_float4(acc[c][0], acc[c][1], acc[c][2], acc[c][3]));
      __stcg(s4 + 1, make_float4(acc[c][4], acc[c][5], acc[c][6], acc[c][7]));
    }
  }
  __syncthreads();
  if (tid == 0) {
    if (last) {
      a.split_turn[slot] = 0;  // the next call is a later launch
    } else {
      __threadfence();
      store_release(a.split_turn + slot, p + 1);
    }
  }
}

// A helper CTA of the block kernel: claims the items (part, split row) in index order, part p of
// a row being its tiles [p, p + 1) * part_tiles, and for each lists the part's entries (slots, or
// stored values of the row's overflow-block row), runs the up product on them (one token: x in
// staged row 0), the down projection into registers, and add_part. Claiming in index order lets
// a part wait for the one before it: that part was claimed earlier, by a CTA already running;
// part-major order spaces a row's parts so that the wait is short.
template <class T, int kChunks, Pass kPass>
__device__ void run_split_parts(const FfnArgs& a, unsigned char* smem) {
  const BlockLists l = block_lists(smem, a.k);
  __shared__ std::int32_t item_s, total_s;
  const int tid = static_cast<int>(threadIdx.x);
  const int lane = tid & 31, warp = tid >> 5;
  const std::int64_t items = std::int64_t{a.block_state[kStateListed]} * a.parts;
  const std::int64_t tiles = a.layout.tiles(a.n);
  for (;;) {
    __syncthreads();  // the previous item is done with the list and item_s
    if (tid == 0) item_s = atomicAdd(a.block_state + kStateNextItem, 1);
    __syncthreads();
    const std::int64_t item = item_s;
    if (item >= items) return;
    const std::int64_t listed = items / a.parts;
    const auto p = static_cast<std::int32_t>(item / listed);  // part-major: a row's parts start apart
    const std::int64_t slot = item % listed;
    const std::int64_t row = a.block_state[kStateSplitRows + slot];
    const std::int64_t tau0 = p * a.part_tiles, tau1 = min(tiles, tau0 + a.part_tiles);
    if (a.gated) stage_x_row<T>(a, row, 0, l.xs);
    if (warp == 0) {
      const std::int32_t o = a.row_to_overflow[row];
      int end = 0;
      if (o >= 0) {
        const std::int64_t c0 = a.layout.tile_begin(tau0), c1 = min(a.n, a.layout.tile_begin(tau1));
        end = list_dense_row<T>(dense_gate_row<T>(a, o), c0 / 8, c1 / 8, 0, 0, lane, l.e_col, l.e_val, l.e_tok,
                                l.e_place);
      } else {
        end = list_twell_tiles<T>(a.packed + row * a.layout.packed_width(a.n), a.layout, tau0, tau1, 0, 0, lane,
                                  l.e_col, l.e_val, l.e_tok, l.e_place);
      }
      if (lane == 0) total_s = end;
    }
    __syncthreads();
    const int total = total_s;
    if (a.gated) {
      // One token: every entry is its own unit, already in column order.
      for (int e = tid; e <= total; e += kThreads) {
        if (e < total) l.s_pos[e] = static_cast<std::int16_t>(e);
        l.g_start[e] = static_cast<std::int16_t>(e);
      }
      __syncthreads();
      up_products<T, kPass>(a, row, l.xs, total, l.g_start, l.s_pos, l.e_col, l.e_tok, l.e_place, l.e_val, warp, lane);
      __syncthreads();
    }
    float acc[kChunks][8];
    zero(acc);
    down_entries<T, kChunks, kPass>(a, l.e_col, l.e_val, 0, total, tid, kThreads, acc);
    add_part<T, kChunks>(a, slot, p, row, acc);
  }
}

template <class T, int kChunks, Pass kPass>
__global__ void __launch_bounds__(kThreads, kChunks == 1 ? 3 : 2) ffn_block_kernel(FfnArgs a) {
  ::twell::detail::wait_for_prior_grids();
  static_assert(ValueTraits<T>::packs_in_slot, "the block kernel stages 16-bit x");
  extern __shared__ __align__(16) unsigned char block_smem[];
  if (static_cast<std::int32_t>(blockIdx.x) < a.helpers) {
    run_split_parts<T, kChunks, kPass>(a, block_smem);
    return;
  }
  const int bt = a.block_tokens;
  const std::int64_t k = a.k;
  const BlockLists l = block_lists(block_smem, k);
  std::uint16_t* xs = l.xs;
  std::int32_t* e_col = l.e_col;
  float* e_val = l.e_val;
  std::int16_t* s_pos = l.s_pos;
  std::int16_t* g_start = l.g_start;
  std::uint8_t* e_tok = l.e_tok;
  std::int32_t* e_place = l.e_place;
  __shared__ std::int32_t cnt[kMaxBlockTokens], state[kMaxBlockTokens], offs[kMaxBlockTokens + 1];
  __shared__ std::int32_t dense_row[kMaxBlockTokens];  // the token's overflow-block row, -1: TwELL slots
  __shared__ std::int32_t warp_count[kThreads / 32];
  enum : std::int32_t { kListed = 0, kRouted = 1, kAbsent = 2 };

  const int tid = static_cast<int>(threadIdx.x);
  const int lane = tid & 31, warp = tid >> 5;
  const bool gated = a.gated;
  const std::int64_t r0 = std::int64_t{a.block_order[blockIdx.x - static_cast<unsigned>(a.helpers)]} * bt;
  const int present = static_cast<int>(a.m - r0 < bt ? a.m - r0 : bt);
  const std::int64_t pw = a.layout.packed_width(a.n);

  if (gated)
    for (int t = 0; t < present; ++t) stage_x_row<T>(a, r0 + t, t, xs);
  // Token states from count_and_order_kernel's counts; a split row is left to the helpers.
  if (tid < bt) {
    const int t = tid;
    std::int32_t st = kAbsent, c = 0, o = -1;
    if (t < present) {
      // Independent loads, one memory latency (row_nnz of a routed row is stale: not used).
      const std::int64_t row = r0 + t;
      o = a.row_to_overflow[row];
      const std::int32_t n_row = a.row_nnz[row];
      const bool split = a.split_capacity > 0 && n_row > a.block_state[kStateThreshold];
      if (routed_row(a, o)) {
        st = kRouted;
      } else {
        c = n_row;
        st = split ? kAbsent : c > kListCap ? kRouted : kListed;
      }
    }
    cnt[t] = c;
    state[t] = st;
    dense_row[t] = o;
  }
  __syncthreads();

  for (int t0 = 0;;) {
    while (t0 < bt && state[t0] != kListed) ++t0;
    if (t0 >= bt) break;
    int t1 = t0, total = 0;
    while (t1 < bt && state[t1] == kListed && total + cnt[t1] <= kListCap) total += cnt[t1++];
    if (tid == 0) {
      int o = 0;
      for (int t = t0; t < t1; ++t) {
        offs[t - t0] = o;
        o += cnt[t];
      }
      offs[t1 - t0] = o;
    }
    __syncthreads();

    for (int t = t0 + warp; t < t1; t += kThreads / 32) {
      const int base = offs[t - t0];
      if (dense_row[t] >= 0) {
        list_dense_row<T>(dense_gate_row<T>(a, dense_row[t]), 0, a.n / 8, t, base, lane, e_col, e_val, e_tok, e_place);
      } else {
        list_twell_tiles<T>(a.packed + (r0 + t) * pw, a.layout, 0, a.layout.tiles(a.n), t, base, lane, e_col, e_val,
                            e_tok, e_place);
      }
    }
    __syncthreads();

    if (gated) {
      for (int e = tid; e < total; e += kThreads) {
        const int t = e_tok[e], c = e_col[e];
        int rank = e - offs[t - t0];
        for (int u = t0; u < t1; ++u) {
          if (u == t) continue;
          const int first = offs[u - t0];
          int lo = first, hi = offs[u - t0 + 1];
          while (lo < hi) {
            const int mid = (lo + hi) >> 1;
            const int cm = e_col[mid];
            if (u < t ? cm <= c : cm < c) {
              lo = mid + 1;
            } else {
              hi = mid;
            }
          }
          rank += lo - first;
        }
        s_pos[rank] = static_cast<std::int16_t>(e);
      }
      __syncthreads();
      int groups = 0;
      for (int p0 = 0; p0 < total; p0 += kThreads) {
        const int p = p0 + tid;
        const bool start = p < total && (p == 0 || e_col[s_pos[p]] != e_col[s_pos[p - 1]]);
        const std::uint32_t mask = __ballot_sync(0xffffffffu, start);
        if (lane == 0) warp_count[warp] = __popc(mask);
        __syncthreads();
        int offset = groups, chunk = 0;
#pragma unroll
        for (int w = 0; w < kThreads / 32; ++w) {
          offset += w < warp ? warp_count[w] : 0;
          chunk += warp_count[w];
        }
        if (start) g_start[offset + __popc(mask & ((1u << lane) - 1u))] = static_cast<std::int16_t>(p);
        groups += chunk;
        __syncthreads();  // warp_count is rewritten by the next chunk
      }
      if (tid == 0) g_start[groups] = static_cast<std::int16_t>(total);
      __syncthreads();

      up_products<T, kPass>(a, r0, xs, groups, g_start, s_pos, e_col, e_tok, e_place, e_val, warp, lane);
      __syncthreads();
    }

    const int cts = down_threads(k);
    if (cts == kThreads) {  // the common case, with the thread count a constant
      for (int t = t0; t < t1; ++t)
        down_token<T, kChunks, kPass>(a, e_col, e_val, offs[t - t0], offs[t - t0 + 1], r0 + t, tid, kThreads);
    } else {
      // Tokens side by side, cts threads each. The first token is read back from lane 0 so that
      // the compiler sees it warp-uniform (cts is a multiple of 32): divergent loop bounds would
      // put reconvergence points in the batches.
      for (int t = t0 + __shfl_sync(0xffffffffu, tid / cts, 0); t < t1; t += kThreads / cts)
        down_token<T, kChunks, kPass>(a, e_col, e_val, offs[t - t0], offs[t - t0 + 1], r0 + t, tid % cts, cts);
    }
    __syncthreads();  // the next round rewrites the list
    t0 = t1;
  }

  for (int t = 0; t < present; ++t)
    if (state[t] == kRouted) ffn_token<T, 8, kChunks, kPass>(a, r0 + t, reinterpret_cast<float*>(block_smem));
}

// The block kernel's preparation, in one pass over the gate's rows (a warp per
// kCountRowsPerWarp rows, a CTA per kCountRows rows, whole token blocks):
//   - gate entries per token: the slot-0 words of a row's tiles, or for an overflow row in the
//     block the stored values of its dense row (16-byte loads, nonzero_flags), into row_nnz
//     (rows the block kernel routes to ffn_token are left to it: it writes their counts);
//   - each token block's weight class (weight_class of its entries; a block with a routed row
//     in the last class) and the blocks per class;
//   - when rows are split: the entry total, the counted rows, the longest row and the candidates
//     (rows over kSplitEntries).
// The last CTA to finish then sets the threshold, max(kSplitEntries, entries / resident CTAs,
// min(kSplitOverMean x entries / counted rows, kSplitAlways)), lists the candidates over it for the
// helpers (none when the longest row is under it, or when they would not fit split_capacity),
// writes the block order and resets the counters for the next call. The order is heaviest class
// first: a CTA's time follows its entries, the heavy blocks take the first CTAs, which the hardware
// starts first in practice, and the light ones fill in around them; a heavy block that started in
// the last wave would set the kernel's length (token-skewed data). A block's rank within its class
// is taken by its counting CTA (one atomic per class the CTA holds), so the last CTA only places
// each block at its class's start plus its rank; ranks follow the CTAs' order of arrival, which
// varies between calls: it changes the speed, never the result.
constexpr int kCountRowsPerWarp = 4;
constexpr int kCountRows = kThreads / 32 * kCountRowsPerWarp;  // rows of a CTA: whole token blocks
static_assert(kCountRows % kMaxBlockTokens == 0, "a CTA counts whole token blocks");
static_assert(kCountRows <= 32, "a lane of warp 0 per counted block, at one token a block");
constexpr int kOrderLoads = 8;  // (class, rank) pairs each thread of the last CTA loads at once

template <class T>
__global__ void __launch_bounds__(kThreads, 4) count_and_order_kernel(FfnArgs a, std::int32_t* order) {
  ::twell::detail::wait_for_prior_grids();
  constexpr int kWarps = kThreads / 32;
  __shared__ std::int32_t warp_entries[kWarps], warp_longest[kWarps], warp_rows[kWarps];
  __shared__ std::int32_t row_weight[kCountRows];  // the row's entries, -1 for a routed row
  __shared__ bool last;
  __shared__ std::int32_t threshold, listed, candidates;
  __shared__ std::int32_t class_place[kWeightClasses];
  const int lane = static_cast<int>(threadIdx.x) & 31, warp = static_cast<int>(threadIdx.x) >> 5;
  const std::int64_t first = (std::int64_t{blockIdx.x} * kWarps + warp) * kCountRowsPerWarp;
  std::int32_t* state = a.block_state;
  const bool split = a.split_capacity > 0;

  std::int32_t counts[kCountRowsPerWarp];
  unsigned counted = 0, routed = 0;  // bit r: row first + r is counted here / routed to ffn_token
#pragma unroll
  for (int r = 0; r < kCountRowsPerWarp; ++r) {  // the rows' loads are independent
    const std::int64_t row = first + r;
    const std::int32_t o = row < a.m ? a.row_to_overflow[row] : -1;
    const bool mine = row < a.m && !routed_row(a, o);
    counted |= mine ? 1u << r : 0u;
    routed |= row < a.m && !mine ? 1u << r : 0u;
    std::int32_t c = 0;
    if (mine && o >= 0) {
      const uint4* dr = dense_gate_row<T>(a, o);
      for (std::int64_t v = lane; v < a.n / 8; v += 32) c += stored_in(dr[v]);
    } else if (mine) {
      const std::uint32_t* pr = a.packed + row * a.layout.packed_width(a.n);
      const std::int64_t tiles = a.layout.tiles(a.n);
      for (std::int64_t tau = lane; tau < tiles; tau += 32) c += static_cast<std::int32_t>(pr[tau * a.layout.slots()]);
    }
    counts[r] = c;
  }
  std::int32_t entries = 0, longest = 0;
#pragma unroll
  for (int r = 0; r < kCountRowsPerWarp; ++r) {
#pragma unroll
    for (int d = 16; d > 0; d >>= 1) counts[r] += __shfl_xor_sync(0xffffffffu, counts[r], d);
    if (lane == 0) row_weight[warp * kCountRowsPerWarp + r] = (routed >> r & 1u) != 0 ? -1 : counts[r];
    if ((counted >> r & 1u) == 0 || lane != 0) continue;
    a.row_nnz[first + r] = counts[r];
    entries += counts[r];
    longest = max(longest, counts[r]);
    if (split && counts[r] > kSplitEntries)
      a.split_candidates[atomicAdd(state + kStateCandidates, 1)] =
          make_int2(static_cast<int>(first + r), counts[r]);
  }
  if (lane == 0) {
    warp_entries[warp] = entries;
    warp_longest[warp] = longest;
    warp_rows[warp] = __popc(counted);
  }
  __syncthreads();
  const int bt = a.block_tokens;
  const std::int64_t blocks = (a.m + bt - 1) / bt;
  if (warp == 0) {  // lane j: the CTA's block j, its class and its rank within the class
    const int cta_blocks = kCountRows / bt;
    const std::int64_t b = std::int64_t{blockIdx.x} * cta_blocks + lane;
    const bool mine = lane < cta_blocks && b < blocks;
    int c = -1;
    if (mine) {
      std::int64_t weight = 0;  // up to 8 rows of N entries: past 2^31 for N > 2^28
      bool has_routed = false;
      for (int t = 0; t < bt; ++t) {
        const std::int32_t w = row_weight[lane * bt + t];
        has_routed |= w < 0;
        weight += max(w, 0);
      }
      c = has_routed ? kWeightClasses - 1
                     : weight_class(static_cast<std::int32_t>(min(weight, std::int64_t{INT32_MAX})));
    }
    // One atomic per class present in the CTA; its result is the first rank of the class's blocks.
    const unsigned same = __match_any_sync(0xffffffffu, c);
    const int leader = __ffs(same) - 1;
    std::int32_t first_rank = 0;
    if (mine && lane == leader) first_rank = atomicAdd(state + kStateClasses + c, __popc(same));
    first_rank = __shfl_sync(0xffffffffu, first_rank, leader);
    if (mine) a.block_class[b] = make_int2(c, first_rank + __popc(same & ((1u << lane) - 1u)));
    __threadfence();  // each lane's class before thread 0's ticket
    __syncwarp();
  }
  if (threadIdx.x == 0) {
    if (split) {
      unsigned long long sum = 0;
      std::int32_t most = 0, rows = 0;
      for (int w = 0; w < kWarps; ++w) {
        sum += static_cast<unsigned long long>(warp_entries[w]);
        most = max(most, warp_longest[w]);
        rows += warp_rows[w];
      }
      atomicAdd(reinterpret_cast<unsigned long long*>(state + kStateEntries), sum);
      atomicMax(state + kStateLongest, most);
      atomicAdd(state + kStateCounted, rows);
    }
    __threadfence();  // this CTA's candidates and sums before its ticket
    last = atomicAdd(state + kStateDone, 1) == static_cast<std::int32_t>(gridDim.x) - 1;
  }
  __syncthreads();
  if (!last) return;

  __threadfence();
  if (threadIdx.x < 32) {  // where each class starts: the heavier classes' blocks before it
    const int c = static_cast<int>(threadIdx.x);
    const std::int32_t n = __ldcg(state + kStateClasses + c);
    std::int32_t heavier = n;  // then the blocks of classes >= c
#pragma unroll
    for (int d = 1; d < 32; d <<= 1) {
      const std::int32_t v = __shfl_down_sync(0xffffffffu, heavier, d);
      if (c + d < 32) heavier += v;
    }
    class_place[c] = heavier - n;
    state[kStateClasses + c] = 0;  // for the next call
  }
  if (threadIdx.x == 0) {
    threshold = INT32_MAX;
    candidates = 0;
    if (split) {
      // The other CTAs' sums are in L2 before their tickets: four loads issued together, one
      // round trip, where read-back atomics would make four in a row.
      const unsigned long long total = __ldcg(reinterpret_cast<const unsigned long long*>(state + kStateEntries));
      const std::int32_t most = __ldcg(state + kStateLongest);
      const std::int32_t found = __ldcg(state + kStateCandidates);
      const std::int32_t rows = __ldcg(state + kStateCounted);
      const unsigned long long share = total / static_cast<unsigned long long>(a.resident);
      const unsigned long long over_mean =
          rows > 0 ? min(kSplitOverMean * total / static_cast<unsigned long long>(rows), kSplitAlways) : 0ull;
      const auto bound =
          static_cast<std::int32_t>(max(static_cast<unsigned long long>(kSplitEntries),
                                        min(max(share, over_mean), static_cast<unsigned long long>(INT32_MAX))));
      if (most > bound) {  // else nothing to split
        threshold = bound;
        candidates = found;
      }
    }
    listed = 0;
  }
  __syncthreads();
  for (std::int32_t i = static_cast<std::int32_t>(threadIdx.x); i < candidates; i += kThreads) {
    const int2 cand = __ldcg(a.split_candidates + i);
    if (cand.y <= threshold) continue;
    const std::int32_t at = atomicAdd(&listed, 1);
    if (at < a.split_capacity) state[kStateSplitRows + at] = cand.x;
  }
  // The block order, heaviest class first (within a class in the order the counting CTAs took
  // their ranks). kOrderLoads (class, rank) pairs per thread are loaded at once: one round trip.
  for (std::int64_t b0 = threadIdx.x; b0 < blocks; b0 += std::int64_t{kThreads} * kOrderLoads) {
    int2 cr[kOrderLoads];
#pragma unroll
    for (int i = 0; i < kOrderLoads; ++i) {
      const std::int64_t b = b0 + std::int64_t{i} * kThreads;
      cr[i] = b < blocks ? __ldcg(a.block_class + b) : make_int2(-1, 0);
    }
#pragma unroll
    for (int i = 0; i < kOrderLoads; ++i)
      if (cr[i].x >= 0)
        order[class_place[cr[i].x] + cr[i].y] = static_cast<std::int32_t>(b0 + std::int64_t{i} * kThreads);
  }
  __syncthreads();
  if (threadIdx.x != 0) return;
  const bool fits = listed <= a.split_capacity;
  state[kStateListed] = fits ? listed : 0;
  state[kStateThreshold] = fits ? threshold : INT32_MAX;
  state[kStateNextItem] = 0;
  state[kStateLongest] = 0;
  state[kStateCandidates] = 0;
  state[kStateDone] = 0;
  state[kStateCounted] = 0;
  *reinterpret_cast<unsigned long long*>(state + kStateEntries) = 0;
}

// The decode path (docs/gemm_to_sparse.md, "Decode path"): at small M a token's entries are too
// few to keep one CTA's memory busy, so the block kernel's chain of dependent loads per token
// (list, up product 8 units at a time, 8 Wd rows in flight per thread) sets the time, and up to
// kDecodeMaxTokens tokens rarely share a unit, so the block kernel's reuse buys little. Two
// kernels spread each token's weight rows over many SMs instead, every load of a phase issued
// before the first is used:
//   ffn_decode_up_kernel, kDecodeUpParts CTAs per token: each lists the token's entries in column
//   order (all of a chunk's candidate words loaded at once, then a block scan), and its warps take
//   every (kDecodeUpParts x 8)-th entry: u = x . Wu^T(j, :) by one warp (decode_dot), h = gate * u
//   (entry_coefficient), stored with the column at the entry's index in the token's list; CTA 0
//   writes the token's entry count into row_nnz;
//   ffn_decode_down_kernel, a CTA per (token, 256 output columns): warp w adds h_e Wd(j_e, its
//   columns) over the w-th of 8 contiguous ranges of the token's list (down_entries), and the CTA
//   adds the 8 partial rows in warp order.
// No count_and_order_kernel, no split rows: nothing waits on another CTA's turn.
constexpr std::int64_t kDecodeMaxTokens = 256;
constexpr int kDecodeUpParts = 4;
constexpr int kDecodePerThread = 4;  // consecutive candidates a thread loads per chunk
constexpr int kDecodeChunk = kThreads * kDecodePerThread;
constexpr int kDecodeSlice = 32 * 8;  // output columns of a down CTA: a warp's lanes x 8
static_assert(kDecodeSlice == kThreads, "thread t of a down CTA adds column t of the warps' rows");
constexpr int kDotLoads = 8;  // 16-byte Wu^T loads in flight per lane in decode_dot

// x . w over K by a warp, x staged as fp32 (16-byte aligned rows, K a multiple of 8): lane l takes
// the 8 values at 8 l + 256 i for i = 0, 1, ... and sums them in that order (ffn_token's order
// with V = 8), then the warp adds the lanes by xor shuffles; kDotLoads loads in flight per lane
// (one round trip for K <= 2048).
template <class T>
__device__ __forceinline__ float decode_dot(const float* xs, const T* w, std::int64_t k, int lane) {
  float s = 0.0f;
  for (std::int64_t k0 = std::int64_t{lane} * 8; k0 < k; k0 += 256 * kDotLoads) {
    uint4 wv[kDotLoads];
#pragma unroll
    for (int b = 0; b < kDotLoads; ++b) {
      const std::int64_t kk = k0 + 256 * b;
      wv[b] = kk < k ? __ldg(reinterpret_cast<const uint4*>(w + kk)) : make_uint4(0, 0, 0, 0);
    }
#pragma unroll
    for (int b = 0; b < kDotLoads; ++b) {
      const std::int64_t kk = k0 + 256 * b;
      if (kk >= k) break;
      float wf[8];
      unpack8<T>(wv[b], wf);
      // x as two 16-byte reads (one float at a time, lanes 32 bytes apart, meet 8-way bank
      // conflicts); the same values in the same order.
      const float4 xa = reinterpret_cast<const float4*>(xs + kk)[0], xb = reinterpret_cast<const float4*>(xs + kk)[1];
      const float xf[8] = {xa.x, xa.y, xa.z, xa.w, xb.x, xb.y, xb.z, xb.w};
#pragma unroll
      for (int i = 0; i < 8; ++i) s = fmaf(xf[i], wf[i], s);
    }
  }
#pragma unroll
  for (int d = 16; d > 0; d >>= 1) s += __shfl_xor_sync(0xffffffffu, s, d);
  return s;
}

// The exclusive prefix of c over the CTA's threads in thread order, and the CTA's total; called by
// every thread (one barrier; warp_total is rewritten by the next call only after another barrier).
__device__ __forceinline__ int block_exclusive_sum(int c, int lane, int warp, int* warp_total, int& total) {
  const int inc = detail::warp_inclusive_sum(c, lane);
  if (lane == 31) warp_total[warp] = inc;
  __syncthreads();
  int before = 0;
  total = 0;
#pragma unroll
  for (int w = 0; w < kThreads / 32; ++w) {
    before += w < warp ? warp_total[w] : 0;
    total += warp_total[w];
  }
  return before + inc - c;
}

// Row `row` (called by every thread of the CTA: one barrier) where one of its TwELL tile counts
// passes S - 1, else -1.
__device__ __forceinline__ std::int32_t own_row_if_overflowed(const TwellLayout& layout, const std::uint32_t* pr,
                                                              std::int64_t pw, std::int64_t row) {
  const std::int64_t slots = layout.slots();
  bool over = false;
  for (std::int64_t t = threadIdx.x; t * slots < pw; t += blockDim.x) over |= layout.overflows(pr[t * slots]);
  return __syncthreads_or(over) ? static_cast<std::int32_t>(row) : -1;
}

// The up product of the decode path; grid (kDecodeUpParts, M), dynamic shared memory K floats
// (x) + kDecodeChunk entries. The host takes this path only where every overflow row sits in the
// gate's block (no row to recompute) and the operands allow 16-byte loads. A chunk's candidates
// are the TwELL row's slot words or, for an overflow row, the dense row's values; thread t loads
// candidates 4t .. 4t + 3 of the chunk (and their tiles' count words) together, then the block
// scan places the stored ones in column order.
template <class T>
__global__ void __launch_bounds__(kThreads, 2) ffn_decode_up_kernel(FfnArgs a) {
  ::twell::detail::wait_for_prior_grids();
  extern __shared__ __align__(16) float decode_smem[];
  float* xs = decode_smem;  // K floats (gated)
  auto* l_col = reinterpret_cast<std::int32_t*>(decode_smem + a.k);
  float* l_gate = reinterpret_cast<float*>(l_col + kDecodeChunk);
  __shared__ int warp_total[kThreads / 32];
  const int tid = static_cast<int>(threadIdx.x), lane = tid & 31, warp = tid >> 5;
  const std::int64_t row = blockIdx.y;
  const int owner = static_cast<int>(blockIdx.x) * (kThreads / 32) + warp;
  const int owners = static_cast<int>(gridDim.x) * (kThreads / 32);
  const std::int64_t slots = a.layout.slots(), pw = a.layout.packed_width(a.n);
  const std::uint32_t* pr = a.packed + row * pw;

  // x's loads first, so that they and the first chunk's (or the tile counts') share one round
  // trip (K <= kFusedFfnMaxK: at most 4 vectors of 8 per thread).
  constexpr int kXLoads = static_cast<int>(kFusedFfnMaxK / (8 * kThreads));
  const auto* x4 = reinterpret_cast<const uint4*>(static_cast<const T*>(a.x) + row * a.ldx);
  const std::int64_t x_vecs = a.gated ? a.k / 8 : 0;
  uint4 xv[kXLoads];
#pragma unroll
  for (int j = 0; j < kXLoads; ++j) {
    const std::int64_t v = tid + std::int64_t{j} * kThreads;
    xv[j] = v < x_vecs ? x4[v] : make_uint4(0, 0, 0, 0);
  }

  // The row's source, fixed before the chunk loop (a value the loop changed slowed heavy rows'
  // loops by 10-15 %, h200-2026-12-02h): the overflow map's block row, or with the gate's own rows
  // block row `row` where a tile count passes its S - 1 slots (the packers' test: the TwELL row
  // lost entries).
  const std::int32_t orow = a.own_rows ? own_row_if_overflowed(a.layout, pr, pw, row) : a.row_to_overflow[row];
  const std::int64_t candidates = orow >= 0 ? a.n : pw;
  const T* dense = orow >= 0 ? static_cast<const T*>(a.overflow) + std::int64_t{orow} * a.ld_overflow : nullptr;

  std::int64_t listed = 0;  // entries of the chunks before
  for (std::int64_t c0 = 0; c0 < candidates; c0 += kDecodeChunk) {
    const std::int64_t v0 = c0 + std::int64_t{tid} * kDecodePerThread;
    std::uint32_t word[kDecodePerThread], count[kDecodePerThread];
    T g[kDecodePerThread];
#pragma unroll
    for (int i = 0; i < kDecodePerThread; ++i) {
      const std::int64_t v = v0 + i;
      word[i] = count[i] = 0;
      g[i] = T{};
      if (v >= candidates) continue;
      if (orow >= 0) {
        g[i] = dense[v];
      } else {
        word[i] = pr[v];
        count[i] = pr[v - v % slots];
      }
    }
    if (c0 == 0) {
#pragma unroll
      for (int j = 0; j < kXLoads; ++j) {
        const std::int64_t v = tid + std::int64_t{j} * kThreads;
        if (v >= x_vecs) continue;
        float f[8];
        unpack8<T>(xv[j], f);
        reinterpret_cast<float4*>(xs + 8 * v)[0] = make_float4(f[0], f[1], f[2], f[3]);
        reinterpret_cast<float4*>(xs + 8 * v)[1] = make_float4(f[4], f[5], f[6], f[7]);
      }
    }
    bool here[kDecodePerThread];
    std::int32_t col[kDecodePerThread];
    float val[kDecodePerThread];
    int c = 0;
#pragma unroll
    for (int i = 0; i < kDecodePerThread; ++i) {
      const std::int64_t v = v0 + i;
      here[i] = false;
      col[i] = 0;
      val[i] = 0.0f;
      if (v >= candidates) continue;
      if (orow >= 0) {
        here[i] = is_stored(g[i]);
        col[i] = static_cast<std::int32_t>(v);
        val[i] = dev_float(g[i]);
      } else {
        const std::int64_t t = v / slots, p = v % slots;
        here[i] = p != 0 && p <= count[i];
        col[i] = static_cast<std::int32_t>(a.layout.tile_begin(t) + TwellLayout::slot_column(word[i]));
        val[i] = bits_to_float<T>(TwellLayout::slot_value_bits(word[i]));
      }
      c += here[i] ? 1 : 0;
    }
    int total = 0;
    int at = block_exclusive_sum(c, lane, warp, warp_total, total);
#pragma unroll
    for (int i = 0; i < kDecodePerThread; ++i) {
      if (!here[i]) continue;
      l_col[at] = col[i];
      l_gate[at] = val[i];
      ++at;
    }
    __syncthreads();

    // Entry e of the token (listed + e here) belongs to warp owner (listed + e) % owners.
    const std::int64_t skip = ((owner - listed) % owners + owners) % owners;
    std::int32_t* out_col = a.decode_col + row * a.n + listed;
    float* out_h = a.decode_h + row * a.n + listed;
    for (std::int64_t e = skip; e < total; e += owners) {
      const std::int32_t j = l_col[e];
      float h = l_gate[e];
      if (a.gated)
        h = entry_coefficient<T, Pass::forward>(
            a, row, kNowhere, h,
            decode_dot<T>(xs, static_cast<const T*>(a.wu_t) + std::int64_t{j} * a.ldwu_t, a.k, lane));
      if (lane == 0) {
        out_col[e] = j;
        out_h[e] = h;
      }
    }
    listed += total;
    __syncthreads();  // the next chunk rewrites the list and warp_total
  }
  if (blockIdx.x == 0 && tid == 0) {
    a.row_nnz[row] = static_cast<std::int32_t>(listed);
    if (a.row_over != nullptr) a.row_over[row] = orow >= 0 ? 1 : 0;
  }
}

// The down projection of the decode path; grid (ceil(K / 256), M). Warp w adds, for the CTA's 256
// columns (8 a lane), h_e Wd(j_e, :) over entries [E w / 8, E (w + 1) / 8) of the token's E in
// list order (column order), in fp32 from 0; thread t then writes column t of y as
// ((P_0 + P_1) + ...) + P_7, rounded to T once. The order depends on E alone.
template <class T>
__global__ void __launch_bounds__(kThreads) ffn_decode_down_kernel(FfnArgs a) {
  ::twell::detail::wait_for_prior_grids();
  constexpr int kWarps = kThreads / 32;
  __shared__ __align__(16) float partial[kWarps][kDecodeSlice];
  const int tid = static_cast<int>(threadIdx.x), lane = tid & 31, warp = tid >> 5;
  const std::int64_t row = blockIdx.y, s0 = std::int64_t{blockIdx.x} * kDecodeSlice;
  const std::int64_t entries = a.row_nnz[row];
  float acc[1][8];
  zero(acc);
  // With one chunk, thread ct of down_entries owns columns 8 ct .. 8 ct + 7.
  down_entries<T, 1, Pass::forward>(
      a, a.decode_col + row * a.n, a.decode_h + row * a.n, static_cast<int>(entries * warp / kWarps),
      static_cast<int>(entries * (warp + 1) / kWarps), static_cast<int>(s0 / 8) + lane, 32, acc);
  auto* mine = reinterpret_cast<float4*>(&partial[warp][lane * 8]);
  mine[0] = make_float4(acc[0][0], acc[0][1], acc[0][2], acc[0][3]);
  mine[1] = make_float4(acc[0][4], acc[0][5], acc[0][6], acc[0][7]);
  __syncthreads();
  if (s0 + tid >= a.k) return;
  float sum[1] = {partial[0][tid]};
#pragma unroll
  for (int w = 1; w < kWarps; ++w) sum[0] += partial[w][tid];
  store_vec<T, 1>(static_cast<T*>(a.y) + row * a.ldy + s0 + tid, sum);
}

bool aligned16(const void* p) { return reinterpret_cast<std::uintptr_t>(p) % 16 == 0; }

using twell::detail::check_device_operand;

// w_in (wg or wu) is K x N, wd is N x K.
template <class T>
void check_weights(DenseView<const T> w_in, DenseView<const T> wd, const char* where) {
  check_device_operand(w_in, where, "wu");
  check_device_operand(wd, where, "wd");
  require(wd.rows == w_in.cols && wd.cols == w_in.rows, ErrorCode::shape_mismatch, where, "wd is ", wd.rows, " x ",
          wd.cols, " but wu is ", w_in.rows, " x ", w_in.cols, " (wd must be ", w_in.cols, " x ", w_in.rows, ")");
  require(w_in.rows <= kFusedFfnMaxK, ErrorCode::unsupported, where, "K = ", w_in.rows,
          " exceeds the fused FFN kernel's limit of ", kFusedFfnMaxK);
}

// x (or the backward's dy) and y (dx), M x K; named as the caller names them.
template <class T>
void check_io(DenseView<const T> x, DenseView<T> y, std::int64_t k, const char* where, const char* x_name = "x",
              const char* y_name = "y") {
  check_device_operand(x, where, x_name);
  check_device_operand(y, where, y_name);
  require(x.cols == k, ErrorCode::shape_mismatch, where, x_name, " is ", x.rows, " x ", x.cols,
          " but the weights need ", k, " columns");
  require(y.rows == x.rows && y.cols == k, ErrorCode::shape_mismatch, where, y_name, " is ", y.rows, " x ", y.cols,
          " but ", x_name, " needs ", x.rows, " x ", k);
  require(x.rows <= INT32_MAX, ErrorCode::unsupported, where, "M = ", x.rows, " exceeds 2^31 - 1 rows");
}

// Parts per split row for a gate of n columns: whole tiles, at most kPartColumns columns each;
// 0 (no splitting) when a tile is wider than that or the row would be a single part.
std::int64_t split_parts(const TwellLayout& layout, std::int64_t n) {
  if (layout.tile > kPartColumns) return 0;
  const std::int64_t part_tiles = kPartColumns / layout.tile;
  const std::int64_t parts = (layout.tiles(n) + part_tiles - 1) / part_tiles;
  return parts >= 2 ? parts : 0;
}

// The block kernel's instance for K (two 2048-column chunks past 2048).
template <class T, Pass kPass>
auto block_kernel_for(std::int64_t k) {
  return k > kThreads * 8 ? ffn_block_kernel<T, 2, kPass> : ffn_block_kernel<T, 1, kPass>;
}

// The device's SMs and the block kernel's CTAs it runs at once.
struct BlockKernelFit {
  std::int64_t sms = 0, resident = 0;
};

// Whether the block kernel takes K (16-bit T; its shared memory must fit the device), and then
// its fit on the device; sets the kernel's shared-memory limit.
template <class T, Pass kPass>
bool block_kernel_fits(std::int64_t k, BlockKernelFit& fit, const char* where) {
  if constexpr (!ValueTraits<T>::packs_in_slot) {
    return false;
  } else {
    if (k > 2 * kThreads * 8) return false;
    const std::size_t bytes = block_smem_bytes(k);
    const auto kernel = block_kernel_for<T, kPass>(k);
    if (bytes > static_cast<std::size_t>(::twell::detail::dynamic_shared_limit(kernel, where))) return false;
    int device = 0, sms = 0, per_sm = 0;
    ::twell::detail::check_cuda(cudaGetDevice(&device), where);
    ::twell::detail::allow_dynamic_shared(kernel, bytes, where);
    ::twell::detail::check_cuda(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device), where);
    per_sm = ::twell::detail::resident_blocks_per_sm(kernel, kThreads, bytes, where);
    fit.sms = sms;
    fit.resident = std::int64_t{sms} * std::max(per_sm, 1);
    return true;
  }
}

// The up/down kernel's memory as sparse_rows takes it: a plan's UpDownBuffers (memory_of) or one
// call's stream-ordered scratch (UpDownScratch). block_state null: the block kernel does not run;
// decode_col null: the decode path does not.
struct UpDownMemory {
  std::int32_t* row_nnz = nullptr;
  std::int32_t* block_order = nullptr;
  int2* block_class = nullptr;
  std::int32_t* block_state = nullptr;
  int2* split_candidates = nullptr;
  std::int32_t* split_turn = nullptr;
  float* split_sum = nullptr;
  std::int64_t split_capacity = 0;
  std::int32_t* decode_col = nullptr;
  float* decode_h = nullptr;
  std::int32_t* decode_over = nullptr;
};

// What the up/down kernel needs for M tokens, K and N: row_nnz M words, block_order one and
// block_class two per block of the smallest size (a token); where the block kernel takes K,
// block_state, and with split rows (capacity min(M, resident CTAs of either pass's kernel)) 2 M
// candidate words, a turn per split row and its K fp32 partial sums.
struct UpDownSizes {
  std::size_t row_nnz = 0, block_order = 0, block_state = 0, capacity = 0, candidates = 0, sum = 0;
  template <class T>
  static UpDownSizes of(std::int64_t m, std::int64_t k, std::int64_t n, const TwellLayout& layout, const char* where) {
    UpDownSizes z;
    z.row_nnz = static_cast<std::size_t>(m);
    z.block_order = static_cast<std::size_t>((m + kMinBlockTokens - 1) / kMinBlockTokens);
    BlockKernelFit fit, backward;
    if (!block_kernel_fits<T, Pass::forward>(k, fit, where) ||
        !block_kernel_fits<T, Pass::backward>(k, backward, where))
      return z;
    const std::int64_t resident = std::max(fit.resident, backward.resident);  // the buffers serve both passes
    if (split_parts(layout, n) > 0) z.capacity = static_cast<std::size_t>(std::min(m, resident));
    z.block_state = kStateSplitRows + z.capacity;
    if (z.capacity > 0) {
      z.candidates = 2 * static_cast<std::size_t>(m);
      z.sum = z.capacity * static_cast<std::size_t>(k);
    }
    return z;
  }
};

template <class T>
UpDownMemory memory_of(detail::UpDownBuffers<T>& b) {
  return {b.row_nnz.data(),
          b.block_order.data(),
          reinterpret_cast<int2*>(b.block_class.data()),
          b.block_state.data(),
          reinterpret_cast<int2*>(b.split_candidates.data()),
          b.split_turn.data(),
          b.split_sum.data(),
          b.split_capacity,
          b.decode_col.size() > 0 ? b.decode_col.data() : nullptr,
          b.decode_h.size() > 0 ? b.decode_h.data() : nullptr,
          b.decode_over.size() > 0 ? b.decode_over.data() : nullptr};
}

// UpDownBuffers for one call, stream-ordered scratch from twell's pool (no device-wide wait,
// unlike a Buffer's free); the block kernel's state and turns zeroed as the plan's are.
class UpDownScratch {
 public:
  UpDownScratch(const UpDownSizes& z, cudaStream_t stream, const char* where)
      : row_nnz_(z.row_nnz * 4, stream, where),
        order_(z.block_order * 4, stream, where),
        class_(z.block_order * 8, stream, where),
        state_(z.block_state * 4, stream, where),
        candidates_(z.candidates * 4, stream, where),
        turn_(z.capacity * 4, stream, where),
        sum_(z.sum * 4, stream, where),
        capacity_(z.capacity) {
    for (const auto& [part, words] : {std::pair{&state_, z.block_state}, std::pair{&turn_, z.capacity}})
      ::twell::detail::fill_bytes_async(part->as<void>(), 0, words * 4, stream, where);
  }
  UpDownMemory memory() const {
    return {row_nnz_.as<std::int32_t>(),
            order_.as<std::int32_t>(),
            class_.as<int2>(),
            state_.as<std::int32_t>(),
            candidates_.as<int2>(),
            turn_.as<std::int32_t>(),
            sum_.as<float>(),
            static_cast<std::int64_t>(capacity_)};
  }

 private:
  detail::Scratch row_nnz_, order_, class_, state_, candidates_, turn_, sum_;
  std::size_t capacity_;
};

// A Hybrid as EntryParts places it (a part the kernel only reads is passed the same way).
template <class T>
PlacedPart placed(HybridView<T> v) {
  return {v.twell.packed, v.overflow.data, v.overflow.ld};
}
template <class T>
PlacedPart placed(HybridView<const T> v) {
  return {const_cast<std::uint32_t*>(v.twell.packed), const_cast<T*>(v.overflow.data), v.overflow.ld};
}

// Whether the up/down kernels' 16-byte loads serve these operands (the decode path, the block
// kernel and ffn_rows_kernel's vector form).
template <class T>
bool vector_operands(DenseView<const T> x, const T* wu_t, std::int64_t ldwu_t, DenseView<const T> wd, DenseView<T> y) {
  return x.cols % 8 == 0 && x.ld % 8 == 0 && wd.ld % 8 == 0 && y.ld % 8 == 0 && aligned16(x.data) &&
         aligned16(wd.data) && aligned16(y.data) && (wu_t == nullptr || (ldwu_t % 8 == 0 && aligned16(wu_t)));
}

// Whether sparse_rows takes the decode path: the forward pass (no u and h kept) on operands that
// allow 16-byte loads (`vec`), where the plan holds its lists (M <= kDecodeMaxTokens) and the
// gate's block holds every overflow row (none to recompute). forward() asks it before the gate
// runs, so that a gate run with its own rows (stale maps) always reaches the decode path.
bool takes_decode_path(bool vec, const UpDownMemory& buffers, const EntryParts& parts, std::int64_t block_rows,
                       std::int64_t rows) {
  return vec && buffers.decode_col != nullptr && parts.u.packed == nullptr && block_rows >= rows;
}

// Queues the up/down kernel on the gate g: the block kernel, after count_and_order_kernel has
// written the counts, the block order and the split rows into `buffers`, or ffn_rows_kernel; wu_t
// null for the non-gated FFN; `parts` empty unless training (then g must be complete): the
// forward's kept u and h, or the backward's operands (Pass); `own_rows`: g comes from the gate's
// run_own_rows (the decode path must then run). Returns the path name.
template <class T, Pass kPass>
std::string sparse_rows(DenseView<const T> x, HybridView<const T> g, DenseView<const T> w_gate, ActivationSpec act,
                        const T* wu_t, std::int64_t ldwu_t, DenseView<const T> wd, DenseView<T> y,
                        const UpDownMemory& buffers, const EntryParts& parts, cudaStream_t stream, const char* where,
                        bool own_rows = false) {
  if (x.rows == 0) return "empty";
  FfnArgs a;
  a.m = x.rows;
  a.x = x.data;
  a.ldx = x.ld;
  a.wu_t = wu_t;
  a.ldwu_t = ldwu_t;
  a.gated = wu_t != nullptr || parts.u.packed != nullptr || kPass == Pass::backward;
  a.wd = wd.data;
  a.ldwd = wd.ld;
  a.y = y.data;
  a.ldy = y.ld;
  a.k = x.cols;
  a.n = g.cols();
  a.layout = g.twell.layout;
  a.packed = g.twell.packed;
  a.value_plane = g.twell.value_plane;
  a.row_to_overflow = g.row_to_overflow;
  a.overflow = g.overflow.data;
  a.ld_overflow = g.overflow.ld;
  a.block_rows = g.overflow.rows;
  a.overflow_vec = g.overflow.data != nullptr && g.overflow.ld % 8 == 0 && aligned16(g.overflow.data) && a.n % 8 == 0;
  a.w_gate = w_gate.data;
  a.ld_w_gate = w_gate.ld;
  a.act = act.kind;
  a.threshold = act.threshold;
  a.row_nnz = buffers.row_nnz;
  a.entry_parts = parts;

  const bool vec = vector_operands<T>(x, wu_t, ldwu_t, wd, y) &&
                   (kPass == Pass::forward || (parts.ldwd2 % 8 == 0 && aligned16(parts.wd2)));
  const std::string pass = kPass == Pass::forward ? "" : "_backward";
  if constexpr (ValueTraits<T>::packs_in_slot && kPass == Pass::forward) {
    if (takes_decode_path(vec, buffers, parts, a.block_rows, x.rows)) {
      a.decode_col = buffers.decode_col;
      a.decode_h = buffers.decode_h;
      a.own_rows = own_rows;
      a.row_over = own_rows ? buffers.decode_over : nullptr;
      const std::size_t smem = static_cast<std::size_t>(x.cols) * sizeof(float) + kDecodeChunk * 8;
      ::twell::detail::launch_kernel(where, ffn_decode_up_kernel<T>,
                                     dim3(kDecodeUpParts, static_cast<unsigned>(x.rows)), kThreads, smem, stream, a);
      if (x.cols > 0)
        ::twell::detail::launch_kernel(
            where, ffn_decode_down_kernel<T>,
            dim3(static_cast<unsigned>((x.cols + kDecodeSlice - 1) / kDecodeSlice), static_cast<unsigned>(x.rows)),
            kThreads, 0, stream, a);
      return "ffn_decode_v8";
    }
  }
  if constexpr (ValueTraits<T>::packs_in_slot) {
    BlockKernelFit fit;
    if (vec && buffers.block_state != nullptr && block_kernel_fits<T, kPass>(x.cols, fit, where)) {
      const std::int64_t parts = split_parts(a.layout, a.n);
      a.block_state = buffers.block_state;
      a.block_class = buffers.block_class;
      a.resident = fit.resident;
      if (buffers.split_capacity > 0 && parts > 0) {
        a.split_candidates = buffers.split_candidates;
        a.split_turn = buffers.split_turn;
        a.split_sum = buffers.split_sum;
        a.split_capacity = buffers.split_capacity;
        a.part_tiles = kPartColumns / a.layout.tile;
        a.parts = static_cast<std::int32_t>(parts);
        // One helper per SM: each claims parts until none is left.
        a.helpers = static_cast<std::int32_t>(std::min(buffers.split_capacity * parts, fit.sms));
      }
      a.block_tokens = block_tokens_for(x.rows, fit.resident);
      ::twell::detail::launch_kernel(where, count_and_order_kernel<T>,
                                     static_cast<unsigned>((x.rows + kCountRows - 1) / kCountRows), kThreads, 0, stream,
                                     a, buffers.block_order);
      a.block_order = buffers.block_order;
      const auto blocks = static_cast<unsigned>((x.rows + a.block_tokens - 1) / a.block_tokens);
      ::twell::detail::launch_kernel(where, block_kernel_for<T, kPass>(x.cols),
                                     blocks + static_cast<unsigned>(a.helpers), kThreads, block_smem_bytes(x.cols),
                                     stream, a);
      return (x.cols > kThreads * 8 ? "ffn_block_wide" : "ffn_block") + pass + "_v8_t" + std::to_string(a.block_tokens);
    }
  }
  const std::size_t smem = static_cast<std::size_t>(x.cols) * sizeof(float) + 3 * kThreads * sizeof(std::int32_t);
  const auto grid = static_cast<unsigned>(x.rows);
  ::twell::detail::launch_kernel(where, vec ? ffn_rows_kernel<T, 8, kPass> : ffn_rows_kernel<T, 1, kPass>, grid,
                                 kThreads, smem, stream, a);
  return "ffn_rows" + pass + (vec ? "_v8" : "_v1");
}

// Checks the plan's operands, then builds its gate plan (so that the checks name the FFN).
template <class T>
GemmToSparsePlan<T> checked_gate(std::int64_t m, bool gated, DenseView<const T> w_gate, DenseView<const T> wu,
                                 DenseView<const T> wd, ActivationSpec act, TwellLayout layout,
                                 std::int64_t capacity, const KernelOptions& options, const char* where) {
  require(m >= 0, ErrorCode::invalid_argument, where, "M = ", m, " is negative");
  require(m <= INT32_MAX, ErrorCode::unsupported, where, "M = ", m, " exceeds 2^31 - 1 rows");
  check_weights<T>(gated ? wu : w_gate, wd, where);
  if (gated) {
    check_device_operand(w_gate, where, "wg");
    require(w_gate.rows == wu.rows && w_gate.cols == wu.cols, ErrorCode::shape_mismatch, where, "wg is ", w_gate.rows,
            " x ", w_gate.cols, " but wu is ", wu.rows, " x ", wu.cols);
  }
  check_layout(layout, where);
  // The split-K decode gate where it applies (M <= 64 on Hopper): its last bits differ from
  // gemm_to_sparse's, as the FFN's y already may between batches (docs/api.md).
  return GemmToSparsePlan<T>(m, w_gate.rows, w_gate.cols, act, layout, capacity, OverflowPolicy::hybrid, options.stream,
                             FusedMainloop::best_decode_split);
}

// Whether an inference plan takes the decode path: 16-bit T, M <= kDecodeMaxTokens and the default
// overflow capacity, which is then M rows so that no row can be past the gate's block (the path
// never recomputes a gate row). An explicit capacity keeps the block kernel; so does a gate on its
// generic path (the plan then allocates no lists).
template <class T>
bool decode_plan(std::int64_t m, std::int64_t overflow_capacity) {
  return ValueTraits<T>::packs_in_slot && m <= kDecodeMaxTokens &&
         overflow_capacity == FfnPlanBase<T>::kDefaultCapacity;
}

}  // namespace

template <Value T>
detail::UpDownBuffers<T>::UpDownBuffers(std::int64_t m, std::int64_t k, std::int64_t n, const TwellLayout& layout,
                                        bool decode, const char* where)
    : split_capacity(0) {
  const UpDownSizes z = UpDownSizes::of<T>(m, k, n, layout, where);
  row_nnz = Buffer<std::int32_t>(z.row_nnz, MemorySpace::device);
  block_order = Buffer<std::int32_t>(z.block_order, MemorySpace::device);
  block_class = Buffer<std::int32_t>(2 * z.block_order, MemorySpace::device, Uninitialized{});
  block_state = Buffer<std::int32_t>(z.block_state, MemorySpace::device);
  split_capacity = static_cast<std::int64_t>(z.capacity);
  split_candidates = Buffer<std::int32_t>(z.candidates, MemorySpace::device, Uninitialized{});
  split_turn = Buffer<std::int32_t>(z.capacity, MemorySpace::device);
  split_sum = Buffer<float>(z.sum, MemorySpace::device, Uninitialized{});
  if (!decode) return;
  decode_col = Buffer<std::int32_t>(static_cast<std::size_t>(m * n), MemorySpace::device, Uninitialized{});
  decode_h = Buffer<float>(static_cast<std::size_t>(m * n), MemorySpace::device, Uninitialized{});
  decode_over = Buffer<std::int32_t>(static_cast<std::size_t>(m), MemorySpace::device, Uninitialized{});
}

template <Value T>
FfnPlanBase<T>::FfnPlanBase(std::int64_t m, bool gated, DenseView<const T> w_gate, DenseView<const T> wu,
                            DenseView<const T> wd, ActivationSpec act, TwellLayout layout,
                            std::int64_t overflow_capacity, const KernelOptions& options, const char* where)
    : m_(m),
      k_(w_gate.rows),
      n_(w_gate.cols),
      gated_(gated),
      w_gate_(w_gate),
      wd_(wd),
      act_(act),
      stream_(options.stream),
      where_(where),
      gate_(
          checked_gate<T>(m, gated, w_gate, wu, wd, act, layout, gate_capacity(m, overflow_capacity), options, where)),
      buffers_(m, k_, n_, gate_.layout(), decode_plan<T>(m, overflow_capacity) && gate_.fused(), where) {
  if (!gated_) return;
  wu_t_ = DenseMatrix<T>(wu.cols, wu.rows, MemorySpace::device);
  cuda::transpose<T>(wu, wu_t_.view(), KernelOptions{stream_});
}

template <Value T>
std::int64_t FfnPlanBase<T>::gate_capacity(std::int64_t m, std::int64_t overflow_capacity) {
  return decode_plan<T>(m, overflow_capacity) ? m : overflow_capacity;
}

template <Value T>
void FfnPlanBase<T>::forward(DenseView<const T> x, DenseView<T> y, FfnStats* stats) {
  twell::detail::require_plan_device(device_, where_);
  check_io<T>(x, y, k_, where_);
  require(x.rows == m_, ErrorCode::shape_mismatch, where_, "the plan is for ", m_, " tokens but x has ", x.rows,
          " rows");
  twell::detail::check_apart(y, "y", {{"x", x}, {gated_ ? "wg" : "wu", w_gate_}, {"wd", wd_}}, where_);
  const auto stream = static_cast<cudaStream_t>(stream_.handle);
  const T* wu_t = gated_ ? wu_t_.values().data() : nullptr;
  const std::int64_t ldwu_t = gated_ ? wu_t_.ld() : 0;
  // Where the decode path will run, the split gate stores its rows densely itself, and neither
  // the ranking nor the fill is queued (docs/gemm_to_sparse.md, "Decode path").
  bool own_rows = false;
  if (takes_decode_path(vector_operands<T>(x, wu_t, ldwu_t, wd_, y), memory_of(buffers_), EntryParts{},
                        gate_.overflow_capacity(), m_)) {
    own_rows = gate_.run_own_rows(x, w_gate_, where_);
  } else {
    gate_.run(x, w_gate_);
  }
  const HybridView<const T> g = own_rows ? gate_.own_rows_view() : gate_.queued_result();
  const std::int64_t block_rows = g.overflow.rows;
  const std::string kernel = sparse_rows<T, Pass::forward>(x, g, w_gate_, act_, wu_t, ldwu_t, wd_, y,
                                                           memory_of(buffers_), EntryParts{}, stream, where_, own_rows);
  path_ = "gate:" + gate_.path() + "+" + kernel;
  if (stats == nullptr) return;

  // The overflow rows: the gate's count, or with its own rows the decode kernel's flags.
  const OverflowCount count = own_rows ? OverflowCount{} : gate_.sync_overflow_count();
  std::vector<std::int32_t> over(own_rows ? static_cast<std::size_t>(m_) : 0);
  if (!over.empty())
    ::twell::detail::check_cuda(cudaMemcpyAsync(over.data(), buffers_.decode_over.data(), buffers_.decode_over.bytes(),
                                                cudaMemcpyDeviceToHost, stream),
                                where_);
  FfnStats s;
  s.tokens = m_;
  s.row_nnz.resize(static_cast<std::size_t>(m_));
  if (m_ > 0)
    ::twell::detail::check_cuda(cudaMemcpyAsync(s.row_nnz.data(), buffers_.row_nnz.data(), buffers_.row_nnz.bytes(),
                                                cudaMemcpyDeviceToHost, stream),
                                where_);
  std::int32_t split_rows = 0;  // the state is written only by the block kernel's path
  if (kernel.starts_with("ffn_block") && buffers_.split_capacity > 0)
    ::twell::detail::check_cuda(cudaMemcpyAsync(&split_rows, buffers_.block_state.data() + kStateListed,
                                                sizeof(split_rows), cudaMemcpyDeviceToHost, stream),
                                where_);
  ::twell::detail::check_cuda(cudaStreamSynchronize(stream), where_);
  for (const std::int32_t c : s.row_nnz) {
    s.nnz += c;
    s.max_row_nnz = std::max(s.max_row_nnz, c);
  }
  s.overflow_rows = own_rows ? std::count(over.begin(), over.end(), 1) : count.rows;
  s.overflow_capacity = block_rows;
  s.split_rows = split_rows;
  s.fallback_rows = std::max<std::int64_t>(0, s.overflow_rows - block_rows);
  *stats = std::move(s);
}

template <Value T>
GatedFfnPlan<T>::GatedFfnPlan(std::int64_t m, DenseView<const T> wg, DenseView<const T> wu, DenseView<const T> wd,
                              ActivationSpec act, TwellLayout layout, std::int64_t overflow_capacity,
                              const KernelOptions& options)
    : FfnPlanBase<T>(m, true, wg, wu, wd, act, layout, overflow_capacity, options, "twell::cuda::GatedFfnPlan") {}

template <Value T>
FfnPlan<T>::FfnPlan(std::int64_t m, DenseView<const T> wu, DenseView<const T> wd, ActivationSpec act,
                    TwellLayout layout, std::int64_t overflow_capacity, const KernelOptions& options)
    : FfnPlanBase<T>(m, false, wu, DenseView<const T>{}, wd, act, layout, overflow_capacity, options,
                     "twell::cuda::FfnPlan") {}

namespace {
// GatedUpDownPlan's arguments, checked before it allocates; returns M.
template <class T>
std::int64_t checked_up_down(std::int64_t m, std::int64_t k, std::int64_t n, const TwellLayout& layout,
                             const char* where) {
  require(m >= 0 && k >= 0 && n >= 0, ErrorCode::invalid_argument, where, "M = ", m, ", K = ", k, " and N = ", n,
          " must not be negative");
  require(m <= INT32_MAX, ErrorCode::unsupported, where, "M = ", m, " exceeds 2^31 - 1 rows");
  require(GatedUpDownPlan<T>::applies(k), ErrorCode::unsupported, where,
          "the kept up/down kernel takes 16-bit values and K <= ", kFusedFfnMaxK, "; this is ", to_string(dtype_of<T>),
          " with K = ", k);
  check_layout(layout, where);
  return m;
}

// Hybrid `part` (named) of an up/down run: M x N in device memory, in the plan's layout.
template <class T>
void check_part(HybridView<T> part, std::int64_t m, std::int64_t n, const TwellLayout& layout, const char* where,
                const char* name) {
  require(part.space() == MemorySpace::device, ErrorCode::space_mismatch, where, name,
          " lives in host memory; the cuda backend takes device operands only");
  require(part.rows() == m && part.cols() == n, ErrorCode::shape_mismatch, where, name, " is ", part.rows(), " x ",
          part.cols(), " but the plan is for ", m, " x ", n);
  require(part.twell.layout == layout, ErrorCode::shape_mismatch, where, name, "'s layout is not the plan's");
}
}  // namespace

template <Value T>
bool GatedUpDownPlan<T>::applies(std::int64_t k) {
  return ValueTraits<T>::packs_in_slot && k <= kFusedFfnMaxK;
}

template <Value T>
GatedUpDownPlan<T>::GatedUpDownPlan(std::int64_t m, std::int64_t k, std::int64_t n, TwellLayout layout,
                                    const KernelOptions& options)
    : m_(checked_up_down<T>(m, k, n, layout, "twell::cuda::GatedUpDownPlan")),
      k_(k),
      n_(n),
      layout_(layout),
      stream_(options.stream),
      wu_t_(n, k, MemorySpace::device),
      wg_t_(n, k, MemorySpace::device),
      buffers_(m, k, n, layout, false, "twell::cuda::GatedUpDownPlan") {}

namespace {
// A Hybrid operand of a training run, named for the messages; `written`: the run writes its values.
template <class T>
struct NamedPart {
  const char* name;
  HybridView<const T> view;
  bool written;
};

// The Hybrid operands of a training run, a first: each M x N in device memory, in `layout`, with
// a's overflow rows; a part the run writes holds a slot array and a dense block of its own (its
// maps may be a's), or it would overwrite another operand before or after the kernel reads it.
// Only the arrays' starts are compared: parts are separate allocations, or views that do not
// overlap (a precondition, as is that every part has a's structure: the run copies a's maps into
// a written part whose maps are not a's).
template <class T>
void check_parts(std::initializer_list<NamedPart<T>> parts, std::int64_t m, std::int64_t n, const TwellLayout& layout,
                 const char* where) {
  const std::int64_t r = parts.begin()->view.overflow.rows;
  for (const NamedPart<T>& p : parts) {
    check_part(p.view, m, n, layout, where, p.name);
    require(p.view.overflow.rows == r, ErrorCode::shape_mismatch, where, p.name, " has ", p.view.overflow.rows,
            " overflow rows but a has ", r);
  }
  for (const NamedPart<T>& w : parts) {
    if (!w.written) continue;
    for (const NamedPart<T>& p : parts) {
      if (&p == &w) continue;
      require(m * layout.packed_width(n) == 0 || w.view.twell.packed != p.view.twell.packed,
              ErrorCode::invalid_argument, where, w.name, " must hold a slot array of its own (it is written), not ",
              p.name, "'s");
      require(r * n == 0 || w.view.overflow.data != p.view.overflow.data, ErrorCode::invalid_argument, where, w.name,
              " must hold a dense block of its own (it is written), not ", p.name, "'s");
    }
  }
}

template <class T>
void check_wu_shape(DenseView<const T> wu, std::int64_t k, std::int64_t n, const char* where) {
  require(wu.rows == k && wu.cols == n, ErrorCode::shape_mismatch, where, "wu is ", wu.rows, " x ", wu.cols,
          " but the plan is for K = ", k, " and N = ", n);
}

// The weights of a training run for K and N: wu (and wg where given: the backward's) K x N, wd N x K.
template <class T>
void check_training_weights(const DenseView<const T>* wg, DenseView<const T> wu, DenseView<const T> wd, std::int64_t k,
                            std::int64_t n, const char* where) {
  check_weights<T>(wu, wd, where);
  check_wu_shape<T>(wu, k, n, where);
  if (wg == nullptr) return;
  check_device_operand(*wg, where, "wg");
  require(wg->rows == k && wg->cols == n, ErrorCode::shape_mismatch, where, "wg is ", wg->rows, " x ", wg->cols,
          " but wu is ", k, " x ", n);
}

// The operands of a kept up/down run for M x K x N in `layout` (checked before anything is queued).
template <class T>
void check_kept(DenseView<const T> x, HybridView<const T> a, DenseView<const T> wu, DenseView<const T> wd,
                HybridView<T> u, HybridView<T> h, DenseView<T> y, std::int64_t m, std::int64_t k, std::int64_t n,
                const TwellLayout& layout, const char* where) {
  check_io<T>(x, y, k, where);
  require(x.rows == m, ErrorCode::shape_mismatch, where, "the plan is for ", m, " tokens but x has ", x.rows, " rows");
  check_training_weights<T>(nullptr, wu, wd, k, n, where);
  twell::detail::check_apart(y, "y", {{"x", x}, {"wu", wu}, {"wd", wd}}, where);
  check_parts<T>({{"a", a, false}, {"u", u, true}, {"h", h, true}}, m, n, layout, where);
}

// The operands of a backward run for M x K x N in `layout`.
template <class T>
void check_backward(const GatedBackwardOperands<T>& op, std::int64_t m, std::int64_t k, std::int64_t n,
                    const TwellLayout& layout, const char* where) {
  check_io<T>(op.dy, op.dx, k, where, "dy", "dx");
  require(op.dy.rows == m, ErrorCode::shape_mismatch, where, "the plan is for ", m, " tokens but dy has ", op.dy.rows,
          " rows");
  check_training_weights<T>(&op.wg, op.wu, op.wd, k, n, where);
  twell::detail::check_activation(op.act, where);
  require(std::isfinite(op.l1_scale), ErrorCode::invalid_argument, where, "l1_scale = ", op.l1_scale, " is not finite");
  if (op.act.kind == Activation::relu) {
    check_parts<T>(
        {{"a", op.a, false}, {"u", op.u, false}, {"h", op.h, false}, {"dg", op.dg, true}, {"du", op.du, true}}, m, n,
        layout, where);
  } else {
    require(op.g.rows() == m && op.g.cols() == n, ErrorCode::invalid_argument, where,
            "the backward of SiLU and GELU multiplies by act'(g) and needs g = x wg on a's pattern, ", m, " x ", n,
            "; g is ", op.g.rows(), " x ", op.g.cols());
    check_parts<T>({{"a", op.a, false},
                    {"u", op.u, false},
                    {"h", op.h, false},
                    {"g", op.g, false},
                    {"dg", op.dg, true},
                    {"du", op.du, true}},
                   m, n, layout, where);
  }
}

// Whether two views are the same storage read the same way.
template <class T>
bool same_view(DenseView<const T> a, DenseView<const T> b) {
  return a.data != nullptr && a.data == b.data && a.rows == b.rows && a.cols == b.cols && a.ld == b.ld;
}

// What GatedUpDownPlan::queue_ahead queued for the run() that follows.
struct KeptAhead {
  bool wu_t = false;        // Wu^T
  bool slot_words = false;  // a's slot words and row map into u and h
};

// Which parts of a's structure copy_structure gives u and h (or dg and du): the slot words and
// row map (all that does not depend on a's overflow rows), the overflow rows' map and zeroed dense
// block, or both.
enum class StructurePart { slot_words, overflow_rows, all };

// One kernel's operands: a's arrays, up to two destinations of each (nullptr: none) and how many
// elements of each to copy (0: none, and the source is not read).
template <class T>
struct StructureCopy {
  const std::uint32_t* words = nullptr;
  std::uint32_t* words_to[2] = {};
  std::int64_t n_words = 0;
  bool vector_words = false;  // all three word arrays 16-byte aligned
  const std::int32_t* row_map = nullptr;
  std::int32_t* row_map_to[2] = {};
  std::int64_t n_row_map = 0;
  const std::int32_t* overflow_map = nullptr;
  std::int32_t* overflow_map_to[2] = {};
  std::int64_t n_overflow_map = 0;
  T* dense_to[2] = {};  // r x n blocks to zero
  std::int64_t dense_ld[2] = {};
  std::int64_t r = 0, n = 0;
};

// Reads each of a's arrays once and writes it to both destinations: one launch where copies and
// memsets took one call each (up to eight), with ~1-2 µs of idle GPU at each.
template <class T>
__global__ void copy_structure_kernel(StructureCopy<T> c) {
  ::twell::detail::wait_for_prior_grids();
  const std::int64_t first = static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  const std::int64_t stride = static_cast<std::int64_t>(gridDim.x) * blockDim.x;
  const auto to_both = [](auto* const(&to)[2], std::int64_t i, auto v) {
    for (auto* dst : to)
      if (dst != nullptr) dst[i] = v;
  };
  std::int64_t scalar_from = 0;
  if (c.vector_words) {
    const auto* from = reinterpret_cast<const uint4*>(c.words);
    uint4* const to[2] = {reinterpret_cast<uint4*>(c.words_to[0]), reinterpret_cast<uint4*>(c.words_to[1])};
    for (std::int64_t i = first; i < c.n_words / 4; i += stride) to_both(to, i, from[i]);
    scalar_from = c.n_words / 4 * 4;
  }
  for (std::int64_t i = scalar_from + first; i < c.n_words; i += stride) to_both(c.words_to, i, c.words[i]);
  for (std::int64_t i = first; i < c.n_row_map; i += stride) to_both(c.row_map_to, i, c.row_map[i]);
  for (std::int64_t i = first; i < c.n_overflow_map; i += stride) to_both(c.overflow_map_to, i, c.overflow_map[i]);
  for (std::int64_t i = first; i < c.r * c.n; i += stride) {
    const std::int64_t row = i / c.n, col = i - row * c.n;
    for (int p = 0; p < 2; ++p)
      if (c.dense_to[p] != nullptr) detail::store_f(c.dense_to[p] + row * c.dense_ld[p] + col, 0.0f);
  }
}

// Gives both `parts` the `what` of a's structure: the up/down kernel then writes the values of
// a's entries. Row maps are copied only where a part's are not a's own.
template <class T>
void copy_structure(HybridView<const T> a, const HybridView<T> (&parts)[2], StructurePart what, cudaStream_t stream,
                    const char* where) {
  StructureCopy<T> c;
  const bool words = what != StructurePart::overflow_rows, overflow = what != StructurePart::slot_words;
  const auto aligned = [](const void* p) { return reinterpret_cast<std::uintptr_t>(p) % 16 == 0; };
  c.vector_words = aligned(a.twell.packed);
  int p = 0;
  for (const HybridView<T>& part : parts) {
    if (words) {
      c.words_to[p] = part.twell.packed;
      c.vector_words = c.vector_words && aligned(part.twell.packed);
      if (part.row_to_overflow != a.row_to_overflow) c.row_map_to[p] = part.row_to_overflow;
    }
    if (overflow) {
      if (part.overflow_to_row != a.overflow_to_row) c.overflow_map_to[p] = part.overflow_to_row;
      c.dense_to[p] = part.overflow.data;
      c.dense_ld[p] = part.overflow.ld;
    }
    ++p;
  }
  // A map with no destination (both parts share a's) is not read.
  const auto wanted = [](auto* const(&to)[2]) { return to[0] != nullptr || to[1] != nullptr; };
  if (words) {
    c.words = a.twell.packed;
    c.n_words = a.rows() * a.twell.layout.packed_width(a.cols());
    c.row_map = a.row_to_overflow;
    c.n_row_map = wanted(c.row_map_to) ? a.rows() : 0;
  }
  if (overflow) {
    c.overflow_map = a.overflow_to_row;
    c.n_overflow_map = wanted(c.overflow_map_to) ? a.overflow.rows : 0;
    c.r = a.overflow.rows;
    c.n = a.cols();
  }
  const std::int64_t items =
      std::max({c.vector_words ? c.n_words / 4 : c.n_words, c.n_row_map, c.n_overflow_map, c.r * c.n});
  if (items == 0) return;
  constexpr int kThreads = 256;
  const auto blocks = static_cast<unsigned>(std::min<std::int64_t>((items + kThreads - 1) / kThreads, 4096));
  ::twell::detail::launch_kernel(where, copy_structure_kernel<T>, blocks, kThreads, 0, stream, c);
}

// Transposes a K x N weight into `out`, an N x K buffer of leading dimension K.
template <class T>
void transpose_into(DenseView<const T> w, T* out, cudaStream_t stream) {
  cuda::transpose<T>(w, DenseView<T>{out, w.cols, w.rows, w.rows, MemorySpace::device}, KernelOptions{Stream{stream}});
}

// Queues a checked kept up/down run: Wu^T into wu_t (N x K, leading dimension K) unless `ahead`
// queued it, a's structure into u and h (the kernel writes the values of its entries only; its
// slot words and row map not where `ahead` queued them), the kernel, then the shadow slots of u and
// h from their dense rows. Returns the kernel's path name.
template <class T>
std::string queue_kept(DenseView<const T> x, HybridView<const T> a, DenseView<const T> wu, DenseView<const T> wd,
                       HybridView<T> u, HybridView<T> h, DenseView<T> y, T* wu_t, const UpDownMemory& memory,
                       KeptAhead ahead, cudaStream_t stream, const char* where) {
  if (!ahead.wu_t) transpose_into<T>(wu, wu_t, stream);
  copy_structure<T>(a, {u, h}, ahead.slot_words ? StructurePart::overflow_rows : StructurePart::all, stream, where);
  EntryParts parts;
  parts.u = placed(u);
  parts.h = placed(h);
  std::string path = sparse_rows<T, Pass::forward>(x, a, DenseView<const T>{}, ActivationSpec{}, wu_t, x.cols, wd, y,
                                                   memory, parts, stream, where);
  for (const HybridView<T>& part : {u, h})
    detail::copy_dense_rows_into_shadows<T>(a.twell, a.overflow_to_row, part, stream, where);
  return path;
}

// Queues a checked backward run (GatedUpDownPlan::backward): Wg^T into wg_t and, unless wu_t
// holds it already (`wu_t_made`), Wu^T into wu_t (N x K, leading dimension K), a's structure into
// dg and du, the kernel on dy with Wd as the rows of its dot products, then the shadow slots of dg
// and du. Returns the kernel's path name.
template <class T>
std::string queue_backward(const GatedBackwardOperands<T>& op, T* wg_t, T* wu_t, bool wu_t_made,
                           const UpDownMemory& memory, cudaStream_t stream, const char* where) {
  transpose_into<T>(op.wg, wg_t, stream);
  if (!wu_t_made) transpose_into<T>(op.wu, wu_t, stream);
  const HybridView<T> written[] = {op.dg, op.du};
  copy_structure<T>(op.a, written, StructurePart::all, stream, where);
  EntryParts parts;
  parts.u = placed(op.u);
  parts.h = placed(op.h);
  if (op.act.kind != Activation::relu) parts.g = placed(op.g);
  parts.dg = placed(op.dg);
  parts.du = placed(op.du);
  parts.wd2 = wu_t;
  parts.ldwd2 = op.dy.cols;
  parts.l1_scale = op.l1_scale;
  const std::int64_t k = op.dy.cols, n = op.a.cols();
  std::string path = sparse_rows<T, Pass::backward>(op.dy, op.a, DenseView<const T>{}, op.act, op.wd.data, op.wd.ld,
                                                    DenseView<const T>{wg_t, n, k, k, MemorySpace::device}, op.dx,
                                                    memory, parts, stream, where);
  for (const HybridView<T>& part : written)
    detail::copy_dense_rows_into_shadows<T>(op.a.twell, op.a.overflow_to_row, part, stream, where);
  return path;
}
}  // namespace

template <Value T>
void GatedUpDownPlan<T>::queue_ahead(HybridView<const T> a, DenseView<const T> wu, HybridView<T> u, HybridView<T> h) {
  constexpr const char* where = "twell::cuda::GatedUpDownPlan::queue_ahead";
  twell::detail::require_plan_device(device_, where);
  wu_t_source_ = {};
  ahead_ = {};
  check_device_operand(wu, where, "wu");
  check_wu_shape<T>(wu, k_, n_, where);
  // Their overflow rows are not read here (a gate's queued result and the parts it will fill may
  // differ in them until the count is known): the parts are checked without.
  HybridView<T> slots_u = u, slots_h = h;
  HybridView<const T> slots_a = a;
  slots_u.overflow.rows = slots_h.overflow.rows = slots_a.overflow.rows = 0;
  check_parts<T>({{"a", slots_a, false}, {"u", slots_u, true}, {"h", slots_h, true}}, m_, n_, layout_, where);
  const auto stream = static_cast<cudaStream_t>(stream_.handle);
  transpose_into<T>(wu, wu_t_.values().data(), stream);
  wu_t_source_ = wu;
  copy_structure<T>(a, {u, h}, StructurePart::slot_words, stream, where);
  ahead_ = {true,           a.twell.packed,   a.row_to_overflow, u.twell.packed, u.row_to_overflow,
            h.twell.packed, h.row_to_overflow};
}

template <Value T>
void GatedUpDownPlan<T>::run(DenseView<const T> x, HybridView<const T> a, DenseView<const T> wu, DenseView<const T> wd,
                             HybridView<T> u, HybridView<T> h, DenseView<T> y) {
  constexpr const char* where = "twell::cuda::GatedUpDownPlan::run";
  twell::detail::require_plan_device(device_, where);
  // What queue_ahead left, for this run only.
  const KeptAhead ahead{ahead_.queued && same_view<T>(wu_t_source_, wu),
                        ahead_ == Ahead{true, a.twell.packed, a.row_to_overflow, u.twell.packed, u.row_to_overflow,
                                        h.twell.packed, h.row_to_overflow}};
  wu_t_source_ = {};
  ahead_ = {};
  check_kept<T>(x, a, wu, wd, u, h, y, m_, k_, n_, layout_, where);
  path_ = queue_kept<T>(x, a, wu, wd, u, h, y, wu_t_.values().data(), memory_of(buffers_), ahead,
                        static_cast<cudaStream_t>(stream_.handle), where);
  wu_t_source_ = wu;
}

template <Value T>
void gated_up_down(DenseView<const T> x, HybridView<const T> a, DenseView<const T> wu, DenseView<const T> wd,
                   HybridView<T> u, HybridView<T> h, DenseView<T> y, const KernelOptions& options) {
  constexpr const char* where = "twell::cuda::gated_up_down";
  const std::int64_t m = x.rows, k = x.cols, n = wu.cols;
  checked_up_down<T>(m, k, n, a.twell.layout, where);
  check_kept<T>(x, a, wu, wd, u, h, y, m, k, n, a.twell.layout, where);
  const cudaStream_t stream = ::twell::cuda::detail::stream_of(options);
  const UpDownScratch memory(UpDownSizes::of<T>(m, k, n, a.twell.layout, where), stream, where);
  const detail::Scratch wu_t(static_cast<std::size_t>(n * k) * sizeof(T), stream, where);
  const std::string path =
      queue_kept<T>(x, a, wu, wd, u, h, y, wu_t.as<T>(), memory.memory(), KeptAhead{}, stream, where);
  if (options.report != nullptr) options.report->path = path;
}

template <Value T>
void GatedUpDownPlan<T>::backward(const GatedBackwardOperands<T>& op) {
  constexpr const char* where = "twell::cuda::GatedUpDownPlan::backward";
  twell::detail::require_plan_device(device_, where);
  check_backward<T>(op, m_, k_, n_, layout_, where);
  const bool reuse = op.reuse_run_wu_t && same_view<T>(wu_t_source_, op.wu);
  if (!reuse) wu_t_source_ = {};
  ahead_ = {};
  path_ = queue_backward<T>(op, wg_t_.values().data(), wu_t_.values().data(), reuse, memory_of(buffers_),
                            static_cast<cudaStream_t>(stream_.handle), where);
}

template <Value T>
void gated_up_down_backward(const GatedBackwardOperands<T>& op, const KernelOptions& options) {
  constexpr const char* where = "twell::cuda::gated_up_down_backward";
  const std::int64_t m = op.dy.rows, k = op.dy.cols, n = op.wu.cols;
  checked_up_down<T>(m, k, n, op.a.twell.layout, where);
  check_backward<T>(op, m, k, n, op.a.twell.layout, where);
  require(!op.reuse_run_wu_t, ErrorCode::invalid_argument, where,
          "reuse_run_wu_t asks for the Wu^T of a GatedUpDownPlan's run(); this one-shot form has none");
  const cudaStream_t stream = ::twell::cuda::detail::stream_of(options);
  const UpDownScratch memory(UpDownSizes::of<T>(m, k, n, op.a.twell.layout, where), stream, where);
  const std::size_t weight_bytes = static_cast<std::size_t>(n * k) * sizeof(T);
  const detail::Scratch wg_t(weight_bytes, stream, where), wu_t(weight_bytes, stream, where);
  const std::string path = queue_backward<T>(op, wg_t.as<T>(), wu_t.as<T>(), false, memory.memory(), stream, where);
  if (options.report != nullptr) options.report->path = path;
}

template <Value T>
void gated_ffn_forward(DenseView<const T> x, DenseView<const T> wg, DenseView<const T> wu, DenseView<const T> wd,
                       ActivationSpec act, DenseView<T> y, const KernelOptions& options) {
  check_device_operand(x, "twell::cuda::gated_ffn_forward", "x");
  GatedFfnPlan<T> plan(x.rows, wg, wu, wd, act, TwellLayout{}, GatedFfnPlan<T>::kDefaultCapacity, options);
  plan.forward(x, y);
  if (options.report != nullptr) options.report->path = plan.path();
}

template <Value T>
void ffn_forward(DenseView<const T> x, DenseView<const T> wu, DenseView<const T> wd, ActivationSpec act,
                 DenseView<T> y, const KernelOptions& options) {
  check_device_operand(x, "twell::cuda::ffn_forward", "x");
  FfnPlan<T> plan(x.rows, wu, wd, act, TwellLayout{}, FfnPlan<T>::kDefaultCapacity, options);
  plan.forward(x, y);
  if (options.report != nullptr) options.report->path = plan.path();
}

#define TWELL_INSTANTIATE(T)                                                                                         \
  template class FfnPlanBase<T>;                                                                                     \
  template class GatedFfnPlan<T>;                                                                                    \
  template class FfnPlan<T>;                                                                                         \
  template class GatedUpDownPlan<T>;                                                                                 \
  template void gated_up_down<T>(DenseView<const T>, HybridView<const T>, DenseView<const T>, DenseView<const T>,    \
                                 HybridView<T>, HybridView<T>, DenseView<T>, const KernelOptions&);                  \
  template void gated_up_down_backward<T>(const GatedBackwardOperands<T>&, const KernelOptions&);                    \
  template void gated_ffn_forward<T>(DenseView<const T>, DenseView<const T>, DenseView<const T>, DenseView<const T>, \
                                     ActivationSpec, DenseView<T>, const KernelOptions&);                            \
  template void ffn_forward<T>(DenseView<const T>, DenseView<const T>, DenseView<const T>, ActivationSpec,           \
                               DenseView<T>, const KernelOptions&);
TWELL_FOR_EACH_VALUE_TYPE(TWELL_INSTANTIATE)
#undef TWELL_INSTANTIATE

}  // namespace twell::cuda
