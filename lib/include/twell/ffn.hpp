// The FFN client of the sparse-activation API, composed from the public operations so that it
// runs on whichever backend holds its operands.
// Shapes: x is M x K; wg and wu are K x N; wd is N x K; y is M x K. Dense references and the
// dense training backward are in <twell/kernels/ffn.hpp> (twell::reference).
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include <twell/formats/dense.hpp>
#include <twell/formats/layout.hpp>
#include <twell/kernels/ffn.hpp>
#include <twell/kernels/options.hpp>
#include <twell/ops.hpp>

namespace twell {

// y = (act(x wg) * (x wu)) wd, as: g = gemm_to_sparse(x, wg) (a Hybrid of `layout`: nothing is
// lost to overflow); u = sddmm(x, wu) at g's pattern; h = g * u on the pattern; y = spmm(h, wd).
// Intermediates are rounded to T (the fused kernel keeps them in fp32), so results agree with
// the dense reference to T's precision, not bit for bit.
template <Value T>
void sparse_gated_ffn_forward(In<DenseView<const T>> x, In<DenseView<const T>> wg, In<DenseView<const T>> wu,
                              In<DenseView<const T>> wd, ActivationSpec act, TwellLayout layout, DenseView<T> y,
                              const KernelOptions& options = {});

// y = act(x wu) wd, as: h = gemm_to_sparse(x, wu); y = spmm(h, wd).
template <Value T>
void sparse_ffn_forward(In<DenseView<const T>> x, In<DenseView<const T>> wu, In<DenseView<const T>> wd,
                        ActivationSpec act, TwellLayout layout, DenseView<T> y, const KernelOptions& options = {});

// The overflow capacity of the objects below that ask for one.
// min(M, max(64, M / 64)) overflow rows; M rows for 16-bit device layers of M <= 256 (the decode path)
inline constexpr std::int64_t kDefaultFfnCapacity = -1;

// ---- training ------------------------------------------------------------------------------
// What the training forward keeps for the backward, on the gate's pattern P only: a = act(x wg)
// (a Hybrid of the layout asked for: P is where a stores a value, overflow rows included), u = x wu
// and h = a * u on P (Hybrids of a's structure), for SiLU and GELU also the pre-activation g = x wg
// on P (act'(g) enters the backward; ReLU's is 1 on P, so g stays empty), and the activation. In
// the operands' memory space; these Hybrids are the activation storage that a dense step holds as
// M x N matrices.
template <Value T>
struct GatedFfnActivationViews {
  HybridView<const T> a, u, h, g;  // g has no rows for ReLU
  ActivationSpec act{};
};

template <Value T>
struct GatedFfnActivations {
  HybridMatrix<T> a, u, h, g;
  ActivationSpec act{};

