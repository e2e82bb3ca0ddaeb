// Shared by the suites (internal): workload data on the device, layout choice, byte counts,
// and the wrapper that turns a case's failure into its status.
#pragma once

#include <cstdint>
#include <functional>
#include <initializer_list>
#include <map>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include <twell/bench/features.hpp>
#include <twell/bench/harness.hpp>
#include <twell/formats/dense.hpp>
#include <twell/formats/hybrid.hpp>
#include <twell/kernels/options.hpp>
#include <twell/workload.hpp>

namespace twell::bench::detail {

using T = bf16;  // the performance contract is stated in bf16

// The densities of the sweeps (DESIGN.md: 0.3 % to 20 %) and the distributions.
const std::vector<double>& sweep_densities(bool quick);
const std::vector<workload::Distribution>& distributions(bool quick);

// Tokens of the large and small cases: --tokens, or by default 16384 and 4096, which --quick
// shrinks to smoke-test sizes.
std::int64_t tokens_large(const Config& config);
std::int64_t tokens_small(const Config& config);
// Decode steps' batches, one token of each of 1, 64, 256 or 512 sequences (the FFN suite only;
// not in --quick or --contract).
std::vector<std::int64_t> decode_batches();

// Whether a point (checked before its inputs are generated) belongs to this run: every point,
// or with --contract only the paper shape at the small and large M, 0.5 %, uniform or
// token-skewed.
bool in_scope(const Config& config, const std::string& shape, std::int64_t m, double density,
              workload::Distribution dist);

// TwELL layout for a density: tile 256 and the largest C (fewest slots) whose capacity is at
// least four times the mean count per tile plus 8, so only genuinely heavy (row, tile) pairs
// overflow into the hybrid's dense block.
TwellLayout layout_for_density(double density);

// Host activations of a workload, uploaded; realized density counted on the host.
struct DeviceActivations {
  DenseMatrix<T> dense;  // M x N on the device
  double realized_density = 0;
  workload::RowProfile profile;
};
// Cached by its arguments: the convert, spmm and sddmm suites sweep the same points.
const DeviceActivations& activations(std::int64_t m, std::int64_t n, double density, workload::Distribution dist,
                                     std::uint64_t seed);

// Gated-FFN inputs whose gate has the requested statistics, on the device, cached by key so
// the gemm_to_sparse and ffn suites share them.
struct DeviceFfn {
  DenseMatrix<T> x, wg, wu, wd;
};
const DeviceFfn& ffn_inputs(const workload::FfnShape& shape, std::int64_t m, double density,
                            workload::Distribution dist, std::uint64_t seed);
void clear_ffn_cache();
// Frees every cached workload (before the CUDA context goes away).
void clear_caches();

// Bytes of each format as stored on the device.
double bytes_of(const HybridMatrix<T>& h);
double bytes_of(HybridView<const T> h);
double bytes_of_dense(std::int64_t rows, std::int64_t cols);

// The fields every case of one sweep point shares: suite, op, the shape's name, M, K, N, the
// distribution and the target and realized densities (variant and results are each case's own).
Case sweep_case(const std::string& suite, const std::string& op, const workload::FfnShape& shape, std::int64_t m,
                std::int64_t k, std::int64_t n, workload::Distribution dist, double density,
                const DeviceActivations& act);
// `base` as the given variant.
Case with_variant(Case base, const std::string& variant);

// Runs body(c) for a case: on success c keeps its numbers; ErrorCode::unsupported becomes
// "not built: ...", any other exception "failed: ...". The case is appended either way. A case
// that report.selection leaves out is appended with status kNotSelected and not run, unless one
// of the variants in needed_by (later cases of the same point that use what this one makes) is
// selected: then it runs and is reported like any other.
void run_case(Report& report, Case c, const std::vector<std::string>& needed_by,
              const std::function<void(Case&)>& body);
void run_case(Report& report, Case c, const std::function<void(Case&)>& body);
// Appends a case that did not run, with its status ("not built: ...", "skipped: ...",
// "failed: ..."), or with kNotSelected where report.selection leaves it out.
void list_case(Report& report, Case c, const std::string& status);
// list_case with "not built: " + why: a case that cannot run in this build.
void not_built(Report& report, Case c, const std::string& why);
// Where report.selection leaves out every case of a point (`base` as each op and variant of
// `cases`), lists them all with kNotSelected and returns true: the suite then skips making the
// point's inputs (seconds at M = 16384), which a short --cases run does not need.
bool none_selected(Report& report, const Case& base, std::initializer_list<std::pair<const char*, const char*>> cases);

// After a suite: every ok case of `suite` whose variant is in twell_variants gets its speedup
// over each ok case of the listed baselines with the same shape, M, K, N, density target and
// distribution, in extra.speedup_vs; its primary baseline (c.baseline, c.speedup) is the
// first one of the list found.
void link_baselines(Report& report, const std::string& suite, const std::vector<std::string>& twell_variants,
                    const std::vector<std::string>& baselines);

#if TWELL_BENCH_BASELINES
// Adapters over kernels/include/twell/kernels/baselines.hpp (suites/baselines.cpp): each
// appends its baseline cases for the data point `base`.
// cuSPARSE SpMM, C = op(A) B, of the dense A's CSR / COO (best of the algorithms, each timed).
void spmm_baselines(Harness& h, Report& report, const Case& base, Op op_a, DenseView<const T> a, DenseView<const T> b,
                    DenseView<T> c, double flops, double dense_bytes);
// cuSPARSE DenseToSparse into CSR.
void convert_baselines(Harness& h, Report& report, const Case& base, DenseView<const T> a);
// cuSPARSE SDDMM: (dy wd^T) at the CSR pattern of `pattern`.
void sddmm_baselines(Harness& h, Report& report, const Case& base, DenseView<const T> dy, DenseView<const T> wd,
                     DenseView<const T> pattern, double flops, double dense_bytes);
// cuBLASLt GEMM with the ReLU in its epilogue, dense output.
void gemm_baselines(Harness& h, Report& report, const Case& base, DenseView<const T> x, DenseView<const T> w,
                    DenseView<T> out, double flops, double in_bytes);
// The dense gated FFN (plan built here, outside the timing); returns the op to time.
std::function<void()> dense_ffn_baseline(Harness& h, DenseView<const T> x, DenseView<const T> wg, DenseView<const T> wu,
                                         DenseView<const T> wd, DenseView<T> y, Case& c);
#endif

// The floor phase (set_floor) of `fmas` multiply-adds of sparse products, each with one 2-byte
// operand loaded from on-chip memory: the least a kernel can load when no operand is reused from
// registers across (row, nonzero) pairs, which at the contract's densities they rarely share.
FloorPhase sparse_products_phase(std::string name, double fmas, double dram_bytes);

// What a case records instead of its error against `reference` when that case did not run (not
// selected, failed, not built), e.g. "not checked: the dense case did not run (not selected)".
std::string not_checked(const Case& reference);

// ||a - b||_F / ||b||_F of two device matrices, in fp64 on host copies (NaN stays NaN).
double relative_error(DenseView<const T> a, DenseView<const T> b);

// Synchronises the harness stream and checks for a pending CUDA error.
void sync(Harness& h, const char* where);

}  // namespace twell::bench::detail
