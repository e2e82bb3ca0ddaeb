// Sparse training of the gated FFN: the free forward and backward (storage allocated per call)
// and GatedFfnTraining (storage held), both through the compositions of ffn_compose.hpp, or, for
// the forward's u, h and y on the device, the fused up/down kernel that keeps u and h.
#include <algorithm>
#include <functional>
#include <optional>
#include <string>
#include <utility>

#include <twell/config.hpp>
#include <twell/ffn.hpp>
#include <twell/formats/dense_checks.hpp>
#include <twell/instantiate.hpp>
#if TWELL_HAS_CUDA
#include <twell/kernels/ffn_cuda.hpp>
#include <twell/kernels/gemm_to_sparse_plan.hpp>
#include <twell/kernels/spmm_plan.hpp>
#endif

#include "ffn_compose.hpp"

namespace twell {

using ffn_detail::check_gated;
using ffn_detail::hybrid_like;
using ffn_detail::shape;
using ffn_detail::spmm_on_backend;

namespace {

// Runs the kept up/down kernel of cuda::GatedUpDownPlan (u, h and y of the forward in one kernel)
// into u, h, y; empty where the forward composes instead.
template <class T>
using RunKeptUpDown = std::function<void(HybridView<T> u, HybridView<T> h, DenseView<T> y)>;

// Whether the kept up/down kernel takes a forward of hidden size K in `space` (device memory,
// 16-bit values, K within the kernel's limit).
template <class T>
bool keeps_up_down([[maybe_unused]] std::int64_t k, [[maybe_unused]] MemorySpace space) {
#if TWELL_HAS_CUDA
  return space == MemorySpace::device && cuda::GatedUpDownPlan<T>::applies(k);
#else
  return false;
#endif
}

// The training forward after its gate a: u = x wu and h = a * u on a's pattern, g = x wg there
// for SiLU and GELU, and y = h wd. Through `kept` where given (the composition's values up to the
// order of fp32 sums), otherwise composed by gated_after_gate. The free forward and
// GatedFfnTraining both come here with the same kernel and bit-identical gates (the gate plan
// promises gemm_to_sparse's bits), so they give the same bits.
template <class T, class Spmm>
void training_after_gate(const RunKeptUpDown<T>& kept, DenseView<const T> x, DenseView<const T> wg,
                         DenseView<const T> wu, DenseView<const T> wd, HybridView<const T> a, HybridView<T> u,
                         HybridView<T> h, const HybridView<T>* g, DenseView<T> y, const KernelOptions& options,
                         Spmm&& spmm) {
  if (!kept) {
    ffn_detail::gated_after_gate<T>(x, wg, wu, wd, a, u, h, g, y, options, std::forward<Spmm>(spmm));
    return;
  }
  kept(u, h, y);
  if (g != nullptr) sddmm<T>(x, Op::none, wg, a, *g, 1.0f, 0.0f, options);
}

#if TWELL_HAS_CUDA
// The operands of the backward's rows in one kernel (cuda::GatedUpDownPlan::backward), from the
// saved activations of the forward that kept u and h.
template <class T>
cuda::GatedBackwardOperands<T> backward_operands(const GatedFfnActivationViews<T>& s, DenseView<const T> dy,
                                                 DenseView<const T> wg, DenseView<const T> wu, DenseView<const T> wd,
                                                 double scale, HybridView<T> dg, HybridView<T> du, DenseView<T> dx) {
  return {dy, s.a, s.u, s.h, s.g, s.act, wg, wu, wd, static_cast<float>(scale), dg, du, dx};
}
#endif

}  // namespace

template <Value T>
GatedFfnActivations<T> sparse_gated_ffn_training_forward(In<DenseView<const T>> x, In<DenseView<const T>> wg,
                                                         In<DenseView<const T>> wu, In<DenseView<const T>> wd,
                                                         ActivationSpec act, TwellLayout layout, DenseView<T> y,
                                                         const KernelOptions& options) {
  check_gated("twell::sparse_gated_ffn_training_forward", x, wg, wu, wd, y);
  ffn_detail::check_settings("twell::sparse_gated_ffn_training_forward", act, layout);
  ConvertOptions convert = hybrid_overflow();
  convert.stream = options.stream;
  GatedFfnActivations<T> s;
  s.act = act;
  s.a = gemm_to_sparse<T>(x, wg, act, layout, convert, options);
  s.u = hybrid_like(s.a);
  s.h = hybrid_like(s.a);
  // ReLU's derivative is 1 on the pattern; the others need the pre-activation there.
  if (act.kind != Activation::relu) s.g = hybrid_like(s.a);
  HybridView<T> g = s.g.view();
  RunKeptUpDown<T> kept;
#if TWELL_HAS_CUDA
  if (keeps_up_down<T>(x.cols, x.space))
    kept = [&](HybridView<T> u, HybridView<T> h, DenseView<T> y_out) {
      cuda::gated_up_down<T>(x, s.a.view(), wu, wd, u, h, y_out, options);
    };
#endif
  training_after_gate<T>(kept, x, wg, wu, wd, s.a.view(), s.u.view(), s.h.view(),
                         act.kind != Activation::relu ? &g : nullptr, y, options, spmm_on_backend<T>(options));
  if (options.report != nullptr) options.report->path = kept ? "fused:cuda" : ffn_detail::composed_path(x.space);
  return s;
}

template <Value T>
GatedFfnGradients<T> sparse_gated_ffn_backward(const GatedFfnActivations<T>& saved, In<DenseView<const T>> x,
                                               In<DenseView<const T>> wg, In<DenseView<const T>> wu,
                                               In<DenseView<const T>> wd, In<DenseView<const T>> dy, float lambda,
                                               L1Normalization norm, const KernelOptions& options) {
  constexpr const char* where = "twell::sparse_gated_ffn_backward";
  check_gated(where, x, wg, wu, wd, dy, ffn_detail::Rows::dy);
  const std::int64_t m = x.rows, k = x.cols, n = wu.cols;
  const MemorySpace space = x.space;
  ffn_detail::check_saved(where, saved.view(), m, n, space);
  const ffn_detail::L1Scale l1 = ffn_detail::l1_scale(where, lambda, norm, m, n);

  GatedFfnGradients<T> out;
  out.z = l1.z;
  out.dx = DenseMatrix<T>(m, k, space);
  out.dwg = DenseMatrix<T>(k, n, space);
  out.dwu = DenseMatrix<T>(k, n, space);
  out.dwd = DenseMatrix<T>(n, k, space);
  // The forward kept u and h with the same kernel exactly where the backward's rows run in one.
  const bool fused = keeps_up_down<T>(k, space);
  HybridMatrix<T> dh = fused ? HybridMatrix<T>() : hybrid_like(saved.a);
  HybridMatrix<T> dg = hybrid_like(saved.a), du = hybrid_like(saved.a);
  DenseMatrix<T> n_by_k[] = {DenseMatrix<T>(n, k, space), DenseMatrix<T>(n, k, space)};
  ffn_detail::BackwardRows<T> rows;
#if TWELL_HAS_CUDA
  if (fused)
    rows = [&](HybridView<T> dg_out, HybridView<T> du_out, DenseView<T> dx) {
      cuda::gated_up_down_backward<T>(backward_operands<T>(saved.view(), dy, wg, wu, wd, l1.scale, dg_out, du_out, dx),
                                      options);
    };
#endif
  out.l1_term =
      ffn_detail::gated_backward<T>(saved.view(), x, wg, wu, wd, dy, l1.scale,
                                    {dh.view(), dg.view(), du.view(), {n_by_k[0].view(), n_by_k[1].view()}},
                                    {out.dx.view(), out.dwg.view(), out.dwu.view(), out.dwd.view()}, options,
                                    spmm_on_backend<T>(options), ffn_detail::products_on_backend<T>(options), rows);
  if (options.report != nullptr) options.report->path = fused ? "fused:cuda" : ffn_detail::composed_path(space);
  return out;
}

// ---- GatedFfnTraining --------------------------------------------------------------------------

template <Value T>
struct GatedFfnTraining<T>::Impl {
  std::int64_t m = 0, k = 0, n = 0;
  MemorySpace space = MemorySpace::host;
  int device = 0;  // where the plans and the held activations live (device memory)
  ActivationSpec act{};
  TwellLayout layout{};
  KernelOptions options{};
  std::string path;
  // The Hybrids held for the forward (u, h, g) and the backward (dh, dg, du; dh where the backward
  // composes), each with `capacity` overflow rows; a call views the first R of them (R: the latest
  // gate's overflow rows).
  std::int64_t capacity = 0;
  HybridMatrix<T> u, h, g, dh, dg, du;
  DenseMatrix<T> n_by_k[2];  // the backward's N x K dwg and dwu before their transposes
  // R of the latest forward that completed; -1 before the first and after one that threw.
  std::int64_t overflow_rows = -1;
  HybridMatrix<T> host_gate;  // the host gate, allocated by gemm_to_sparse per forward
#if TWELL_HAS_CUDA
  std::optional<cuda::GemmToSparsePlan<T>> gate_plan;
  std::optional<cuda::SpmmPlan<T>> spmm_plan;
  std::optional<cuda::GatedUpDownPlan<T>> up_down;  // where the kept up/down kernel applies
#endif

