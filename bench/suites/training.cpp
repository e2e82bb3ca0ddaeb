// training suite: one training step of the gated FFN at the paper's shape, forward keeping its
// activations and backward into dx, dwg, dwu, dwd with the L1 gradient (lambda = 2e-5 per token,
// the paper's), sparse against dense:
//   twell           sparse_gated_ffn_training_forward + sparse_gated_ffn_backward on the device
//                   (gemm_to_sparse; the up/down kernel keeping u and h, cuda::gated_up_down; its
//                   backward pass for dg, du and dx, cuda::gated_up_down_backward; spmm with op T
//                   for dwd, dwg, dwu, dense transposes, l1_norm; allocating, one host read);
//   twell_backward  the backward alone, from activations saved outside the timing;
//   twell_plan      the same step through a GatedFfnTraining (storage held: the gate's
//                   GemmToSparsePlan, one SpmmPlan, one GatedUpDownPlan, the activations, dg, du);
//   twell_plan_backward  its backward alone, after one forward outside the timing;
//   dense           baseline::dense_gated_ffn_training_forward + dense_gated_ffn_backward (nine
//                   cuBLAS(Lt) GEMMs, two elementwise kernels, workspace allocated once);
//   dense_backward  its backward alone.
// Also the bytes of the saved activations (three Hybrids against three dense M x N matrices) and
// each twell gradient's relative error against the dense step's.
#include <cmath>
#include <optional>

#include <twell/bench/features.hpp>

#include <twell/ffn.hpp>
#if TWELL_BENCH_BASELINES
#include <twell/kernels/baselines.hpp>
#endif

#include "common.hpp"

