// cuda kernels against twell::reference on the same fresh random input: spmm, sddmm, transpose,
// elementwise, reductions, for every format, dtype and op. Formats are built by the reference
// converters and copied to the device; outputs are poisoned (NaN / 0xff bytes) before each run,
// so beta = 0 paths that read C, or elements left unwritten, show up as NaN.
#include <doctest/doctest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <stdexcept>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include <cuda_runtime.h>

#include <twell/convert.hpp>
#include <twell/converters/backends.hpp>
#include <twell/formats/copy.hpp>
#include <twell/formats/validate.hpp>
#include <twell/kernels/backends.hpp>
#include <twell/kernels/spmm_plan.hpp>
#include <twell/ops.hpp>
#include <twell/workload.hpp>

#include "checks.hpp"
#include "device.hpp"
#include "fixtures.hpp"
#include "random.hpp"
#include "same.hpp"
#include "shapes.hpp"

using namespace twell;
namespace ref = twell::reference;
namespace dev = twell::cuda;

namespace {

constexpr MemorySpace kHost = MemorySpace::host;
constexpr MemorySpace kDevice = MemorySpace::device;
constexpr TwellLayout kPaper{256, 8};
constexpr TwellLayout kNarrow{16, 4};

using testing::nan_dense;
using testing::poison_device;
using testing::relative_bound;

TwellLayout wide_layout(std::int64_t cols) { return TwellLayout{static_cast<std::int32_t>((cols / 8 + 1) * 8), 1}; }

// The paper's layout when no (row, tile) overflows it, else one tile wider than the matrix.
template <class T>
TwellLayout twell_layout_for(DenseView<const T> d) {
  for (std::int64_t i = 0; i < d.rows; ++i)
    for (std::int64_t t = 0; t < kPaper.tiles(d.cols); ++t) {
      std::int64_t count = 0;
      for (std::int64_t j = kPaper.tile_begin(t); j < std::min<std::int64_t>(d.cols, kPaper.tile_begin(t + 1)); ++j)
        count += is_stored(d.at(i, j)) ? 1 : 0;
      if (kPaper.overflows(count)) return wide_layout(d.cols);
    }
  return kPaper;
}

template <class T>
struct Formats {
  CsrMatrix<T> csr;
  EllMatrix<T> ell;
  TwellMatrix<T> twell;
  HybridMatrix<T> hybrid;
};

template <class T>
Formats<T> host_formats(DenseView<const T> d, TwellLayout hybrid_layout) {
  return {ref::dense_to_csr<T>(d), ref::dense_to_ell<T>(d), ref::dense_to_twell<T>(d, twell_layout_for(d)),
          ref::dense_to_hybrid<T>(d, hybrid_layout)};
}

template <class T>
Formats<T> to_device(const Formats<T>& h) {
  return {h.csr.to(kDevice), h.ell.to(kDevice), h.twell.to(kDevice), h.hybrid.to(kDevice)};
}

template <class T>
double rel(const DenseMatrix<T>& got, const DenseMatrix<T>& want) {
  return testing::relative_error<T, T>(got.view(), want.view());
}

// ||got - want|| / ||x||, for results bounded by |x| times a factor near 1 (x * act'(y)), where a
// result near zero carries the absolute error of its fp32 factor.
template <class T>
double error_over_x(const DenseMatrix<T>& got, const DenseMatrix<T>& want, const DenseMatrix<T>& x) {
  double diff = 0.0, norm = 0.0;
  for (std::int64_t i = 0; i < x.rows(); ++i)
    for (std::int64_t j = 0; j < x.cols(); ++j) {
      const double d = to_float(got.view().at(i, j)) - to_float(want.view().at(i, j));
      const double v = to_float(x.view().at(i, j));
      diff += d * d;
      norm += v * v;
    }
  return std::sqrt(diff) / std::max(std::sqrt(norm), 1e-30);
}

bool cuda_path(const KernelReport& r) { return r.path.rfind("cuda/", 0) == 0; }

using testing::Shape;

std::vector<Shape> small_shapes() {
  const std::vector<Shape> fixed = {{1, 1, 1}, {3, 5, 2}, {17, 33, 7}, {40, 300, 64}, {70, 520, 130}, {33, 17, 250}};
  return testing::with_random_shapes(fixed, 90, 3);
}

constexpr double kDensities[] = {0.0, 0.005, 0.05, 0.5, 1.0};

// Row by row too, since one wrong row of a tall result hides in the whole matrix's norm: each row's
// error relative to at least the matrix's RMS row norm (a row whose terms cancel has a tiny norm
// and a large relative rounding: fp32 sddmm rows measured 1.5e-5 and 1.5e-4 against 1e-5 on their
// own norms), against ten times the matrix's bound; a wrong or unwritten row is off by ~1.
constexpr double kRowBound = 10.0;
template <class T>
double worst_row_error(const DenseMatrix<T>& got, const DenseMatrix<T>& want) {
  return testing::worst_row_error<T>(got, want, testing::rms_row_norm<T>(want));
}

// One spmm case on one format: the same A (host and device twins), B and C0 for both backends.
template <class T, class HostM>
void check_spmm(const std::string& name, Op op, const HostM& a_host, const DenseMatrix<T>& b, const DenseMatrix<T>& c0,
                float alpha, float beta) {
  CAPTURE(name);
  CAPTURE(alpha);
  CAPTURE(beta);
  const bool tr = op == Op::transpose;
  const std::int64_t m = tr ? a_host.cols() : a_host.rows();
  DenseMatrix<T> want = beta == 0.0f ? nan_dense<T>(m, b.cols()) : c0.to(kHost);
  ref::spmm<T>(op, a_host.view(), b.view(), want.view(), alpha, beta);

  const auto a_dev = a_host.to(kDevice);
  const DenseMatrix<T> b_dev = b.to(kDevice);
  DenseMatrix<T> c_dev = beta == 0.0f ? nan_dense<T>(m, b.cols()).to(kDevice) : c0.to(kDevice);
  KernelReport report;
  KernelOptions options;
  options.report = &report;
  dev::spmm<T>(op, a_dev.view(), b_dev.view(), c_dev.view(), alpha, beta, options);
  REQUIRE(cudaDeviceSynchronize() == cudaSuccess);
  CAPTURE(report.path);
  CHECK(cuda_path(report));
  const DenseMatrix<T> got = c_dev.to(kHost);
  const double err = rel(got, want);
  CHECK(err <= relative_bound<T>());  // NaN (poison leaked or unwritten) fails too
  CHECK(worst_row_error<T>(got, want) <= kRowBound * relative_bound<T>());
}

// C = A^T B on the device, C poisoned first; the result stays on the device.
template <class T, class HostM>
DenseMatrix<T> spmm_t_on_device(const HostM& a, const DenseMatrix<T>& b) {
  const auto a_dev = a.to(kDevice);
  const DenseMatrix<T> b_dev = b.to(kDevice);
  DenseMatrix<T> c = nan_dense<T>(a.cols(), b.cols()).to(kDevice);
  dev::spmm<T>(Op::transpose, a_dev.view(), b_dev.view(), c.view(), 1.0f, 0.0f);
  REQUIRE(cudaDeviceSynchronize() == cudaSuccess);
  return c;
}

}  // namespace

TEST_CASE_TEMPLATE("cuda spmm matches the reference: formats, ops, densities, alpha/beta", T, bf16, fp16, float) {
  testing::for_each_product_case(
      small_shapes(), kDensities, [&](const Shape& s, double density, Op op, std::uint64_t seed) {
        const bool tr = op == Op::transpose;
        // full_row_share: skewed rows that overflow.
        const testing::SparseDenseOptions so{
            .density = density, .empty_row_share = 0.1, .full_row_share = density > 0.0 && density < 0.5 ? 0.05 : 0.0};
        const auto a_dense = testing::random_sparse_dense<T>(tr ? s.k : s.m, tr ? s.m : s.k, so, seed);
        const auto b = testing::random_dense<T>(s.k, s.n, 1.0f, seed + 1);
        const auto c0 = testing::random_dense<T>(s.m, s.n, 1.0f, seed + 2);
        const Formats<T> f = host_formats<T>(a_dense.view(), kNarrow);
        for (const auto& [alpha, beta] : {std::pair{1.0f, 0.0f}, std::pair{-0.5f, 0.0f}, std::pair{1.5f, -2.0f}}) {
          check_spmm<T>("csr", op, f.csr, b, c0, alpha, beta);
          check_spmm<T>("ell", op, f.ell, b, c0, alpha, beta);
          check_spmm<T>("twell", op, f.twell, b, c0, alpha, beta);
          check_spmm<T>("hybrid", op, f.hybrid, b, c0, alpha, beta);
        }
      });
}