  bool on_device() const { return space == MemorySpace::device; }
  bool needs_g() const { return act.kind != Activation::relu; }

  // Whether the forward keeps u and h, and the backward runs its rows, in the up/down kernel.
  bool fused() const {
#if TWELL_HAS_CUDA
    return up_down.has_value();
#else
    return false;
#endif
  }

  void allocate(std::int64_t rows) {
    for (HybridMatrix<T>* part : {&u, &h, &dg, &du}) *part = HybridMatrix<T>(m, n, layout, rows, space);
    if (!fused()) dh = HybridMatrix<T>(m, n, layout, rows, space);
    if (needs_g()) g = HybridMatrix<T>(m, n, layout, rows, space);
#if TWELL_HAS_CUDA
    // The overflow rows of y = h wd and of dx's two products (K columns of B each).
    if (spmm_plan) spmm_plan->reserve_overflow(rows, k);
#endif
    capacity = rows;  // last: a failed allocation leaves the old capacity, which every part holds
  }

  // Room for `rows` overflow rows in every held Hybrid: grown to min(M, max(rows, 2 capacity)).
  void hold(std::int64_t rows) {
    if (rows > capacity) allocate(std::min(m, std::max(rows, 2 * capacity)));
  }

  // A held Hybrid as a gate of R overflow rows structures it: its first R overflow rows.
  static HybridView<T> first_rows(HybridMatrix<T>& part, std::int64_t rows) {
    HybridView<T> v = part.view();
    v.overflow.rows = rows;
    return v;
  }
  HybridView<const T> saved(const HybridMatrix<T>& part) const {
    HybridView<const T> v = part.view();
    v.overflow.rows = overflow_rows;
    return v;
  }

