// convert suite: dense M x 5632 activations -> TwELL / Hybrid on the device, against a plain
// device copy of the dense matrix (the bandwidth ceiling of a pass over it) and cuSPARSE's
// DenseToSparse into CSR, allocating the result (cusparse_dense_to_csr) or into a plan's arrays
// (cusparse_dense_to_csr_plan). dense->twell and dense->hybrid allocate their result (owning API);
// dense->hybrid_plan converts into a DenseToHybridPlan's storage (the hot path for Hybrids);
// dense->twell_into writes a preallocated TwELL (the hot path), with the overflow check, and
// dense->twell_into_async without it (the kernel alone). GB/s: dense bytes read plus packed
// bytes written.
#include <cuda_runtime.h>

#include <twell/bench/features.hpp>

#include <twell/converters/backends.hpp>
#include <twell/converters/hybrid_plan.hpp>
#if TWELL_BENCH_BASELINES
#include <twell/kernels/baselines.hpp>
#endif

#include "common.hpp"

namespace twell::bench {

using detail::T;

void run_convert(Harness& h, Report& report) {
  const bool quick = h.config().quick;
  const workload::FfnShape shape = workload::paper_shape();
  const std::int64_t units = shape.intermediate;
  const std::int64_t m = detail::tokens_large(h.config());
  DenseMatrix<T> copy_dst(m, units, MemorySpace::device);
  const double dense_bytes = detail::bytes_of_dense(m, units);

  for (const auto dist : detail::distributions(quick)) {
    for (const double density : detail::sweep_densities(quick)) {
      if (!detail::in_scope(h.config(), shape.name, m, density, dist)) continue;
      const auto& act = detail::activations(m, units, density, dist, h.config().seed);
      const DenseView<const T> a{act.dense.values().data(), m, units, units, MemorySpace::device};
      const Case base = detail::sweep_case("convert", "dense_to_twell", shape, m, units, 0, dist, density, act);
      const TwellLayout layout = detail::layout_for_density(density);

#if TWELL_BENCH_CUDA_CONVERT
      std::int64_t overflow_rows = 0;
      // The cases below need its overflow count: the plan's capacity, whether plain TwELL applies.
      const std::vector<std::string> needed_by{"dense->hybrid_plan", "dense->twell", "dense->twell_into",
                                               "dense->twell_into_async"};
      detail::run_case(report, detail::with_variant(base, "dense->hybrid"), needed_by, [&](Case& x) {
        ConvertOptions o;
        o.overflow = OverflowPolicy::hybrid;
        o.stream = h.stream();
        ConvertReport rep;
        ConvertOptions probe = o;
        probe.report = &rep;
        const HybridMatrix<T> once = cuda::dense_to_hybrid<T>(a, layout, probe);
        overflow_rows = once.overflow_rows();
        x.timing = h.time([&] { (void)cuda::dense_to_hybrid<T>(a, layout, o); });
        x.bytes = dense_bytes + detail::bytes_of(once);
        x.extra["tile"] = layout.tile;
        x.extra["C"] = layout.compression;
        x.extra["overflow_rows"] = overflow_rows;
        x.extra["nnz"] = rep.nnz;
        x.extra["includes"] = "allocation of the result (the API returns an owning matrix)";
      });
      // The hot path for Hybrids: a plan allocated once, outside the timing (with room for this
      // matrix's overflow rows), converting into its own storage.
      detail::run_case(report, detail::with_variant(base, "dense->hybrid_plan"), [&](Case& x) {
        cuda::DenseToHybridPlan<T> plan(m, units, layout, overflow_rows);
        ConvertOptions o;
        o.stream = h.stream();
        const HybridView<T> once = plan.run(a, o);
        x.timing = h.time([&] { (void)plan.run(a, o); });
        x.bytes = dense_bytes + detail::bytes_of(HybridView<const T>(once));
        x.extra["tile"] = layout.tile;
        x.extra["C"] = layout.compression;
        x.extra["overflow_rows"] = overflow_rows;
        x.extra["includes"] = "packing, scan of the overflow flags, one 4-byte read back of R, maps and dense rows";
      });
      // Plain TwELL only where nothing overflows: the error policy would throw otherwise.
      if (overflow_rows > 0) {
        const std::string why =
            "skipped: " + std::to_string(overflow_rows) + " rows overflow this layout (see dense->hybrid)";
        for (const char* v : {"dense->twell", "dense->twell_into", "dense->twell_into_async"})
          detail::list_case(report, detail::with_variant(base, v), why);
      } else {
        // The hot path: a TwELL allocated once, outside the timing, written whole by every run.
        TwellMatrix<T> dst(m, units, layout, MemorySpace::device);
        const double twell_bytes = static_cast<double>(dst.packed().bytes());
        const auto time_into = [&](const char* variant, OverflowPolicy policy, const char* includes) {
          detail::run_case(report, detail::with_variant(base, variant), [&](Case& x) {
            ConvertOptions o;
            o.stream = h.stream();
            o.overflow = policy;
            x.timing = h.time([&] { cuda::dense_to_twell_into<T>(a, dst.view(), o); });
            x.bytes = dense_bytes + twell_bytes;
            x.extra["tile"] = layout.tile;
            x.extra["C"] = layout.compression;
            x.extra["includes"] = includes;
          });
        };
        time_into("dense->twell_into", OverflowPolicy::error,
                  "overflow check (error policy): counters, one 24-byte read back and a stream sync");
        // Nothing overflows this layout, so drop writes what error writes; without a report
        // nothing is read back and the host never waits: the kernel alone.
        time_into("dense->twell_into_async", OverflowPolicy::drop,
                  "the packing kernel only (drop policy, no report: no read back, no sync)");
        detail::run_case(report, detail::with_variant(base, "dense->twell"), [&](Case& x) {
          ConvertOptions o;
          o.stream = h.stream();
          const TwellMatrix<T> once = cuda::dense_to_twell<T>(a, layout, o);
          x.timing = h.time([&] { (void)cuda::dense_to_twell<T>(a, layout, o); });
          x.bytes = dense_bytes + static_cast<double>(once.packed().bytes());
          x.extra["tile"] = layout.tile;
          x.extra["C"] = layout.compression;
          x.extra["includes"] = "allocation of the result (the API returns an owning matrix)";
        });
      }
#else
      for (const char* v :
           {"dense->hybrid", "dense->hybrid_plan", "dense->twell", "dense->twell_into", "dense->twell_into_async"})
        detail::not_built(report, detail::with_variant(base, v), "converters/cuda/*.cu are not in this build");
#endif

      detail::run_case(report, detail::with_variant(base, "copy"), [&](Case& x) {
        const auto s = static_cast<cudaStream_t>(h.stream().handle);
        x.timing = h.time([&] {
          const cudaError_t st = cudaMemcpyAsync(copy_dst.values().data(), a.data,
                                                 static_cast<std::size_t>(dense_bytes), cudaMemcpyDeviceToDevice, s);
          require(st == cudaSuccess, ErrorCode::cuda, "convert suite (cudaMemcpyAsync)", cudaGetErrorString(st));
        });
        x.bytes = 2 * dense_bytes;
      });

#if TWELL_BENCH_BASELINES
      detail::convert_baselines(h, report, base, a);
#else
      for (const char* v : {"cusparse_dense_to_csr", "cusparse_dense_to_csr_plan"})
        detail::not_built(report, detail::with_variant(base, v),
                          "kernels/include/twell/kernels/baselines.hpp is not in this build");
#endif
    }
  }
  for (Case& c : report.cases) {
    if (c.suite != "convert" || c.status != "ok" || h.ceilings().copy_gbps <= 0) continue;
    c.extra["percent_of_copy_bandwidth"] = 100.0 * c.gbps() / h.ceilings().copy_gbps;
  }
  // Each conversion against cuSPARSE's of the same kind first: allocating ones against the
  // allocating DenseToSparse, those into preallocated storage against DenseToSparse into a plan.
  detail::link_baselines(report, "convert", {"dense->hybrid", "dense->twell"},
                         {"cusparse_dense_to_csr", "cusparse_dense_to_csr_plan", "copy"});
  detail::link_baselines(report, "convert", {"dense->hybrid_plan", "dense->twell_into", "dense->twell_into_async"},
                         {"cusparse_dense_to_csr_plan", "cusparse_dense_to_csr", "copy"});
}

}  // namespace twell::bench