// A paper-like down projection (K = 5632 in tiles of 256, C = 8) with token-skewed rows, some of
// which overflow into the Hybrid's dense block; B and C with a ragged column count too.
TEST_CASE_TEMPLATE("cuda spmm at the paper's layout with token skew", T, bf16, fp16, float) {
  for (const std::int64_t n : {std::int64_t{256}, std::int64_t{100}}) {
    for (const double density : {0.005, 0.02}) {
      const std::uint64_t seed = testing::fresh_seed();
      CAPTURE(seed);
      CAPTURE(n);
      CAPTURE(density);
      const std::int64_t m = 700, k = 5632;
      const testing::SparseDenseOptions so{.density = density, .full_row_share = 0.01};
      auto a_dense = testing::random_sparse_dense<T>(m, k, so, seed);
      // A few heavy rows that stay within capacity: they must be spread over warps, not overflow.
      for (std::int64_t i = 1; i < m; i += 97)
        for (std::int64_t j = 0; j < k; j += 9) a_dense.view().at(i, j) = from_float<T>(0.5f + 0.001f * j);
      const auto b = testing::random_dense<T>(k, n, 1.0f, seed + 1);
      const auto c0 = testing::random_dense<T>(m, n, 1.0f, seed + 2);
      const HybridMatrix<T> hybrid = ref::dense_to_hybrid<T>(a_dense.view(), kPaper);
      CHECK(hybrid.overflow_rows() > 0);
      check_spmm<T>("hybrid", Op::none, hybrid, b, c0, 1.0f, 0.0f);
      check_spmm<T>("hybrid", Op::none, hybrid, b, c0, 0.5f, 1.0f);
      // op = transpose: C (k x n) = A^T B with B m x n (the dWd = h^T dy shape).
      const auto bt = testing::random_dense<T>(m, n, 1.0f, seed + 3);
      const auto ct = testing::random_dense<T>(k, n, 1.0f, seed + 4);
      check_spmm<T>("hybrid", Op::transpose, hybrid, bt, ct, 1.0f, 0.0f);
      // The same matrix without its overflowed rows, as a plain TwELL.
      ConvertOptions drop;
      drop.overflow = OverflowPolicy::drop;
      const TwellMatrix<T> twell = ref::dense_to_twell<T>(a_dense.view(), kPaper, drop);
      check_spmm<T>("twell", Op::none, twell, b, c0, 1.0f, 0.0f);
      check_spmm<T>("twell", Op::none, twell, b, c0, -1.0f, 0.5f);
    }
  }
}

