// gemm_to_sparse suite: ReLU(x Wg) written straight into TwELL/Hybrid (paper shape, M tokens),
// against the cuBLAS GEMM of the same shape writing the dense result and cuBLASLt's GEMM with
// the ReLU fused in its epilogue. Inputs come from the workload generator so that the ReLU
// pattern has the target density and distribution.
#include <twell/bench/features.hpp>
#include <twell/kernels/backends.hpp>
#if TWELL_BENCH_BASELINES
#include <twell/kernels/baselines.hpp>
#endif

#include "common.hpp"

namespace twell::bench {

using detail::T;

namespace {
const std::vector<double>& gemm_densities(bool quick) {
  static const std::vector<double> full{0.005, 0.02, 0.05};
  static const std::vector<double> small{0.005};
  return quick ? small : full;
}
}  // namespace

void run_gemm_to_sparse(Harness& h, Report& report) {
  const bool quick = h.config().quick;
  const workload::FfnShape shape = workload::paper_shape();
  const std::int64_t m = detail::tokens_large(quick), k = shape.hidden, n = shape.intermediate;
  DenseMatrix<T> dense_out(m, n, MemorySpace::device);
  const double flops = 2.0 * static_cast<double>(m) * static_cast<double>(k) * static_cast<double>(n);
  const double in_bytes = detail::bytes_of_dense(m, k) + detail::bytes_of_dense(k, n);

  for (const auto dist : detail::distributions(quick)) {
    for (const double density : gemm_densities(quick)) {
      const auto& in = detail::ffn_inputs(shape, m, density, dist, h.config().seed);
      const DenseView<const T> x = in.x.view(), wg = in.wg.view();
      Case base;
      base.suite = "gemm_to_sparse";
      base.op = "gemm_to_sparse";
      base.shape = shape.name;
      base.m = m;
      base.k = k;
      base.n = n;
      base.distribution = workload::to_string(dist);
      base.density_target = density;

      Case tw = base;
      tw.variant = "twell";
      double realized = 0;
#if TWELL_BENCH_CUDA_GEMM_TO_SPARSE
      detail::run_case(report, tw, [&](Case& x_case) {
        const TwellLayout layout = detail::layout_for_density(density);
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
        x_case.timing = h.time([&] { (void)cuda::gemm_to_sparse<T>(x, wg, ActivationSpec{}, layout, conv, ko); });
        realized = static_cast<double>(rep.nnz) / (static_cast<double>(m) * static_cast<double>(n));
        x_case.density_realized = realized;
        x_case.bytes = in_bytes + detail::bytes_of(once);
        x_case.flops = flops;
        x_case.extra["path"] = kr.path;
        x_case.extra["tile"] = layout.tile;
        x_case.extra["C"] = layout.compression;
        x_case.extra["overflow_rows"] = once.overflow_rows();
        x_case.extra["output_bytes"] = detail::bytes_of(once);
        x_case.extra["includes"] = "allocation of the result (the API returns an owning matrix)";
      });
#else
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
  }
  detail::link_baselines(report, "gemm_to_sparse", {"twell"}, {"cublas_gemm", "cublaslt_relu"});
  // The contract states this one as a time ratio (twell / cuBLAS, target <= 1.05).
  for (Case& c : report.cases)
    if (c.suite == "gemm_to_sparse" && c.variant == "twell" && c.speedup > 0)
      c.extra["time_ratio_vs_baseline"] = 1.0 / c.speedup;
}

}  // namespace twell::bench