  HybridView<const T> gate_result() const {
#if TWELL_HAS_CUDA
    if (gate_plan) return gate_plan->result();
#endif
    return host_gate.view();
  }

  // Runs the gate on x and returns its overflow row count R. On the device, the kept up/down
  // kernel's work that does not need R (Wu^T, a's slot words into u and h) is queued before the
  // host waits for R, so the GPU has it to do meanwhile.
  std::int64_t run_gate(DenseView<const T> x, DenseView<const T> wg, [[maybe_unused]] DenseView<const T> wu) {
#if TWELL_HAS_CUDA
    if (gate_plan) {
      gate_plan->run(x, wg);
      return gate_plan
          ->sync_overflow_count([&] {
            if (fused()) up_down->queue_ahead(gate_plan->queued_result(), wu, u.view(), h.view());
          })
          .rows;
    }
#endif
    host_gate = gemm_to_sparse<T>(x, wg, act, layout, hybrid_overflow(), options);
    return host_gate.overflow_rows();
  }

  // The spmm of the compositions: the held plan on the device, the reference backend on the host.
  auto spmm_fn() {
    return [this](Op op, HybridView<const T> a, DenseView<const T> b, DenseView<T> c, float alpha, float beta) {
#if TWELL_HAS_CUDA
      if (spmm_plan) {
        spmm_plan->run(op, a, b, c, alpha, beta);
        return;
      }
#endif
      spmm_on_backend<T>(options)(op, a, b, c, alpha, beta);
    };
  }