  GatedFfnActivationViews<T> view() const { return {a.view(), u.view(), h.view(), g.view(), act}; }
};

// y = (act(x wg) * (x wu)) wd, composed as sparse_gated_ffn_forward is, keeping the activations
// (for SiLU and GELU one more sddmm gives g on P). On the device with 16-bit values and K <=
// cuda::kFusedFfnMaxK, u, h and y come from one kernel (cuda::gated_up_down), the composition's
// values up to the order of fp32 sums.
template <Value T>
GatedFfnActivations<T> sparse_gated_ffn_training_forward(In<DenseView<const T>> x, In<DenseView<const T>> wg,
                                                         In<DenseView<const T>> wu, In<DenseView<const T>> wd,
                                                         ActivationSpec act, TwellLayout layout, DenseView<T> y,
                                                         const KernelOptions& options = {});

// The gradients of reference::gated_ffn_backward (the same loss <y, dy> + lambda sum(|h|) / Z)
// from the saved activations, composed on the operands' backend:
//   dh  = sddmm(dy, wd^T) on P, then + lambda / Z sign(h) (add_scaled_sign with y = h);
//   dg  = dh * u (multiply_on_pattern), times act'(g) for SiLU and GELU
//         (multiply_by_activation_derivative; ReLU's act' is 1 on P), du = dh * a;
//   dwd = spmm(h^T, dy); dx = spmm(dg, wg^T) + spmm(du, wu^T);
//   dwg = spmm(dg^T, x)^T, dwu = spmm(du^T, x)^T (dense transposes of K x N);
//   l1_term = lambda / Z l1_norm(h) (on the device this waits for it: one host read).
// Where the forward ran its one kernel, dh, dg, du and dx come from that kernel's backward pass
// (cuda::gated_up_down_backward; report path "fused:cuda"): the same values up to the order of
// fp32 sums, dx summed once and rounded once.
// Every activation, with or without threshold (the threshold acts as a hard mask: no gradient
// outside P, as in the reference). Every intermediate is rounded to T, so the gradients agree with
// the reference to T's precision, not bit for bit. Gradients are allocated in x's memory space;
// x, the weights and dy must be those of the forward that made `saved`.
template <Value T>
GatedFfnGradients<T> sparse_gated_ffn_backward(const GatedFfnActivations<T>& saved, In<DenseView<const T>> x,
                                               In<DenseView<const T>> wg, In<DenseView<const T>> wu,
                                               In<DenseView<const T>> wd, In<DenseView<const T>> dy, float lambda,
                                               L1Normalization norm, const KernelOptions& options = {});

// Caller-owned gradient buffers for GatedFfnTraining::backward, in the operands' memory space.
template <Value T>
struct GatedFfnGradientViews {
  DenseView<T> dx;   // M x K
  DenseView<T> dwg;  // K x N
  DenseView<T> dwu;  // K x N
  DenseView<T> dwd;  // N x K
};

// The training step of one gated FFN layer with its storage held, the plan form of the two
// functions above: bound to M tokens, hidden size K, intermediate size N, the memory space, the
// activation, the gate layout and an overflow capacity (default min(M, max(64, M / 64)) rows). It
// holds the saved activations of its latest forward() (a, u, h, and g for SiLU and GELU), the
// backward's dg, du (and dh where it composes) and one N x K matrix, and on the device a
// cuda::GemmToSparsePlan for the gate, a cuda::GatedUpDownPlan where the fused up/down kernel
// applies (the forward's u, h, y and the backward's dg, du, dx), and one cuda::SpmmPlan for the
// other products (dwd, dwg^T, dwu^T; y and dx's two where they compose). The weights
// are arguments of each call, since training changes them between steps; backward() must get the
// x and weights of the forward() before it.
//   forward(x, wg, wu, wd, y): y = (act(x wg) * (x wu)) wd, keeping the activations. The host
//     waits for the gate's overflow row count R (the later operations are sized by it).
//   backward(x, wg, wu, wd, dy, lambda, norm, out): the gradients of sparse_gated_ffn_backward
//     into out, returning its l1_term (read back last). The three products with op(A) = A^T each
//     read A^T's dense-row count while their kernel runs (SpmmPlan). Where wu is the forward's
//     view, the fused backward takes the forward's Wu^T (reuse_run_wu_t) instead of making it again.
// Same operations in the same order as the free functions; the plans promise the bits of the
// free gemm_to_sparse and spmm, so the results are the free functions' bit for bit. Storage on
// the device: the constructor allocates the held Hybrids and the SpmmPlan's overflow buffer for
// `capacity` rows; a forward meeting more than `capacity` overflow rows grows the Hybrids to
// min(M, max(R, 2 capacity)) rows (overflow_capacity()); the SpmmPlan's own buffers (the slice
// kernel's on A and on A^T, A^T's slots and dense rows, the overflow rows of A^T) are made by the
// first step and grow when a step's counts exceed every earlier one's. So after the first steps a
// step allocates no Buffer unless its counts are new; what it still takes per call is small
// stream-ordered scratch from twell's pool (sddmm's, l1_norm's). Layouts whose
// A^T takes spmm's CSR route and gates on gemm_to_sparse's generic path (fp32, tiles other than
// 128 / 256, K or N not a multiple of 8, unaligned operands) allocate per call, as the free
// functions do; so does the host. A call rejected by its checks (shapes, spaces, lambda) changes
// nothing; a forward that fails later (a bad leading dimension is caught by the operation that
// reads it) leaves no activations, and backward() without them is invalid_argument. path():
// "planned:cuda" or "composed:reference" for the latest call.
template <Value T>
class GatedFfnTraining {
 public:
  GatedFfnTraining(std::int64_t tokens, std::int64_t hidden, std::int64_t intermediate, MemorySpace space,
                   ActivationSpec act = {}, TwellLayout layout = {},
                   std::int64_t overflow_capacity = kDefaultFfnCapacity, const KernelOptions& options = {});
  GatedFfnTraining(GatedFfnTraining&&) noexcept;
  GatedFfnTraining& operator=(GatedFfnTraining&&) noexcept;
  ~GatedFfnTraining();