// An SpmmPlan runs a Hybrid's overflow rows on its side stream beside the TwELL kernel; the plan's
// stream must still wait for them. Each run's C is NaN-poisoned on the plan's stream just before the
// run and copied back on it just after, and only that stream is synchronised: the pair-balanced
// kernel reads ~8 B rows for each of ~350 rows (~23 MB) while the dense block is a 350 x 8192 x 4096
// GEMM (~23.5 GFLOP), so a run that did not join its side stream would likely copy poisoned rows
// (a race: how often it shows is in docs/testing-results.md). Each run must equal, bit for bit, the
// one-shot spmm (overflow rows after the kernel, the device synchronised), whose values the
// token-skew case above checks against the reference.
TEST_CASE("SpmmPlan's overflow rows beside the kernel: the plan's stream waits for them") {
  cudaStream_t stream = nullptr;
  testing::cuda_ok(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  const std::uint64_t seed = testing::fresh_seed();
  CAPTURE(seed);
  const std::int64_t m = 700, k = 8192, n = 4096;
  const testing::SparseDenseOptions so{.density = 0.001, .full_row_share = 0.5};
  const HybridMatrix<bf16> hybrid =
      ref::dense_to_hybrid<bf16>(testing::random_sparse_dense<bf16>(m, k, so, seed).view(), kPaper);
  CHECK(hybrid.overflow_rows() > m / 3);
  const auto a_dev = hybrid.to(kDevice);
  const DenseMatrix<bf16> b_dev = testing::random_dense<bf16>(k, n, 1.0f, seed + 1).to(kDevice);
  DenseMatrix<bf16> c_dev = nan_dense<bf16>(m, n).to(kDevice);
  testing::cuda_ok(cudaDeviceSynchronize());  // the uploads (from pageable memory) land first
  KernelReport report;
  KernelOptions options;
  options.report = &report;
  dev::spmm<bf16>(Op::none, a_dev.view(), b_dev.view(), c_dev.view(), 1.0f, 0.0f, options);
  testing::cuda_ok(cudaDeviceSynchronize());
  const std::string path = "cuda/spmm/hybrid/pair_balanced+cublas_overflow";
  CHECK(report.path == path);
  const DenseMatrix<bf16> want = c_dev.to(kHost);
  std::int64_t not_finite = 0;
  for (const bf16 v : want.values().host_span()) not_finite += std::isfinite(to_float(v)) ? 0 : 1;
  CHECK(not_finite == 0);

  dev::SpmmPlan<bf16> plan(m, k, kPaper, Stream{stream});
  DenseMatrix<bf16> got(m, n);
  for (int run = 0; run < 8; ++run) {
    CAPTURE(run);
    testing::cuda_ok(cudaMemsetAsync(c_dev.values().data(), 0xff, c_dev.values().bytes(), stream));
    plan.run(a_dev.view(), b_dev.view(), c_dev.view());
    testing::cuda_ok(cudaMemcpyAsync(got.values().data(), c_dev.values().data(), c_dev.values().bytes(),
                                     cudaMemcpyDeviceToHost, stream));
    testing::cuda_ok(cudaStreamSynchronize(stream));
    CHECK(plan.path() == path);
    CHECK(testing::bitwise_equal<bf16>(got.view(), want.view()));
  }
  testing::cuda_ok(cudaStreamDestroy(stream));
}

namespace {
// Copies src's bytes over dst's, which has its size, on `stream`: a captured graph's operands
// change in place between replays on that stream.
template <class U>
void overwrite(Buffer<U>& dst, const Buffer<U>& src, cudaStream_t stream) {
  REQUIRE(dst.bytes() == src.bytes());
  if (src.bytes() > 0)
    testing::cuda_ok(cudaMemcpyAsync(dst.data(), src.data(), src.bytes(), cudaMemcpyDefault, stream));
}
template <class T>
void overwrite(HybridMatrix<T>& dst, const HybridMatrix<T>& src, cudaStream_t stream) {
  overwrite(dst.twell().packed(), src.twell().packed(), stream);
  overwrite(dst.twell().value_plane(), src.twell().value_plane(), stream);
  overwrite(dst.overflow().values(), src.overflow().values(), stream);
  overwrite(dst.row_to_overflow(), src.row_to_overflow(), stream);
  overwrite(dst.overflow_to_row(), src.overflow_to_row(), stream);
}
}  // namespace

// An SpmmPlan's op-none run queues its work on the plan's stream (and, for a Hybrid's overflow
// rows, on its side lane, which forks from that stream and joins it again): once a first run
// outside capture has made the plan's buffers, side stream and cuBLAS handle, a run can be
// captured in the strictest capture mode, and each replay computes from what A and B hold then
// (a graph is bound to the operands' shapes, a Hybrid's overflow rows included): the direct
// runs' bits.
TEST_CASE("SpmmPlan's op-none runs captured into a CUDA graph replay the direct runs' bits") {
  const testing::NonBlockingStream stream;
  constexpr std::int64_t k = 5632, n = 256;
  struct Setting {
    std::int64_t m;
    bool overflow_rows;
    TwellLayout layout;
    const char* path;
  };
  // Each kernel without overflow rows and with them, where the side lane's cuBLAS GEMM runs beside
  // the kernel (tile-streaming: its dealt form for uneven rows; pair-balanced), or between the
  // slice-reuse pre-pass and its product.
  constexpr TwellLayout k16{256, 16};
  for (const Setting& s : {Setting{1000, false, k16, "cuda/spmm/hybrid/tile_stream"},
                           Setting{5000, false, k16, "cuda/spmm/hybrid/slice_reuse"},
                           Setting{700, true, kPaper, "cuda/spmm/hybrid/pair_balanced+cublas_overflow"},
                           Setting{1000, true, k16, "cuda/spmm/hybrid/tile_stream+cublas_overflow"},
                           Setting{5000, true, kPaper, "cuda/spmm/hybrid/slice_reuse+cublas_overflow"}}) {
    const std::uint64_t seed = testing::fresh_seed();
    CAPTURE(seed);
    CAPTURE(s.m);
    CAPTURE(s.overflow_rows);
    const TwellLayout layout = s.layout;
    const testing::SparseDenseOptions so{.density = 0.005, .full_row_share = s.overflow_rows ? 0.1 : 0.0};
    const DenseMatrix<bf16> d0 = testing::random_sparse_dense<bf16>(s.m, k, so, seed);
    // The second A: another pattern without overflow rows, the first one's negation with them
    // (the same structure).
    DenseMatrix<bf16> d1 = s.overflow_rows ? d0.to(kHost) : testing::random_sparse_dense<bf16>(s.m, k, so, seed + 1);
    if (s.overflow_rows)
      for (bf16& v : d1.values().host_span()) v = from_float<bf16>(-to_float(v));
    const HybridMatrix<bf16> a[2] = {ref::dense_to_hybrid<bf16>(d0.view(), layout).to(kDevice),
                                     ref::dense_to_hybrid<bf16>(d1.view(), layout).to(kDevice)};
    REQUIRE(a[0].overflow_rows() == a[1].overflow_rows());
    CHECK((a[0].overflow_rows() > 0) == s.overflow_rows);
    const DenseMatrix<bf16> b[2] = {testing::random_dense<bf16>(k, n, 1.0f, seed + 2).to(kDevice),
                                    testing::random_dense<bf16>(k, n, 1.0f, seed + 3).to(kDevice)};

    dev::SpmmPlan<bf16> plan(s.m, k, layout, Stream{stream.get()});
    DenseMatrix<bf16> want[2];
    for (int i = 0; i < 2; ++i) {
      DenseMatrix<bf16> c = nan_dense<bf16>(s.m, n).to(kDevice);
      plan.run(a[i].view(), b[i].view(), c.view());
      testing::cuda_ok(cudaStreamSynchronize(stream.get()));
      want[i] = c.to(kHost);
    }
    CHECK(plan.path() == s.path);

    HybridMatrix<bf16> a_in = a[0].to(kDevice);
    DenseMatrix<bf16> b_in = b[0].to(kDevice);
    DenseMatrix<bf16> c_in(s.m, n, kDevice);
    cudaGraph_t graph = nullptr;
    testing::cuda_ok(cudaStreamBeginCapture(stream.get(), cudaStreamCaptureModeGlobal));
    plan.run(std::as_const(a_in).view(), std::as_const(b_in).view(), c_in.view());
    testing::cuda_ok(cudaStreamEndCapture(stream.get(), &graph));
    cudaGraphExec_t exec = nullptr;
    testing::cuda_ok(cudaGraphInstantiate(&exec, graph, 0));
    for (const int replay : {1, 0, 1}) {
      CAPTURE(replay);
      overwrite(a_in, a[replay], stream.get());
      overwrite(b_in.values(), b[replay].values(), stream.get());
      poison_device(c_in.values(), stream.get());
      testing::cuda_ok(cudaGraphLaunch(exec, stream.get()));
      testing::cuda_ok(cudaStreamSynchronize(stream.get()));
      CHECK(testing::bitwise_equal<bf16>(c_in.to(kHost).view(), want[replay].view()));
    }
    testing::cuda_ok(cudaGraphExecDestroy(exec));
    testing::cuda_ok(cudaGraphDestroy(graph));
  }
}

// op(A) = A^T where A's columns (the rows of A^T) are far apart in length, as the units of a
// skewed workload: a few columns almost full (rows of A^T of ~2700 entries, past the row kernel's
// 128, which a CTA's warps share), most sparse, some empty.
TEST_CASE_TEMPLATE("cuda spmm with op(A) = A^T on skewed columns: long rows of A^T take a CTA each", T, bf16, fp16,
                   float) {
  // n = 520: several column slices, the last one partial; 100: the scalar path for 16-bit types.
  for (const std::int64_t n : {std::int64_t{64}, std::int64_t{100}, std::int64_t{520}}) {
    const std::uint64_t seed = testing::fresh_seed();
    CAPTURE(seed);
    CAPTURE(n);
    const std::int64_t m = 3000, k = 300;
    std::mt19937_64 rng(seed);
    std::uniform_real_distribution<float> u(0.0f, 1.0f);
    DenseMatrix<T> a_dense(m, k);
    for (std::int64_t j = 0; j < k; ++j) {
      const float p = j % 100 == 7 ? 0.9f : (j % 5 == 0 ? 0.0f : 0.02f);
      for (std::int64_t i = 0; i < m; ++i)
        if (u(rng) < p) a_dense.view().at(i, j) = from_float<T>(u(rng) < 0.5f ? 0.25f + u(rng) : -0.25f - u(rng));
    }
    const auto b = testing::random_dense<T>(m, n, 1.0f, seed + 1);
    const auto c0 = testing::random_dense<T>(k, n, 1.0f, seed + 2);
    const Formats<T> f = host_formats<T>(a_dense.view(), kNarrow);
    for (const auto& [alpha, beta] : {std::pair{1.0f, 0.0f}, std::pair{0.5f, -1.5f}}) {
      check_spmm<T>("csr", Op::transpose, f.csr, b, c0, alpha, beta);
      check_spmm<T>("hybrid", Op::transpose, f.hybrid, b, c0, alpha, beta);
    }
  }
}

// An output view whose leading dimension is not a multiple of 8 takes the scalar path.
TEST_CASE_TEMPLATE("cuda spmm on misaligned B and C takes the scalar path and stays right", T, bf16, float) {
  const std::uint64_t seed = testing::fresh_seed();
  CAPTURE(seed);
  const testing::SparseDenseOptions so{.density = 0.05};
  const auto a_dense = testing::random_sparse_dense<T>(50, 700, so, seed);
  const TwellMatrix<T> a = ref::dense_to_twell<T>(a_dense.view(), twell_layout_for<T>(a_dense.view()));
  const auto b = testing::random_dense<T>(700, 37, 1.0f, seed + 1);
  DenseMatrix<T> want = nan_dense<T>(50, 37);
  ref::spmm<T>(Op::none, a.view(), b.view(), want.view(), 1.0f, 0.0f);
  // C lives inside a wider buffer (ld 41) with poison around it.
  DenseMatrix<T> wide = nan_dense<T>(50, 41).to(kDevice);
  DenseView<T> c{wide.view().data + 1, 50, 37, 41, kDevice};
  const auto a_dev = a.to(kDevice);
  const auto b_dev = b.to(kDevice);
  KernelReport report;
  KernelOptions options;
  options.report = &report;
  dev::spmm<T>(Op::none, a_dev.view(), b_dev.view(), c, 1.0f, 0.0f, options);
  REQUIRE(cudaDeviceSynchronize() == cudaSuccess);
  CHECK(report.path == "cuda/spmm/twell/pair_balanced_scalar");
  const DenseMatrix<T> host = wide.to(kHost);
  DenseMatrix<T> got(50, 37);
  for (std::int64_t i = 0; i < 50; ++i) {
    for (std::int64_t j = 0; j < 37; ++j) got.view().at(i, j) = host.view().at(i, j + 1);
    CHECK(std::isnan(to_float(host.view().at(i, 0))));  // neighbours untouched
    CHECK(std::isnan(to_float(host.view().at(i, 38))));
  }
  CHECK(rel(got, want) <= relative_bound<T>());
}

// The TwELL kernel's per-tile prefix lives in shared memory: 55,000 tiles of 8 columns need
// ~237 KB, past a Hopper's 227 KB opt-in. Either a kernel takes the operands and is right, or the
// call says `unsupported`, naming shared memory (it was a bare CUDA error from cudaFuncSetAttribute).
TEST_CASE("cuda spmm on a TwELL whose tile prefix outgrows shared memory is right or unsupported") {
  const std::uint64_t seed = testing::fresh_seed();
  CAPTURE(seed);
  constexpr std::int64_t kRows = 4, kCols = 8 * 55000, kN = 8;
  const auto a_dense = testing::random_sparse_dense<bf16>(kRows, kCols, {.density = 0.001}, seed);
  const TwellMatrix<bf16> a = ref::dense_to_twell<bf16>(a_dense.view(), TwellLayout{8, 2});
  const auto b = testing::random_dense<bf16>(kCols, kN, 1.0f, seed + 1);
  DenseMatrix<bf16> want = nan_dense<bf16>(kRows, kN);
  ref::spmm<bf16>(Op::none, a.view(), b.view(), want.view(), 1.0f, 0.0f);
  const auto a_dev = a.to(kDevice);
  const auto b_dev = b.to(kDevice);
  DenseMatrix<bf16> c = nan_dense<bf16>(kRows, kN).to(kDevice);
  try {
    dev::spmm<bf16>(Op::none, a_dev.view(), b_dev.view(), c.view(), 1.0f, 0.0f);
    REQUIRE(cudaDeviceSynchronize() == cudaSuccess);
    CHECK(rel(c.to(kHost), want) <= relative_bound<bf16>());
  } catch (const Error& e) {
    CHECK(e.code() == ErrorCode::unsupported);
    CHECK(std::string(e.what()).find("bytes of shared memory per block") != std::string::npos);
  }
  REQUIRE(cudaGetLastError() == cudaSuccess);  // no sticky error left for the next case
}

// The kernels read A and B while they write out: an out over A is refused before any launch
// (tests/cpu/test_kernels.cpp covers every format through the shared check).
TEST_CASE("cuda sddmm refuses an out whose values overlap A") {
  const std::uint64_t seed = testing::fresh_seed();
  CAPTURE(seed);
  const auto pattern = to_csr(testing::random_sparse_dense<bf16>(6, 40, {.density = 0.3}, seed)).to(kDevice);
  auto out = pattern.to(kDevice);
  const auto b = testing::random_dense<bf16>(5, 40, 1.0f, seed + 1).to(kDevice);
  const DenseView<const bf16> a_over_out{out.values().data(), 6, 5, 5, kDevice};
  const std::string message = testing::message_of(
      [&] { dev::sddmm<bf16>(a_over_out, Op::none, b.view(), pattern.view(), out.view(), 1.0f, 0.0f); });
  CHECK(message.find("out overlaps A or B") != std::string::npos);
  REQUIRE(cudaDeviceSynchronize() == cudaSuccess);
}

// K = 0: op(A) B has no terms, and the kernel scales every row of C by beta, a Hybrid's overflow
// rows included; they must not be scaled again by the overflow product. (Overflow rows at K = 0
// make no valid Hybrid, but spmm does not validate its operands.)
TEST_CASE("cuda spmm at K = 0 scales every row of C by beta once, a Hybrid's overflow rows included") {
  HybridMatrix<float> a(2, 0, TwellLayout{8, 4}, 1);
  a.row_to_overflow().host_span()[0] = 0;
  a.overflow_to_row().host_span()[0] = 0;
  const auto a_dev = a.to(kDevice);
  const DenseMatrix<float> b(0, 4, kDevice);
  DenseMatrix<float> c(2, 4);
  for (float& v : c.values().host_span()) v = 1.0f;
  auto c_dev = c.to(kDevice);
  dev::spmm<float>(Op::none, a_dev.view(), b.view(), c_dev.view(), 1.0f, 2.0f);
  const DenseMatrix<float> got = c_dev.to(kHost);
  for (const float v : got.values().host_span()) CHECK(v == 2.0f);
}

namespace {
// A 70 x 130 fp32 Hybrid with rows in its dense block (the products with it reach cuBLAS).
HybridMatrix<float> overflowing_hybrid(std::uint64_t seed) {
  const testing::SparseDenseOptions so{.density = 0.05, .full_row_share = 0.1};
  auto a = ref::dense_to_hybrid<float>(testing::random_sparse_dense<float>(70, 130, so, seed).view(), kNarrow);
  REQUIRE(a.overflow_rows() > 0);
  return a;
}
}  // namespace

// The cuBLAS handle behind a Hybrid's overflow rows is kept per host thread and device: one
// thread running spmm on device 0, then 1, then 0 again must get each device's own handle (a
// handle of device 0 fails on device 1's streams). Two users of it: op = none on an fp32 Hybrid
// with overflow rows, and op = transpose through the direct transpose (bf16, a hot unit, so A^T
// has dense rows for cuBLAS). Every device there is takes part; with one, the case runs there
// alone and says the switch went untested.
TEST_CASE("cuda spmm's Hybrid overflow rows on every device from one host thread") {
  int devices = 0;
  testing::cuda_ok(cudaGetDeviceCount(&devices));
  if (devices < 2) MESSAGE("one device: the switch between devices is not tested");
  std::vector<int> order;
  for (int d = 0; d < devices; ++d) order.push_back(d);
  order.push_back(0);
  const std::uint64_t seed = testing::fresh_seed();
  CAPTURE(seed);
  const auto a = overflowing_hybrid(seed);
  const auto b = testing::random_dense<float>(130, 33, 1.0f, seed + 1);
  const auto c0 = testing::random_dense<float>(70, 33, 1.0f, seed + 2);
  auto hot = testing::random_sparse_dense<bf16>(300, 130, {.density = 0.05}, seed + 3);
  for (std::int64_t i = 0; i < 300; i += 2) hot.view().at(i, 1) = from_float<bf16>(0.5f);  // 150 > A^T's 15 a tile
  const auto a16 = ref::dense_to_hybrid<bf16>(hot.view(), TwellLayout{256, 16});
  const auto bt = testing::random_dense<bf16>(300, 32, 1.0f, seed + 4);
  const auto ct = testing::random_dense<bf16>(130, 32, 1.0f, seed + 5);
  for (const int d : order) {
    CAPTURE(d);
    testing::cuda_ok(cudaSetDevice(d));
    check_spmm<float>("hybrid", Op::none, a, b, c0, 1.5f, -2.0f);
    check_spmm<bf16>("hybrid", Op::transpose, a16, bt, ct, 1.5f, -2.0f);
  }
  testing::cuda_ok(cudaSetDevice(0));
}

// twell's pool may keep nearly all of the device's memory (memory.hpp) when a Hybrid's overflow
// rows reach cuBLAS on a host thread that has not used it: that thread's cuBLAS handle, which
// allocates cuBLAS's default workspace, is made with one retry after a pool trim. Whether that
// retry or the driver (which has served cudaMalloc from a full pool's unused memory, docs/api.md)
// gives the handle its memory, the product must work and be right. The same product runs once
// before the fill, so that the kernels' modules are loaded (a kernel's first launch may need
// memory, and launches are not retried: docs/api.md).
TEST_CASE("cuda spmm's Hybrid overflow rows run on a new host thread while twell's pool keeps the memory") {
  const std::uint64_t seed = testing::fresh_seed();
  CAPTURE(seed);
  const auto a = overflowing_hybrid(seed);
  const auto b = testing::random_dense<float>(130, 33, 1.0f, seed + 1);
  DenseMatrix<float> want = nan_dense<float>(70, 33);
  ref::spmm<float>(Op::none, a.view(), b.view(), want.view(), 1.0f, 0.0f);
  const auto a_dev = a.to(kDevice);
  const DenseMatrix<float> b_dev = b.to(kDevice);
  DenseMatrix<float> warm = nan_dense<float>(70, 33).to(kDevice);
  dev::spmm<float>(Op::none, a_dev.view(), b_dev.view(), warm.view(), 1.0f, 0.0f);
  DenseMatrix<float> c = nan_dense<float>(70, 33).to(kDevice);
  int device = 0;
  testing::cuda_ok(cudaGetDevice(&device));
  testing::cuda_ok(cudaDeviceSynchronize());

  const testing::FilledDevice filled;
  CAPTURE(filled.free_bytes());
  KernelReport report;
  std::string failure;  // doctest's captures belong to this thread: the worker reports in words
  std::thread fresh([&] {
    try {
      if (cudaSetDevice(device) != cudaSuccess) throw std::runtime_error("cudaSetDevice failed");
      KernelOptions options;
      options.report = &report;
      dev::spmm<float>(Op::none, a_dev.view(), b_dev.view(), c.view(), 1.0f, 0.0f, options);
      const cudaError_t status = cudaDeviceSynchronize();
      if (status != cudaSuccess) throw std::runtime_error(cudaGetErrorString(status));
    } catch (const std::exception& e) {
      failure = e.what();
    }
  });
  fresh.join();
  // Whether the handle needed memory, and so a trim (cuBLAS's needs are its own to change).
  MESSAGE("kept by the pool after the new thread's spmm: ", twell::detail::kept_device_bytes(), " bytes");
  CHECK_MESSAGE(failure.empty(), failure);
  CAPTURE(report.path);
  CHECK(report.path.find("+cublas_overflow") != std::string::npos);  // the product reached cuBLAS
  CHECK(rel(c.to(kHost), want) <= relative_bound<float>());
}

TEST_CASE("cuda spmm rejects host operands and bad shapes") {
  const auto a = ref::dense_to_csr<float>(testing::random_dense<float>(4, 5, 1.0f, testing::fresh_seed()).view());
  const auto a_dev = a.to(kDevice);
  DenseMatrix<float> b(5, 3, kDevice), c(4, 3, kDevice), bad(6, 3, kDevice);
  DenseMatrix<float> b_host(5, 3);
  try {
    dev::spmm<float>(Op::none, a_dev.view(), b_host.view(), c.view(), 1.0f, 0.0f);
    FAIL("no error for a host operand");
  } catch (const Error& e) {
    CHECK(e.code() == ErrorCode::space_mismatch);
  }
  try {
    dev::spmm<float>(Op::none, a_dev.view(), bad.view(), c.view(), 1.0f, 0.0f);
    FAIL("no error for a shape mismatch");
  } catch (const Error& e) {
    CHECK(e.code() == ErrorCode::shape_mismatch);
  }
  // b starting a byte into its buffer: refused before any launch (it would fault on the GPU).
  const DenseView<const float> shifted = testing::off_boundary<float>(b.view());
  CHECK(testing::code_of([&] { dev::spmm<float>(Op::none, a_dev.view(), shifted, c.view(), 1.0f, 0.0f); }) ==
        ErrorCode::misaligned);
  CHECK(testing::code_of([&] { twell::spmm<float>(Op::none, a_dev.view(), shifted, c.view()); }) ==
        ErrorCode::misaligned);

  // C over B: refused before any launch (the kernels read B while they write C).
  const auto square = ref::dense_to_csr<float>(testing::random_dense<float>(5, 5, 1.0f, testing::fresh_seed()).view());
  const auto square_dev = square.to(kDevice);
  DenseMatrix<float> bc(5, 3, kDevice);
  CHECK(testing::code_of([&] {
          dev::spmm<float>(Op::none, square_dev.view(), DenseView<const float>(bc.view()), bc.view(), 1.0f, 0.0f);
        }) == ErrorCode::invalid_argument);

  // Null arrays that the shape says exist are malformed here as in the reference, not a device
  // fault: a Hybrid's overflow map or block, an ELL's entries.
  const auto dense = testing::random_dense<float>(4, 5, 1.0f, testing::fresh_seed());
  const auto hybrid = ref::dense_to_hybrid<float>(dense.view(), TwellLayout{8, 4}, ConvertOptions{}).to(kDevice);
  REQUIRE(hybrid.overflow_rows() > 0);
  HybridView<const float> no_map = hybrid.view(), no_block = hybrid.view();
  no_map.overflow_to_row = nullptr;
  no_block.overflow.data = nullptr;
  const auto ell = ref::dense_to_ell<float>(dense.view(), ConvertOptions{}).to(kDevice);
  EllView<const float> no_entries = ell.view();
  REQUIRE(no_entries.width > 0);
  no_entries.col_idx = nullptr;
  CHECK(testing::code_of([&] { dev::spmm<float>(Op::none, no_map, b.view(), c.view(), 1, 0); }) == ErrorCode::malformed);
  CHECK(testing::code_of([&] { dev::spmm<float>(Op::none, no_block, b.view(), c.view(), 1, 0); }) ==
        ErrorCode::malformed);
  CHECK(testing::code_of([&] { dev::spmm<float>(Op::none, no_entries, b.view(), c.view(), 1, 0); }) ==
        ErrorCode::malformed);
}

namespace {

// Words of a TwELL result compared column by column (the low 16 bits: slot-0 counts and
// columns) and, for fp32, whole packed words; values are compared through the dense form.
template <class T>
bool same_columns(const TwellMatrix<T>& a, const TwellMatrix<T>& b) {
  const auto x = a.packed().host_span(), y = b.packed().host_span();
  if (x.size() != y.size()) return false;
  for (std::size_t i = 0; i < x.size(); ++i) {
    const std::uint32_t mask = ValueTraits<T>::packs_in_slot ? 0xffffu : 0xffffffffu;
    if ((x[i] & mask) != (y[i] & mask)) return false;
  }
  return true;
}

template <class T>
bool same_maps(const HybridMatrix<T>& a, const HybridMatrix<T>& b) {
  const auto x = a.row_to_overflow().host_span(), y = b.row_to_overflow().host_span();
  const auto p = a.overflow_to_row().host_span(), q = b.overflow_to_row().host_span();
  return std::equal(x.begin(), x.end(), y.begin(), y.end()) && std::equal(p.begin(), p.end(), q.begin(), q.end());
}

// The output of a sampled kernel on the device: a copy of `pattern` (so it has the structure
// that beta != 0 reads), or, for beta = 0, the same shape with every byte poisoned.
template <class T>
CsrMatrix<T> device_out(const CsrMatrix<T>& p, bool poisoned) {
  CsrMatrix<T> o = p.to(kDevice);
  if (poisoned) poison_device(o.values());
  return o;
}
template <class T>
EllMatrix<T> device_out(const EllMatrix<T>& p, bool poisoned) {
  EllMatrix<T> o = p.to(kDevice);
  if (poisoned) {
    // Only the pattern's slots are written; poison them through a host copy.
    EllMatrix<T> h = p.to(kHost);
    auto v = h.values().host_span();
    const auto count = h.row_count().host_span();
    for (std::int64_t i = 0; i < h.rows(); ++i)
      for (std::int64_t s = 0; s < count[static_cast<std::size_t>(i)]; ++s)
        v[static_cast<std::size_t>(i * h.width() + s)] = from_float<T>(std::numeric_limits<float>::quiet_NaN());
    o = h.to(kDevice);
  }
  return o;
}
template <class T>
TwellMatrix<T> device_out(const TwellMatrix<T>& p, bool poisoned) {
  if (!poisoned) return p.to(kDevice);
  TwellMatrix<T> o(p.rows(), p.cols(), p.layout(), kDevice);
  poison_device(o.packed());
  poison_device(o.value_plane());
  return o;
}
template <class T>
HybridMatrix<T> device_out(const HybridMatrix<T>& p, bool poisoned) {
  if (!poisoned) return p.to(kDevice);
  HybridMatrix<T> o(p.rows(), p.cols(), p.layout(), p.overflow_rows(), kDevice);
  poison_device(o.twell().packed());
  poison_device(o.twell().value_plane());
  poison_device(o.overflow().values());
  poison_device(o.row_to_overflow());
  poison_device(o.overflow_to_row());
  return o;
}

template <class T>
void check_structure(const CsrMatrix<T>&, const CsrMatrix<T>&) {}
template <class T>
void check_structure(const EllMatrix<T>&, const EllMatrix<T>&) {}
template <class T>
void check_structure(const TwellMatrix<T>& got, const TwellMatrix<T>& want) {
  CHECK(same_columns(got, want));
}
template <class T>
void check_structure(const HybridMatrix<T>& got, const HybridMatrix<T>& want) {
  CHECK(same_columns(got.twell(), want.twell()));
  CHECK(same_maps(got, want));
}

template <class T, class HostM>
void check_sddmm(const std::string& name, const DenseMatrix<T>& a, Op op_b, const DenseMatrix<T>& b,
                 const HostM& pattern, float alpha, float beta, bool alias) {
  CAPTURE(name);
  CAPTURE(alpha);
  CAPTURE(beta);
  CAPTURE(alias);
  HostM want = pattern.to(kHost);
  ref::sddmm<T>(a.view(), op_b, b.view(), pattern.view(), want.view(), alpha, beta);

  const auto a_dev = a.to(kDevice);
  const auto b_dev = b.to(kDevice);
  auto p_dev = pattern.to(kDevice);
  auto out = device_out(pattern, beta == 0.0f && !alias);
  auto& target = alias ? p_dev : out;
  KernelReport report;
  KernelOptions options;
  options.report = &report;
  dev::sddmm<T>(a_dev.view(), op_b, b_dev.view(), p_dev.view(), target.view(), alpha, beta, options);
  REQUIRE(cudaDeviceSynchronize() == cudaSuccess);
  CAPTURE(report.path);
  CHECK(cuda_path(report));
  const HostM got = target.to(kHost);
  check_structure(got, want);
  const double err = rel(to_dense(got), to_dense(want));
  CHECK(err <= relative_bound<T>());
  CHECK(worst_row_error<T>(to_dense(got), to_dense(want)) <= kRowBound * relative_bound<T>());
}

}  // namespace

TEST_CASE_TEMPLATE("cuda sddmm matches the reference on every pattern format", T, bf16, fp16, float) {
  const std::vector<Shape> shapes = {{1, 1, 1}, {5, 3, 7}, {37, 64, 45}, {64, 2048 / 8, 300}, {20, 130, 70}};
  testing::for_each_product_case(shapes, kDensities, [&](const Shape& s, double density, Op op_b, std::uint64_t seed) {
    const bool tr = op_b == Op::transpose;
    const testing::SparseDenseOptions so{.density = density,
                                         .full_row_share = density > 0.0 && density < 0.5 ? 0.1 : 0.0};
    const auto pattern_dense = testing::random_sparse_dense<T>(s.m, s.n, so, seed);
    const auto a = testing::random_dense<T>(s.m, s.k, 1.0f, seed + 1);
    const auto b =
        tr ? testing::random_dense<T>(s.n, s.k, 1.0f, seed + 2) : testing::random_dense<T>(s.k, s.n, 1.0f, seed + 2);
    const Formats<T> f = host_formats<T>(pattern_dense.view(), kNarrow);
    for (const auto& [alpha, beta] : {std::pair{1.0f, 0.0f}, std::pair{0.75f, -1.5f}}) {
      check_sddmm<T>("csr", a, op_b, b, f.csr, alpha, beta, false);
      check_sddmm<T>("ell", a, op_b, b, f.ell, alpha, beta, false);
      check_sddmm<T>("twell", a, op_b, b, f.twell, alpha, beta, false);
      check_sddmm<T>("hybrid", a, op_b, b, f.hybrid, alpha, beta, false);
    }
    check_sddmm<T>("twell", a, op_b, b, f.twell, 1.0f, 0.5f, true);
    check_sddmm<T>("hybrid", a, op_b, b, f.hybrid, 2.0f, 0.0f, true);
  });
}

namespace {

// The cuda sddmm of `pattern` into a poisoned output (beta = 0), in dense form.
template <class T, class HostM>
DenseMatrix<T> device_sddmm_dense(const DenseMatrix<T>& a, Op op_b, const DenseMatrix<T>& b, const HostM& pattern) {
  const auto a_dev = a.to(kDevice);
  const auto b_dev = b.to(kDevice);
  const auto p_dev = pattern.to(kDevice);
  auto out = device_out(pattern, true);
  dev::sddmm<T>(a_dev.view(), op_b, b_dev.view(), p_dev.view(), out.view(), 1.0f, 0.0f);
  REQUIRE(cudaDeviceSynchronize() == cudaSuccess);
  return to_dense(out.to(kHost));
}

}  // namespace

// The backward's dh = dy Wd^T at a token-skewed hidden pattern of the paper's FFN shape: heavy rows
// are cut into many warps' chunks, and the heaviest overflow into the Hybrid's dense block. Layouts
// with S = 32 (a chunk is a tile), S = 16 (a chunk spans two tiles) and S = 128 (a tile spans four
// chunks). Each entry is one fixed-order dot product, so every format gives the same bits for it.
TEST_CASE_TEMPLATE("cuda sddmm at the paper's shape with token skew", T, bf16, float) {
  const std::int64_t m = 512, k = 2048, n = 5632;
  for (const double density : {0.005, 0.05}) {
    const std::uint64_t seed = testing::fresh_seed();
    CAPTURE(seed);
    CAPTURE(density);
    workload::ActivationOptions ao;
    ao.tokens = m;
    ao.units = n;
    ao.density = density;
    ao.distribution = workload::Distribution::token_skewed;
    ao.seed = seed;
    DenseMatrix<T> h = workload::activations<T>(ao);
    const workload::RowProfile profile = workload::profile<T>(h.view());
    CAPTURE(profile.mean);
    CAPTURE(profile.max);
    CHECK(static_cast<double>(profile.max) >= 3.0 * profile.mean);
    // At M = 512 and 0.5 % a draw may have no (row, tile) past 31 entries: one token fills its
    // first tile, so every layout below has an overflow row.
    for (std::int64_t j = 0; j < 256; ++j) h.view().at(0, j) = from_float<T>(1.0f + 0.01f * static_cast<float>(j));
    const auto dy = testing::random_dense<T>(m, k, 1.0f, seed + 1);
    const auto wd = testing::random_dense<T>(n, k, 1.0f, seed + 2);
    const auto wd_t = testing::random_dense<T>(k, n, 1.0f, seed + 3);

    const HybridMatrix<T> hybrid = ref::dense_to_hybrid<T>(h.view(), kPaper);
    CHECK(hybrid.overflow_rows() > 0);
    check_sddmm<T>("hybrid", dy, Op::transpose, wd, hybrid, 1.0f, 0.0f, false);
    check_sddmm<T>("hybrid", dy, Op::transpose, wd, hybrid, 0.5f, -1.0f, false);
    check_sddmm<T>("hybrid", dy, Op::none, wd_t, hybrid, 1.0f, 0.0f, false);
    for (const TwellLayout layout : {TwellLayout{256, 16}, TwellLayout{256, 2}}) {
      CAPTURE(layout.slots());
      const HybridMatrix<T> other = ref::dense_to_hybrid<T>(h.view(), layout);
      CHECK(other.overflow_rows() > 0);
      check_sddmm<T>("hybrid", dy, Op::transpose, wd, other, 1.0f, 0.0f, false);
    }
    const CsrMatrix<T> csr = ref::dense_to_csr<T>(h.view());
    const EllMatrix<T> ell = ref::dense_to_ell<T>(h.view());
    check_sddmm<T>("csr", dy, Op::transpose, wd, csr, 1.0f, 0.0f, false);
    check_sddmm<T>("csr", dy, Op::transpose, wd, csr, -2.0f, 0.25f, false);
    check_sddmm<T>("ell", dy, Op::transpose, wd, ell, 1.0f, 0.0f, false);

    const DenseMatrix<T> from_csr = device_sddmm_dense<T>(dy, Op::transpose, wd, csr);
    CHECK(testing::bitwise_equal<T>(device_sddmm_dense<T>(dy, Op::transpose, wd, hybrid).view(), from_csr.view()));
    CHECK(testing::bitwise_equal<T>(device_sddmm_dense<T>(dy, Op::transpose, wd, ell).view(), from_csr.view()));
    CHECK(testing::bitwise_equal<T>(
        device_sddmm_dense<T>(dy, Op::transpose, wd, ref::dense_to_hybrid<T>(h.view(), TwellLayout{256, 2})).view(),
        from_csr.view()));
  }
}

namespace {

// A host matrix with the pattern of `d` and fresh nonzero values.
template <class T>
DenseMatrix<T> same_pattern(DenseView<const T> d, std::uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<float> value(0.25f, 2.0f);
  DenseMatrix<T> out(d.rows, d.cols);
  for (std::int64_t i = 0; i < d.rows; ++i)
    for (std::int64_t j = 0; j < d.cols; ++j)
      out.view().at(i, j) = is_stored(d.at(i, j)) ? from_float<T>(rng() % 2 ? value(rng) : -value(rng)) : T{};
  return out;
}

template <class T, class HostM>
void check_elementwise(const std::string& name, const HostM& x, const HostM& y) {
  CAPTURE(name);
  const auto x_dev = x.to(kDevice);
  const auto y_dev = y.to(kDevice);
  KernelReport report;
  KernelOptions options;
  options.report = &report;
  {
    HostM want = x.to(kHost);
    ref::multiply_on_pattern<T>(x.view(), y.view(), want.view());
    auto out = device_out(x, true);
    dev::multiply_on_pattern<T>(x_dev.view(), y_dev.view(), out.view(), options);
    REQUIRE(cudaDeviceSynchronize() == cudaSuccess);
    CHECK(cuda_path(report));
    const HostM got = out.to(kHost);
    check_structure(got, want);
    CHECK(testing::bitwise_equal<T>(to_dense(got).view(), to_dense(want).view()));
  }
  {
    const float s = 0.375f;
    HostM want = x.to(kHost);
    ref::add_scaled_sign<T>(x.view(), s, want.view());
    auto out = device_out(x, true);
    dev::add_scaled_sign<T>(x_dev.view(), s, out.view(), options);
    REQUIRE(cudaDeviceSynchronize() == cudaSuccess);
    const HostM got = out.to(kHost);
    check_structure(got, want);
    CHECK(rel(to_dense(got), to_dense(want)) <= 1e-6);
    // In place: out aliases x.
    auto inplace = x.to(kDevice);
    dev::add_scaled_sign<T>(inplace.view(), s, inplace.view(), options);
    REQUIRE(cudaDeviceSynchronize() == cudaSuccess);
    CHECK(rel(to_dense(inplace.to(kHost)), to_dense(want)) <= 1e-6);
  }
  for (const Activation act : {Activation::relu, Activation::silu, Activation::gelu}) {  // x * act'(y)
    CAPTURE(static_cast<int>(act));
    HostM want = x.to(kHost);
    ref::multiply_by_activation_derivative<T>(x.view(), y.view(), act, want.view());
    auto out = device_out(x, true);
    report.path.clear();
    dev::multiply_by_activation_derivative<T>(x_dev.view(), y_dev.view(), act, out.view(), options);
    REQUIRE(cudaDeviceSynchronize() == cudaSuccess);
    CHECK(report.path == std::string("cuda/multiply_by_activation_derivative/") + name);
    const HostM got = out.to(kHost);
    check_structure(got, want);
    // expf / erff against std::exp / std::erf: last-bit differences of act' (absolute, so large
    // relative ones near its zeros) and, for 16-bit values, a rounding the other way.
    CHECK(error_over_x(to_dense(got), to_dense(want), to_dense(x)) <= (sizeof(T) == 2 ? 1e-2 : 1e-6));
  }
  {  // x + s sign(y): fresh output, then in place
    const float s = -0.625f;
    HostM want = x.to(kHost);
    ref::add_scaled_sign<T>(x.view(), s, y.view(), want.view());
    auto out = device_out(x, true);
    report.path.clear();  // each call's own path, not one left by the call before
    dev::add_scaled_sign<T>(x_dev.view(), s, y_dev.view(), out.view(), options);
    REQUIRE(cudaDeviceSynchronize() == cudaSuccess);
    CHECK(cuda_path(report));
    const HostM got = out.to(kHost);
    check_structure(got, want);
    CHECK(rel(to_dense(got), to_dense(want)) <= 1e-6);
    auto inplace = x.to(kDevice);
    dev::add_scaled_sign<T>(inplace.view(), s, y_dev.view(), inplace.view(), options);
    REQUIRE(cudaDeviceSynchronize() == cudaSuccess);
    CHECK(rel(to_dense(inplace.to(kHost)), to_dense(want)) <= 1e-6);
  }
  {
    KernelOptions plain;
    const double l1_want = ref::l1_norm<T>(x.view());
    report.path.clear();
    const double l1_got = dev::l1_norm<T>(x_dev.view(), options);
    CHECK(cuda_path(report));
    CHECK(std::fabs(l1_got - l1_want) <= 1e-9 * std::max(1.0, std::fabs(l1_want)));
    CHECK(dev::l0_norm<T>(x_dev.view(), plain) == ref::l0_norm<T>(x.view()));
    // Deterministic: the same bits twice.
    CHECK(dev::l1_norm<T>(x_dev.view(), plain) == l1_got);
  }
}

}  // namespace

TEST_CASE_TEMPLATE("cuda elementwise kernels and reductions match the reference", T, bf16, fp16, float) {
  const std::vector<std::pair<std::int64_t, std::int64_t>> shapes = {{1, 1}, {7, 13}, {64, 300}, {513, 700}};
  for (const auto& [m, n] : shapes) {
    for (const double density : kDensities) {
      const std::uint64_t seed = testing::fresh_seed();
      CAPTURE(seed);
      CAPTURE(m);
      CAPTURE(n);
      CAPTURE(density);
      const testing::SparseDenseOptions so{.density = density,
                                           .full_row_share = density > 0.0 && density < 0.5 ? 0.05 : 0.0};
      const auto x = testing::random_sparse_dense<T>(m, n, so, seed);
      const auto y = same_pattern<T>(x.view(), seed + 1);
      const Formats<T> fx = host_formats<T>(x.view(), kNarrow);
      Formats<T> fy = host_formats<T>(y.view(), kNarrow);
      // Same structure: y's formats share x's index arrays by construction, and the same layouts.
      check_elementwise<T>("csr", fx.csr, fy.csr);
      check_elementwise<T>("ell", fx.ell, fy.ell);
      check_elementwise<T>("twell", fx.twell, fy.twell);
      check_elementwise<T>("hybrid", fx.hybrid, fy.hybrid);
      // S = 12: the one-word kernels and reduction source on a Hybrid with dense rows (the
      // layouts above take the four-word ones for 16-bit values).
      check_elementwise<T>("hybrid", ref::dense_to_hybrid<T>(x.view(), TwellLayout{24, 2}),
                           ref::dense_to_hybrid<T>(y.view(), TwellLayout{24, 2}));
    }
  }
}

TEST_CASE_TEMPLATE("cuda add_scaled_sign(x, s, y): an exactly-zero x in a Hybrid's dense rows keeps y's sign", T,
                   bf16, float) {
  // x sampled on y's pattern with the even rows of A zero, as dh for tokens outside the loss
  // (zero_row_sample): most rows are dense overflow rows, which cannot store x's zeros.
  const std::uint64_t seed = testing::fresh_seed();
  CAPTURE(seed);
  const std::int64_t m = 300, n = 520;
  const auto s = testing::zero_row_sample<T>(m, n, 8, seed);
  REQUIRE(s.y.overflow_rows() > 0);
  HybridMatrix<T> want(m, n, s.y.layout(), s.y.overflow_rows());
  ref::add_scaled_sign<T>(s.x.view(), 0.5f, s.y.view(), want.view());
  const auto x_dev = s.x.to(kDevice), y_dev = s.y.to(kDevice);
  auto out = device_out(s.x, true);
  dev::add_scaled_sign<T>(x_dev.view(), 0.5f, y_dev.view(), out.view());
  REQUIRE(cudaDeviceSynchronize() == cudaSuccess);
  const auto got = out.to(kHost);
  check_structure(got, want);
  CHECK(testing::bitwise_equal<T>(to_dense(got).view(), to_dense(want).view()));
}

TEST_CASE_TEMPLATE("cuda reductions count NaN, skip -0.0 and Hybrid shadows", T, bf16, float) {
  // Two inputs: one with NaN and infinities (L1 is not finite: it must come out NaN or Inf as
  // the reference's does), and a finite one with -0.0 in place of every 11th element, so that
  // the full rows (the Hybrid's dense rows) hold -0.0 and L1 is compared as a number.
  for (const bool specials : {true, false}) {
    const std::uint64_t seed = testing::fresh_seed();
    CAPTURE(specials);
    CAPTURE(seed);
    const testing::SparseDenseOptions so{.density = 0.1, .specials = specials, .full_row_share = 0.1};
    auto x = testing::random_sparse_dense<T>(200, 90, so, seed);
    if (!specials)
      for (std::int64_t e = 0; e < x.rows() * x.cols(); e += 11)
        x.view().at(e / x.cols(), e % x.cols()) = from_float<T>(-0.0f);
    const Formats<T> f = host_formats<T>(x.view(), kNarrow);
    REQUIRE(f.hybrid.overflow_rows() > 0);
    const auto h = f.hybrid.to(kDevice);
    CHECK(dev::l0_norm<T>(h.view()) == ref::l0_norm<T>(f.hybrid.view()));
    const double got = dev::l1_norm<T>(h.view()), want = ref::l1_norm<T>(f.hybrid.view());
    REQUIRE(std::isfinite(want) != specials);
    if (specials) {
      CHECK((std::isnan(got) == std::isnan(want) && std::isinf(got) == std::isinf(want)));
    } else {
      CHECK(std::fabs(got - want) <= 1e-9 * std::max(1.0, want));
    }
  }
}

namespace {

template <class T, class HostM>
void check_transpose_bitwise(const std::string& name, const HostM& a) {
  CAPTURE(name);
  const auto want = ref::transpose<T>(a.view());
  const auto a_dev = a.to(kDevice);
  KernelReport report;
  KernelOptions options;
  options.report = &report;
  const auto got = dev::transpose<T>(a_dev.view(), options);
  REQUIRE(cudaDeviceSynchronize() == cudaSuccess);
  CHECK(cuda_path(report));
  // Every array: the entries' order within a row, ELL's width and padding, stored zeros.
  testing::expect_same(got.to(kHost), want);
}

template <class T, class HostM>
void check_transpose_hybrid(const std::string& name, const HostM& a, TwellLayout layout) {
  CAPTURE(name);
  const auto want = ref::transpose<T>(a.view(), layout);
  const auto a_dev = a.to(kDevice);
  const auto got = dev::transpose<T>(a_dev.view(), layout);
  REQUIRE(cudaDeviceSynchronize() == cudaSuccess);
  // Word for word: slots, maps, shadow slots and the dense block, not only the values they hold.
  testing::expect_same(got.to(kHost), want);
}

}  // namespace

TEST_CASE_TEMPLATE("cuda transpose matches the reference bit for bit", T, bf16, fp16, float) {
  const std::vector<std::pair<std::int64_t, std::int64_t>> shapes = {{1, 1}, {3, 8}, {45, 37}, {300, 70}, {64, 1030}};
  for (const auto& [m, n] : shapes) {
    for (const double density : kDensities) {
      const std::uint64_t seed = testing::fresh_seed();
      CAPTURE(seed);
      CAPTURE(m);
      CAPTURE(n);
      CAPTURE(density);
      const testing::SparseDenseOptions so{.density = density, .specials = true};
      const auto x = testing::random_sparse_dense<T>(m, n, so, seed);
      const Formats<T> f = host_formats<T>(x.view(), kNarrow);
      check_transpose_bitwise<T>("csr", f.csr);
      check_transpose_bitwise<T>("ell", f.ell);
      check_transpose_hybrid<T>("twell", f.twell, kNarrow);
      check_transpose_hybrid<T>("hybrid", f.hybrid, kPaper);
    }
  }
}

// Stored zeros (an sddmm result on a CSR or ELL pattern may hold some) are entries: both backends
// keep them in A^T, with the ELL width they give. Row 0 holds a stored zero and a one, row 1 two
// stored zeros (one -0.0) and nothing else, row 2 no entries.
TEST_CASE_TEMPLATE("cuda transpose keeps stored zeros of CSR and ELL", T, bf16, float) {
  EllMatrix<T> ell(3, 4, 2);
  const std::int32_t counts[] = {2, 2, 0};
  const std::int32_t cols[] = {0, 3, 1, 3, 0, 0};
  const float values[] = {0.0f, 1.0f, 0.0f, -0.0f, 0.0f, 0.0f};
  for (int i = 0; i < 3; ++i) ell.row_count().host_span()[i] = counts[i];
  for (int e = 0; e < 6; ++e) {
    ell.col_idx().host_span()[e] = cols[e];
    ell.values().host_span()[e] = from_float<T>(values[e]);
  }
  const auto want = ref::transpose<T>(ell.view());
  REQUIRE(want.width() == 2);  // column 3 of A holds a one and a -0.0
  check_transpose_bitwise<T>("ell", ell);
  CsrMatrix<T> csr(3, 4, 4);  // the same entries (the converters would drop the zeros)
  const std::int64_t row_ptr[] = {0, 2, 4, 4};
  const std::int32_t csr_cols[] = {0, 3, 1, 3};
  for (int i = 0; i < 4; ++i) csr.row_ptr().host_span()[i] = row_ptr[i];
  for (int e = 0; e < 4; ++e) {
    csr.col_idx().host_span()[e] = csr_cols[e];
    csr.values().host_span()[e] = from_float<T>(values[e]);
  }
  check_transpose_bitwise<T>("csr", csr);
  // spmm with op = transpose keeps them too: 0 x Inf is NaN in C, as the reference has it.
  DenseMatrix<T> b(3, 2);
  for (T& v : b.values().host_span()) v = from_float<T>(1.0f);
  b.view().at(1, 0) = from_float<T>(std::numeric_limits<float>::infinity());
  for (const auto& [name, got] :
       {std::pair{"ell", spmm_t_on_device<T>(ell, b)}, std::pair{"csr", spmm_t_on_device<T>(csr, b)}}) {
    CAPTURE(name);
    DenseMatrix<T> want_c(4, 2);
    ref::spmm<T>(Op::transpose, ell.view(), b.view(), want_c.view(), 1.0f, 0.0f);
    DenseMatrix<T> mine = got.to(kHost);
    CHECK(std::isnan(to_float(want_c.view().at(1, 0))));  // column 1's stored zero meets B's Inf
    CHECK(testing::split_non_finite<T>(mine, want_c).first == 0);
    CHECK(testing::bitwise_equal<T>(mine.view(), want_c.view()));
  }
}

// The direct TwELL transpose launches a CTA row per column tile of A, at most 65535: past that,
// spmm with op = transpose and transpose() take the CSR route instead of refusing. Layout (16, 8)
// maps to A^T in tiles of 256 with 32 slots, the direct route's choice; 65537 tiles of A.
TEST_CASE("cuda transposes of a TwELL with more than 65535 column tiles take the CSR route") {
  const std::uint64_t seed = testing::fresh_seed();
  CAPTURE(seed);
  constexpr std::int64_t kRows = 3, kCols = 16 * 65537, kN = 8;
  const testing::SparseDenseOptions so{.density = 0.002};
  const auto dense = testing::random_sparse_dense<bf16>(kRows, kCols, so, seed);
  const auto hybrid = ref::dense_to_hybrid<bf16>(dense.view(), TwellLayout{16, 8});
  const auto b = testing::random_dense<bf16>(kRows, kN, 1.0f, seed + 1);
  const auto c0 = testing::random_dense<bf16>(kCols, kN, 1.0f, seed + 2);
  check_spmm<bf16>("hybrid", Op::transpose, hybrid, b, c0, 1.5f, -2.0f);
  check_transpose_hybrid<bf16>("hybrid", hybrid, kPaper);
}

TEST_CASE_TEMPLATE("cuda dense transpose matches the reference bit for bit", T, bf16, fp16, float) {
  // {192, 256}: 16-bit values take only the kernel's whole-tile path (64 x 64 tiles), the others
  // its edge path too (the views below: the whole-tile path with leading dimensions past the
  // extents, then, one element in, the edge path alone).
  const std::vector<std::pair<std::int64_t, std::int64_t>> shapes = {{0, 4},    {1, 1},     {31, 33},
                                                                     {300, 70}, {64, 1030}, {192, 256}};
  for (const auto& [m, n] : shapes) {
    const std::uint64_t seed = testing::fresh_seed();
    CAPTURE(seed);
    CAPTURE(m);
    CAPTURE(n);
    const testing::SparseDenseOptions so{.density = 0.5, .specials = true};
    const DenseMatrix<T> a = testing::random_sparse_dense<T>(m, n, so, seed);
    DenseMatrix<T> want(n, m);
    reference::transpose<T>(a.view(), want.view());
    const DenseMatrix<T> a_dev = copy_to(a.view(), MemorySpace::device);
    DenseMatrix<T> out_dev(n, m, MemorySpace::device);
    testing::poison_device(out_dev.values());
    KernelReport report;
    twell::transpose<T>(a_dev.view(), out_dev.view(), KernelOptions{{}, &report});
    CHECK(report.path == "cuda/transpose/dense");
    CHECK(testing::bitwise_equal<T>(copy_to(std::as_const(out_dev).view(), MemorySpace::host).view(),
                                    std::as_const(want).view()));
  }
  // Views inside wider matrices: odd row and column counts with even leading dimensions (16-bit
  // values move in pairs up to the last row and column), and the same views starting one element
  // in (odd addresses for 16-bit values, so they move one by one). What lies outside the output
  // view must keep its poison.
  for (const std::int64_t offset : {0, 1}) {
    const std::uint64_t seed = testing::fresh_seed();
    CAPTURE(seed);
    CAPTURE(offset);
    const std::int64_t m = 131, n = 67, ld_a = 70, ld_out = 134;
    const DenseMatrix<T> a_full = testing::random_dense<T>(m + 1, ld_a, 1.0f, seed);
    const DenseView<const T> a_host{a_full.view().data + offset, m, n, ld_a, MemorySpace::host};
    DenseMatrix<T> want(n, m);
    reference::transpose<T>(a_host, want.view());
    const DenseMatrix<T> a_dev = copy_to(std::as_const(a_full).view(), MemorySpace::device);
    DenseMatrix<T> out_dev(n + 1, ld_out, MemorySpace::device);
    testing::poison_device(out_dev.values());
    const DenseView<const T> a_view{a_dev.view().data + offset, m, n, ld_a, MemorySpace::device};
    const DenseView<T> out_view{out_dev.view().data + offset, n, m, ld_out, MemorySpace::device};
    twell::transpose<T>(a_view, out_view);
    const DenseMatrix<T> got_full = copy_to(std::as_const(out_dev).view(), MemorySpace::host);
    const DenseView<const T> got{got_full.view().data + offset, n, m, ld_out, MemorySpace::host};
    CHECK(testing::bitwise_equal<T>(got, std::as_const(want).view()));
    std::int64_t touched_outside = 0;
    const auto* bytes = reinterpret_cast<const unsigned char*>(got_full.view().data);
    for (std::int64_t e = 0; e < (n + 1) * ld_out; ++e) {
      const std::int64_t i = (e - offset) / ld_out, j = (e - offset) % ld_out;
      const bool inside = e >= offset && i < n && j < m;
      for (std::size_t b = 0; b < sizeof(T) && !inside; ++b)
        touched_outside += bytes[static_cast<std::size_t>(e) * sizeof(T) + b] != 0xff ? 1 : 0;
    }
    CHECK(touched_outside == 0);
  }
  const DenseMatrix<T> a_dev(4, 6, MemorySpace::device);
  DenseMatrix<T> wrong(4, 6, MemorySpace::device);
  CHECK(testing::code_of([&] { cuda::transpose<T>(a_dev.view(), wrong.view()); }) == ErrorCode::shape_mismatch);
  DenseMatrix<T> host_out(6, 4);
  CHECK(testing::code_of([&] { twell::transpose<T>(a_dev.view(), host_out.view()); }) == ErrorCode::space_mismatch);
}

// The dense transpose kernels take 64 rows of 16-bit values (32 of fp32) per CTA and at most 65535
// CTAs down the rows. A taller matrix is refused with ErrorCode::unsupported and a message naming
// the limit, before anything is written (the outputs keep their poison), where transpose() takes
// it as A and where sddmm with op_b = none takes it as B (K x N, transposed first); at exactly the
// limit both run and equal the reference bit for bit. Two columns: 16 MB per bf16 operand.
// sddmm's operands hold +-1, so that its K-term dot products are exact integers in fp32 whatever
// the order of the sum.
// Each kernel lets the next one in its stream launch early and begins by waiting for the grids
// before it (docs/decisions.md, "Kernels launch early"); captured into a graph, that becomes a
// programmatic edge. The second transpose reads what the first writes, so a launch that did not
// wait would read poison.
TEST_CASE("kernels launched early keep their order inside a captured CUDA graph") {
  const std::uint64_t seed = testing::fresh_seed();
  CAPTURE(seed);
  const std::int64_t m = 1000, n = 3000;
  const DenseMatrix<bf16> a = testing::random_dense<bf16>(m, n, 1.0f, seed);
  const DenseMatrix<bf16> a_dev = copy_to(a.view(), MemorySpace::device);
  DenseMatrix<bf16> t_dev(n, m, MemorySpace::device), back_dev(m, n, MemorySpace::device);
  cudaStream_t stream = nullptr;
  testing::cuda_ok(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  const KernelOptions options{Stream{stream}};
  cudaGraph_t graph = nullptr;
  testing::cuda_ok(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal));
  twell::transpose<bf16>(a_dev.view(), t_dev.view(), options);
  twell::transpose<bf16>(std::as_const(t_dev).view(), back_dev.view(), options);
  testing::cuda_ok(cudaStreamEndCapture(stream, &graph));
  std::size_t edges = 0;
  testing::cuda_ok(cudaGraphGetEdges(graph, nullptr, nullptr, nullptr, &edges));
  REQUIRE(edges == 1);
  cudaGraphNode_t from = nullptr, to = nullptr;
  cudaGraphEdgeData edge{};
  testing::cuda_ok(cudaGraphGetEdges(graph, &from, &to, &edge, &edges));
  const std::string kind = edge.type == cudaGraphDependencyTypeProgrammatic ? "programmatic" : "plain";
  MESSAGE("the captured edge is " << kind);
  cudaGraphExec_t exec = nullptr;
  testing::cuda_ok(cudaGraphInstantiate(&exec, graph, 0));
  for (int replay = 0; replay < 3; ++replay) {
    CAPTURE(replay);
    testing::poison_device(t_dev.values(), stream);  // the legacy stream's cudaMemset would race the graph
    testing::poison_device(back_dev.values(), stream);
    testing::cuda_ok(cudaGraphLaunch(exec, stream));
    testing::cuda_ok(cudaStreamSynchronize(stream));
    CHECK(testing::bitwise_equal<bf16>(copy_to(std::as_const(back_dev).view(), MemorySpace::host).view(), a.view()));
  }
  testing::cuda_ok(cudaGraphExecDestroy(exec));
  testing::cuda_ok(cudaGraphDestroy(graph));
  testing::cuda_ok(cudaStreamDestroy(stream));
}

TEST_CASE_TEMPLATE("cuda dense transpose refuses more rows than 65535 CTAs cover, naming the limit, and is exact at it",
                   T, bf16, float) {
  constexpr std::int64_t kLimit = 65535 * (sizeof(T) == 2 ? 64 : 32), kCols = 2;
  const std::uint64_t seed = testing::fresh_seed();
  CAPTURE(seed);
  const auto signs = [](DenseMatrix<T> d) {
    auto v = d.view();
    for (std::int64_t i = 0; i < v.rows; ++i)
      for (std::int64_t j = 0; j < v.cols; ++j) v.at(i, j) = from_float<T>(to_float(v.at(i, j)) < 0.0f ? -1.0f : 1.0f);
    return d;
  };
  const CsrMatrix<T> pattern = ref::dense_to_csr<T>(signs(testing::random_dense<T>(1, kCols, 1.0f, seed)).view());
  REQUIRE(pattern.nnz() == kCols);
  for (const std::int64_t rows : {kLimit + 1, kLimit}) {
    CAPTURE(rows);
    const DenseMatrix<T> a = testing::random_dense<T>(rows, kCols, 1.0f, seed + 1);
    const DenseMatrix<T> x = signs(testing::random_dense<T>(1, rows, 1.0f, seed + 2));
    const DenseMatrix<T> y = signs(testing::random_dense<T>(rows, kCols, 1.0f, seed + 3));
    const DenseMatrix<T> a_dev = copy_to(a.view(), MemorySpace::device);
    DenseMatrix<T> t_dev(kCols, rows, MemorySpace::device);
    poison_device(t_dev.values());
    if (rows > kLimit) {
      const auto expect_refused = [&](const auto& call) {
        CHECK(testing::code_of(call) == ErrorCode::unsupported);
        CHECK(testing::message_of(call).find(std::to_string(kLimit)) != std::string::npos);
      };
      expect_refused([&] { twell::transpose<T>(a_dev.view(), t_dev.view()); });
      const auto x_dev = x.to(kDevice);
      const auto y_dev = y.to(kDevice);
      const auto p_dev = pattern.to(kDevice);
      auto out = device_out(pattern, true);
      expect_refused(
          [&] { dev::sddmm<T>(x_dev.view(), Op::none, y_dev.view(), p_dev.view(), out.view(), 1.0f, 0.0f); });
      CHECK(testing::still_poisoned(t_dev.values()));
      CHECK(testing::still_poisoned(out.values()));
      continue;
    }
    KernelReport report;
    twell::transpose<T>(a_dev.view(), t_dev.view(), KernelOptions{{}, &report});
    CHECK(report.path == "cuda/transpose/dense");
    DenseMatrix<T> want(kCols, rows);
    reference::transpose<T>(a.view(), want.view());
    CHECK(testing::bitwise_equal<T>(copy_to(std::as_const(t_dev).view(), MemorySpace::host).view(),
                                    std::as_const(want).view()));
    CsrMatrix<T> want_sddmm = pattern.to(kHost);
    ref::sddmm<T>(x.view(), Op::none, y.view(), pattern.view(), want_sddmm.view(), 1.0f, 0.0f);
    CHECK(
        testing::bitwise_equal<T>(device_sddmm_dense<T>(x, Op::none, y, pattern).view(), to_dense(want_sddmm).view()));
  }
}

TEST_CASE_TEMPLATE("cuda Hybrid results stay valid when their pattern holds exact zeros in overflow rows", T, bf16,
                   float) {
  // sddmm and multiply_on_pattern on the pattern of x (zero_row_sample: exact zeros in its
  // structure) compute those places' slots (a nonzero sample, 0 * Inf = NaN) but not the dense
  // elements, and the shadow must still equal the dense row. The reference is checked the same way
  // in tests/cpu/test_kernels.cpp.
  const std::uint64_t seed = testing::fresh_seed();
  CAPTURE(seed);
  const std::int64_t m = 300, n = 520, k = 8;
  const auto s = testing::zero_row_sample<T>(m, n, k, seed);
  REQUIRE(s.y.overflow_rows() > 0);
  const ValidateOptions zeros_allowed{.allow_explicit_zeros = true};
  const auto x_dev = s.x.to(kDevice);
  const auto b_dev = s.b.to(kDevice);

  HybridMatrix<T> resampled_want(m, n, s.y.layout(), s.y.overflow_rows());
  ref::sddmm<T>(s.resample_a.view(), Op::none, s.b.view(), s.x.view(), resampled_want.view(), 1.0f, 0.0f);
  auto resampled = device_out(s.x, true);
  dev::sddmm<T>(s.resample_a.to(kDevice).view(), Op::none, b_dev.view(), x_dev.view(), resampled.view(), 1.0f, 0.0f);
  REQUIRE(cudaDeviceSynchronize() == cudaSuccess);
  const auto resampled_got = resampled.to(kHost);
  CHECK(find_violation(resampled_got.view(), zeros_allowed) == "");
  check_structure(resampled_got, resampled_want);
  CHECK(rel(to_dense(resampled_got), to_dense(resampled_want)) <= relative_bound<T>());

  HybridMatrix<T> product_want(m, n, s.y.layout(), s.y.overflow_rows());
  ref::multiply_on_pattern<T>(s.x.view(), s.infinite.view(), product_want.view());
  auto product = device_out(s.x, true);
  dev::multiply_on_pattern<T>(x_dev.view(), s.infinite.to(kDevice).view(), product.view());
  REQUIRE(cudaDeviceSynchronize() == cudaSuccess);
  const auto product_got = product.to(kHost);
  CHECK(find_violation(product_got.view(), zeros_allowed) == "");
  check_structure(product_got, product_want);
  // One rounding of x * y on both sides: the same bits, except that NaN's bits differ by device.
  const auto got_d = to_dense(product_got), want_d = to_dense(product_want);
  std::int64_t differing = 0;
  for (std::int64_t i = 0; i < m; ++i)
    for (std::int64_t j = 0; j < n; ++j) {
      const T g = got_d.view().at(i, j), w = want_d.view().at(i, j);
      const bool both_nan = std::isnan(to_float(g)) && std::isnan(to_float(w));
      if (!both_nan && std::memcmp(&g, &w, sizeof(T)) != 0) ++differing;
    }
  CHECK(differing == 0);
}
