// ffn suite: the gated FFN forward y = (relu(x Wg) * (x Wu)) Wd at three shapes, fused
// (twell::cuda::GatedFfnPlan::forward), composed of unfused twell kernels, and dense (the strongest
// dense path: cuBLASLt ReLU epilogue, fused product, cuBLAS); the gate alone
// (GemmToSparsePlan::run, variant fused_gate_only) so that the up/down kernel's share reads as
// fused - fused_gate_only (less where fused's gate stores its own rows, path "..._own_rows": it
// skips the ranking and fill that run() queues); and the non-gated FFN y = relu(x Wu) Wd, fused
// (FfnPlan::forward, variant fused_plain) against dense (cuBLASLt ReLU GEMM + cuBLAS GEMM, variant
// dense_plain). Also energy per token and the bytes of the hidden state as TwELL/Hybrid against
// dense.
#include <cmath>
#include <optional>

#include <twell/bench/features.hpp>

#include <twell/kernels/backends.hpp>
#if TWELL_BENCH_CUDA_FFN
#include <twell/kernels/ffn_cuda.hpp>
#endif
#if TWELL_BENCH_CUDA_GEMM_TO_SPARSE
#include <twell/kernels/gemm_to_sparse_plan.hpp>
#endif
#if TWELL_BENCH_BASELINES
#include <twell/kernels/baselines.hpp>
#endif

#include "common.hpp"

