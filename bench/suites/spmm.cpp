// spmm suite: the down projection C = A B with A the sparse M x 5632 hidden state and B the
// 5632 x 2048 weight (paper shape), TwELL/Hybrid against cuSPARSE CSR/COO and dense cuBLAS.
#include <cmath>
#include <string>
#include <utility>

#include <twell/bench/features.hpp>

#include <twell/converters/backends.hpp>
#include <twell/converters/hybrid_plan.hpp>
#include <twell/formats/copy.hpp>
#include <twell/kernels/backends.hpp>
#if TWELL_BENCH_CUDA_SPMM
#include <twell/kernels/spmm_plan.hpp>
#endif
#if TWELL_BENCH_BASELINES
#include <twell/kernels/baselines.hpp>
#endif

#include "common.hpp"

namespace twell::bench {

namespace {

using detail::T;

// Device Hybrid of a device dense view: the cuda converter where built, else the reference
// one on a host copy (outside every timed region; twell+convert converts through a
// DenseToHybridPlan instead).
HybridMatrix<T> to_hybrid(DenseView<const T> a, TwellLayout layout, ConvertReport* rep, Stream stream) {
  ConvertOptions o;
  o.overflow = OverflowPolicy::hybrid;
  o.report = rep;
  o.stream = stream;
#if TWELL_BENCH_CUDA_CONVERT
  return cuda::dense_to_hybrid<T>(a, layout, o);
#else
  const DenseMatrix<T> host = copy_to(a, MemorySpace::host);
  return reference::dense_to_hybrid<T>(host.view(), layout, o).to(MemorySpace::device);
#endif
}

// C = A^T dy, training's weight gradient dWd = h^T dy (N x K), at the same data point: twell's
// spmm with op(A) = transpose (A transposed into a Hybrid by the direct kernels, then the op-none
// Hybrid path; docs/api.md), cuSPARSE SpMM with opA = transpose on A's CSR / COO, and cuBLAS on the
// dense A.
void transposed_cases(Harness& h, Report& report, const Case& point, const HybridMatrix<T>& a,
                      DenseView<const T> a_dense, DenseView<const T> dy, DenseView<T> c_t, double flops) {
  Case base = point;
  base.op = "spmm_at";
  const double dense_bytes = detail::bytes_of_dense(dy.rows, dy.cols) + detail::bytes_of_dense(c_t.rows, c_t.cols);
  Case tw = base;
  tw.variant = "twell";
#if TWELL_BENCH_CUDA_SPMM
  detail::run_case(report, tw, [&](Case& x) {
    KernelReport path;
    const KernelOptions ko{h.stream(), &path, false};
    x.timing = h.time([&] { cuda::spmm<T>(Op::transpose, HybridView<const T>(a.view()), dy, c_t, 1.0f, 0.0f, ko); });
    x.bytes = detail::bytes_of(a) + dense_bytes;
    x.flops = flops;
    x.extra["path"] = path.path;
    x.extra["includes"] = path.path.find("via_transpose") != std::string::npos
                              ? "A transposed into a Hybrid (two passes and a read-back of its overflow row count; "
                                "stream-ordered scratch), then the op-none Hybrid path on it"
                              : "A (Hybrid) to CSR, its CSR transpose (both allocated per call), the CSR row kernels";
  });
  Case planned = base;
  planned.variant = "twell_plan";
  detail::run_case(report, planned, [&](Case& x) {
    cuda::SpmmPlan<T> plan(a.rows(), a.cols(), a.layout(), h.stream());
    x.timing = h.time([&] { plan.run(Op::transpose, HybridView<const T>(a.view()), dy, c_t, 1.0f, 0.0f); });
    x.bytes = detail::bytes_of(a) + dense_bytes;
    x.flops = flops;
    x.extra["path"] = plan.path();
    x.extra["includes"] = "SpmmPlan::run(Op::transpose): as spmm() with A^T's storage held by the plan (grown in the "
                          "warm-up runs)";
  });
#else
  detail::not_built(report, tw, "kernels/cuda/spmm.cu is not in this build");
#endif
#if TWELL_BENCH_BASELINES
  detail::spmm_baselines(h, report, base, Op::transpose, a_dense, dy, c_t, flops, dense_bytes);
#endif
  Case dn = base;
  dn.variant = "cublas_dense";
  detail::run_case(report, dn, [&](Case& x) {
    x.timing = h.time([&] { h.gemm(a_dense, dy, c_t, true); });
    x.bytes = detail::bytes_of_dense(a_dense.rows, a_dense.cols) + dense_bytes;
    x.flops = 2.0 * static_cast<double>(a_dense.rows) * static_cast<double>(a_dense.cols) * static_cast<double>(dy.cols);
    x.extra["note"] = "dense A^T dy of the same (mostly zero) matrix; TFLOP/s counts dense work";
  });
}

}  // namespace

void run_spmm(Harness& h, Report& report) {
  const bool quick = h.config().quick;
  const workload::FfnShape shape = workload::paper_shape();
  const std::int64_t units = shape.intermediate, out_cols = shape.hidden;
  const std::int64_t m_large = detail::tokens_large(h.config());
  const std::int64_t m_values[] = {detail::tokens_small(h.config()), m_large};

  DenseMatrix<T> b(units, out_cols, MemorySpace::device);
  h.fill_random(b.values().data(), b.values().size(), 1.0f / std::sqrt(static_cast<float>(units)), 21);
  DenseMatrix<T> c(m_large, out_cols, MemorySpace::device);
  const double b_bytes = detail::bytes_of_dense(units, out_cols);
  // op(A) = A^T: dy (M x K) in, the N x K weight gradient out.
  DenseMatrix<T> dy(m_large, out_cols, MemorySpace::device), c_t(units, out_cols, MemorySpace::device);
  h.fill_random(dy.values().data(), dy.values().size(), 1.0f, 22);

  for (const auto dist : detail::distributions(quick)) {
    for (const double density : detail::sweep_densities(quick)) {
      if (!detail::in_scope(h.config(), shape.name, m_large, density, dist)) continue;
      const auto& act = detail::activations(m_large, units, density, dist, h.config().seed);
      for (const std::int64_t m : m_values) {
        if (!detail::in_scope(h.config(), shape.name, m, density, dist)) continue;
        const DenseView<const T> a_dense{act.dense.values().data(), m, units, units, MemorySpace::device};
        const DenseView<T> cv{c.values().data(), m, out_cols, out_cols, MemorySpace::device};
        const double c_bytes = detail::bytes_of_dense(m, out_cols);
        Case base;
        base.suite = "spmm";
        base.op = "spmm";
        base.shape = shape.name;
        base.m = m;
        base.k = units;
        base.n = out_cols;
        base.distribution = workload::to_string(dist);
        base.density_target = density;
        base.density_realized = act.realized_density;

        const TwellLayout layout = detail::layout_for_density(density);
        ConvertReport rep;
        HybridMatrix<T> a;
        try {
          a = to_hybrid(a_dense, layout, &rep, h.stream());
          detail::sync(h, "spmm suite (conversion)");
        } catch (const Error& e) {
          // Listed whatever --cases selects: no case of this point could run.
          Case failed = detail::with_variant(base, "twell");
          failed.status = std::string("failed: conversion: ") + e.what();
          report.cases.push_back(failed);
          continue;
        }
        const double nnz = static_cast<double>(rep.nnz);
        if (rep.nnz > 0) base.density_realized = nnz / (static_cast<double>(m) * static_cast<double>(units));
        const double flops = 2.0 * base.density_realized * static_cast<double>(m) * static_cast<double>(units) *
                             static_cast<double>(out_cols);
        auto layout_facts = [&](Case& x) {
          x.extra["tile"] = layout.tile;
          x.extra["C"] = layout.compression;
          x.extra["overflow_rows"] = a.overflow_rows();
          x.extra["format"] = a.overflow_rows() > 0 ? "hybrid" : "twell";
        };

        Case tw = base;
        tw.variant = "twell";
#if TWELL_BENCH_CUDA_SPMM
        detail::run_case(report, tw, [&](Case& x) {
          cuda::SpmmPlan<T> plan(m, units, layout, h.stream());
          plan.reserve_overflow(a.overflow_rows(), out_cols);
          plan.reserve_b_cols(out_cols);
          x.timing =
              h.time([&] { plan.run(HybridView<const T>(a.view()), DenseView<const T>(b.view()), cv, 1.0f, 0.0f); });
          x.bytes = detail::bytes_of(a) + b_bytes + c_bytes;
          x.flops = flops;
          x.extra["path"] = plan.path();
          x.extra["includes"] =
              "SpmmPlan::run with the kernel it picks (extra.path; slice_reuse: its pre-pass and slice-major copy "
              "of B), overflow rows (cuBLAS + scatter); the plan's buffers are allocated outside the timed region";
          layout_facts(x);
        });
        // At 0.5 % each TwELL kernel forced in turn, so that the automatic choice can be checked
        // against the others in one run (docs/benchmarks/history.md, "spmm paths by M").
        if (density == 0.005) {
          for (const auto& [algorithm, name] : {std::pair{SpmmAlgorithm::pair_balanced, "twell_pair_balanced"},
                                                std::pair{SpmmAlgorithm::tile_stream, "twell_tile_stream"},
                                                std::pair{SpmmAlgorithm::slice_reuse, "twell_slice_reuse"}}) {
            Case forced = base;
            forced.variant = name;
            detail::run_case(report, forced, [&](Case& x) {
              cuda::SpmmPlan<T> plan(m, units, layout, h.stream(), algorithm);
              plan.reserve_overflow(a.overflow_rows(), out_cols);
              if (algorithm == SpmmAlgorithm::slice_reuse) plan.reserve_b_cols(out_cols);
              x.timing = h.time(
                  [&] { plan.run(HybridView<const T>(a.view()), DenseView<const T>(b.view()), cv, 1.0f, 0.0f); });
              x.bytes = detail::bytes_of(a) + b_bytes + c_bytes;
              x.flops = flops;
              x.extra["path"] = plan.path();
              x.extra["includes"] = "as twell, with KernelOptions::spmm_algorithm forced to this kernel";
              layout_facts(x);
            });
          }
        }
        Case twc = base;
        twc.variant = "twell+convert";
#if TWELL_BENCH_CUDA_CONVERT
        detail::run_case(report, twc, [&](Case& x) {
          // Both plans built outside the timing, as a caller converting every step would keep them.
          cuda::DenseToHybridPlan<T> convert(m, units, layout, a.overflow_rows());
          cuda::SpmmPlan<T> plan(m, units, layout, h.stream());
          plan.reserve_overflow(a.overflow_rows(), out_cols);
          plan.reserve_b_cols(out_cols);
          ConvertOptions o;
          o.stream = h.stream();
          x.timing = h.time([&] {
            const HybridView<T> fresh = convert.run(a_dense, o);
            plan.run(HybridView<const T>(fresh), DenseView<const T>(b.view()), cv, 1.0f, 0.0f);
          });
          x.bytes = detail::bytes_of_dense(m, units) + 2 * detail::bytes_of(a) + b_bytes + c_bytes;
          x.flops = flops;
          x.extra["path"] = plan.path();
          x.extra["includes"] = "dense -> Hybrid conversion into a DenseToHybridPlan (one read back of R) and spmm";
          layout_facts(x);
        });
#else
        detail::not_built(report, twc, "converters/cuda/*.cu are not in this build");
#endif
#else
        detail::not_built(report, tw, "kernels/cuda/spmm.cu is not in this build");
#endif

#if TWELL_BENCH_BASELINES
        detail::spmm_baselines(h, report, base, Op::none, a_dense, DenseView<const T>(b.view()), cv, flops,
                               b_bytes + c_bytes);
#else
        for (const char* name : {"cusparse_csr", "cusparse_coo"}) {
          Case bl = base;
          bl.variant = name;
          detail::not_built(report, bl, "kernels/include/twell/kernels/baselines.hpp is not in this build");
        }
#endif
        Case dn = base;
        dn.variant = "cublas_dense";
        detail::run_case(report, dn, [&](Case& x) {
          x.timing = h.time([&] { h.gemm(a_dense, DenseView<const T>(b.view()), cv); });
          x.bytes = detail::bytes_of_dense(m, units) + b_bytes + c_bytes;
          x.flops = 2.0 * static_cast<double>(m) * static_cast<double>(units) * static_cast<double>(out_cols);
          x.extra["note"] = "dense GEMM of the same (mostly zero) matrix; TFLOP/s counts dense work";
        });
        // The weight-gradient product at 0.5 % only (cuSPARSE's transposed algorithms are slow to
        // try at every density).
        if (density == 0.005) {
          const DenseView<const T> dyv{dy.values().data(), m, out_cols, out_cols, MemorySpace::device};
          transposed_cases(h, report, base, a, a_dense, dyv, c_t.view(), flops);
        }
      }
    }
  }
  // The least work of a product: N FMAs per (row, nonzero) pair, A, B and C through DRAM once.
  for (Case& x : report.cases) {
    if (x.suite != "spmm" || x.status != "ok" || !x.variant.starts_with("twell") || x.variant.ends_with("+convert"))
      continue;
    set_floor(x, h.ceilings(), {detail::sparse_products_phase("product", x.flops / 2, x.bytes)});
  }
  // Both ops: link_baselines pairs cases of the same op only.
  detail::link_baselines(report, "spmm", {"twell"}, {"cusparse_csr", "cusparse_coo", "cublas_dense"});
  // Conversion from dense included on both sides.
  detail::link_baselines(
      report, "spmm", {"twell+convert"},
      {"cusparse_csr+convert_plan", "cusparse_csr+convert", "cusparse_csr", "cusparse_coo", "cublas_dense"});
  detail::link_baselines(report, "spmm", {"cusparse_csr", "cusparse_coo"}, {"cublas_dense"});
}

}  // namespace twell::bench