  // The backward's products on A^T: the held plan runs them together, the host one after another.
  // Where the up/down kernel made h (forward) and dg, du (backward), all three hold their values
  // in a's slots, so the plan transposes them together (SlotStructure::shared).
  ffn_detail::ProductsOnTranspose<T> products_fn() {
#if TWELL_HAS_CUDA
    if (spmm_plan) {
      const cuda::SlotStructure structure = fused() ? cuda::SlotStructure::shared : cuda::SlotStructure::separate;
      return [this, structure](std::span<const HybridView<const T>> a, std::span<const DenseView<const T>> b,
                               std::span<const DenseView<T>> c) {
        spmm_plan->run_transposed(a, b, c, 1.0f, 0.0f, structure);
      };
    }
#endif
    return ffn_detail::products_on_backend<T>(options);
  }

  void check_call(const char* where, DenseView<const T> x, DenseView<const T> wu) const {
    require(x.rows == m && x.cols == k && wu.cols == n, ErrorCode::shape_mismatch, where, "the object is for x of ",
            shape(m, k), " and ", n, " intermediate units, but x is ", shape(x.rows, x.cols), " and wu ",
            shape(wu.rows, wu.cols));
    require(x.space == space, ErrorCode::space_mismatch, where, "the object holds ", to_string(space),
            " memory but x is in ", to_string(x.space), " memory");
    if (on_device()) twell::detail::require_plan_device(device, where);
  }
};

namespace {
template <class Impl>
Impl& state_of(const std::unique_ptr<Impl>& impl, const char* where) {
  require(impl != nullptr, ErrorCode::invalid_argument, where, "the object was moved from");
  return *impl;
}
}  // namespace

template <Value T>
GatedFfnTraining<T>::GatedFfnTraining(std::int64_t tokens, std::int64_t hidden, std::int64_t intermediate,
                                      MemorySpace space, ActivationSpec act, TwellLayout layout,
                                      std::int64_t overflow_capacity, const KernelOptions& options)
    : impl_(std::make_unique<Impl>()) {
  constexpr const char* where = "twell::GatedFfnTraining";
  require(tokens >= 0 && hidden >= 0 && intermediate >= 0, ErrorCode::invalid_argument, where, "tokens ", tokens,
          ", hidden ", hidden, " and intermediate ", intermediate, " must not be negative");
  ffn_detail::check_overflow_capacity(overflow_capacity, where);
  ffn_detail::check_settings(where, act, layout);
  Impl& s = *impl_;
  s.m = tokens;
  s.k = hidden;
  s.n = intermediate;
  s.space = space;
  s.act = act;
  s.layout = layout;
  s.options = options;
  s.options.report = nullptr;
  const std::int64_t capacity =
      std::min(tokens, overflow_capacity == kDefaultFfnCapacity ? std::max<std::int64_t>(64, tokens / 64)
                                                                : overflow_capacity);
  if (space == MemorySpace::device) {
#if TWELL_HAS_CUDA
    require_cuda_device(where);
    s.device = twell::detail::plan_device(where);
    s.gate_plan.emplace(tokens, hidden, intermediate, act, layout, capacity, OverflowPolicy::hybrid, options.stream);
    s.spmm_plan.emplace(tokens, intermediate, layout, options.stream, options.spmm_algorithm);
    if (keeps_up_down<T>(hidden, space)) s.up_down.emplace(tokens, hidden, intermediate, layout, s.options);
#else
    fail(ErrorCode::no_device, where, "device memory asked for, but this build of twell has no cuda backend");
#endif
  }
  s.allocate(capacity);
  for (DenseMatrix<T>& part : s.n_by_k) part = DenseMatrix<T>(intermediate, hidden, space);
}

template <Value T>
void GatedFfnTraining<T>::forward(In<DenseView<const T>> x, In<DenseView<const T>> wg, In<DenseView<const T>> wu,
                                  In<DenseView<const T>> wd, DenseView<T> y) {
  constexpr const char* where = "twell::GatedFfnTraining::forward";
  Impl& s = state_of(impl_, where);
  check_gated(where, x, wg, wu, wd, y);
  s.check_call(where, x, wu);
  // From here the held activations are being overwritten: none is valid until the forward ends.
  s.overflow_rows = -1;
  const std::int64_t rows = s.run_gate(x, wg, wu);
  s.hold(rows);
  std::optional<HybridView<T>> g;
  if (s.needs_g()) g = Impl::first_rows(s.g, rows);
  const HybridView<const T> a = s.gate_result();
  RunKeptUpDown<T> kept;
#if TWELL_HAS_CUDA
  if (s.fused())
    kept = [&](HybridView<T> u, HybridView<T> h, DenseView<T> y_out) { s.up_down->run(x, a, wu, wd, u, h, y_out); };
#endif
  training_after_gate<T>(kept, x, wg, wu, wd, a, Impl::first_rows(s.u, rows), Impl::first_rows(s.h, rows),
                         g ? &*g : nullptr, y, s.options, s.spmm_fn());
  s.overflow_rows = rows;
  s.path = s.on_device() ? "planned:cuda" : "composed:reference";
}

namespace {
// backward() and activations() need a forward() before them; each names itself.
template <class Impl>
void require_activations_saved(const Impl& s, const char* where) {
  require(s.overflow_rows >= 0, ErrorCode::invalid_argument, where,
          "no activations saved: call forward() (with the x and weights of the backward) first");
}
}  // namespace

template <Value T>
double GatedFfnTraining<T>::backward(In<DenseView<const T>> x, In<DenseView<const T>> wg, In<DenseView<const T>> wu,
                                     In<DenseView<const T>> wd, In<DenseView<const T>> dy, float lambda,
                                     L1Normalization norm, const GatedFfnGradientViews<T>& out) {
  constexpr const char* where = "twell::GatedFfnTraining::backward";
  Impl& s = state_of(impl_, where);
  check_gated(where, x, wg, wu, wd, dy, ffn_detail::Rows::dy);
  s.check_call(where, x, wu);
  require_activations_saved(s, where);
  const GatedFfnActivationViews<T> saved = activations();
  const std::pair<const char*, DenseView<T>> grads[] = {
      {"dx", out.dx}, {"dwg", out.dwg}, {"dwu", out.dwu}, {"dwd", out.dwd}};
  const std::pair<std::int64_t, std::int64_t> want[] = {{s.m, s.k}, {s.k, s.n}, {s.k, s.n}, {s.n, s.k}};
  for (std::size_t i = 0; i < 4; ++i) {
    const auto& [name, view] = grads[i];
    require(view.rows == want[i].first && view.cols == want[i].second, ErrorCode::shape_mismatch, where, name, " is ",
            shape(view.rows, view.cols), " but must be ", shape(want[i].first, want[i].second));
    require(view.space == s.space, ErrorCode::space_mismatch, where, "x is in ", to_string(s.space), " memory but ",
            name, " is in ", to_string(view.space), " memory");
    // Here, not in the operation that writes it: a refused gradient must leave the others unwritten.
    twell::detail::check_dense_geometry(view, where, name);
  }
  // The backward reads every input while it writes the gradients, and computes dwd from dy beside
  // dwg and dwu from x: no gradient may share a byte with an input or another gradient.
  const std::pair<const char*, DenseView<const T>> inputs[] = {
      {"x", x}, {"wg", wg}, {"wu", wu}, {"wd", wd}, {"dy", dy}};
  for (std::size_t i = 0; i < 4; ++i) {
    const auto [name, view] = grads[i];
    const twell::detail::ByteRange range = twell::detail::byte_range(view);
    for (const auto& [input, in_view] : inputs)
      require(!range.overlaps(twell::detail::byte_range(in_view)), ErrorCode::invalid_argument, where, name,
              " overlaps ", input, "; the gradients need memory of their own");
    for (std::size_t j = 0; j < i; ++j)
      require(!range.overlaps(twell::detail::byte_range(grads[j].second)), ErrorCode::invalid_argument, where, name,
              " overlaps ", grads[j].first, "; the gradients need memory of their own");
  }
  const ffn_detail::L1Scale l1 = ffn_detail::l1_scale(where, lambda, norm, s.m, s.n);
  const std::int64_t rows = s.overflow_rows;
  ffn_detail::BackwardRows<T> fused_rows;
#if TWELL_HAS_CUDA
  if (s.fused())
    fused_rows = [&](HybridView<T> dg, HybridView<T> du, DenseView<T> dx) {
      cuda::GatedBackwardOperands<T> op = backward_operands<T>(saved, dy, wg, wu, wd, l1.scale, dg, du, dx);
      // backward() takes its forward's weights: the forward's Wu^T serves where wu is the same view.
      op.reuse_run_wu_t = true;
      s.up_down->backward(op);
    };
#endif
  const double l1_term = ffn_detail::gated_backward<T>(saved, x, wg, wu, wd, dy, l1.scale,
                                                       {s.fused() ? HybridView<T>{} : Impl::first_rows(s.dh, rows),
                                                        Impl::first_rows(s.dg, rows),
                                                        Impl::first_rows(s.du, rows),
                                                        {s.n_by_k[0].view(), s.n_by_k[1].view()}},
                                                       out, s.options, s.spmm_fn(), s.products_fn(), fused_rows);
  s.path = s.on_device() ? "planned:cuda" : "composed:reference";
  return l1_term;
}

template <Value T>
GatedFfnActivationViews<T> GatedFfnTraining<T>::activations() const {
  constexpr const char* where = "twell::GatedFfnTraining::activations";
  const Impl& s = state_of(impl_, where);
  require_activations_saved(s, where);
  return {s.gate_result(), s.saved(s.u), s.saved(s.h), s.needs_g() ? s.saved(s.g) : HybridView<const T>{}, s.act};
}

template <Value T>
std::int64_t GatedFfnTraining<T>::overflow_capacity() const {
  return state_of(impl_, "twell::GatedFfnTraining::overflow_capacity").capacity;
}
template <Value T>
const std::string& GatedFfnTraining<T>::path() const {
  return state_of(impl_, "twell::GatedFfnTraining::path").path;
}
template <Value T>
GatedFfnTraining<T>::GatedFfnTraining(GatedFfnTraining&&) noexcept = default;
template <Value T>
GatedFfnTraining<T>& GatedFfnTraining<T>::operator=(GatedFfnTraining&&) noexcept = default;
template <Value T>
GatedFfnTraining<T>::~GatedFfnTraining() = default;

#define TWELL_INSTANTIATE(T)                                                                                       \
  template GatedFfnActivations<T> sparse_gated_ffn_training_forward<T>(                                             \
      In<DenseView<const T>>, In<DenseView<const T>>, In<DenseView<const T>>, In<DenseView<const T>>, ActivationSpec, \
      TwellLayout, DenseView<T>, const KernelOptions&);                                                              \
  template GatedFfnGradients<T> sparse_gated_ffn_backward<T>(                                                        \
      const GatedFfnActivations<T>&, In<DenseView<const T>>, In<DenseView<const T>>, In<DenseView<const T>>,          \
      In<DenseView<const T>>, In<DenseView<const T>>, float, L1Normalization, const KernelOptions&);                  \
  template class GatedFfnTraining<T>;
TWELL_FOR_EACH_VALUE_TYPE(TWELL_INSTANTIATE)
#undef TWELL_INSTANTIATE

}  // namespace twell