namespace twell::bench {

using detail::T;

namespace {

struct FfnPoint {
  workload::FfnShape shape;
  std::int64_t m;
  double density;
  workload::Distribution dist;
};

std::vector<FfnPoint> ffn_points(const Config& config) {
  using workload::Distribution;
  const bool quick = config.quick;
  const std::int64_t large = detail::tokens_large(config), small = detail::tokens_small(config);
  std::vector<FfnPoint> out;
  if (quick) {
    out.push_back({workload::small_shape(), large, 0.005, Distribution::uniform});
    out.push_back({workload::paper_shape(), large, 0.005, Distribution::token_skewed});
    return out;
  }
  // The paper shape sweeps density (break-even) at M = 16384, and at 0.5 % also the neuron-skewed
  // distribution and M = 4096; the other two shapes are measured at 0.5 %.
  for (const Distribution d : {Distribution::uniform, Distribution::token_skewed})
    for (const double density : {0.005, 0.01, 0.02, 0.05, 0.10, 0.20})
      out.push_back({workload::paper_shape(), large, density, d});
  out.push_back({workload::paper_shape(), large, 0.005, Distribution::neuron_skewed});
  for (const Distribution d : {Distribution::uniform, Distribution::neuron_skewed, Distribution::token_skewed})
    out.push_back({workload::paper_shape(), small, 0.005, d});
  // Decode-sized: each kernel's work is a few microseconds, so fixed costs (launches, the
  // preparation's chain, one CTA's chain per token) show; a single sequence and batches the
  // up/down kernel runs in blocks of 1 token (up to 256) and 2 (512) on a 132-SM GPU
  // (docs/benchmarks/diagnostics/h200-2026-12-02a-ffn-by-m.md). At 64 tokens also token-skewed:
  // a small batch's heavy tokens, each one CTA's chain unless split (h200-2026-12-02b).
  for (const std::int64_t m : detail::decode_batches()) {
    if (m == small || m == large) continue;  // --tokens may name them: one case per point
    out.push_back({workload::paper_shape(), m, 0.005, Distribution::uniform});
    if (m == 64) out.push_back({workload::paper_shape(), m, 0.005, Distribution::token_skewed});
  }
  for (const Distribution d : {Distribution::uniform, Distribution::token_skewed}) {
    out.push_back({workload::small_shape(), large, 0.005, d});
    out.push_back({workload::llama7b_shape(), large, 0.005, d});
  }
  return out;
}

constexpr double kEnergySeconds = 0.5;
constexpr double kEnergyDensity = 0.005;

// Joules per token of op, into the case's extra (or the reason it is missing).
void add_energy(Harness& h, Case& c, const std::function<void()>& op) {
  if (c.density_target != kEnergyDensity) return;
  if (!h.config().energy) {
    c.extra["joules_per_token"] = "not measured (--no-energy)";
    return;
  }
  const std::optional<double> j = h.joules_per_run(op, h.config().quick ? 0.1 : kEnergySeconds);
  if (j)
    c.extra["joules_per_token"] = *j / static_cast<double>(c.m);
  else
    c.extra["joules_per_token"] = "unavailable";
}

// The pattern statistics of a plan's untimed sizing call.
void add_stats(Case& c, const FfnStats& s) {
  c.extra["mean_row_nnz"] = s.tokens > 0 ? static_cast<double>(s.nnz) / static_cast<double>(s.tokens) : 0.0;
  c.extra["max_row_nnz"] = static_cast<std::int64_t>(s.max_row_nnz);
  c.extra["plan_overflow_rows"] = s.overflow_rows;
  c.extra["plan_overflow_capacity"] = s.overflow_capacity;
  c.extra["plan_fallback_rows_first_call"] = s.fallback_rows;
  c.extra["split_rows"] = s.split_rows;
}

#if TWELL_BENCH_CUDA_FFN
// Times plan.forward(x, y) after one untimed call with stats (it sizes the overflow block, as
// earlier batches would have in a model, and gives the pattern's statistics).
template <class Plan>
void time_plan_forward(Harness& h, Case& c, Plan& plan, DenseView<const T> x, DenseView<T> y, double flops,
                       double bytes, const char* includes) {
  FfnStats stats;
  plan.forward(x, y, &stats);
  auto op = [&] { plan.forward(x, y); };
  c.timing = h.time(op);
  c.flops = flops;
  c.bytes = bytes;
  c.extra["path"] = plan.path();
  c.extra["includes"] = includes;
  add_stats(c, stats);
  add_energy(h, c, op);
}
#endif

// The least work of the sparse blocks of one point, cases from `first` on (set_floor): the gate
// as a dense GEMM on tensor cores, then K FMAs per (token, unit) pair of its pattern for each
// sparse projection (up and down; down only without a gate), each projection's weights and M x K
// activations (x read, y written) through DRAM once.
void add_floors(const Harness& h, Report& report, std::size_t first) {
  for (std::size_t i = first; i < report.cases.size(); ++i) {
    Case& c = report.cases[i];
    const bool gated = c.variant == "fused" || c.variant == "unfused", plain = c.variant == "fused_plain";
    if (c.status != "ok" || !(gated || plain) || c.density_realized <= 0) continue;
    const double mk = static_cast<double>(c.m) * static_cast<double>(c.k);
    const double pairs = c.density_realized * static_cast<double>(c.m) * static_cast<double>(c.n);
    const double projections = gated ? 2 : 1;
    const double x_bytes = detail::bytes_of_dense(c.m, c.k), weight_bytes = detail::bytes_of_dense(c.k, c.n);
    set_floor(
        c, h.ceilings(),
        {{.name = "gate", .dram_bytes = x_bytes + weight_bytes, .tensor_flops = 2 * mk * static_cast<double>(c.n)},
         detail::sparse_products_phase(gated ? "up and down" : "down", projections * pairs * static_cast<double>(c.k),
                                       projections * (weight_bytes + x_bytes))});  // Wu, x again; Wd, y
  }
}

}  // namespace

void run_ffn(Harness& h, Report& report) {
  std::string last_shape;
  for (const FfnPoint& p : ffn_points(h.config())) {
    if (!detail::in_scope(h.config(), p.shape.name, p.m, p.density, p.dist)) continue;
    // Inputs of earlier shapes are not needed again; the cache would hold gigabytes.
    if (!last_shape.empty() && last_shape != p.shape.name) detail::clear_ffn_cache();
    last_shape = p.shape.name;
    const std::int64_t m = p.m, k = p.shape.hidden, n = p.shape.intermediate;
    const TwellLayout layout = detail::layout_for_density(p.density);

    Case base;
    base.suite = "ffn";
    base.op = "gated_ffn_forward";
    base.shape = p.shape.name;
    base.m = m;
    base.k = k;
    base.n = n;
    base.distribution = workload::to_string(p.dist);
    base.density_target = p.density;
    // Dense FLOPs of the block: the sparse variants' rate is reported against the same count,
    // so TFLOP/s reads as "dense-equivalent" throughput.
    const double dense_flops = 3 * 2.0 * static_cast<double>(m) * static_cast<double>(k) * static_cast<double>(n);
    const double weight_bytes = 3 * detail::bytes_of_dense(k, n);
    const double io_bytes = 2 * detail::bytes_of_dense(m, k);

    if (detail::none_selected(report, base,
                              {{"gated_ffn_forward", "fused"},
                               {"gated_ffn_forward", "fused_gate_only"},
                               {"gated_ffn_forward", "unfused"},
                               {"gated_ffn_forward", "dense"},
                               {"ffn_forward", "fused_plain"},
                               {"ffn_forward", "dense_plain"}}))
      continue;
    const auto& in = detail::ffn_inputs(p.shape, m, p.density, p.dist, h.config().seed);
    const DenseView<const T> x = in.x.view(), wg = in.wg.view(), wu = in.wu.view(), wd = in.wd.view();
    // One output per variant, so the sparse ones can be checked against the dense one.
    DenseMatrix<T> y_fused(m, k, MemorySpace::device), y_unfused(m, k, MemorySpace::device),
        y_dense(m, k, MemorySpace::device);

    // The gate's pattern, once, untimed: realized density and the hidden state's storage.
#if TWELL_BENCH_CUDA_GEMM_TO_SPARSE
    try {
      ConvertOptions conv;
      conv.overflow = OverflowPolicy::hybrid;
      ConvertReport rep;
      conv.report = &rep;
      const HybridMatrix<T> gate =
          cuda::gemm_to_sparse<T>(x, wg, ActivationSpec{}, layout, conv, KernelOptions{h.stream(), nullptr, false});
      detail::sync(h, "ffn suite (gate pattern)");
      base.density_realized = static_cast<double>(rep.nnz) / (static_cast<double>(m) * static_cast<double>(n));
      base.extra["hidden_bytes_sparse"] = detail::bytes_of(gate);
      base.extra["hidden_bytes_dense"] = detail::bytes_of_dense(m, n);
      base.extra["hidden_bytes_ratio"] = detail::bytes_of(gate) / detail::bytes_of_dense(m, n);
      base.extra["overflow_rows"] = gate.overflow_rows();
      base.extra["tile"] = layout.tile;
      base.extra["C"] = layout.compression;
    } catch (const Error& e) {
      base.extra["gate_pattern"] = std::string("failed: ") + e.what();
    }
#endif

    const std::size_t first = report.cases.size();
    Case fused = base;
    fused.variant = "fused";
#if TWELL_BENCH_CUDA_FFN
    detail::run_case(report, fused, [&](Case& c) {
      const KernelOptions ko{h.stream(), nullptr, false};
      cuda::GatedFfnPlan<T> plan(m, wg, wu, wd, ActivationSpec{}, layout, cuda::GatedFfnPlan<T>::kDefaultCapacity, ko);
      time_plan_forward(h, c, plan, x, y_fused.view(), dense_flops, weight_bytes + io_bytes,
                        "GatedFfnPlan::forward: GemmToSparsePlan::run (gate GEMM + TwELL epilogue, overflow ranking, "
                        "dense recompute of overflow rows into the preallocated block; with path _own_rows the "
                        "gate kernel alone, storing its rows densely) and the up/down kernel; no "
                        "allocation, no host sync; plan construction (Wu transpose) and one sizing call with stats "
                        "outside the timed region");
    });
#else
    detail::not_built(report, fused,
                      "kernels/include/twell/kernels/ffn_cuda.hpp or kernels/cuda/*ffn*.cu is not in this build");
#endif

    Case gate_only = base;
    gate_only.variant = "fused_gate_only";
#if TWELL_BENCH_CUDA_GEMM_TO_SPARSE
    detail::run_case(report, gate_only, [&](Case& c) {
      // The fused variant's gate, mainloop and block capacity included, so that fused -
      // fused_gate_only stays the up/down kernel's share (less the ranking and fill where the
      // fused variant's gate stores its own rows and skips them).
      cuda::GemmToSparsePlan<T> plan(m, k, n, ActivationSpec{}, layout,
                                     cuda::GatedFfnPlan<T>::gate_capacity(m, cuda::GatedFfnPlan<T>::kDefaultCapacity),
                                     OverflowPolicy::hybrid, h.stream(), cuda::FusedMainloop::best_decode_split);
      plan.run(x, wg);
      plan.sync_overflow_count();
      c.timing = h.time([&] { plan.run(x, wg); });
      plan.sync_overflow_count();
      c.flops = dense_flops / 3;
      c.bytes = detail::bytes_of_dense(k, n) + detail::bytes_of_dense(m, k);
      c.extra["path"] = plan.path();
      c.extra["includes"] =
          "GemmToSparsePlan::run alone (the gate of the fused variant); the up/down kernel's "
          "time is fused - fused_gate_only, or more where fused's path has _own_rows (no ranking or fill)";
    });
#else
    detail::not_built(report, gate_only, "kernels/cuda/gemm_to_sparse.cu is not in this build");
#endif

    Case unfused = base;
    unfused.variant = "unfused";
#if TWELL_BENCH_CUDA_GEMM_TO_SPARSE && TWELL_BENCH_CUDA_SDDMM && TWELL_BENCH_CUDA_ELEMENTWISE && TWELL_BENCH_CUDA_SPMM
    detail::run_case(report, unfused, [&](Case& c) {
      const KernelOptions ko{h.stream(), nullptr, false};
      ConvertOptions conv;
      conv.overflow = OverflowPolicy::hybrid;
      const DenseView<T> yv = y_unfused.view();
      // gate = relu(x Wg) as Hybrid; u = (x Wu) at its pattern; u *= gate; y = u Wd.
      auto op = [&] {
        const HybridMatrix<T> gate = cuda::gemm_to_sparse<T>(x, wg, ActivationSpec{}, layout, conv, ko);
        HybridMatrix<T> u = gate.to(MemorySpace::device);
        cuda::sddmm<T>(x, Op::none, wu, gate.view(), u.view(), 1.0f, 0.0f, ko);
        cuda::multiply_on_pattern<T>(gate.view(), HybridView<const T>(u.view()), u.view(), ko);
        cuda::spmm<T>(Op::none, HybridView<const T>(u.view()), wd, yv, 1.0f, 0.0f, ko);
      };
      c.timing = h.time(op);
      c.flops = dense_flops;
      c.bytes = weight_bytes + io_bytes;
      c.extra["includes"] =
          "gemm_to_sparse, a copy of the pattern, sddmm, multiply_on_pattern, spmm (with allocations)";
      add_energy(h, c, op);
    });
#else
    detail::not_built(report, unfused,
                      "one of kernels/cuda/{gemm_to_sparse,sddmm,elementwise,spmm}.cu is not in this build");
#endif

    Case dense = base;
    dense.variant = "dense";
#if TWELL_BENCH_BASELINES
    detail::run_case(report, dense, [&](Case& c) {
      auto op = detail::dense_ffn_baseline(h, x, wg, wu, wd, y_dense.view(), c);
      c.timing = h.time(op);
      c.flops = dense_flops;
      c.bytes = weight_bytes + io_bytes + 2 * detail::bytes_of_dense(m, n);
      add_energy(h, c, op);
    });
#else
    detail::not_built(report, dense, "kernels/include/twell/kernels/baselines.hpp is not in this build");
#endif

    // The sparse paths must compute the dense block's function: ||y - y_dense|| / ||y_dense||
    // (bf16 outputs: about 1e-3 to 1e-2 is rounding; NaN or more is wrong).
    const Case& dense_case = report.cases.back();
    for (std::size_t i = first; i + 1 < report.cases.size(); ++i) {
      Case& c = report.cases[i];
      if (c.status != "ok" || (c.variant != "fused" && c.variant != "unfused")) continue;
      if (dense_case.status != "ok") {
        c.extra["rel_error_vs_dense"] = detail::not_checked(dense_case);
        continue;
      }
      const DenseMatrix<T>& y = c.variant == "fused" ? y_fused : y_unfused;
      try {
        const double err = detail::relative_error(y.view(), y_dense.view());
        c.extra["rel_error_vs_dense"] = std::isfinite(err) ? Json(err) : Json("not finite");
      } catch (const Error& e) {
        c.extra["rel_error_vs_dense"] = std::string("failed: ") + e.what();
      }
    }

    // The non-gated FFN y = relu(x Wu) Wd, with Wg as its Wu so that the hidden state has this
    // point's pattern. Its own variant names keep link_baselines from pairing it with the gated
    // cases of the same point.
    Case plain_base = base;
    plain_base.op = "ffn_forward";
    const double plain_flops = 2 * 2.0 * static_cast<double>(m) * static_cast<double>(k) * static_cast<double>(n);
    const double plain_weight_bytes = 2 * detail::bytes_of_dense(k, n);
    const std::size_t plain_first = report.cases.size();
    Case fused_plain = plain_base;
    fused_plain.variant = "fused_plain";
#if TWELL_BENCH_CUDA_FFN
    detail::run_case(report, fused_plain, [&](Case& c) {
      const KernelOptions ko{h.stream(), nullptr, false};
      cuda::FfnPlan<T> plan(m, wg, wd, ActivationSpec{}, layout, cuda::FfnPlan<T>::kDefaultCapacity, ko);
      time_plan_forward(h, c, plan, x, y_fused.view(), plain_flops, plain_weight_bytes + io_bytes,
                        "FfnPlan::forward: GemmToSparsePlan::run and the down kernel; no allocation, no host sync; "
                        "plan construction and one sizing call with stats outside the timed region");
    });
#else
    detail::not_built(report, fused_plain,
                      "kernels/include/twell/kernels/ffn_cuda.hpp or kernels/cuda/*ffn*.cu is not in this build");
#endif

    Case dense_plain = plain_base;
    dense_plain.variant = "dense_plain";
#if TWELL_BENCH_BASELINES
    detail::run_case(report, dense_plain, [&](Case& c) {
      baseline::Handles handles(h.stream());
      DenseMatrix<T> hidden(m, n, MemorySpace::device);
      const DenseView<T> hv = hidden.view(), yv = y_dense.view();
      auto op = [&] {
        baseline::gemm_relu<T>(handles, x, wg, hv);
        baseline::gemm<T>(handles, Op::none, DenseView<const T>(hv), Op::none, wd, yv, 1.0f, 0.0f);
      };
      c.timing = h.time(op);
      c.flops = plain_flops;
      c.bytes = plain_weight_bytes + io_bytes + 2 * detail::bytes_of_dense(m, n);
      c.extra["dense_path"] = "cuBLASLt GEMM with fused ReLU into an M x N buffer (allocated once), cuBLAS down GEMM";
    });
#else
    detail::not_built(report, dense_plain, "kernels/include/twell/kernels/baselines.hpp is not in this build");
#endif
    if (report.cases.size() == plain_first + 2 && report.cases[plain_first].status == "ok") {
      Case& c = report.cases[plain_first];
      const Case& dense_plain_case = report.cases[plain_first + 1];
      if (dense_plain_case.status != "ok") {
        c.extra["rel_error_vs_dense"] = detail::not_checked(dense_plain_case);
      } else {
        try {
          const double err = detail::relative_error(y_fused.view(), y_dense.view());
          c.extra["rel_error_vs_dense"] = std::isfinite(err) ? Json(err) : Json("not finite");
        } catch (const Error& e) {
          c.extra["rel_error_vs_dense"] = std::string("failed: ") + e.what();
        }
      }
    }
    add_floors(h, report, first);
  }
  detail::clear_ffn_cache();
  detail::link_baselines(report, "ffn", {"fused", "unfused"}, {"dense"});
  detail::link_baselines(report, "ffn", {"fused_plain"}, {"dense_plain"});
}

}  // namespace twell::bench
