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
#if TWELL_HAS_CUDA
#include <twell/kernels/ffn_cuda.hpp>
#endif

#include "ffn_compose.hpp"

namespace twell {
namespace {

using ffn_detail::check_gated;
using ffn_detail::check_plain;
using ffn_detail::composed_path;
using ffn_detail::hybrid_like;
using ffn_detail::spmm_on_backend;

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

// The compositions behind the inference functions and the host objects; stats read back the
// gate. h overwrites u: inference needs neither afterwards.
template <class T>
void composed_gated(DenseView<const T> x, DenseView<const T> wg, DenseView<const T> wu, DenseView<const T> wd,
                    ActivationSpec act, TwellLayout layout, DenseView<T> y, const KernelOptions& options,
                    FfnStats* stats) {
  ConvertOptions convert = hybrid_overflow();
  convert.stream = options.stream;
  const HybridMatrix<T> a = gemm_to_sparse<T>(x, wg, act, layout, convert, options);
  HybridMatrix<T> h = hybrid_like(a);
  ffn_detail::gated_after_gate<T>(x, wg, wu, wd, a.view(), h.view(), h.view(), nullptr, y, options,
                                  spmm_on_backend<T>(options));
  if (stats != nullptr)
    *stats = host_stats<T>(a.space() == MemorySpace::host ? a.view() : a.to(MemorySpace::host).view());
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
  ffn_detail::check_settings("twell::sparse_gated_ffn_forward", act, layout);
  composed_gated<T>(x, wg, wu, wd, act, layout, y, options, nullptr);
  if (options.report != nullptr) options.report->path = composed_path(x.space);  // not its last step's
}

template <Value T>
void sparse_ffn_forward(In<DenseView<const T>> x, In<DenseView<const T>> wu, In<DenseView<const T>> wd,
                        ActivationSpec act, TwellLayout layout, DenseView<T> y, const KernelOptions& options) {
  check_plain("twell::sparse_ffn_forward", x, wu, wd, y);
  ffn_detail::check_settings("twell::sparse_ffn_forward", act, layout);
  composed_plain<T>(x, wu, wd, act, layout, y, options, nullptr);
  if (options.report != nullptr) options.report->path = composed_path(x.space);
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
  int device = 0;                     // with device weights: the device current when the layer was made
#if TWELL_HAS_CUDA
  std::optional<Plan> plan;
#endif

  // A layer on device weights runs on their device only (its plan and copies live there too).
  void require_own_device(const char* where) const {
    if (wu.space == MemorySpace::device) twell::detail::require_plan_device(device, where);
  }

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

// A layer's weights in `space` need that space's backend.
void require_backend(const char* where, MemorySpace space) {
#if TWELL_HAS_CUDA
  if (space == MemorySpace::device) require_cuda_device(where);
#else
  require(space == MemorySpace::host, ErrorCode::no_device, where,
          "the weights live in device memory but this build of twell has no cuda backend");
#endif
}

// Checks the weights, each under its name, then against each other with an empty probe of x and
// y (the layer's M is checked at forward()); fails on device weights without a device.
template <class T>
void check_layer(const char* where, std::int64_t tokens, DenseView<const T> wg, DenseView<const T> wu,
                 DenseView<const T> wd, bool gated) {
  require(tokens >= 0, ErrorCode::invalid_argument, where, "tokens = ", tokens, " is negative");
  if (gated) detail::check_dense_geometry(wg, where, "wg");
  detail::check_dense_geometry(wu, where, "wu");
  detail::check_dense_geometry(wd, where, "wd");
  const DenseView<const T> x{nullptr, 0, wu.rows, wu.rows, wu.space};
  const DenseView<T> y{nullptr, 0, wu.rows, wu.rows, wu.space};
  if (gated) {
    check_gated(where, x, wg, wu, wd, y);
  } else {
    check_plain(where, x, wu, wd, y);
  }
  require_backend(where, wu.space);
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
  // Checked here whatever the backend, so that a host layer refuses what a device one does.
  ffn_detail::check_settings(where, act, layout);
  ffn_detail::check_overflow_capacity(overflow_capacity, where);
  s.assign(tokens, wg, wu, wd, act, layout, options);
  if (wu.space == MemorySpace::device) s.device = twell::detail::plan_device(where);
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

// OutIn weights, each checked under its name before its in x out copy is made (the copy's
// transpose would name it "a").
template <class T>
std::vector<DenseMatrix<T>> in_out_copies(const char* where,
                                          std::initializer_list<std::pair<const char*, OutIn<T>>> weights,
                                          const KernelOptions& options) {
  const auto& [first_name, first] = *weights.begin();
  for (const auto& [name, w] : weights) {
    detail::check_dense_geometry(w.w, where, name);
    // Spaces before the backend, as for in x out weights: a mix is space_mismatch in every build.
    require(w.w.space == first.w.space, ErrorCode::space_mismatch, where, first_name, " is in ",
            to_string(first.w.space), " memory but ", name, " is in ", to_string(w.w.space), " memory");
  }
  require_backend(where, first.w.space);
  std::vector<DenseMatrix<T>> copies;
  for (const auto& [name, w] : weights) copies.push_back(in_out_copy<T>(w.w, options));
  return copies;
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
  s.owned = in_out_copies<T>("twell::GatedFfn (OutIn weights)", {{"wg", wg}, {"wu", wu}, {"wd", wd}}, options);
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
  s.require_own_device(where);
  if (s.forward_on_plan(x, y, stats)) return;
  composed_gated<T>(x, s.wg, s.wu, s.wd, s.act, s.layout, y, s.options, stats);
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
  s.owned = in_out_copies<T>("twell::Ffn (OutIn weights)", {{"wu", wu}, {"wd", wd}}, options);
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
  s.require_own_device(where);
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
  require(impl_ != nullptr, ErrorCode::invalid_argument, "twell::GatedFfn::path", "the layer was moved from");
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
  require(impl_ != nullptr, ErrorCode::invalid_argument, "twell::Ffn::path", "the layer was moved from");
  return impl_->path;
}

#define TWELL_INSTANTIATE(T)                                                                                        \
  template void sparse_gated_ffn_forward<T>(In<DenseView<const T>>, In<DenseView<const T>>, In<DenseView<const T>>, \
                                            In<DenseView<const T>>, ActivationSpec, TwellLayout, DenseView<T>,      \
                                            const KernelOptions&);                                                  \
  template void sparse_ffn_forward<T>(In<DenseView<const T>>, In<DenseView<const T>>, In<DenseView<const T>>,       \
                                      ActivationSpec, TwellLayout, DenseView<T>, const KernelOptions&);             \
  template class GatedFfn<T>;                                                                                       \
  template class Ffn<T>;
TWELL_FOR_EACH_VALUE_TYPE(TWELL_INSTANTIATE)
#undef TWELL_INSTANTIATE

}  // namespace twell
