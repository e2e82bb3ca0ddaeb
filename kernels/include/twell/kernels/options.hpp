// Options shared by the sparse-dense kernels of both backends.
#pragma once

#include <cmath>
#include <cstdint>
#include <string>

#include <twell/error.hpp>
#include <twell/memory.hpp>

namespace twell {

// op(A) of a product: A as stored, or its transpose.
enum class Op : std::uint8_t { none, transpose };

// Activation applied by gemm_to_sparse before sparsification; entries with |act(v)| <= threshold
// are not stored. relu with threshold 0 is plain ReLU.
enum class Activation : std::uint8_t { relu, silu, gelu };
struct ActivationSpec {
  Activation kind = Activation::relu;
  float threshold = 0.0f;
};

// Normalisation Z of the L1 term lambda * sum(|h|) / Z of the FFN training loss.
enum class L1Normalization : std::uint8_t { per_token /* Z = M */, per_entry /* Z = M * N */ };

// Throws invalid_argument, naming `where`, unless lambda is a finite number >= 0 (an infinite one
// would make every gradient of the sparse activations infinite) and norm one of the enum's values.
inline void check_l1_penalty(float lambda, L1Normalization norm, const char* where) {
  require(std::isfinite(lambda) && lambda >= 0.0f, ErrorCode::invalid_argument, where, "lambda ", lambda,
          " must be a finite non-negative number");
  require(norm == L1Normalization::per_token || norm == L1Normalization::per_entry, ErrorCode::invalid_argument, where,
          "L1 normalization ", static_cast<int>(norm), " is unknown");
}

// Filled by a kernel when asked: which implementation path ran (for tests and benchmarks).
struct KernelReport {
  std::string path;
};

// The kernel of a cuda spmm with a TwELL or Hybrid A: for op(A) = A, and for op(A) = A^T the
// product on A^T where the GPU transposes A (other formats and the reference backend ignore its
// value, but refuse one outside the enum as the cuda TwELL and Hybrid paths do).
// automatic picks by rows, layout and operands (docs/api.md, "spmm paths"); the others force one
// kernel and raise ErrorCode::unsupported, naming the condition, where it does not take the
// operands; a value outside the enum is invalid_argument. pair_balanced takes every operand within
// its grid (at most 65535 row blocks) and shared memory (its per-row tile prefix).
enum class SpmmAlgorithm : std::uint8_t { automatic, pair_balanced, tile_stream, slice_reuse };

struct KernelOptions {
  Stream stream{};
  KernelReport* report = nullptr;
  // Opt-in to faster paths that would use float atomics (DESIGN.md). No kernel has one yet: every
  // path is deterministic (fixed summation order), so the flag changes nothing today.
  bool allow_nondeterministic = false;
  SpmmAlgorithm spmm_algorithm = SpmmAlgorithm::automatic;
};

}  // namespace twell
