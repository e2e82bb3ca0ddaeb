// The sparse FFN forward composed from the public operations, and the FFN layer objects that
// hold a GPU plan (or run the composition on the host).
#include <algorithm>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include <twell/config.hpp>
#include <twell/ffn.hpp>
#include <twell/instantiate.hpp>
#include <twell/kernels/detail/checks.hpp>
#if TWELL_HAS_CUDA
#include <twell/kernels/ffn_cuda.hpp>
#endif

namespace twell {
namespace {

std::string shape(std::int64_t rows, std::int64_t cols) { return std::to_string(rows) + " x " + std::to_string(cols); }

// Checked here so that a mistake is reported with the FFN's names, not an inner operation's.
template <class T>
void check_shapes(const char* where, DenseView<const T> x, DenseView<const T> w_in, DenseView<const T> wd,
                  In<DenseView<const T>> y) {
  const std::int64_t m = x.rows, k = x.cols, n = w_in.cols;
  require(w_in.rows == k, ErrorCode::shape_mismatch, where, "x is ", shape(m, k), " but wu is ",
          shape(w_in.rows, w_in.cols));
  require(wd.rows == n && wd.cols == k, ErrorCode::shape_mismatch, where, "wd is ", shape(wd.rows, wd.cols),
          " but x and wu need ", shape(n, k));
  require(y.rows == m && y.cols == k, ErrorCode::shape_mismatch, where, "y is ", shape(y.rows, y.cols), " but x needs ",
          shape(m, k));
}

// FfnStats of a host gate: per-row counts from the TwELL slot-0 words, or the dense row of an
// overflow row (its TwELL part is a shadow); the block holds every overflow row (capacity = R).
template <class T>
FfnStats host_stats(HybridView<const T> g) {
  FfnStats s;
  s.tokens = g.rows();
  s.row_nnz.assign(static_cast<std::size_t>(g.rows()), 0);
  const TwellLayout layout = g.twell.layout;
  const std::int64_t tiles = layout.tiles(g.cols()), pw = g.twell.packed_width();
  for (std::int64_t r = 0; r < g.rows(); ++r) {
    std::int64_t count = 0;
    const std::int32_t o = g.row_to_overflow[r];
    if (o >= 0) {
      for (std::int64_t j = 0; j < g.cols(); ++j) count += is_stored(g.overflow.at(o, j)) ? 1 : 0;
    } else {
      for (std::int64_t t = 0; t < tiles; ++t) count += g.twell.packed[r * pw + t * layout.slots()];
    }
    s.row_nnz[static_cast<std::size_t>(r)] = static_cast<std::int32_t>(count);
    s.nnz += count;
    s.max_row_nnz = std::max(s.max_row_nnz, static_cast<std::int32_t>(count));
  }
  s.overflow_rows = g.overflow_rows();
  s.overflow_capacity = g.overflow_rows();
  return s;
}

template <class T>
void check_gated(const char* where, DenseView<const T> x, DenseView<const T> wg, DenseView<const T> wu,
                 DenseView<const T> wd, In<DenseView<const T>> y) {
  check_shapes(where, x, wu, wd, y);
  require(wg.rows == wu.rows && wg.cols == wu.cols, ErrorCode::shape_mismatch, where, "wg is ", shape(wg.rows, wg.cols),
          " but wu is ", shape(wu.rows, wu.cols));
  for (const auto s : {wg.space, wu.space, wd.space, y.space})
    require(s == x.space, ErrorCode::space_mismatch, where, "x is in ", to_string(x.space),
            " memory but a weight or y is in ", to_string(s), " memory");
}

template <class T>
void check_plain(const char* where, DenseView<const T> x, DenseView<const T> wu, DenseView<const T> wd,
                 DenseView<T> y) {
  check_shapes(where, x, wu, wd, y);
  for (const auto s : {wu.space, wd.space, y.space})
    require(s == x.space, ErrorCode::space_mismatch, where, "x is in ", to_string(x.space),
            " memory but a weight or y is in ", to_string(s), " memory");
}

// An empty Hybrid with `like`'s shape, layout and overflow row count, in its memory space.
template <class T>
HybridMatrix<T> hybrid_like(const HybridMatrix<T>& like) {
  return HybridMatrix<T>(like.rows(), like.cols(), like.layout(), like.overflow_rows(), like.space());
}

// The compositions behind the free functions and the host objects; stats read back the gate.
// Without keep_activations, h overwrites u (inference needs neither afterwards) and s.u is empty.
template <class T>
GatedFfnActivations<T> composed_gated(DenseView<const T> x, DenseView<const T> wg, DenseView<const T> wu,
                                      DenseView<const T> wd, ActivationSpec act, TwellLayout layout, DenseView<T> y,
                                      const KernelOptions& options, FfnStats* stats, bool keep_activations) {
  ConvertOptions convert = hybrid_overflow();
  convert.stream = options.stream;
  GatedFfnActivations<T> s;
  s.act = act;
  s.a = gemm_to_sparse<T>(x, wg, act, layout, convert, options);
  s.u = hybrid_like(s.a);
  sddmm<T>(x, Op::none, wu, s.a.view(), s.u.view(), 1.0f, 0.0f, options);
  if (keep_activations) {
    s.h = hybrid_like(s.a);
    multiply_on_pattern<T>(s.a.view(), s.u.view(), s.h.view(), options);
    // ReLU's derivative is 1 on the pattern; the others need the pre-activation there.
    if (act.kind != Activation::relu) {
      s.g = hybrid_like(s.a);
      sddmm<T>(x, Op::none, wg, s.a.view(), s.g.view(), 1.0f, 0.0f, options);
    }
  } else {
    multiply_on_pattern<T>(s.a.view(), s.u.view(), s.u.view(), options);
    s.h = std::move(s.u);
  }
  spmm<T>(Op::none, s.h.view(), wd, y, 1.0f, 0.0f, options);
  if (stats != nullptr)
    *stats = host_stats<T>(s.a.space() == MemorySpace::host ? s.a.view() : s.a.to(MemorySpace::host).view());
  return s;
}

template <class T>
void composed_plain(DenseView<const T> x, DenseView<const T> wu, DenseView<const T> wd, ActivationSpec act,
                    TwellLayout layout, DenseView<T> y, const KernelOptions& options, FfnStats* stats) {
  ConvertOptions convert = hybrid_overflow();
  convert.stream = options.stream;
  const HybridMatrix<T> h = gemm_to_sparse<T>(x, wu, act, layout, convert, options);
  spmm<T>(Op::none, h.view(), wd, y, 1.0f, 0.0f, options);
  if (stats != nullptr)
    *stats = host_stats<T>(h.space() == MemorySpace::host ? h.view() : h.to(MemorySpace::host).view());
}

}  // namespace

template <Value T>
void sparse_gated_ffn_forward(In<DenseView<const T>> x, In<DenseView<const T>> wg, In<DenseView<const T>> wu,
                              In<DenseView<const T>> wd, ActivationSpec act, TwellLayout layout, DenseView<T> y,
                              const KernelOptions& options) {
  check_gated("twell::sparse_gated_ffn_forward", x, wg, wu, wd, y);
  composed_gated<T>(x, wg, wu, wd, act, layout, y, options, nullptr, false);
}

template <Value T>
void sparse_ffn_forward(In<DenseView<const T>> x, In<DenseView<const T>> wu, In<DenseView<const T>> wd,
                        ActivationSpec act, TwellLayout layout, DenseView<T> y, const KernelOptions& options) {
  check_plain("twell::sparse_ffn_forward", x, wu, wd, y);
  composed_plain<T>(x, wu, wd, act, layout, y, options, nullptr);
}

template <Value T>
GatedFfnActivations<T> sparse_gated_ffn_training_forward(In<DenseView<const T>> x, In<DenseView<const T>> wg,
                                                         In<DenseView<const T>> wu, In<DenseView<const T>> wd,
                                                         ActivationSpec act, TwellLayout layout, DenseView<T> y,
                                                         const KernelOptions& options) {
  constexpr const char* where = "twell::sparse_gated_ffn_training_forward";
  check_gated(where, x, wg, wu, wd, y);
  return composed_gated<T>(x, wg, wu, wd, act, layout, y, options, nullptr, true);
}

template <Value T>
GatedFfnGradients<T> sparse_gated_ffn_backward(const GatedFfnActivations<T>& saved, In<DenseView<const T>> x,
                                               In<DenseView<const T>> wg, In<DenseView<const T>> wu,
                                               In<DenseView<const T>> wd, In<DenseView<const T>> dy, float lambda,
                                               L1Normalization norm, const KernelOptions& options) {
  constexpr const char* where = "twell::sparse_gated_ffn_backward";
  check_gated(where, x, wg, wu, wd, dy);
  const std::int64_t m = x.rows, k = x.cols, n = wu.cols;
  const MemorySpace space = x.space;
  twell::detail::check_activation(saved.act, where);
  const bool relu = saved.act.kind == Activation::relu;
  require(relu || saved.g.rows() > 0 || m == 0, ErrorCode::shape_mismatch, where,
          "SiLU and GELU need the pre-activation g on the pattern (saved.g), which "
          "sparse_gated_ffn_training_forward keeps for them; these activations have none");
  std::vector<const HybridMatrix<T>*> parts{&saved.a, &saved.u, &saved.h};
  if (!relu) parts.push_back(&saved.g);
  for (const HybridMatrix<T>* saved_part : parts) {
    require(saved_part->rows() == m && saved_part->cols() == n, ErrorCode::shape_mismatch, where,
            "the saved activations are ", shape(saved_part->rows(), saved_part->cols()), " but x and wu need ",
            shape(m, n));
    require(saved_part->space() == space, ErrorCode::space_mismatch, where, "x is in ", to_string(space),
            " memory but the saved activations are in ", to_string(saved_part->space()), " memory");
    // The operations below index u and h by a's structure.
    require(saved_part->layout() == saved.a.layout() && saved_part->overflow_rows() == saved.a.overflow_rows(),
            ErrorCode::shape_mismatch, where,
            "the saved u, h (and g for SiLU and GELU) must share a's layout and overflow rows (as the training "
            "forward makes them)");
  }
  require(lambda >= 0.0f, ErrorCode::invalid_argument, where, "lambda ", lambda, " must be a non-negative number");
  require(norm == L1Normalization::per_token || norm == L1Normalization::per_entry, ErrorCode::invalid_argument, where,
          "L1 normalization ", static_cast<int>(norm), " is unknown");

  GatedFfnGradients<T> out;
  out.z = norm == L1Normalization::per_token ? double(m) : double(m) * double(n);
  // Z = 0 only for an empty batch, whose L1 term and gradients are all empty sums.
  const double scale = out.z > 0.0 ? double(lambda) / out.z : 0.0;

  HybridMatrix<T> dh = hybrid_like(saved.a), dg = hybrid_like(saved.a), du = hybrid_like(saved.a);
  sddmm<T>(dy, Op::transpose, wd, saved.a.view(), dh.view(), 1.0f, 0.0f, options);
  add_scaled_sign<T>(dh.view(), static_cast<float>(scale), saved.h.view(), dh.view(), options);
  multiply_on_pattern<T>(dh.view(), saved.u.view(), dg.view(), options);
  if (!relu) multiply_by_activation_derivative<T>(dg.view(), saved.g.view(), saved.act.kind, dg.view(), options);
  multiply_on_pattern<T>(dh.view(), saved.a.view(), du.view(), options);

  out.dwd = DenseMatrix<T>(n, k, space);
  spmm<T>(Op::transpose, saved.h.view(), dy, out.dwd.view(), 1.0f, 0.0f, options);
  // dx = dg wg^T + du wu^T: spmm takes its dense operand as stored, so each weight is transposed
  // into one N x K buffer in turn (same stream: the second transpose waits for the first product).
  DenseMatrix<T> n_by_k(n, k, space);
  out.dx = DenseMatrix<T>(m, k, space);
  transpose<T>(wg, n_by_k.view(), options);
  spmm<T>(Op::none, dg.view(), n_by_k.view(), out.dx.view(), 1.0f, 0.0f, options);
  transpose<T>(wu, n_by_k.view(), options);
  spmm<T>(Op::none, du.view(), n_by_k.view(), out.dx.view(), 1.0f, 1.0f, options);
  // dwg = x^T dg = (dg^T x)^T, likewise dwu: the spmm gives N x K, the weights are K x N.
  const auto weight_gradient = [&](const HybridMatrix<T>& d) {
    DenseMatrix<T> grad(k, n, space);
    spmm<T>(Op::transpose, d.view(), x, n_by_k.view(), 1.0f, 0.0f, options);
    transpose<T>(n_by_k.view(), grad.view(), options);
    return grad;
  };
  out.dwg = weight_gradient(dg);
  out.dwu = weight_gradient(du);
  // Last, so that its read-back (a host wait on the device) comes after everything is queued.
  out.l1_term = scale * l1_norm<T>(saved.h.view(), options);
  if (options.report != nullptr)
    options.report->path = space == MemorySpace::host ? "composed:reference" : "composed:cuda";
  return out;
}

// The weights, the settings and (device) the plan; the host path keeps only what it needs to
// compose. Both objects share it: `wg` is empty for the non-gated FFN.
template <class T, class Plan>
struct FfnState {
  std::int64_t tokens = 0;
  DenseView<const T> wg{}, wu{}, wd{};
  ActivationSpec act{};
  TwellLayout layout{};
  KernelOptions options{};
  std::string path;
  std::vector<DenseMatrix<T>> owned;  // the in x out copies of OutIn weights (empty for InOut)
#if TWELL_HAS_CUDA
  std::optional<Plan> plan;
#endif

