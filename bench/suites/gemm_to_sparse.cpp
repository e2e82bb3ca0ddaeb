// gemm_to_sparse suite: ReLU(x Wg) written straight into TwELL/Hybrid (paper shape, M tokens),
// against the cuBLAS GEMM of the same shape writing the dense result and cuBLASLt's GEMM with
// the ReLU fused in its epilogue, all timed in the same run. Inputs come from the workload
// generator so that the ReLU pattern has the target density and distribution. twell variants:
//   twell               GemmToSparsePlan::run() (plan built outside the timing; no allocation,
//                       no host wait): the hot path, the figure the contract's ratio is about
//   twell_run_and_count run() + sync_overflow_count() (adds one 40-byte read and a stream sync)
//   twell_allocating    the free function cuda::gemm_to_sparse (allocates its result, syncs)
//   twell_portable      as twell, on the portable mma.sync mainloop (FusedMainloop::portable):
//                       what devices before Hopper run, and the compute_80 build everywhere
//   twell_decode_split  as twell, on FusedMainloop::best_decode_split (the FFN plans' gate): the
//                       split-K decode kernel where M <= 64 on Hopper, else as twell
#include <algorithm>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include <twell/bench/features.hpp>
#include <twell/kernels/backends.hpp>
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

struct GemmPoint {
  workload::FfnShape shape;
  std::int64_t m;
  double density;
  workload::Distribution dist;
};

// The paper shape sweeps density and distribution at M = 16384 (break-even, skew); M = 4096 and
// the other two shapes are measured at 0.5 %. The secondary variants (run + count, allocating)
// only at the contract's point, 0.5 %, and the portable mainloop at the paper shape's 0.5 %
// points (both M, each distribution), to keep the suite short.
std::vector<GemmPoint> gemm_points(const Config& config) {
  const bool quick = config.quick;
  const workload::FfnShape paper = workload::paper_shape();
  std::vector<GemmPoint> out;
  for (const auto dist : detail::distributions(quick))
    for (const double density : detail::sweep_densities(quick))
      out.push_back({paper, detail::tokens_large(config), density, dist});
  for (const auto dist : detail::distributions(quick))
    out.push_back({paper, detail::tokens_small(config), 0.005, dist});
  if (!quick)
    for (const workload::FfnShape& other : {workload::small_shape(), workload::llama7b_shape()})
      out.push_back({other, detail::tokens_large(config), 0.005, workload::Distribution::uniform});
  return out;
}

constexpr double kSecondaryDensity = 0.005;

}  // namespace

