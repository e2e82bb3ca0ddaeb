// Workload generator: realistic sparse activations and FFN inputs, seeded and reproducible.
// See DESIGN.md "Workload generator" and docs/benchmarks/README.md for the statistics targeted.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include <twell/formats/dense.hpp>

namespace twell::workload {

enum class Distribution : std::uint8_t {
  uniform,        // every (token, unit) fires with the same probability
  neuron_skewed,  // heavy-tailed per-unit rates, a share of dead units
  token_skewed,   // neuron skew plus a heavy tail of tokens with many nonzeros (the real case)
};

std::string to_string(Distribution d);
Distribution parse_distribution(const std::string& name);  // throws twell::Error(invalid_argument)

// FFN shapes: hidden (K) and intermediate (N) sizes.
struct FfnShape {
  std::string name;
  std::int64_t hidden = 0;
  std::int64_t intermediate = 0;
};
FfnShape paper_shape();   // (2048, 5632): every model of the paper shares it
FfnShape llama7b_shape(); // (4096, 11008)
FfnShape small_shape();   // (1024, 2816)
std::vector<FfnShape> presets();
FfnShape preset(const std::string& name);  // "paper", "llama7b", "small"

struct ActivationOptions {
  std::int64_t tokens = 16384;   // M
  std::int64_t units = 5632;     // N
  double density = 0.005;        // target mean nonzeros per row / N
  Distribution distribution = Distribution::token_skewed;
  double dead_fraction = 0.3;    // neuron/token-skewed: share of units that never fire
  std::uint64_t seed = 1;
};

// Throws twell::Error(invalid_argument), naming `where`, for options that activations() and
// ffn_inputs() refuse (a command line checks them before any work).
void check_options(const ActivationOptions& options, const char* where);

// Dense M x N host matrix of ReLU-like activations (nonzeros positive, exponential magnitudes).
template <Value T>
DenseMatrix<T> activations(const ActivationOptions& options);

// Inputs of a gated FFN whose gate ReLU(x Wg) has the requested pattern statistics:
// x is M x K, wg and wu are K x N, wd is N x K, all on the host; hidden (K) >= 3.
// Construction: column 0 of x is 1 and column 1 a per-token shift, so row 0 of wg holds a
// per-unit bias and row 1 is all ones; the other K - 2 entries are N(0, 1) in x and unit-norm
// Gaussian columns in wg, so (x Wg)(i, j) = bias_j + shift_i + N(0, 1) noise. Each unit's bias
// and each token's shift are set from the same per-unit rates and per-token factors that
// activations() draws for the seed, so the gate matches them in expectation (per token closely,
// per unit approximately). wu and wd are N(0, 1 / fan-in).
template <Value T>
struct FfnInputs {
  DenseMatrix<T> x, wg, wu, wd;
};
template <Value T>
FfnInputs<T> ffn_inputs(const ActivationOptions& options, std::int64_t hidden);

// Distribution summary of nonzeros per row, to check a workload against its target.
struct RowProfile {
  double mean = 0;
  std::int64_t p50 = 0, p99 = 0, max = 0;
  double dead_unit_share = 0;  // units with no nonzero in any row
};
template <Value T>
RowProfile profile(DenseView<const T> m);

}  // namespace twell::workload
