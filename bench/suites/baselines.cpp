// The baseline cases of the suites, over twell::baseline (kernels/include/twell/kernels/baselines.hpp).
#include <twell/bench/features.hpp>

#if TWELL_BENCH_BASELINES
#include <algorithm>
#include <limits>
#include <memory>

#include <twell/kernels/baselines.hpp>

#include "common.hpp"

namespace twell::bench::detail {

namespace {

// CSR of a device dense matrix through cuSPARSE itself, so the baselines need nothing of twell's
// converters.
CsrMatrix<T> csr_of(baseline::Handles& handles, DenseView<const T> a) {
  baseline::DenseToCsrPlan<T> plan(handles, a);
  return plan.run_allocating();
}

double csr_bytes(CsrView<const T> a) {
  return static_cast<double>(a.rows + 1) * sizeof(std::int64_t) +
         static_cast<double>(a.nnz) * static_cast<double>(sizeof(std::int32_t) + sizeof(T));
}

constexpr int kSelectionReps = 10;
// The cases that take the algorithm the cusparse_csr case picks.
const std::vector<std::string> kConvertVariants{"cusparse_csr+convert_plan", "cusparse_csr+convert"};

}  // namespace

void spmm_baselines(Harness& h, Report& report, const Case& base, Op op_a, DenseView<const T> a, DenseView<const T> b,
                    DenseView<T> c, double flops, double dense_bytes) {
  std::vector<std::string> variants{"cusparse_csr", "cusparse_coo"};
  if (op_a == Op::none) variants.insert(variants.end(), kConvertVariants.begin(), kConvertVariants.end());
  // No CSR to make where --cases selects none of these cases.
  if (std::none_of(variants.begin(), variants.end(),
                   [&](const std::string& v) { return report.selection.selects(with_variant(base, v)); })) {
    for (const std::string& v : variants) list_case(report, with_variant(base, v), kNotSelected);
    return;
  }
  baseline::Handles handles(h.stream());
  CsrMatrix<T> csr;
  try {
    csr = csr_of(handles, a);
  } catch (const Error& e) {
    // Listed whatever --cases selects: none of cuSPARSE's cases of this point could run.
    for (const char* v : {"cusparse_csr", "cusparse_coo"}) {
      Case x = with_variant(base, v);
      x.status = std::string("failed: cuSPARSE DenseToSparse: ") + e.what();
      report.cases.push_back(x);
    }
    return;
  }
  baseline::SpmmAlgorithm best_csr{};
  bool csr_ok = false;
  for (const auto storage : {baseline::SparseStorage::csr, baseline::SparseStorage::coo}) {
    Case x = base;
    x.variant = storage == baseline::SparseStorage::csr ? "cusparse_csr" : "cusparse_coo";
    const bool picks_for_convert = storage == baseline::SparseStorage::csr && op_a == Op::none;
    run_case(report, x, picks_for_convert ? kConvertVariants : std::vector<std::string>{}, [&](Case& cs) {
      const auto algs = baseline::supported_spmm_algorithms<T>(handles, op_a, csr.view(), storage, b, c);
      require(!algs.empty(), ErrorCode::unsupported, "cuSPARSE SpMM", "no algorithm accepts this problem");
      // Best of the algorithms: a short timing of each, then the winner timed in full.
      baseline::SpmmAlgorithm best = algs.front();
      double best_ms = std::numeric_limits<double>::infinity();
      Json tried = Json::object();
      for (const auto alg : algs) {
        baseline::SpmmPlan<T> plan(handles, op_a, csr.view(), storage, alg, b, c, 1.0f, 0.0f);
        const Timing t = h.time([&] { plan.run(); }, kSelectionReps);
        tried[std::string(baseline::to_string(alg))] = t.median_ms;
        if (t.median_ms < best_ms) {
          best_ms = t.median_ms;
          best = alg;
        }
      }
      baseline::SpmmPlan<T> plan(handles, op_a, csr.view(), storage, best, b, c, 1.0f, 0.0f);
      cs.timing = h.time([&] { plan.run(); });
      if (storage == baseline::SparseStorage::csr) {
        best_csr = best;
        csr_ok = true;
      }
      const double coo_rows = storage == baseline::SparseStorage::coo ? 4.0 * static_cast<double>(csr.nnz()) : 0.0;
      cs.bytes = csr_bytes(csr.view()) + coo_rows + dense_bytes;
      cs.flops = flops;
      cs.extra["algorithm"] = std::string(baseline::to_string(best));
      cs.extra["algorithms_ms"] = tried;
    });
  }
  // The same product with cuSPARSE's own conversion from dense in the timed region, to set
  // against twell+convert, in two forms: cusparse_csr+convert_plan converts into a DenseToCsrPlan's
  // arrays (analysis with its read-back of the count, conversion, widening of the 32-bit row
  // offsets; as twell's side, nothing allocated), cusparse_csr+convert into a new CSR (its
  // allocation and zero fill with device syncs too: cuSPARSE needs the count before the arrays
  // exist). Then SpMM with the best CSR algorithm, on a plan built once on the converted arrays, so
  // that the buffer query and preprocessing stay outside (the pattern does not change between runs).
  if (op_a == Op::none && csr_ok) {
    for (const bool into_plan : {true, false}) {
      Case x = base;
      x.variant = kConvertVariants[into_plan ? 0 : 1];
      run_case(report, x, [&](Case& cs) {
        baseline::DenseToCsrPlan<T> convert(handles, a, into_plan ? csr.nnz() : 0);
        const CsrView<const T> converted = into_plan ? convert.run() : csr.view();
        baseline::SpmmPlan<T> plan(handles, op_a, converted, baseline::SparseStorage::csr, best_csr, b, c, 1.0f, 0.0f);
        cs.timing = h.time([&] {
          if (into_plan)
            (void)convert.run();
          else
            (void)convert.run_allocating();
          plan.run();
        });
        cs.bytes = bytes_of_dense(a.rows, a.cols) + 2 * csr_bytes(csr.view()) + dense_bytes;
        cs.flops = flops;
        cs.extra["algorithm"] = std::string(baseline::to_string(best_csr));
        cs.extra["includes"] =
            into_plan ? "cuSPARSE DenseToSparse into a DenseToCsrPlan's arrays (analysis with its read-back of the "
                        "count, conversion, row offsets widened to 64 bits) and SpMM"
                      : "cuSPARSE DenseToSparse (analysis, allocation and zero fill of the CSR with device syncs, "
                        "conversion) and SpMM";
        if (into_plan) cs.extra["growths"] = convert.growths();
      });
    }
  }
}

void convert_baselines(Harness& h, Report& report, const Case& base, DenseView<const T> a) {
  Case x = base;
  x.variant = "cusparse_dense_to_csr";
  run_case(report, x, [&](Case& cs) {
    baseline::Handles handles(h.stream());
    baseline::DenseToCsrPlan<T> plan(handles, a);
    const CsrMatrix<T> once = plan.run_allocating();
    cs.timing = h.time([&] { (void)plan.run_allocating(); });
    cs.bytes = bytes_of_dense(a.rows, a.cols) + csr_bytes(once.view());
    cs.extra["includes"] = "analysis, allocation of the result and conversion";
  });
  Case y = base;
  y.variant = "cusparse_dense_to_csr_plan";
  run_case(report, y, [&](Case& cs) {
    baseline::Handles handles(h.stream());
    baseline::DenseToCsrPlan<T> plan(handles, a);
    const CsrView<const T> once = plan.run();  // sizes the plan's arrays outside the timing
    cs.timing = h.time([&] { (void)plan.run(); });
    cs.bytes = bytes_of_dense(a.rows, a.cols) + csr_bytes(once);
    cs.extra["growths"] = plan.growths();
    cs.extra["includes"] =
        "analysis (with its read-back of the count) and conversion into the plan's arrays, row offsets widened "
        "to 64 bits; nothing allocated";
  });
}

// cuSPARSE's SDDMM twice where it refuses bf16: converting dy and Wd to fp32 in every timed run
// (a user holding bf16 data), and from fp32 copies made and preprocessed once, outside the timing
// (a user keeping fp32 copies: the first baseline of the suite).
void sddmm_baselines(Harness& h, Report& report, const Case& base, DenseView<const T> dy, DenseView<const T> wd,
                     DenseView<const T> pattern, double flops, double dense_bytes) {
  const std::pair<const char*, baseline::Fp32Copies> variants[] = {
      {"cusparse_sddmm", baseline::Fp32Copies::every_run}, {"cusparse_sddmm_fp32_inputs", baseline::Fp32Copies::once}};
  for (const auto& [name, copies] : variants) {
    Case x = base;
    x.variant = name;
    run_case(report, x, [&](Case& cs) {
      baseline::Handles handles(h.stream());
      CsrMatrix<T> out = csr_of(handles, pattern);
      baseline::SddmmPlan<T> plan(handles, dy, Op::transpose, wd, out.view(), 1.0f, 0.0f, copies);
      cs.timing = h.time([&] { plan.run(); });
      cs.bytes = dense_bytes + 2 * csr_bytes(out.view());
      cs.flops = flops;
      cs.extra["native_16bit"] = plan.native();
      if (!plan.native())
        cs.extra["includes"] = copies == baseline::Fp32Copies::every_run
                                   ? "dy and Wd converted to fp32 in every run; out's values to fp32 and back"
                                   : "dy and Wd as fp32 copies made outside the timing; out's fp32 values rounded to bf16";
    });
  }
}

void gemm_baselines(Harness& h, Report& report, const Case& base, DenseView<const T> x, DenseView<const T> w,
                    DenseView<T> out, double flops, double in_bytes) {
  Case c = base;
  c.variant = "cublaslt_relu";
  run_case(report, c, [&](Case& cs) {
    baseline::Handles handles(h.stream());
    cs.timing = h.time([&] { baseline::gemm_relu<T>(handles, x, w, out); });
    cs.bytes = in_bytes + static_cast<double>(out.rows) * static_cast<double>(out.cols) * sizeof(T);
    cs.flops = flops;
  });
}

std::function<void()> dense_ffn_baseline(Harness& h, DenseView<const T> x, DenseView<const T> wg, DenseView<const T> wu,
                                         DenseView<const T> wd, DenseView<T> y, Case& c) {
  struct State {
    baseline::Handles handles;
    baseline::DenseFfnWorkspace<T> workspace;
    State(Stream s, std::int64_t m, std::int64_t n) : handles(s), workspace(handles, m, n) {}
  };
  // DenseFfnWorkspace keeps a pointer to its Handles, so both live together at a fixed address.
  auto state = std::make_shared<State>(h.stream(), x.rows, wg.cols);
  c.extra["dense_path"] = "cuBLASLt gate GEMM with fused ReLU, cuBLAS up GEMM, fused product, cuBLAS down GEMM";
  return [state, x, wg, wu, wd, y] { baseline::dense_gated_ffn_forward<T>(x, wg, wu, wd, y, state->workspace); };
}

}  // namespace twell::bench::detail
#endif