void run_gemm_to_sparse(Harness& h, Report& report) {
  std::string last_shape;
  for (const GemmPoint& p : gemm_points(h.config())) {
    if (!detail::in_scope(h.config(), p.shape.name, p.m, p.density, p.dist)) continue;
    // Inputs of earlier shapes are not needed again; the cache would hold gigabytes.
    if (!last_shape.empty() && last_shape != p.shape.name) detail::clear_ffn_cache();
    last_shape = p.shape.name;
    const workload::FfnShape& shape = p.shape;
    const double density = p.density;
    const std::int64_t m = p.m, k = shape.hidden, n = shape.intermediate;
    DenseMatrix<T> dense_out(m, n, MemorySpace::device);
    const double flops = 2.0 * static_cast<double>(m) * static_cast<double>(k) * static_cast<double>(n);
    const double in_bytes = detail::bytes_of_dense(m, k) + detail::bytes_of_dense(k, n);
    const bool paper_point = shape.name == workload::paper_shape().name && density == kSecondaryDensity;
    const bool secondary = paper_point && m == detail::tokens_large(h.config());
    const auto& in = detail::ffn_inputs(shape, m, density, p.dist, h.config().seed);
    const DenseView<const T> x = in.x.view(), wg = in.wg.view();
    Case base;
    base.suite = "gemm_to_sparse";
    base.op = "gemm_to_sparse";
    base.shape = shape.name;
    base.m = m;
    base.k = k;
    base.n = n;
    base.distribution = workload::to_string(p.dist);
    base.density_target = density;

    double realized = 0;
#if TWELL_BENCH_CUDA_GEMM_TO_SPARSE
    const TwellLayout layout = detail::layout_for_density(density);
    const auto density_of = [&](const cuda::OverflowCount& count) {
      return static_cast<double>(count.nnz) / (static_cast<double>(m) * static_cast<double>(n));
    };
    auto describe = [&](Case& c, const cuda::OverflowCount& count, std::int64_t output_bytes) {
      c.density_realized = density_of(count);
      c.bytes = in_bytes + static_cast<double>(output_bytes);
      c.flops = flops;
      c.extra["tile"] = layout.tile;
      c.extra["C"] = layout.compression;
      c.extra["overflow_rows"] = count.rows;
      c.extra["output_bytes"] = output_bytes;
    };
    const auto output_bytes_of = [&](const HybridView<const T>& r) {
      const auto word = static_cast<std::int64_t>(sizeof(std::uint32_t));
      return r.rows() * (r.twell.packed_width() + 1) * word +
             r.overflow_rows() * (n * static_cast<std::int64_t>(sizeof(T)) + word);
    };
    {
      // One plan for both plan-based measurements; the untimed first run sizes the
      // overflow block (a second pass there if the default capacity was too small), so the
      // timed runs of this input never exceed it.
      std::optional<cuda::GemmToSparsePlan<T>> made;
      cuda::OverflowCount first{};
      std::int64_t output_bytes = 0;
      Case tw = base;
      tw.variant = "twell";
      // The cases below take its plan (twell_run_and_count) or its realized density (the baselines).
      detail::run_case(report, tw, {"twell_run_and_count", "cublas_gemm", "cublaslt_relu"}, [&](Case& c) {
        made.emplace(m, k, n, ActivationSpec{}, layout, cuda::GemmToSparsePlan<T>::kDefaultCapacity,
                     OverflowPolicy::hybrid, h.stream());
        cuda::GemmToSparsePlan<T>& plan = *made;
        plan.run(x, wg);
        first = plan.sync_overflow_count();
        realized = density_of(first);
        output_bytes = output_bytes_of(plan.result());
        c.extra["first_run_exceeded_capacity"] = first.exceeded_capacity;
        c.extra["overflow_capacity"] = plan.overflow_capacity();
        c.extra["path"] = plan.path();
        c.timing = h.time([&] { plan.run(x, wg); });
        describe(c, first, output_bytes);
        const cuda::OverflowCount after = plan.sync_overflow_count();
        c.extra["timed_runs_exceeded_capacity"] = after.exceeded_capacity;
        c.extra["includes"] =
            "run(): mainloop + TwELL epilogue, overflow ranking, overflow block (filled or recomputed)";
      });
      Case ts = base;
      ts.variant = "twell_run_and_count";
      if (secondary)
        detail::run_case(report, ts, [&](Case& c) {
          require(made.has_value(), ErrorCode::unsupported, "gemm_to_sparse suite", "the plan could not be built");
          cuda::GemmToSparsePlan<T>& plan = *made;
          c.timing = h.time([&] {
            plan.run(x, wg);
            (void)plan.sync_overflow_count();
          });
          describe(c, first, output_bytes);
          c.extra["path"] = plan.path();
          c.extra["includes"] = "run() + sync_overflow_count() (one 40-byte device-to-host read, stream sync)";
        });
      // As twell on another mainloop: its own plan, its block sized by an untimed run as twell's.
      const auto time_mainloop = [&](const char* variant, cuda::FusedMainloop mainloop, const char* includes) {
        Case tm = base;
        tm.variant = variant;
        detail::run_case(report, tm, [&](Case& c) {
          cuda::GemmToSparsePlan<T> plan(m, k, n, ActivationSpec{}, layout, cuda::GemmToSparsePlan<T>::kDefaultCapacity,
                                         OverflowPolicy::hybrid, h.stream(), mainloop);
          plan.run(x, wg);
          const cuda::OverflowCount count = plan.sync_overflow_count();
          const std::int64_t bytes = output_bytes_of(plan.result());
          c.timing = h.time([&] { plan.run(x, wg); });
          describe(c, count, bytes);
          (void)plan.sync_overflow_count();  // the path names the overflow block's making once counted
          c.extra["path"] = plan.path();
          c.extra["includes"] = includes;
        });
      };
      if (paper_point) {
        time_mainloop("twell_portable", cuda::FusedMainloop::portable, "as twell, on the portable mma.sync mainloop");
        time_mainloop("twell_decode_split", cuda::FusedMainloop::best_decode_split,
                      "as twell, on the best_decode_split mainloop (the FFN plans' gate): split in K where M <= 64");
      }
    }
    Case ta = base;
    ta.variant = "twell_allocating";
    if (secondary)
      detail::run_case(report, ta, [&](Case& c) {
        ConvertOptions conv;
        conv.overflow = OverflowPolicy::hybrid;
        ConvertReport rep;
        conv.report = &rep;
        KernelReport kr;
        const HybridMatrix<T> once =
            cuda::gemm_to_sparse<T>(x, wg, ActivationSpec{}, layout, conv, KernelOptions{h.stream(), &kr, false});
        detail::sync(h, "gemm_to_sparse suite");
        conv.report = nullptr;
        const KernelOptions ko{h.stream(), nullptr, false};
        c.timing = h.time([&] { (void)cuda::gemm_to_sparse<T>(x, wg, ActivationSpec{}, layout, conv, ko); });
        cuda::OverflowCount count;
        count.rows = once.overflow_rows();
        count.nnz = rep.nnz;
        describe(c, count, static_cast<std::int64_t>(detail::bytes_of(once)));
        c.extra["path"] = kr.path;
        c.extra["includes"] = "allocation of the result (the free function returns an owning matrix), host sync";
      });
#else
    Case tw = base;
    tw.variant = "twell";
    detail::not_built(report, tw, "kernels/cuda/gemm_to_sparse.cu is not in this build");
#endif
    base.density_realized = realized;

    Case cb = base;
    cb.variant = "cublas_gemm";
    detail::run_case(report, cb, [&](Case& x_case) {
      const DenseView<T> out = dense_out.view();
      x_case.timing = h.time([&] { h.gemm(x, wg, out); });
      x_case.bytes = in_bytes + detail::bytes_of_dense(m, n);
      x_case.flops = flops;
    });
#if TWELL_BENCH_BASELINES
    detail::gemm_baselines(h, report, base, x, wg, dense_out.view(), flops, in_bytes);
#else
    Case lt = base;
    lt.variant = "cublaslt_relu";
    detail::not_built(report, lt, "kernels/include/twell/kernels/baselines.hpp is not in this build");
#endif
  }
  const std::vector<std::string> twell_variants{"twell", "twell_run_and_count", "twell_allocating", "twell_portable",
                                                "twell_decode_split"};
  detail::link_baselines(report, "gemm_to_sparse", twell_variants, {"cublas_gemm", "cublaslt_relu"});
  // The contract states this one as a time ratio (twell / cuBLAS, target <= 1.05).
  for (Case& c : report.cases)
    if (c.suite == "gemm_to_sparse" && c.speedup > 0 &&
        std::find(twell_variants.begin(), twell_variants.end(), c.variant) != twell_variants.end())
      c.extra["time_ratio_vs_baseline"] = 1.0 / c.speedup;
}

}  // namespace twell::bench
