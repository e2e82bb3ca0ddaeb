// sddmm suite: the backward's dh = (dy Wd^T) sampled at the hidden state's pattern (dy: M x 2048,
// Wd: 5632 x 2048, pattern M x 5632), TwELL/Hybrid against cuSPARSE SDDMM on a CSR pattern.
#include <cmath>

#include <twell/bench/features.hpp>

#include <twell/converters/backends.hpp>
#include <twell/kernels/backends.hpp>
#if TWELL_BENCH_BASELINES
#include <twell/kernels/baselines.hpp>
#endif

#include "common.hpp"

namespace twell::bench {

using detail::T;

void run_sddmm(Harness& h, Report& report) {
  const bool quick = h.config().quick;
  const workload::FfnShape shape = workload::paper_shape();
  const std::int64_t units = shape.intermediate, hidden = shape.hidden;
  const std::int64_t m = detail::tokens_large(h.config());

  DenseMatrix<T> dy(m, hidden, MemorySpace::device);
  DenseMatrix<T> wd(units, hidden, MemorySpace::device);
  h.fill_random(dy.values().data(), dy.values().size(), 1.0f, 31);
  h.fill_random(wd.values().data(), wd.values().size(), 1.0f / std::sqrt(static_cast<float>(units)), 32);
  const double dense_in = detail::bytes_of_dense(m, hidden) + detail::bytes_of_dense(units, hidden);

  for (const auto dist : detail::distributions(quick)) {
    for (const double density : detail::sweep_densities(quick)) {
      if (!detail::in_scope(h.config(), shape.name, m, density, dist)) continue;
      const auto& act = detail::activations(m, units, density, dist, h.config().seed);
      const DenseView<const T> a_dense{act.dense.values().data(), m, units, units, MemorySpace::device};
      const Case base = detail::sweep_case("sddmm", "sddmm", shape, m, hidden, units, dist, density, act);
      const double flops = 2.0 * act.realized_density * static_cast<double>(m) * static_cast<double>(units) *
                           static_cast<double>(hidden);

      const Case tw = detail::with_variant(base, "twell");
#if TWELL_BENCH_CUDA_SDDMM && TWELL_BENCH_CUDA_CONVERT
      detail::run_case(report, tw, [&](Case& x) {
        const TwellLayout layout = detail::layout_for_density(density);
        ConvertOptions o;
        o.overflow = OverflowPolicy::hybrid;
        o.stream = h.stream();
        const HybridMatrix<T> pattern = cuda::dense_to_hybrid<T>(a_dense, layout, o);
        HybridMatrix<T> out = pattern.to(MemorySpace::device);
        KernelReport kr;
        cuda::sddmm<T>(DenseView<const T>(dy.view()), Op::transpose, DenseView<const T>(wd.view()), pattern.view(),
                       out.view(), 1.0f, 0.0f, KernelOptions{h.stream(), &kr, false});
        const KernelOptions ko{h.stream(), nullptr, false};
        x.timing = h.time([&] {
          cuda::sddmm<T>(DenseView<const T>(dy.view()), Op::transpose, DenseView<const T>(wd.view()), pattern.view(),
                         out.view(), 1.0f, 0.0f, ko);
        });
        x.bytes = dense_in + 2 * detail::bytes_of(pattern);
        x.flops = flops;
        x.extra["path"] = kr.path;
        x.extra["tile"] = layout.tile;
        x.extra["C"] = layout.compression;
        x.extra["overflow_rows"] = pattern.overflow_rows();
        // The least work: K FMAs per pair, the operands and the pattern through DRAM once.
        set_floor(x, h.ceilings(), {detail::sparse_products_phase("products", flops / 2, x.bytes)});
      });
#else
      detail::not_built(report, tw, "kernels/cuda/sddmm.cu or converters/cuda/*.cu are not in this build");
#endif

#if TWELL_BENCH_BASELINES
      detail::sddmm_baselines(h, report, base, DenseView<const T>(dy.view()), DenseView<const T>(wd.view()), a_dense,
                              flops, dense_in);
#else
      for (const char* name : {"cusparse_sddmm_fp32_inputs", "cusparse_sddmm"})
        detail::not_built(report, detail::with_variant(base, name),
                          "kernels/include/twell/kernels/baselines.hpp is not in this build");
#endif
    }
  }
  detail::link_baselines(report, "sddmm", {"twell"}, {"cusparse_sddmm_fp32_inputs", "cusparse_sddmm"});
}

}  // namespace twell::bench