namespace twell::bench {

using detail::T;

namespace {

struct TrainingPoint {
  std::int64_t m;
  double density;
  workload::Distribution dist;
};

std::vector<TrainingPoint> training_points(const Config& config) {
  using workload::Distribution;
  const std::int64_t large = detail::tokens_large(config), small = detail::tokens_small(config);
  if (config.quick) return {{large, 0.005, Distribution::uniform}, {large, 0.005, Distribution::token_skewed}};
  std::vector<TrainingPoint> out;
  for (const double density : {0.005, 0.01, 0.02, 0.05}) out.push_back({large, density, Distribution::uniform});
  out.push_back({large, 0.005, Distribution::token_skewed});
  out.push_back({small, 0.005, Distribution::uniform});
  out.push_back({small, 0.005, Distribution::token_skewed});
  return out;
}

constexpr float kLambda = 2e-5f;  // the paper's, with the L1 term normalised per token

// g is empty for ReLU, the suite's activation.
double activation_bytes(const GatedFfnActivations<T>& s) {
  return detail::bytes_of(s.a) + detail::bytes_of(s.u) + detail::bytes_of(s.h) + detail::bytes_of(s.g);
}

// The least work of the twell cases of one point, from `first` on (set_floor): a step is the gate
// as a dense GEMM on tensor cores, then eight sparse products (u and y forward; dh, dwd, dx's two,
// dwg and dwu backward), each K FMAs per (token, unit) pair of the gate's pattern; the backward
// alone is its six products. The
// pattern's density is the one the twell case counted (the other cases do not count it).
void add_floors(const Harness& h, Report& report, std::size_t first) {
  const Case& counted = report.cases[first];
  if (counted.variant != "twell" || counted.status != "ok" || counted.density_realized <= 0) return;
  for (std::size_t i = first; i < report.cases.size(); ++i) {
    Case& c = report.cases[i];
    const bool backward_only = c.variant.ends_with("_backward");
    if (c.status != "ok" || !c.variant.starts_with("twell")) continue;
    c.density_realized = counted.density_realized;
    const double mk = static_cast<double>(c.m) * static_cast<double>(c.k);
    const double pair_fmas = c.density_realized * mk * static_cast<double>(c.n);
    const double products = backward_only ? 6 : 8;
    const FloorPhase sparse = detail::sparse_products_phase("sparse products", products * pair_fmas, c.bytes);
    if (backward_only) {
      set_floor(c, h.ceilings(), {sparse});
    } else {
      set_floor(c, h.ceilings(), {{.name = "gate", .tensor_flops = 2 * mk * static_cast<double>(c.n)}, sparse});
    }
  }
}

}  // namespace

void run_training(Harness& h, Report& report) {
  const bool quick = h.config().quick;
  const workload::FfnShape shape = quick ? workload::small_shape() : workload::paper_shape();
  for (const TrainingPoint& p : training_points(h.config())) {
    if (!detail::in_scope(h.config(), shape.name, p.m, p.density, p.dist)) continue;
    const std::int64_t m = p.m, k = shape.hidden, n = shape.intermediate;
    const TwellLayout layout = detail::layout_for_density(p.density);
    const KernelOptions ko{h.stream(), nullptr, false};
    const float l1_scale = kLambda / static_cast<float>(m);

    Case base;
    base.suite = "training";
    base.op = "gated_ffn_training_step";
    base.shape = shape.name;
    base.m = m;
    base.k = k;
    base.n = n;
    base.distribution = workload::to_string(p.dist);
    base.density_target = p.density;
    if (detail::none_selected(report, base,
                              {{"gated_ffn_training_step", "twell"},
                               {"gated_ffn_training_step", "twell_backward"},
                               {"gated_ffn_training_step", "twell_plan"},
                               {"gated_ffn_training_step", "twell_plan_backward"},
                               {"gated_ffn_training_step", "dense"},
                               {"gated_ffn_training_step", "dense_backward"}}))
      continue;
    const auto& in = detail::ffn_inputs(shape, m, p.density, p.dist, h.config().seed);
    const DenseView<const T> x = in.x.view(), wg = in.wg.view(), wu = in.wu.view(), wd = in.wd.view();
    DenseMatrix<T> dy(m, k, MemorySpace::device), y(m, k, MemorySpace::device);
    h.fill_random(dy.view().data, static_cast<std::size_t>(m * k), 1.0f, h.config().seed + 17);

    // Dense FLOPs of a step: three GEMMs forward, six backward; TFLOP/s reads as dense-equivalent.
    const double step_flops = 9 * 2.0 * static_cast<double>(m) * static_cast<double>(k) * static_cast<double>(n);
    const double backward_flops = step_flops * 6 / 9;
    const double weight_bytes = 3 * detail::bytes_of_dense(k, n);

    // The sparse step's gradients stay for the comparison with the dense step's.
    GatedFfnGradients<T> sparse_grads;
    const std::size_t twell_index = report.cases.size();
    Case tw = base;
    tw.variant = "twell";
    detail::run_case(report, tw, [&](Case& c) {
      auto op = [&] {
        const auto saved =
            sparse_gated_ffn_training_forward<T>(x, wg, wu, wd, ActivationSpec{}, layout, y.view(), ko);
        sparse_grads = sparse_gated_ffn_backward<T>(saved, x, wg, wu, wd, dy.view(), kLambda,
                                                    L1Normalization::per_token, ko);
      };
      c.timing = h.time(op);
      c.flops = step_flops;
      // Weights read and their gradients written, x, y, dy, dx.
      c.bytes = 2 * weight_bytes + 4 * detail::bytes_of_dense(m, k);
      const auto saved = sparse_gated_ffn_training_forward<T>(x, wg, wu, wd, ActivationSpec{}, layout, y.view(), ko);
      c.density_realized = static_cast<double>(l0_norm<T>(saved.a.view(), ko)) /
                           (static_cast<double>(m) * static_cast<double>(n));
      c.extra["activation_bytes_sparse"] = activation_bytes(saved);
      c.extra["activation_bytes_dense"] = 3 * detail::bytes_of_dense(m, n);
      c.extra["overflow_rows"] = saved.a.overflow_rows();
      c.extra["tile"] = layout.tile;
      c.extra["C"] = layout.compression;
      c.extra["l1_term"] = sparse_grads.l1_term;
      c.extra["includes"] =
          "sparse_gated_ffn_training_forward (gemm_to_sparse, the up/down kernel keeping u and h; allocating) and "
          "sparse_gated_ffn_backward (the up/down kernel's backward pass for dg, du and dx, three spmm with op T, "
          "four dense transposes, l1_norm with its host read; allocating)";
    });

    Case tw_back = base;
    tw_back.variant = "twell_backward";
    detail::run_case(report, tw_back, [&](Case& c) {
      const auto saved = sparse_gated_ffn_training_forward<T>(x, wg, wu, wd, ActivationSpec{}, layout, y.view(), ko);
      c.timing = h.time([&] {
        sparse_gated_ffn_backward<T>(saved, x, wg, wu, wd, dy.view(), kLambda, L1Normalization::per_token, ko);
      });
      c.flops = backward_flops;
      c.bytes = 2 * weight_bytes + 3 * detail::bytes_of_dense(m, k);
      c.extra["includes"] = "sparse_gated_ffn_backward alone, from activations saved outside the timing";
    });

    // The plan form; its gradients go to buffers allocated here, outside the timing.
    DenseMatrix<T> pdx(m, k, MemorySpace::device), pdwg(k, n, MemorySpace::device), pdwu(k, n, MemorySpace::device),
        pdwd(n, k, MemorySpace::device);
    const std::size_t plan_index = report.cases.size();
    {
      // Made inside the first case, so that a failure to make it marks the cases, not the suite.
      std::optional<GatedFfnTraining<T>> step;
      const GatedFfnGradientViews<T> grads{pdx.view(), pdwg.view(), pdwu.view(), pdwd.view()};
      Case plan = base;
      plan.variant = "twell_plan";
      detail::run_case(report, plan, {"twell_plan_backward"}, [&](Case& c) {
        step.emplace(m, k, n, MemorySpace::device, ActivationSpec{}, layout, kDefaultFfnCapacity, ko);
        c.timing = h.time([&] {
          step->forward(x, wg, wu, wd, y.view());
          step->backward(x, wg, wu, wd, dy.view(), kLambda, L1Normalization::per_token, grads);
        });
        c.flops = step_flops;
        c.bytes = 2 * weight_bytes + 4 * detail::bytes_of_dense(m, k);
        c.extra["overflow_capacity"] = step->overflow_capacity();
        c.extra["includes"] =
            "GatedFfnTraining::forward (the gate's GemmToSparsePlan with one host wait for its overflow count, "
            "GatedUpDownPlan keeping u and h) and ::backward (the free backward's operations through the held "
            "GatedUpDownPlan and SpmmPlan, l1_norm with its host read)";
      });
      Case plan_back = base;
      plan_back.variant = "twell_plan_backward";
      detail::run_case(report, plan_back, [&](Case& c) {
        require(step.has_value(), ErrorCode::invalid_argument, "training suite", "the twell_plan case failed");
        step->forward(x, wg, wu, wd, y.view());
        c.timing = h.time(
            [&] { step->backward(x, wg, wu, wd, dy.view(), kLambda, L1Normalization::per_token, grads); });
        c.flops = backward_flops;
        c.bytes = 2 * weight_bytes + 3 * detail::bytes_of_dense(m, k);
        c.extra["includes"] = "GatedFfnTraining::backward alone, after one forward outside the timing";
      });
    }

#if TWELL_BENCH_BASELINES
    baseline::Handles handles(h.stream());
    baseline::DenseFfnTrainingWorkspace<T> workspace(handles, m, n);
    DenseMatrix<T> dx(m, k, MemorySpace::device), dwg(k, n, MemorySpace::device), dwu(k, n, MemorySpace::device),
        dwd(n, k, MemorySpace::device);
    const auto dense_backward = [&] {
      baseline::dense_gated_ffn_backward<T>(x, wg, wu, wd, dy.view(), l1_scale, dx.view(), dwg.view(), dwu.view(),
                                            dwd.view(), workspace);
    };
    const std::size_t dense_index = report.cases.size();
    Case dense = base;
    dense.variant = "dense";
    detail::run_case(report, dense, [&](Case& c) {
      c.timing = h.time([&] {
        baseline::dense_gated_ffn_training_forward<T>(x, wg, wu, wd, y.view(), workspace);
        dense_backward();
      });
      c.flops = step_flops;
      c.bytes = 2 * weight_bytes + 4 * detail::bytes_of_dense(m, k) + 8 * detail::bytes_of_dense(m, n);
      c.extra["dense_path"] =
          "cuBLASLt ReLU gate GEMM, up GEMM, product kernel, down GEMM; backward: six cuBLAS GEMMs and one "
          "elementwise kernel (dg, du with the L1 gradient); workspace (5 x M x N) allocated once";
    });
    Case dense_back = base;
    dense_back.variant = "dense_backward";
    detail::run_case(report, dense_back, [&](Case& c) {
      baseline::dense_gated_ffn_training_forward<T>(x, wg, wu, wd, y.view(), workspace);
      c.timing = h.time(dense_backward);
      c.flops = backward_flops;
      c.bytes = 2 * weight_bytes + 3 * detail::bytes_of_dense(m, k) + 6 * detail::bytes_of_dense(m, n);
    });
    // Each sparse step (the free functions' and the plan's last) against the dense one, gradient by
    // gradient (bf16: ~1e-2 is rounding).
    const auto record_errors = [&](std::size_t index, const DenseMatrix<T>* const (&got)[4]) {
      Case& c = report.cases[index];
      const Case& dense_case = report.cases[dense_index];
      if (c.status != "ok") return;
      if (dense_case.status != "ok") {
        c.extra["rel_error_vs_dense"] = detail::not_checked(dense_case);
        return;
      }
      try {
        const char* const names[] = {"dx", "dwg", "dwu", "dwd"};
        const DenseMatrix<T>* const want[] = {&dx, &dwg, &dwu, &dwd};
        Json errors = Json::object();
        for (int g = 0; g < 4; ++g) {
          const double err = detail::relative_error(got[g]->view(), want[g]->view());
          errors[names[g]] = std::isfinite(err) ? Json(err) : Json("not finite");
        }
        c.extra["rel_error_vs_dense"] = errors;
      } catch (const Error& e) {
        c.extra["rel_error_vs_dense"] = std::string("failed: ") + e.what();
      }
    };
    record_errors(twell_index, {&sparse_grads.dx, &sparse_grads.dwg, &sparse_grads.dwu, &sparse_grads.dwd});
    record_errors(plan_index, {&pdx, &pdwg, &pdwu, &pdwd});
#else
    detail::not_built(report, detail::with_variant(base, "dense"),
                      "kernels/include/twell/kernels/baselines.hpp is not in this build");
#endif
    add_floors(h, report, twell_index);
  }
  detail::clear_ffn_cache();
  detail::link_baselines(report, "training", {"twell", "twell_plan"}, {"dense"});
  detail::link_baselines(report, "training", {"twell_backward", "twell_plan_backward"}, {"dense_backward"});
}

}  // namespace twell::bench