  void assign(std::int64_t n, DenseView<const T> g, DenseView<const T> u, DenseView<const T> d, ActivationSpec a,
              TwellLayout l, const KernelOptions& o) {
    tokens = n;
    wg = g;
    wu = u;
    wd = d;
    act = a;
    layout = l;
    options = o;
    options.report = nullptr;
  }

  // Runs the device plan when the layer has one (device weights); false leaves the call to the
  // host composition.
  bool forward_on_plan([[maybe_unused]] DenseView<const T> x, [[maybe_unused]] DenseView<T> y,
                       [[maybe_unused]] FfnStats* stats) {
#if TWELL_HAS_CUDA
    if (plan) {
      plan->forward(x, y, stats);
      path = plan->path();
      return true;
    }
#endif
    return false;
  }
};

#if TWELL_HAS_CUDA
template <Value T>
struct GatedFfn<T>::Impl : FfnState<T, cuda::GatedFfnPlan<T>> {};
template <Value T>
struct Ffn<T>::Impl : FfnState<T, cuda::FfnPlan<T>> {};
#else
template <Value T>
struct GatedFfn<T>::Impl : FfnState<T, int> {};
template <Value T>
struct Ffn<T>::Impl : FfnState<T, int> {};
#endif

namespace {

// Checks the weights against each other with a 1-row probe of x and y (the layer's M is checked at
// forward()); fails on device weights without a device.
template <class T>
void check_layer(const char* where, std::int64_t tokens, DenseView<const T> wg, DenseView<const T> wu,
                 DenseView<const T> wd, bool gated) {
  require(tokens >= 0, ErrorCode::invalid_argument, where, "tokens = ", tokens, " is negative");
  const DenseView<const T> x{nullptr, 0, wu.rows, wu.rows, wu.space};
  const DenseView<T> y{nullptr, 0, wu.rows, wu.rows, wu.space};
  if (gated) {
    check_gated(where, x, wg, wu, wd, y);
  } else {
    check_plain(where, x, wu, wd, y);
  }
#if TWELL_HAS_CUDA
  if (wu.space == MemorySpace::device) require_cuda_device(where);
#else
  require(wu.space == MemorySpace::host, ErrorCode::no_device, where,
          "the weights live in device memory but this build of twell has no cuda backend");
#endif
}

// path() of a forward that ran the composition, on the backend of its operands.
std::string composed_path(MemorySpace space) {
  return space == MemorySpace::device ? "composed:cuda" : "composed:reference";
}

template <class T>
void check_tokens(const char* where, std::int64_t tokens, DenseView<const T> x) {
  require(x.rows == tokens, ErrorCode::shape_mismatch, where, "the layer is for ", tokens, " tokens but x has ", x.rows,
          " rows");
}

// Checks the (in x out) weights, keeps them, and for device weights builds the cuda plan.
template <bool kGated, class T, class State>
void set_up(State& s, const char* where, std::int64_t tokens, DenseView<const T> wg, DenseView<const T> wu,
            DenseView<const T> wd, ActivationSpec act, TwellLayout layout, std::int64_t overflow_capacity,
            const KernelOptions& options) {
  check_layer<T>(where, tokens, wg, wu, wd, kGated);
  check_layout(layout, where);
  s.assign(tokens, wg, wu, wd, act, layout, options);
#if TWELL_HAS_CUDA
  // Past the fused kernels' K the layer composes the public operations on the device instead
  // (correct, but it allocates per call and writes the hidden state out; path "composed:cuda").
  if (wu.space != MemorySpace::device || wu.rows > cuda::kFusedFfnMaxK) return;
  if constexpr (kGated) {
    s.plan.emplace(tokens, wg, wu, wd, act, layout, overflow_capacity, s.options);
  } else {
    s.plan.emplace(tokens, wu, wd, act, layout, overflow_capacity, s.options);
  }
#else
  static_cast<void>(overflow_capacity);
#endif
}

// The in x out copy of an out x in weight, made on the weight's own backend.
template <class T>
DenseMatrix<T> in_out_copy(DenseView<const T> out_in, const KernelOptions& options) {
  DenseMatrix<T> w(out_in.cols, out_in.rows, out_in.space);
  KernelOptions quiet = options;
  quiet.report = nullptr;
  transpose<T>(out_in, w.view(), quiet);
  return w;
}

}  // namespace

template <Value T>
GatedFfn<T>::GatedFfn(std::int64_t tokens, In<DenseView<const T>> wg, In<DenseView<const T>> wu,
                      In<DenseView<const T>> wd, ActivationSpec act, TwellLayout layout, std::int64_t overflow_capacity,
                      const KernelOptions& options)
    : impl_(std::make_unique<Impl>()) {
  set_up<true, T>(*impl_, "twell::GatedFfn", tokens, wg, wu, wd, act, layout, overflow_capacity, options);
}

template <Value T>
GatedFfn<T>::GatedFfn(std::int64_t tokens, InOut<T> wg, InOut<T> wu, InOut<T> wd, ActivationSpec act,
                      TwellLayout layout, std::int64_t overflow_capacity, const KernelOptions& options)
    : GatedFfn(tokens, wg.w, wu.w, wd.w, act, layout, overflow_capacity, options) {}

template <Value T>
GatedFfn<T>::GatedFfn(std::int64_t tokens, OutIn<T> wg, OutIn<T> wu, OutIn<T> wd, ActivationSpec act,
                      TwellLayout layout, std::int64_t overflow_capacity, const KernelOptions& options)
    : impl_(std::make_unique<Impl>()) {
  Impl& s = *impl_;
  for (const OutIn<T>& w : {wg, wu, wd}) s.owned.push_back(in_out_copy<T>(w.w, options));
  set_up<true, T>(s, "twell::GatedFfn (OutIn weights, as their in x out copies)", tokens, s.owned[0].view(),
                  s.owned[1].view(), s.owned[2].view(), act, layout, overflow_capacity, options);
}

template <Value T>
void GatedFfn<T>::forward(In<DenseView<const T>> x, DenseView<T> y, FfnStats* stats) {
  constexpr const char* where = "twell::GatedFfn::forward";
  require(impl_ != nullptr, ErrorCode::invalid_argument, where, "the layer was moved from");
  Impl& s = *impl_;
  check_gated(where, x, s.wg, s.wu, s.wd, y);
  check_tokens(where, s.tokens, x);
  if (s.forward_on_plan(x, y, stats)) return;
  composed_gated<T>(x, s.wg, s.wu, s.wd, s.act, s.layout, y, s.options, stats, false);
  s.path = composed_path(x.space);
}

template <Value T>
Ffn<T>::Ffn(std::int64_t tokens, In<DenseView<const T>> wu, In<DenseView<const T>> wd, ActivationSpec act,
            TwellLayout layout, std::int64_t overflow_capacity, const KernelOptions& options)
    : impl_(std::make_unique<Impl>()) {
  set_up<false, T>(*impl_, "twell::Ffn", tokens, DenseView<const T>{}, wu, wd, act, layout, overflow_capacity, options);
}

template <Value T>
Ffn<T>::Ffn(std::int64_t tokens, InOut<T> wu, InOut<T> wd, ActivationSpec act, TwellLayout layout,
            std::int64_t overflow_capacity, const KernelOptions& options)
    : Ffn(tokens, wu.w, wd.w, act, layout, overflow_capacity, options) {}

template <Value T>
Ffn<T>::Ffn(std::int64_t tokens, OutIn<T> wu, OutIn<T> wd, ActivationSpec act, TwellLayout layout,
            std::int64_t overflow_capacity, const KernelOptions& options)
    : impl_(std::make_unique<Impl>()) {
  Impl& s = *impl_;
  for (const OutIn<T>& w : {wu, wd}) s.owned.push_back(in_out_copy<T>(w.w, options));
  set_up<false, T>(s, "twell::Ffn (OutIn weights, as their in x out copies)", tokens, DenseView<const T>{},
                   s.owned[0].view(), s.owned[1].view(), act, layout, overflow_capacity, options);
}

template <Value T>
void Ffn<T>::forward(In<DenseView<const T>> x, DenseView<T> y, FfnStats* stats) {
  constexpr const char* where = "twell::Ffn::forward";
  require(impl_ != nullptr, ErrorCode::invalid_argument, where, "the layer was moved from");
  Impl& s = *impl_;
  check_plain(where, x, s.wu, s.wd, y);
  check_tokens(where, s.tokens, x);
  if (s.forward_on_plan(x, y, stats)) return;
  composed_plain<T>(x, s.wu, s.wd, s.act, s.layout, y, s.options, stats);
  s.path = composed_path(x.space);
}

template <Value T>
GatedFfn<T>::GatedFfn(GatedFfn&&) noexcept = default;
template <Value T>
GatedFfn<T>& GatedFfn<T>::operator=(GatedFfn&&) noexcept = default;
template <Value T>
GatedFfn<T>::~GatedFfn() = default;
template <Value T>
const std::string& GatedFfn<T>::path() const {
  return impl_->path;
}
template <Value T>
Ffn<T>::Ffn(Ffn&&) noexcept = default;
template <Value T>
Ffn<T>& Ffn<T>::operator=(Ffn&&) noexcept = default;
template <Value T>
Ffn<T>::~Ffn() = default;
template <Value T>
const std::string& Ffn<T>::path() const {
  return impl_->path;
}

#define TWELL_INSTANTIATE(T)                                                                                        \
  template void sparse_gated_ffn_forward<T>(In<DenseView<const T>>, In<DenseView<const T>>, In<DenseView<const T>>, \
                                            In<DenseView<const T>>, ActivationSpec, TwellLayout, DenseView<T>,      \
                                            const KernelOptions&);                                                  \
  template void sparse_ffn_forward<T>(In<DenseView<const T>>, In<DenseView<const T>>, In<DenseView<const T>>,       \
                                      ActivationSpec, TwellLayout, DenseView<T>, const KernelOptions&);             \
  template GatedFfnActivations<T> sparse_gated_ffn_training_forward<T>(                                              \
      In<DenseView<const T>>, In<DenseView<const T>>, In<DenseView<const T>>, In<DenseView<const T>>, ActivationSpec,  \
      TwellLayout, DenseView<T>, const KernelOptions&);                                                               \
  template GatedFfnGradients<T> sparse_gated_ffn_backward<T>(                                                         \
      const GatedFfnActivations<T>&, In<DenseView<const T>>, In<DenseView<const T>>, In<DenseView<const T>>,           \
      In<DenseView<const T>>, In<DenseView<const T>>, float, L1Normalization, const KernelOptions&);                   \
  template class GatedFfn<T>;                                                                                       \
  template class Ffn<T>;
TWELL_FOR_EACH_VALUE_TYPE(TWELL_INSTANTIATE)
#undef TWELL_INSTANTIATE

}  // namespace twell