  void forward(In<DenseView<const T>> x, In<DenseView<const T>> wg, In<DenseView<const T>> wu,
               In<DenseView<const T>> wd, DenseView<T> y);
  double backward(In<DenseView<const T>> x, In<DenseView<const T>> wg, In<DenseView<const T>> wu,
                  In<DenseView<const T>> wd, In<DenseView<const T>> dy, float lambda, L1Normalization norm,
                  const GatedFfnGradientViews<T>& out);
  // The latest forward's saved activations (valid until the next forward()).
  GatedFfnActivationViews<T> activations() const;
  std::int64_t overflow_capacity() const;
  const std::string& path() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

// A weight matrix with its convention in its type, so that a layer never guesses it from shapes
// (a square layer would make any guess silently wrong):
//   InOut<T>{w}: w is (features in) x (features out) and the layer computes x w: twell's own
//                convention (wg, wu: K x N; wd: N x K). The layer views w.
//   OutIn<T>{w}: w is (features out) x (features in) and the layer computes x w^T, the way
//                torch.nn.Linear stores its weight (wg, wu: N x K; wd: K x N). The layer keeps its
//                own transposed copy, made once at construction by twell::transpose on w's backend.
// Plain DenseView arguments mean InOut.
template <Value T>
struct InOut {
  DenseView<const T> w;
};
template <Value T>
struct OutIn {
  DenseView<const T> w;
};

// FFN layers bound to their weights (views that must outlive the object and stay in one memory
// space), activation, gate layout and token count M, for repeated forward passes. Construction
// allocates; forward(x, y) then runs on the weights' backend:
//   - device: twell::cuda::GatedFfnPlan / FfnPlan (<twell/kernels/ffn_cuda.hpp>): the gate through
//     a GemmToSparsePlan whose overflow block holds `overflow_capacity` rows (default min(M, max(64, M/64)),
//     M rows for 16-bit weights at M <= 256, where the up/down projections take the decode path),
//     then the fused up/down kernel; nothing allocated and no host wait where the gate takes its
//     fused path (path() does not start with "gate:generic"). The gated plan copies Wu^T once at
//     construction: after wu changes, build a new layer (wg and wd are read at each call). Overflow rows past the
//     block are still exact (the kernel recomputes their gate rows); a forward() with stats waits
//     for the device, reports them, and lets the block grow so later calls avoid that slow path.
//     K (the hidden size) above cuda::kFusedFfnMaxK (8192) is past the fused kernels: such a layer
//     runs the composed forward below on the device (path "composed:cuda"). A device layer
//     belongs to the device current when it was made: forward() with another one current is
//     space_mismatch (docs/api.md, "Conventions").
//   - host: the composed forward above (gemm_to_sparse, sddmm, spmm; it allocates per call).
// stats (optional): per-token nonzero counts, overflow rows and the capacity they met (FfnStats).
// path() names what the latest forward() ran. Shapes: x and y are M x K; y overlapping x or a
// weight is invalid_argument.
template <Value T>
class GatedFfn {
 public:
  GatedFfn(std::int64_t tokens, In<DenseView<const T>> wg, In<DenseView<const T>> wu, In<DenseView<const T>> wd,
           ActivationSpec act = {}, TwellLayout layout = {}, std::int64_t overflow_capacity = kDefaultFfnCapacity,
           const KernelOptions& options = {});
  GatedFfn(std::int64_t tokens, InOut<T> wg, InOut<T> wu, InOut<T> wd, ActivationSpec act = {}, TwellLayout layout = {},
           std::int64_t overflow_capacity = kDefaultFfnCapacity, const KernelOptions& options = {});
  GatedFfn(std::int64_t tokens, OutIn<T> wg, OutIn<T> wu, OutIn<T> wd, ActivationSpec act = {}, TwellLayout layout = {},
           std::int64_t overflow_capacity = kDefaultFfnCapacity, const KernelOptions& options = {});
  GatedFfn(GatedFfn&&) noexcept;
  GatedFfn& operator=(GatedFfn&&) noexcept;
  ~GatedFfn();

  void forward(In<DenseView<const T>> x, DenseView<T> y, FfnStats* stats = nullptr);
  const std::string& path() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

// y = act(x wu) wd, the same way.
template <Value T>
class Ffn {
 public:
  Ffn(std::int64_t tokens, In<DenseView<const T>> wu, In<DenseView<const T>> wd, ActivationSpec act = {},
      TwellLayout layout = {}, std::int64_t overflow_capacity = kDefaultFfnCapacity, const KernelOptions& options = {});
  Ffn(std::int64_t tokens, InOut<T> wu, InOut<T> wd, ActivationSpec act = {}, TwellLayout layout = {},
      std::int64_t overflow_capacity = kDefaultFfnCapacity, const KernelOptions& options = {});
  Ffn(std::int64_t tokens, OutIn<T> wu, OutIn<T> wd, ActivationSpec act = {}, TwellLayout layout = {},
      std::int64_t overflow_capacity = kDefaultFfnCapacity, const KernelOptions& options = {});
  Ffn(Ffn&&) noexcept;
  Ffn& operator=(Ffn&&) noexcept;
  ~Ffn();

  void forward(In<DenseView<const T>> x, DenseView<T> y, FfnStats* stats = nullptr);
  const std::string& path() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace twell
