// twell::cuda::gemm_to_sparse against twell::reference::gemm_to_sparse on fresh random inputs:
// fused (tile 128/256) and generic paths, ragged shapes, densities 0.3 % to ~50 %, token-skewed
// overflow-heavy rows, every activation with and without threshold, all overflow policies.
// Entries may differ in being stored only where the fp32 product sits within accumulation
// rounding of the threshold; those are counted and bounded. GemmToSparsePlan: bitwise equal to
// the free function, outputs poisoned before each run, the capacity-exceeded second pass,
// repeated runs. Every fused case runs with both mainloops (FusedMainloop::best, which is the
// wgmma + TMA kernel on an H100/H200, and ::portable, the mma.sync kernel); the two are also
// compared with each other, up to the paper's shape.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <optional>
#include <string>
#include <vector>

#include <Eigen/Dense>
#include <cuda_runtime.h>

#include <twell/converters/backends.hpp>
#include <twell/kernels/backends.hpp>
#include <twell/kernels/gemm_to_sparse_plan.hpp>
#include <twell/workload.hpp>

#include "checks.hpp"
#include "device.hpp"
#include "fixtures.hpp"
#include "random.hpp"
#include "sweep.hpp"

namespace {

using namespace twell;
using MatrixF = Eigen::Matrix<float, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;

// Workload patterns from 0.3 % to 20 % density; token-skewed ones overflow the TwELL slots.
constexpr testing::WorkloadSetting kWorkloadSettings[] = {
    {512, 2048, 5632, 0.005, workload::Distribution::token_skewed},
    {512, 2048, 5632, 0.003, workload::Distribution::uniform},
    {384, 512, 1408, 0.05, workload::Distribution::token_skewed},
    {256, 256, 1024, 0.2, workload::Distribution::neuron_skewed}};

template <class T>
MatrixF to_eigen(DenseView<const T> v) {
  MatrixF m(v.rows, v.cols);
  for (std::int64_t i = 0; i < v.rows; ++i)
    for (std::int64_t j = 0; j < v.cols; ++j) m(i, j) = to_float(v.at(i, j));
  return m;
}

float activate(Activation kind, float v) {
  switch (kind) {
    case Activation::relu: return v < 0.0f ? 0.0f : v;
    case Activation::silu: return v / (1.0f + std::exp(-v));
    case Activation::gelu: return 0.5f * v * (1.0f + std::erf(v * 0.70710678118654752f));
  }
  return v;
}

template <class T>
bool stored_at(ActivationSpec act, float p) {
  const float a = activate(act.kind, p);
  if (std::fabs(a) <= act.threshold) return false;
  return is_stored(from_float<T>(a));
}

// Decodes a host Hybrid into dense fp32, checking every structural invariant the GEMM epilogue
// promises on the way (CHECKs fail the test case).
template <class T>
MatrixF decode_checked(const HybridMatrix<T>& h) {
  const TwellLayout& l = h.layout();
  const std::int64_t m = h.rows(), n = h.cols(), tiles = l.tiles(n), s = l.slots();
  const auto packed = h.twell().packed().host_span();
  const auto r2o = h.row_to_overflow().host_span();
  const auto o2r = h.overflow_to_row().host_span();
  const auto& plane = h.twell().value_plane();
  MatrixF out = MatrixF::Zero(m, n);
  for (std::int64_t r = 0; r < h.overflow_rows(); ++r) {
    REQUIRE(o2r[r] >= 0);
    REQUIRE(o2r[r] < m);
    CHECK(r2o[static_cast<std::size_t>(o2r[r])] == r);
    if (r > 0) CHECK(o2r[r] > o2r[r - 1]);
  }
  std::int64_t bad_rows = 0;
  for (std::int64_t i = 0; i < m; ++i) {
    const std::int32_t o = r2o[static_cast<std::size_t>(i)];
    bool any_overflow = false;
    for (std::int64_t t = 0; t < tiles; ++t) {
      const std::int64_t base = l.slot_offset(i, t, n);
      const std::uint32_t count = packed[static_cast<std::size_t>(base)];
      any_overflow = any_overflow || l.overflows(count);
      const std::int64_t written = std::min<std::int64_t>(count, l.capacity());
      std::int64_t prev = -1;
      bool ok = true;
      for (std::int64_t q = 1; q < s; ++q) {
        const std::uint32_t word = packed[static_cast<std::size_t>(base + q)];
        if (q > written) {
          ok = ok && word == 0;
          continue;
        }
        const std::int64_t col = TwellLayout::slot_column(word);
        ok = ok && col > prev && col < l.tile_cols(t, n);
        prev = col;
        float v;
        if constexpr (ValueTraits<T>::packs_in_slot) {
          ok = ok && TwellLayout::slot_value_bits(word) != 0 && TwellLayout::slot_value_bits(word) != 0x8000;
          v = to_float(ValueTraits<T>::from_bits(TwellLayout::slot_value_bits(word)));
        } else {
          v = plane.host_span()[static_cast<std::size_t>(base + q)];
        }
        if (o < 0) out(i, l.tile_begin(t) + col) = v;
      }
      if (!ok) ++bad_rows;
    }
    CHECK((o >= 0) == any_overflow);
    if (o >= 0) {
      const auto dense = h.overflow().view();
      for (std::int64_t j = 0; j < n; ++j) out(i, j) = to_float(dense.at(o, j));
      // The shadow keeps the true count of each tile.
      for (std::int64_t t = 0; t < tiles; ++t) {
        std::int64_t c = 0;
        for (std::int64_t j = l.tile_begin(t); j < l.tile_begin(t) + l.tile_cols(t, n); ++j) c += out(i, j) != 0.0f;
        CHECK(packed[static_cast<std::size_t>(l.slot_offset(i, t, n))] == static_cast<std::uint32_t>(c));
      }
    }
  }
  CHECK(bad_rows == 0);
  return out;
}

struct Outcome {
  std::int64_t stored = 0;      // entries stored by the reference
  std::int64_t ambiguous = 0;   // stored-ness differs, product within rounding of the threshold
  std::int64_t wrong = 0;       // differs in stored-ness away from the threshold, or in value
};

template <class T>
Outcome compare(const MatrixF& ref, const MatrixF& gpu, const MatrixF& prod, const MatrixF& abs_prod,
                ActivationSpec act) {
  const float rel = std::is_same_v<T, bf16> ? 1.6e-2f : (std::is_same_v<T, fp16> ? 2e-3f : 1e-5f);
  Outcome o;
  for (std::int64_t i = 0; i < ref.rows(); ++i)
    for (std::int64_t j = 0; j < ref.cols(); ++j) {
      const float r = ref(i, j), g = gpu(i, j);
      o.stored += r != 0.0f;
      const float e = 1e-5f * abs_prod(i, j) + 1e-30f;  // fp32 accumulation-order spread
      if ((r != 0.0f) != (g != 0.0f)) {
        const bool here = stored_at<T>(act, prod(i, j));
        const bool amb = stored_at<T>(act, prod(i, j) - e) != here || stored_at<T>(act, prod(i, j) + e) != here;
        (amb ? o.ambiguous : o.wrong) += 1;
        continue;
      }
      if (!(std::fabs(g - r) <= rel * std::fabs(r) + 4.0f * e)) ++o.wrong;
    }
  return o;
}

template <class T>
struct Case {
  DenseMatrix<T> x, w;
};

template <class T>
Case<T> random_case(std::int64_t m, std::int64_t k, std::int64_t n, std::uint64_t seed) {
  return {testing::random_dense<T>(m, k, 1.0f, seed), testing::random_dense<T>(k, n, 1.0f, seed + 1)};
}

template <class T>
Case<T> workload_case(const testing::WorkloadSetting& s, std::uint64_t seed) {
  auto in = testing::workload_inputs<T>(s, seed);
  return {std::move(in.x), std::move(in.wg)};
}

// Counts 32-bit words (or values) that differ between two buffers of the same size.
template <class U>
std::int64_t differing(const Buffer<U>& a, const Buffer<U>& b) {
  if (a.size() != b.size()) return static_cast<std::int64_t>(std::max(a.size(), b.size()));
  std::int64_t n = 0;
  for (std::size_t i = 0; i < a.size(); ++i) n += std::memcmp(a.data() + i, b.data() + i, sizeof(U)) != 0;
  return n;
}

// The wgmma and mma.sync mainloops feed one epilogue. Both accumulate each k16 step on the tensor
// cores in K order, and on the H200 (2026-11-22) their outputs were identical to the bit over
// this whole suite; so any difference fails, and the tolerant comparison with the product says
// how large it is.
template <class T>
void check_mainloops_agree(const HybridMatrix<T>& a, const HybridMatrix<T>& b, const MatrixF& prod,
                           const MatrixF& abs_prod, ActivationSpec act) {
  REQUIRE(a.rows() == b.rows());
  REQUIRE(a.cols() == b.cols());
  const Outcome o = compare<T>(decode_checked(a), decode_checked(b), prod, abs_prod, act);
  CAPTURE(o.stored);
  CAPTURE(o.ambiguous);
  CHECK(o.wrong == 0);
  CHECK(o.ambiguous <= 2 + o.stored / 1000);
  std::int64_t diff = differing(a.twell().packed(), b.twell().packed()) + differing(a.row_to_overflow(), b.row_to_overflow());
  if (a.overflow_rows() == b.overflow_rows()) diff += differing(a.overflow().values(), b.overflow().values());
  else diff += 1;
  CAPTURE(a.rows());
  CAPTURE(a.cols());
  CHECK(diff == 0);
}

// Whether FusedMainloop::best must take the wgmma kernel: a compute capability 9.0 device and a
// build whose device code holds sm_90a (the default; a build for compute_80 alone runs the
// mma.sync kernel on a Hopper too, from PTX the driver compiles).
bool wgmma_expected() {
  static const bool expected = [] {
    int device = 0;
    cudaDeviceProp p{};
    testing::cuda_ok(cudaGetDevice(&device));
    testing::cuda_ok(cudaGetDeviceProperties(&p, device));
    return TWELL_TEST_BUILT_SM90A == 1 && p.major == 9 && p.minor == 0;
  }();
  return expected;
}

// The path prefix a fused run reports.
std::string fused_prefix(cuda::FusedMainloop mainloop) {
  return mainloop == cuda::FusedMainloop::best && wgmma_expected() ? "fused_wgmma_tma_tile" : "fused_mma_sync_tile";
}

// Whether the wgmma kernel must run in 64-row CTA tiles (path suffix "_rows64"): it does where its
// tile pairs (2 row blocks of 64 x one TwELL tile) take one wave of resident 2-CTA clusters, about
// SMs / 2 with one CTA an SM. Near that bound the answer depends on the device's cluster
// placement, so there nothing is expected (empty).
std::optional<bool> rows64_expected(std::int64_t m, std::int64_t n, std::int32_t tile) {
  const std::int64_t pairs = (n + tile - 1) / tile * (((m + 63) / 64 + 1) / 2);
  const int sms = testing::device_multiprocessors();
  if (pairs <= sms / 4) return true;
  if (pairs > sms / 2) return false;
  return std::nullopt;
}

constexpr cuda::FusedMainloop kMainloops[] = {cuda::FusedMainloop::best, cuda::FusedMainloop::portable};

const char* name_of(cuda::FusedMainloop mainloop) { return mainloop == cuda::FusedMainloop::best ? "best" : "portable"; }

// cuda::gemm_to_sparse with the chosen mainloop: the free function for best, and for portable
// the plan it is made of (capacity 0, run, sync, take_result) with the mma.sync mainloop forced.
template <class T>
HybridMatrix<T> gpu_gemm_to_sparse(DenseView<const T> x, DenseView<const T> w, ActivationSpec act, TwellLayout layout,
                                   const ConvertOptions& conv, cuda::FusedMainloop mainloop, std::string* path) {
  // The plans allocate their TwELL without zero fill (the epilogue writes every slot): with new
  // device buffers poisoned, a slot it missed shows, in this process's later plans too.
  twell::detail::set_uninitialized_device_fill(0xff);
  if (mainloop == cuda::FusedMainloop::best) {
    KernelReport kr;
    KernelOptions ko;
    ko.report = &kr;
    HybridMatrix<T> out = cuda::gemm_to_sparse<T>(x, w, act, layout, conv, ko);
    if (path != nullptr) *path = kr.path;
    return out;
  }
  cuda::GemmToSparsePlan<T> plan(x.rows, x.cols, w.cols, act, layout, 0, conv.overflow, {}, mainloop);
  plan.run(x, w);
  const cuda::OverflowCount count = plan.sync_overflow_count();
  if (conv.report != nullptr) {
    conv.report->nnz = count.nnz;
    conv.report->dropped = count.dropped;
    conv.report->overflow_rows = count.rows;
  }
  if (path != nullptr) *path = plan.path();
  return std::move(plan).take_result();
}

// Runs both backends with the given policy, the GPU with both fused mainloops; returns the
// outcome of the default one against the reference, checks paths and reports, and that the two
// mainloops agree.
template <class T>
Outcome run_case(const Case<T>& c, ActivationSpec act, TwellLayout layout, OverflowPolicy policy,
                 const std::string& expect_path_prefix) {
  ConvertOptions conv;
  conv.overflow = policy;
  ConvertReport ref_report;
  conv.report = &ref_report;
  const HybridMatrix<T> ref = reference::gemm_to_sparse<T>(c.x.view(), c.w.view(), act, layout, conv);
  const auto xd = c.x.to(MemorySpace::device);
  const auto wd = c.w.to(MemorySpace::device);
  const MatrixF xf = to_eigen<T>(c.x.view()), wf = to_eigen<T>(c.w.view());
  const MatrixF prod = xf * wf;
  const MatrixF abs_prod = xf.cwiseAbs() * wf.cwiseAbs();
  const MatrixF ref_dense = decode_checked(ref);
  Outcome first;
  HybridMatrix<T> results[2];
  for (const cuda::FusedMainloop mainloop : kMainloops) {
    CAPTURE(name_of(mainloop));
    ConvertReport gpu_report;
    conv.report = &gpu_report;
    std::string path;
    HybridMatrix<T> got =
        gpu_gemm_to_sparse<T>(xd.view(), wd.view(), act, layout, conv, mainloop, &path).to(MemorySpace::host);
    CAPTURE(path);
    const bool fused = expect_path_prefix == "fused_mma_sync_tile";
    CHECK(path.rfind(fused ? fused_prefix(mainloop) : expect_path_prefix, 0) == 0);
    if (fused && mainloop == cuda::FusedMainloop::best && wgmma_expected()) {
      if (const auto rows64 = rows64_expected(c.x.rows(), c.w.cols(), layout.tile))
        CHECK((path.find("_rows64") != std::string::npos) == *rows64);
    }
    const Outcome o = compare<T>(ref_dense, decode_checked(got), prod, abs_prod, act);
    CAPTURE(o.stored);
    CAPTURE(o.ambiguous);
    CHECK(o.wrong == 0);
    CHECK(o.ambiguous <= 2 + o.stored / 1000);
    if (o.ambiguous == 0) {
      CHECK(got.overflow_rows() == ref.overflow_rows());
      CHECK(gpu_report.nnz == ref_report.nnz);
      CHECK(gpu_report.dropped == ref_report.dropped);
      CHECK(gpu_report.overflow_rows == ref_report.overflow_rows);
    }
    if (mainloop == cuda::FusedMainloop::best) first = o;
    results[mainloop == cuda::FusedMainloop::best ? 0 : 1] = std::move(got);
  }
  check_mainloops_agree(results[0], results[1], prod, abs_prod, act);
  return first;
}

const ActivationSpec kActs[] = {{Activation::relu, 0.0f}, {Activation::relu, 0.5f}, {Activation::silu, 0.3f},
                                {Activation::gelu, 0.3f}, {Activation::silu, 0.0f}};

// An M x K x N product in TwELL tiles of `tile` columns.
struct Shape {
  std::int64_t m, k, n;
  std::int32_t tile;
};

}  // namespace

TEST_CASE_TEMPLATE("gemm_to_sparse fused path, random dense inputs (about 50 % dense), every activation", T, bf16,
                   fp16) {
  // Ragged M, N and K (K = 40, 136, 264, 1000 are not multiples of the 64-deep K step).
  for (const Shape s : testing::sweep({Shape{77, 96, 328, 256}, Shape{130, 40, 256, 128}, Shape{1, 8, 8, 256},
                                       Shape{300, 264, 520, 128}, Shape{77, 136, 264, 256}, Shape{300, 1000, 520, 256}})) {
    for (const ActivationSpec act : testing::sweep(kActs)) {
      const std::uint64_t seed = testing::fresh_seed();
      CAPTURE(seed);
      CAPTURE(s.m);
      CAPTURE(s.k);
      CAPTURE(s.n);
      CAPTURE(static_cast<int>(act.kind));
      CAPTURE(act.threshold);
      const auto c = random_case<T>(s.m, s.k, s.n, seed);
      // C = 2 holds half a tile: dense rows fit, sparse-ish thresholded ones too.
      run_case<T>(c, act, TwellLayout{s.tile, 2}, OverflowPolicy::hybrid, "fused_mma_sync_tile");
      // C = 8 makes most dense rows overflow: the hybrid block and the dense recompute.
      run_case<T>(c, act, TwellLayout{s.tile, 8}, OverflowPolicy::hybrid, "fused_mma_sync_tile");
      run_case<T>(c, act, TwellLayout{s.tile, 8}, OverflowPolicy::drop, "fused_mma_sync_tile");
    }
  }
}

TEST_CASE_TEMPLATE("gemm_to_sparse generic paths: other tiles, unaligned shapes, fp32", T, bf16, fp16, float) {
  const std::uint64_t seed = testing::fresh_seed();
  CAPTURE(seed);
  const auto ragged = random_case<T>(77, 96, 300, seed);  // N % 8 != 0: no 16-byte rows
  run_case<T>(ragged, kActs[0], TwellLayout{256, 8}, OverflowPolicy::hybrid, "generic:simt_dense");
  run_case<T>(ragged, kActs[2], TwellLayout{64, 4}, OverflowPolicy::drop, "generic:simt_dense");
  const auto aligned = random_case<T>(90, 64, 192, seed + 7);
  const std::string dense = std::is_same_v<T, float> ? "generic:simt_dense" : "generic:mma_sync_dense";
  run_case<T>(aligned, kActs[1], TwellLayout{64, 2}, OverflowPolicy::hybrid, dense);
  if constexpr (std::is_same_v<T, float>) run_case<T>(aligned, kActs[3], TwellLayout{256, 4}, OverflowPolicy::hybrid, dense);
}

// device_overflow_count() is the latest fused run's count: null before any run and after a run
// that took the generic path (an x whose leading dimension breaks the 16-byte rows), where it
// once pointed at the previous fused run's status.
TEST_CASE("GemmToSparsePlan's device count is null unless the latest run was fused") {
  const std::uint64_t seed = testing::fresh_seed();
  CAPTURE(seed);
  constexpr std::int64_t kM = 64, kK = 64, kN = 256;
  const auto c = random_case<bf16>(kM, kK, kN, seed);
  const auto padded = testing::random_dense<bf16>(kM, kK + 2, 1.0f, seed + 2);
  const DenseMatrix<bf16> xd = c.x.to(MemorySpace::device), wd = c.w.to(MemorySpace::device);
  const DenseMatrix<bf16> pd = padded.to(MemorySpace::device);
  const DenseView<const bf16> unaligned_x{pd.view().data, kM, kK, kK + 2, MemorySpace::device};
  cuda::GemmToSparsePlan<bf16> plan(kM, kK, kN, {}, TwellLayout{256, 8});
  REQUIRE(plan.fused());
  CHECK(plan.device_overflow_count() == nullptr);
  plan.run(xd.view(), wd.view());
  (void)plan.sync_overflow_count();
  CHECK(plan.path().rfind("fused", 0) == 0);
  CHECK(plan.device_overflow_count() != nullptr);
  plan.run(unaligned_x, wd.view());
  (void)plan.sync_overflow_count();
  CHECK(plan.path().rfind("generic:", 0) == 0);
  CHECK(plan.device_overflow_count() == nullptr);
}

TEST_CASE_TEMPLATE("gemm_to_sparse on workload patterns, densities 0.3 % to 20 %, token-skewed overflow", T, bf16,
                   fp16) {
  for (const testing::WorkloadSetting& s : testing::sweep(kWorkloadSettings)) {
    const std::uint64_t seed = testing::fresh_seed();
    CAPTURE(seed);
    CAPTURE(s.density);
    const auto c = workload_case<T>(s, seed);
    for (const std::int32_t tile : {256, 128}) {
      CAPTURE(tile);
      run_case<T>(c, kActs[0], TwellLayout{tile, 8}, OverflowPolicy::hybrid, "fused_mma_sync_tile");
      run_case<T>(c, kActs[0], TwellLayout{tile, 16}, OverflowPolicy::drop, "fused_mma_sync_tile");
    }
  }
}

// 1000 tokens: 8 x 22 CTA tiles of 128 x 256, more than one per CTA of the persistent wgmma kernel.
TEST_CASE_TEMPLATE("gemm_to_sparse at the paper's FFN shape (K 2048, N 5632, 1000 tokens), both mainloops", T, bf16,
                   fp16) {
  const std::uint64_t seed = testing::fresh_seed();
  CAPTURE(seed);
  const auto c = workload_case<T>({1000, 2048, 5632, 0.005, workload::Distribution::token_skewed}, seed);
  for (const std::int32_t tile : {256, 128}) {
    CAPTURE(tile);
    run_case<T>(c, kActs[0], TwellLayout{tile, 16}, OverflowPolicy::hybrid, "fused_mma_sync_tile");
  }
}

// 20000 rows: each warp of the overflow ranking kernel reads 20 ballots of 32 rows, in two batches
// (kernels/cuda/row_ballots.cuh), where the shapes above give every warp one ballot at most.
TEST_CASE_TEMPLATE("gemm_to_sparse ranks the overflow rows of 20000 tokens", T, bf16, fp16) {
  const std::uint64_t seed = testing::fresh_seed();
  CAPTURE(seed);
  const auto c = workload_case<T>(
      {testing::sweep_size(20000, 2500), 64, 512, 0.05, workload::Distribution::token_skewed}, seed);
  const TwellLayout layout{256, 16};
  ConvertOptions conv;
  conv.overflow = OverflowPolicy::hybrid;
  // The case must spread overflow rows over many warps' ranges (run_case checks the maps).
  REQUIRE(reference::gemm_to_sparse<T>(c.x.view(), c.w.view(), kActs[0], layout, conv).overflow_rows() > 64);
  run_case<T>(c, kActs[0], layout, OverflowPolicy::hybrid, "fused_mma_sync_tile");
}

TEST_CASE("gemm_to_sparse error policy names the first overflowed row and tile") {
  const std::uint64_t seed = testing::fresh_seed();
  CAPTURE(seed);
  auto c = random_case<bf16>(200, 64, 512, seed);
  // Row 150 alone is dense in tile 1: x(150, :) = 1 and w's tile-1 columns positive.
  auto xv = c.x.view();
  for (std::int64_t i = 0; i < 200; ++i)
    for (std::int64_t k = 0; k < 64; ++k) xv.at(i, k) = from_float<bf16>(i == 150 ? 1.0f : 0.0f);
  auto wv = c.w.view();
  for (std::int64_t k = 0; k < 64; ++k)
    for (std::int64_t j = 0; j < 512; ++j) wv.at(k, j) = from_float<bf16>(j >= 256 ? 0.25f : -0.25f);
  const auto xd = c.x.to(MemorySpace::device);
  const auto wd = c.w.to(MemorySpace::device);
  ConvertOptions conv;  // error is the default policy
  try {
    (void)cuda::gemm_to_sparse<bf16>(xd.view(), wd.view(), {Activation::relu, 0.0f}, TwellLayout{256, 8}, conv);
    FAIL("no overflow reported");
  } catch (const Error& e) {
    CHECK(e.code() == ErrorCode::overflow);
    const std::string what = e.what();
    CAPTURE(what);
    CHECK(what.find("row 150, tile 1 has 256") != std::string::npos);
    CHECK(what.rfind("twell::cuda::gemm_to_sparse: ", 0) == 0);  // the function called, not the plan it runs
  }
  // The generic path (a layout the fused kernel does not take) names it too, not dense_to_twell.
  try {
    (void)cuda::gemm_to_sparse<bf16>(xd.view(), wd.view(), {Activation::relu, 0.0f}, TwellLayout{64, 8}, conv);
    FAIL("no overflow reported");
  } catch (const Error& e) {
    CHECK(e.code() == ErrorCode::overflow);
    const std::string what = e.what();
    CAPTURE(what);
    CHECK(what.rfind("twell::cuda::gemm_to_sparse: row 150, tile 4 ", 0) == 0);
  }
  // The same input under hybrid: exactly row 150 in the block, fully dense in tile 1.
  conv.overflow = OverflowPolicy::hybrid;
  const auto h = cuda::gemm_to_sparse<bf16>(xd.view(), wd.view(), {Activation::relu, 0.0f}, TwellLayout{256, 8}, conv)
                     .to(MemorySpace::host);
  REQUIRE(h.overflow_rows() == 1);
  CHECK(h.overflow_to_row().host_span()[0] == 150);
  CHECK(h.row_to_overflow().host_span()[150] == 0);
  CHECK(h.row_to_overflow().host_span()[149] == -1);
  const auto o = h.overflow().view();
  CHECK(to_float(o.at(0, 300)) == doctest::Approx(16.0f));
  CHECK(to_float(o.at(0, 10)) == 0.0f);
}

TEST_CASE("gemm_to_sparse rejects bad input") {
  const auto x = testing::random_dense<bf16>(16, 32, 1.0f, 1).to(MemorySpace::device);
  const auto w = testing::random_dense<bf16>(24, 64, 1.0f, 2).to(MemorySpace::device);
  const auto wh = testing::random_dense<bf16>(32, 64, 1.0f, 3);
  const auto wk = wh.to(MemorySpace::device);
  using testing::code_of;
  CHECK(code_of([&] { (void)cuda::gemm_to_sparse<bf16>(x.view(), w.view(), {}, TwellLayout{}, {}); }) ==
        ErrorCode::shape_mismatch);
  CHECK(code_of([&] { (void)cuda::gemm_to_sparse<bf16>(x.view(), wh.view(), {}, TwellLayout{}, {}); }) ==
        ErrorCode::space_mismatch);
  CHECK(code_of([&] { (void)cuda::gemm_to_sparse<bf16>(x.view(), wk.view(), {}, TwellLayout{256, 3}, {}); }) ==
        ErrorCode::invalid_argument);
  CHECK(code_of([&] {
          (void)cuda::gemm_to_sparse<bf16>(x.view(), wk.view(), {Activation::relu, -1.0f}, TwellLayout{}, {});
        }) == ErrorCode::invalid_argument);
  CHECK(code_of([&] {
          (void)cuda::gemm_to_sparse<bf16>(testing::off_boundary<bf16>(x.view()), wk.view(), {}, TwellLayout{}, {});
        }) == ErrorCode::misaligned);
}

namespace {

using testing::cuda_ok;

template <class U>
void copy_down(U* dst, const U* src, std::int64_t n) {
  if (n > 0) cuda_ok(cudaMemcpy(dst, src, static_cast<std::size_t>(n) * sizeof(U), cudaMemcpyDeviceToHost));
}

// A host copy of a device Hybrid view, bit for bit (the overflow view's R rows only).
template <class T>
HybridMatrix<T> to_host(HybridView<const T> v) {
  const std::int64_t m = v.rows(), n = v.cols(), r = v.overflow_rows(), width = v.twell.packed_width();
  HybridMatrix<T> h(m, n, v.twell.layout, r, MemorySpace::host);
  copy_down(h.twell().packed().data(), v.twell.packed, m * width);
  if (v.twell.value_plane != nullptr) copy_down(h.twell().value_plane().data(), v.twell.value_plane, m * width);
  for (std::int64_t i = 0; i < r; ++i) copy_down(h.overflow().view().data + i * n, v.overflow.data + i * v.overflow.ld, n);
  copy_down(h.row_to_overflow().data(), v.row_to_overflow, m);
  copy_down(h.overflow_to_row().data(), v.overflow_to_row, r);
  return h;
}

template <class U>
bool same_bits(const Buffer<U>& a, const Buffer<U>& b) {
  return a.size() == b.size() && (a.size() == 0 || std::memcmp(a.data(), b.data(), a.bytes()) == 0);
}

template <class T>
void check_bitwise_equal(const HybridMatrix<T>& a, const HybridMatrix<T>& b) {
  REQUIRE(a.rows() == b.rows());
  REQUIRE(a.cols() == b.cols());
  REQUIRE(a.overflow_rows() == b.overflow_rows());
  CHECK(same_bits(a.twell().packed(), b.twell().packed()));
  CHECK(same_bits(a.twell().value_plane(), b.twell().value_plane()));
  CHECK(same_bits(a.overflow().values(), b.overflow().values()));
  CHECK(same_bits(a.row_to_overflow(), b.row_to_overflow()));
  CHECK(same_bits(a.overflow_to_row(), b.overflow_to_row()));
}

// 0xFF over every output word the plan owns (the whole overflow block, not just its R rows), so
// a slot the next run fails to write shows. The result's pointers are the plan's storage.
template <class T>
void poison(const cuda::GemmToSparsePlan<T>& plan) {
  const HybridView<const T> v = plan.result();
  const std::int64_t m = v.rows(), width = v.twell.packed_width(), cap = plan.overflow_capacity();
  auto bytes = [](std::int64_t count, std::size_t size) { return static_cast<std::size_t>(count) * size; };
  auto wipe = [](const void* p, std::size_t b) {
    if (b != 0) cuda_ok(cudaMemset(const_cast<void*>(p), 0xFF, b));
  };
  wipe(v.twell.packed, bytes(m * width, sizeof(std::uint32_t)));
  if (v.twell.value_plane != nullptr) wipe(v.twell.value_plane, bytes(m * width, sizeof(T)));
  if (plan.fused()) {
    wipe(v.overflow.data, bytes(cap * v.cols(), sizeof(T)));
    wipe(v.overflow_to_row, bytes(cap, sizeof(std::int32_t)));
  }
  wipe(v.row_to_overflow, bytes(m, sizeof(std::int32_t)));
  cuda_ok(cudaDeviceSynchronize());
}

// The plan against the free function on the same device operands: a first run on other data
// (state left behind must not leak), then two poisoned runs on x; both bitwise equal to the free
// function's result, and the counts agree with its report. Returns whether a run's block was
// filled from spilled segments (path "+overflow:spilled").
template <class T>
bool check_plan(DenseView<const T> x, DenseView<const T> w, DenseView<const T> x_other, ActivationSpec act,
                TwellLayout layout, OverflowPolicy policy, std::int64_t capacity, bool expect_fused,
                cuda::FusedMainloop mainloop) {
  CAPTURE(layout.tile);
  CAPTURE(layout.compression);
  CAPTURE(static_cast<int>(policy));
  CAPTURE(capacity);
  CAPTURE(name_of(mainloop));
  ConvertOptions conv;
  conv.overflow = policy;
  ConvertReport report;
  conv.report = &report;
  const HybridMatrix<T> expect = gpu_gemm_to_sparse<T>(x, w, act, layout, conv, mainloop, nullptr).to(MemorySpace::host);
  cuda::GemmToSparsePlan<T> plan(x.rows, x.cols, w.cols, act, layout, capacity, policy, {}, mainloop);
  CHECK(plan.fused() == expect_fused);
  plan.run(x_other, w);
  (void)plan.sync_overflow_count();
  bool spilled = false;
  for (int round = 0; round < 2; ++round) {
    CAPTURE(round);
    poison(plan);
    const std::int64_t cap_before = plan.overflow_capacity();
    plan.run(x, w);
    CHECK(testing::code_of([&] { (void)plan.result(); }) == ErrorCode::invalid_argument);  // not before the sync
    const cuda::OverflowCount c = plan.sync_overflow_count();
    CAPTURE(plan.path());
    if (expect_fused) CHECK(plan.path().rfind(fused_prefix(mainloop), 0) == 0);
    // On the fused paths a block that holds every flagged row is filled from the packers' spilled
    // segments (their pool has one for each (row, tile) of the block), not recomputed.
    const bool filled = plan.path().find("+overflow:spilled") != std::string::npos;
    spilled = spilled || filled;
    if (policy == OverflowPolicy::hybrid && plan.path().rfind("fused_", 0) == 0 && c.rows > 0 && c.rows <= cap_before)
      CHECK(filled);
    CHECK(c.rows == expect.overflow_rows());
    CHECK(c.nnz == report.nnz);
    CHECK(c.dropped == report.dropped);
    if (plan.fused()) {
      CHECK(c.exceeded_capacity == (c.rows > cap_before));
      CHECK(c.second_pass == c.exceeded_capacity);
      CHECK(plan.overflow_capacity() >= c.rows);
      CHECK(plan.overflow_capacity() ==
            (c.exceeded_capacity ? std::min(x.rows, std::max(c.rows, 2 * cap_before)) : cap_before));
    }
    const HybridMatrix<T> got = to_host(plan.result());
    check_bitwise_equal(got, expect);
    if (policy == OverflowPolicy::hybrid) (void)decode_checked(got);
  }
  return spilled;
}

}  // namespace

TEST_CASE_TEMPLATE("GemmToSparsePlan equals gemm_to_sparse bitwise: random dense inputs, poisoned outputs", T, bf16,
                   fp16) {
  for (const Shape s : {Shape{77, 96, 328, 256}, Shape{130, 40, 256, 128}, Shape{1, 8, 8, 256},
                        Shape{300, 264, 520, 128}, Shape{600, 64, 512, 256}}) {
    const std::uint64_t seed = testing::fresh_seed();
    CAPTURE(seed);
    CAPTURE(s.m);
    CAPTURE(s.k);
    CAPTURE(s.n);
    const auto c = random_case<T>(s.m, s.k, s.n, seed);
    const auto other = testing::random_dense<T>(s.m, s.k, 1.0f, seed + 2).to(MemorySpace::device);
    const auto xd = c.x.to(MemorySpace::device), wd = c.w.to(MemorySpace::device);
    const auto cap = cuda::GemmToSparsePlan<T>::kDefaultCapacity;
    for (const cuda::FusedMainloop ml : kMainloops)
      for (const ActivationSpec act : {kActs[0], kActs[2]}) {
        CAPTURE(static_cast<int>(act.kind));
        // C = 2: few rows overflow, inside the default block; C = 8: most rows overflow, past it.
        check_plan<T>(xd.view(), wd.view(), other.view(), act, TwellLayout{s.tile, 2}, OverflowPolicy::hybrid, cap,
                      true, ml);
        check_plan<T>(xd.view(), wd.view(), other.view(), act, TwellLayout{s.tile, 8}, OverflowPolicy::hybrid, cap,
                      true, ml);
        check_plan<T>(xd.view(), wd.view(), other.view(), act, TwellLayout{s.tile, 8}, OverflowPolicy::hybrid, s.m,
                      true, ml);
        check_plan<T>(xd.view(), wd.view(), other.view(), act, TwellLayout{s.tile, 8}, OverflowPolicy::drop, cap,
                      true, ml);
      }
  }
}

// GemmToSparsePlan against gemm_to_sparse on the workload patterns, through mainloop `ml`.
template <class T>
void check_plan_workloads(cuda::FusedMainloop ml) {
  bool filled_from_spills = false;  // a block mixing TwELL slots and spilled segments
  for (testing::WorkloadSetting s : testing::sweep(kWorkloadSettings)) {
    s.m = testing::sweep_size(s.m, 128);  // under the sanitizer: 128 tokens, a CTA's rows
    const std::uint64_t seed = testing::fresh_seed();
    CAPTURE(seed);
    CAPTURE(s.density);
    const auto c = workload_case<T>(s, seed);
    const auto other = workload_case<T>(s, seed + 5);
    const auto xd = c.x.to(MemorySpace::device), wd = c.w.to(MemorySpace::device);
    const auto od = other.x.to(MemorySpace::device);
    for (const std::int32_t tile : {256, 128}) {
      CAPTURE(tile);
      for (const std::int32_t compression : {8, 16}) {
        filled_from_spills |=
            check_plan<T>(xd.view(), wd.view(), od.view(), kActs[0], TwellLayout{tile, compression},
                          OverflowPolicy::hybrid, cuda::GemmToSparsePlan<T>::kDefaultCapacity, true, ml);
        filled_from_spills |= check_plan<T>(xd.view(), wd.view(), od.view(), kActs[0], TwellLayout{tile, compression},
                                            OverflowPolicy::hybrid, 4, true, ml);
      }
      check_plan<T>(xd.view(), wd.view(), od.view(), kActs[0], TwellLayout{tile, 16}, OverflowPolicy::drop, 4, true, ml);
    }
  }
  if (testing::whole_sweep()) CHECK(filled_from_spills);
}

// One case per mainloop, so that each finishes under compute-sanitizer's racecheck in one call.
TEST_CASE_TEMPLATE("GemmToSparsePlan equals gemm_to_sparse bitwise: workload patterns, 0.3 % to 20 %, best mainloop", T,
                   bf16, fp16) {
  check_plan_workloads<T>(cuda::FusedMainloop::best);
}

TEST_CASE_TEMPLATE("GemmToSparsePlan equals gemm_to_sparse bitwise: workload patterns, 0.3 % to 20 %, portable mainloop",
                   T, bf16, fp16) {
  check_plan_workloads<T>(cuda::FusedMainloop::portable);
}

TEST_CASE_TEMPLATE("GemmToSparsePlan on the generic path equals gemm_to_sparse bitwise", T, bf16, fp16, float) {
  const std::uint64_t seed = testing::fresh_seed();
  CAPTURE(seed);
  const auto ragged = random_case<T>(77, 96, 300, seed);  // N % 8 != 0
  const auto other = testing::random_dense<T>(77, 96, 1.0f, seed + 3).to(MemorySpace::device);
  const auto xd = ragged.x.to(MemorySpace::device), wd = ragged.w.to(MemorySpace::device);
  check_plan<T>(xd.view(), wd.view(), other.view(), kActs[0], TwellLayout{256, 8}, OverflowPolicy::hybrid, 16, false,
                cuda::FusedMainloop::best);
  check_plan<T>(xd.view(), wd.view(), other.view(), kActs[1], TwellLayout{64, 4}, OverflowPolicy::drop, 16, false,
                cuda::FusedMainloop::best);
}

TEST_CASE_TEMPLATE("GemmToSparsePlan with capacity 1: many overflow rows completed by the second pass", T, bf16, fp16) {
  const std::uint64_t seed = testing::fresh_seed();
  CAPTURE(seed);
  const auto c = workload_case<T>({1024, 512, 1408, 0.05, workload::Distribution::token_skewed}, seed);
  const auto xd = c.x.to(MemorySpace::device), wd = c.w.to(MemorySpace::device);
  const TwellLayout layout{256, 16};  // 15 slots per (row, tile): token-skewed rows overflow
  ConvertOptions conv;
  conv.overflow = OverflowPolicy::hybrid;
  const HybridMatrix<T> expect = cuda::gemm_to_sparse<T>(xd.view(), wd.view(), {}, layout, conv).to(MemorySpace::host);
  REQUIRE(expect.overflow_rows() > 8);  // the workload must produce many overflow rows
  // Checked against the CPU reference too, not only against the free function.
  const HybridMatrix<T> ref = reference::gemm_to_sparse<T>(c.x.view(), c.w.view(), {}, layout, conv);

  const MatrixF xf = to_eigen<T>(c.x.view()), wf = to_eigen<T>(c.w.view());
  for (const cuda::FusedMainloop mainloop : kMainloops) {
    CAPTURE(name_of(mainloop));
    cuda::GemmToSparsePlan<T> plan(1024, 512, 1408, {}, layout, 1, OverflowPolicy::hybrid, {}, mainloop);
    CHECK(plan.overflow_capacity() == 1);
    plan.run(xd.view(), wd.view());
    CHECK(plan.device_overflow_count() != nullptr);
    const cuda::OverflowCount first = plan.sync_overflow_count();
    CHECK(first.rows == expect.overflow_rows());
    std::uint64_t on_device = 0;
    REQUIRE(cudaMemcpy(&on_device, plan.device_overflow_count(), sizeof on_device, cudaMemcpyDeviceToHost) ==
            cudaSuccess);
    CHECK(on_device == static_cast<std::uint64_t>(first.rows));
    CHECK(first.exceeded_capacity);
    CHECK(first.second_pass);
    CAPTURE(plan.path());
    CHECK(plan.path().find("+second_pass:") != std::string::npos);
    // Each flagged row spills at least one segment, and R > 8 exceeds the pool's 6 (one block row
    // of 6 tiles): the block's row was recomputed, not filled.
    CHECK(plan.path().find("+overflow:spilled") == std::string::npos);
    CHECK(plan.overflow_capacity() == first.rows);  // max(R, 2 * 1)
    const HybridMatrix<T> got = to_host(plan.result());
    check_bitwise_equal(got, expect);
    const Outcome o = compare<T>(decode_checked(ref), decode_checked(got), xf * wf, xf.cwiseAbs() * wf.cwiseAbs(), {});
    CHECK(o.wrong == 0);
    CHECK(o.ambiguous <= 2 + o.stored / 1000);

    // The grown block now holds every overflow row: a second run needs no second pass.
    poison(plan);
    plan.run(xd.view(), wd.view());
    const cuda::OverflowCount again = plan.sync_overflow_count();
    CHECK(again.rows == first.rows);
    CHECK_FALSE(again.exceeded_capacity);
    CHECK_FALSE(again.second_pass);
    // The pool grew with the block, so the block is now filled from the spills.
    CHECK(plan.path().find("+overflow:spilled") != std::string::npos);
    check_bitwise_equal(to_host(plan.result()), expect);

    // take_result moves the storage out, trimmed to R rows, and retires the plan.
    const HybridMatrix<T> taken = std::move(plan).take_result().to(MemorySpace::host);
    check_bitwise_equal(taken, expect);
    // Every later call says so, not "call run() first" (which would be refused too).
    // NOLINTBEGIN(bugprone-use-after-move)
    for (const std::string& m :
         {testing::message_of([&] { (void)plan.sync_overflow_count(); }),
          testing::message_of([&] { (void)plan.result(); }), testing::message_of([&] { (void)plan.queued_result(); }),
          testing::message_of([&] { (void)std::move(plan).take_result(); }),
          testing::message_of([&] { plan.run(xd.view(), wd.view()); })}) {
      CAPTURE(m);
      CHECK(m.find("moved out") != std::string::npos);
    }
    // NOLINTEND(bugprone-use-after-move)
  }
}

namespace {
// Token-skewed rows (1024 x 512 times 512 x 1408) in TwELL(256, 16), whose 15 slots a (row,
// tile) many rows overflow: x and w on the device, the free function's result on the host.
struct SkewedGate {
  DenseMatrix<bf16> x, w;
  TwellLayout layout{256, 16};
  HybridMatrix<bf16> expect{};
};

SkewedGate skewed_gate(std::uint64_t seed) {
  const auto c = workload_case<bf16>({1024, 512, 1408, 0.05, workload::Distribution::token_skewed}, seed);
  SkewedGate g{c.x.to(MemorySpace::device), c.w.to(MemorySpace::device)};
  ConvertOptions conv;
  conv.overflow = OverflowPolicy::hybrid;
  g.expect = cuda::gemm_to_sparse<bf16>(g.x.view(), g.w.view(), {}, g.layout, conv).to(MemorySpace::host);
  REQUIRE(g.expect.overflow_rows() > 8);  // the workload must produce many overflow rows
  return g;
}

// Runs f with the pool allocation that follows `succeeding` successful ones failing for good:
// whether f reached that allocation, and the code f threw (none if it returned). The hook is
// disarmed on return, also when f throws something else.
struct AllocationFailure {
  bool fired = false;
  std::optional<ErrorCode> code;
};

template <class F>
AllocationFailure with_allocation_failing_after(int succeeding, F&& f) {
  struct Disarm {
    ~Disarm() { twell::detail::fail_pool_allocation_after(-1); }
  } const disarm;
  twell::detail::fail_pool_allocation_after(succeeding);
  AllocationFailure out;
  try {
    f();
  } catch (const Error& e) {
    out.code = e.code();
  }
  out.fired = !twell::detail::pool_allocation_failure_armed();
  CHECK(cudaGetLastError() == cudaSuccess);  // a failed allocation leaves no error behind
  return out;
}
}  // namespace

// An x whose rows lie 2^40 bytes apart (one row, so nothing past it is read) cannot be described
// to TMA: the best mainloop then runs the portable kernel (the wgmma one's applies() refuses it)
// instead of failing its encode at launch, with the bits of the portable kernel on a compact x.
TEST_CASE("GemmToSparsePlan takes an x whose rows are too far apart for a tensor map") {
  const std::uint64_t seed = testing::fresh_seed();
  CAPTURE(seed);
  const auto c = random_case<bf16>(1, 64, 256, seed);
  const auto xd = c.x.to(MemorySpace::device), wd = c.w.to(MemorySpace::device);
  DenseView<const bf16> far = xd.view();
  far.ld = std::int64_t{1} << 39;
  const TwellLayout layout{128, 8};
  ConvertOptions conv;
  conv.overflow = OverflowPolicy::hybrid;
  const HybridMatrix<bf16> expect =
      gpu_gemm_to_sparse<bf16>(xd.view(), wd.view(), {}, layout, conv, cuda::FusedMainloop::portable, nullptr)
          .to(MemorySpace::host);
  cuda::GemmToSparsePlan<bf16> plan(1, 64, 256, {}, layout);
  plan.run(far, wd.view());
  (void)plan.sync_overflow_count();
  CAPTURE(plan.path());
  CHECK(plan.path().rfind("fused_mma_sync_tile128", 0) == 0);
  check_bitwise_equal(to_host(plan.result()), expect);
  plan.run(xd.view(), wd.view());  // the same plan on a compact x: its best mainloop
  (void)plan.sync_overflow_count();
  CHECK(plan.path().rfind(fused_prefix(cuda::FusedMainloop::best), 0) == 0);
}

TEST_CASE("GemmToSparsePlan: an allocation that fails while the block grows leaves the plan as it was") {
  // Capacity 1 on token-skewed rows, so that sync_overflow_count grows the block, its map, the
  // spill pool and (on Hopper) the gathered rows. Each of its allocations fails in turn, for good
  // (a full device); the plan must then give the exact result when counted again, and serve a
  // later run with what it holds. Under compute-sanitizer memcheck, a buffer left smaller than
  // the plan thinks shows as an out-of-bounds access. take_result() of a block larger than R
  // allocates an exact one: each of its allocations fails in turn too, leaving the result.
  twell::detail::set_uninitialized_device_fill(0xff);
  const std::uint64_t seed = testing::fresh_seed();
  CAPTURE(seed);
  const SkewedGate g = skewed_gate(seed);
  const auto& [xd, wd, layout, expect] = g;
  for (const cuda::FusedMainloop mainloop : kMainloops) {
    CAPTURE(name_of(mainloop));
    int failed = 0;
    for (int succeeding = 0;; ++succeeding) {
      CAPTURE(succeeding);
      cuda::GemmToSparsePlan<bf16> plan(1024, 512, 1408, {}, layout, 1, OverflowPolicy::hybrid, {}, mainloop);
      plan.run(xd.view(), wd.view());
      const std::string path = plan.path();
      const auto [fired, code] = with_allocation_failing_after(succeeding, [&] { (void)plan.sync_overflow_count(); });
      if (!fired) {  // the growth made fewer allocations than `succeeding`: every one was reached
        CHECK_FALSE(code.has_value());
        break;
      }
      ++failed;
      REQUIRE(code == ErrorCode::out_of_memory);
      CHECK(plan.overflow_capacity() == 1);
      CHECK(plan.path() == path);
      CHECK(testing::code_of([&] { (void)plan.result(); }) == ErrorCode::invalid_argument);
      const cuda::OverflowCount retried = plan.sync_overflow_count();
      CHECK(retried.rows == expect.overflow_rows());
      CHECK(retried.second_pass);
      check_bitwise_equal(to_host(plan.result()), expect);
      poison(plan);
      plan.run(xd.view(), wd.view());
      CHECK_FALSE(plan.sync_overflow_count().second_pass);
      check_bitwise_equal(to_host(plan.result()), expect);
    }
    CHECK(failed >= 4);  // block, map, spill values and segments, at least

    int take_failed = 0;
    for (int succeeding = 0;; ++succeeding) {
      CAPTURE(succeeding);
      cuda::GemmToSparsePlan<bf16> plan(1024, 512, 1408, {}, layout, 1024, OverflowPolicy::hybrid, {}, mainloop);
      plan.run(xd.view(), wd.view());
      REQUIRE(plan.sync_overflow_count().rows < plan.overflow_capacity());
      std::optional<HybridMatrix<bf16>> taken;
      const auto [fired, code] =
          with_allocation_failing_after(succeeding, [&] { taken.emplace(std::move(plan).take_result()); });
      if (!fired) {
        REQUIRE(taken.has_value());
        check_bitwise_equal(taken->to(MemorySpace::host), expect);
        break;
      }
      ++take_failed;
      REQUIRE(code == ErrorCode::out_of_memory);
      check_bitwise_equal(to_host(plan.result()), expect);  // NOLINT(bugprone-use-after-move): refused, kept
      check_bitwise_equal(std::move(plan).take_result().to(MemorySpace::host), expect);
    }
    CHECK(take_failed == 2);  // the exact block and its map
  }
}

TEST_CASE("GemmToSparsePlan's sync_overflow_count(meanwhile): called once, its work queued, a throw leaves the count") {
  // Capacity 1 on token-skewed rows: the count's wait is followed by a second pass. `meanwhile`
  // queues a fill of another buffer on the plan's stream; the count, the result and that buffer
  // must come out as without it.
  const std::uint64_t seed = testing::fresh_seed();
  CAPTURE(seed);
  const SkewedGate g = skewed_gate(seed);
  const auto& [xd, wd, layout, expect] = g;
  cuda::GemmToSparsePlan<bf16> plan(1024, 512, 1408, {}, layout, 1, OverflowPolicy::hybrid);
  Buffer<std::int32_t> side(4096, MemorySpace::device);
  int calls = 0;
  const auto fill_side = [&] {
    ++calls;
    testing::cuda_ok(cudaMemsetAsync(side.data(), 0x5a, side.bytes(), static_cast<cudaStream_t>(plan.stream().handle)));
  };

  plan.run(xd.view(), wd.view());
  CHECK(testing::code_of([&] {
          plan.sync_overflow_count([] { fail(ErrorCode::invalid_argument, "test", "meanwhile throws"); });
        }) == ErrorCode::invalid_argument);
  const cuda::OverflowCount first = plan.sync_overflow_count(fill_side);  // the throw left the run to count
  CHECK(calls == 1);
  CHECK(first.rows == expect.overflow_rows());
  CHECK(first.second_pass);
  check_bitwise_equal(to_host(plan.result()), expect);
  testing::cuda_ok(cudaDeviceSynchronize());
  const Buffer<std::int32_t> filled = side.copy_to(MemorySpace::host);
  CHECK(std::ranges::all_of(filled.host_span(), [](std::int32_t v) { return v == 0x5a5a5a5a; }));

  // Counted already: meanwhile still runs, once, and the count is the same.
  CHECK(plan.sync_overflow_count(fill_side).rows == first.rows);
  CHECK(calls == 2);
  poison(plan);
  plan.run(xd.view(), wd.view());
  CHECK(plan.sync_overflow_count(fill_side).rows == first.rows);
  CHECK(calls == 3);
  check_bitwise_equal(to_host(plan.result()), expect);
}

TEST_CASE("GemmToSparsePlan: error policy, misuse and bad input") {
  const std::uint64_t seed = testing::fresh_seed();
  CAPTURE(seed);
  auto c = random_case<bf16>(200, 64, 512, seed);
  auto xv = c.x.view();
  for (std::int64_t i = 0; i < 200; ++i)
    for (std::int64_t k = 0; k < 64; ++k) xv.at(i, k) = from_float<bf16>(i == 150 ? 1.0f : 0.0f);
  auto wv = c.w.view();
  for (std::int64_t k = 0; k < 64; ++k)
    for (std::int64_t j = 0; j < 512; ++j) wv.at(k, j) = from_float<bf16>(j >= 256 ? 0.25f : -0.25f);
  const auto xd = c.x.to(MemorySpace::device), wd = c.w.to(MemorySpace::device);
  cuda::GemmToSparsePlan<bf16> plan(200, 64, 512, {}, TwellLayout{256, 8}, 16, OverflowPolicy::error);
  CHECK(testing::code_of([&] { (void)plan.sync_overflow_count(); }) == ErrorCode::invalid_argument);  // nothing ran
  plan.run(xd.view(), wd.view());
  try {
    (void)plan.sync_overflow_count();
    FAIL("no overflow reported");
  } catch (const Error& e) {
    CHECK(e.code() == ErrorCode::overflow);
    const std::string what = e.what();
    CAPTURE(what);
    CHECK(what.find("row 150, tile 1 has 256") != std::string::npos);
    CHECK(what.rfind("twell::cuda::GemmToSparsePlan::sync_overflow_count: ", 0) == 0);
  }
  CHECK(testing::code_of([&] { (void)plan.result(); }) == ErrorCode::invalid_argument);  // a failed count: no result

  using testing::code_of;
  const auto x_small = testing::random_dense<bf16>(100, 64, 1.0f, seed + 1).to(MemorySpace::device);
  CHECK(code_of([&] { plan.run(x_small.view(), wd.view()); }) == ErrorCode::shape_mismatch);
  CHECK(code_of([&] { plan.run(c.x.view(), wd.view()); }) == ErrorCode::space_mismatch);
  CHECK(code_of([&] { cuda::GemmToSparsePlan<bf16>(200, 64, 512, {}, TwellLayout{256, 3}); }) ==
        ErrorCode::invalid_argument);
  CHECK(code_of([&] { cuda::GemmToSparsePlan<bf16>(200, 64, 512, {}, TwellLayout{}, -5); }) ==
        ErrorCode::invalid_argument);
  CHECK(code_of([&] { cuda::GemmToSparsePlan<bf16>(200, 64, 512, {Activation::relu, -1.0f}, TwellLayout{}); }) ==
        ErrorCode::invalid_argument);
  // A moved-from plan has no storage: it refuses to run (not a kernel on null pointers).
  cuda::GemmToSparsePlan<bf16> moved_to = std::move(plan);
  CHECK(code_of([&] { plan.run(xd.view(), wd.view()); }) == ErrorCode::invalid_argument);  // NOLINT(bugprone-use-after-move)
  CHECK(code_of([&] { (void)plan.sync_overflow_count(); }) == ErrorCode::invalid_argument);
  moved_to.run(xd.view(), wd.view());
  CHECK(code_of([&] { (void)moved_to.sync_overflow_count(); }) == ErrorCode::overflow);
}

namespace {

// A plan's result on x after a first run on other data and two runs on x into poisoned outputs,
// which must agree bitwise; `path` is the latest run's.
template <class T>
HybridMatrix<T> run_poisoned_twice(cuda::GemmToSparsePlan<T>& plan, DenseView<const T> x, DenseView<const T> w,
                                   DenseView<const T> x_other, std::string& path) {
  plan.run(x_other, w);
  (void)plan.sync_overflow_count();
  HybridMatrix<T> first;
  for (int round = 0; round < 2; ++round) {
    CAPTURE(round);
    poison(plan);
    plan.run(x, w);
    (void)plan.sync_overflow_count();
    path = plan.path();
    HybridMatrix<T> got = to_host(plan.result());
    if (round == 0) {
      first = std::move(got);
    } else {
      check_bitwise_equal(got, first);  // a missing cluster barrier would show as a race here
    }
  }
  return first;
}

// Row i of a (its TwELL slot words and, if it overflowed, its dense block row) equals row j of b,
// bit for bit.
template <class T>
void check_row_bits(const HybridMatrix<T>& a, std::int64_t i, const HybridMatrix<T>& b, std::int64_t j) {
  CAPTURE(i);
  CAPTURE(j);
  const TwellLayout& l = a.layout();
  const std::int64_t n = a.cols();
  const auto pa = a.twell().packed().host_span(), pb = b.twell().packed().host_span();
  std::int64_t diff = 0;
  for (std::int64_t t = 0; t < l.tiles(n); ++t)
    for (std::int64_t s = 0; s < l.slots(); ++s)
      diff += pa[static_cast<std::size_t>(l.slot_offset(i, t, n) + s)] !=
              pb[static_cast<std::size_t>(l.slot_offset(j, t, n) + s)];
  CHECK(diff == 0);
  const std::int32_t oa = a.row_to_overflow().host_span()[static_cast<std::size_t>(i)];
  const std::int32_t ob = b.row_to_overflow().host_span()[static_cast<std::size_t>(j)];
  REQUIRE((oa >= 0) == (ob >= 0));
  if (oa >= 0)
    CHECK(std::memcmp(a.overflow().view().data + oa * n, b.overflow().view().data + ob * n,
                      static_cast<std::size_t>(n) * sizeof(T)) == 0);
}

}  // namespace

// FusedMainloop::best_decode_split at decode-sized M and K > 448: on an H100/H200 the split-K
// kernel (4 CTAs a TwELL tile, K summed in 4 ranges added in K order). Its values may differ from
// the unsplit kernel's in the last bits, so it is held to the reference and to best with the
// tolerance of the mainloop comparison; to itself bitwise (poisoned repeats, and a row's bits
// whatever M <= 64 it is computed in); and where it must not split (a hybrid block of fewer than
// M rows), to best bitwise.
TEST_CASE_TEMPLATE("GemmToSparsePlan with best_decode_split: the split-K decode kernel at M <= 64, K > 448", T, bf16,
                   fp16) {
  struct Policy {
    OverflowPolicy policy;
    std::int32_t compression;  // 8: most rows overflow (the block filled from spills); 1: none does
    std::int64_t capacity;
  };
  const auto cap = cuda::GemmToSparsePlan<T>::kDefaultCapacity;  // M rows at M <= 64: the split's rule holds
  // M = 13 and 45: a warp whose lanes differ on their second fragment row (rows r0 + 8 below M or
  // not); K = 4096 at tile 128: 16 K steps a CTA, the 8-stage ring wrapped twice.
  for (const Shape s : testing::sweep({Shape{1, 2048, 5632, 256}, Shape{13, 520, 1000, 256}, Shape{45, 4096, 520, 128},
                                       Shape{64, 2048, 1408, 256}})) {
    const std::uint64_t seed = testing::fresh_seed();
    CAPTURE(seed);
    CAPTURE(s.m);
    CAPTURE(s.k);
    CAPTURE(s.n);
    CAPTURE(s.tile);
    const auto c = random_case<T>(s.m, s.k, s.n, seed);
    const auto xd = c.x.to(MemorySpace::device), wd = c.w.to(MemorySpace::device);
    const auto other = testing::random_dense<T>(s.m, s.k, 1.0f, seed + 2).to(MemorySpace::device);
    const MatrixF xf = to_eigen<T>(c.x.view()), wf = to_eigen<T>(c.w.view());
    const MatrixF prod = xf * wf, abs_prod = xf.cwiseAbs() * wf.cwiseAbs();
    const std::optional<bool> split = testing::decode_split_expected(s.m, s.k, s.n, s.tile);
    for (const ActivationSpec act : {kActs[0], kActs[2]}) {
      CAPTURE(static_cast<int>(act.kind));
      for (const Policy p : {Policy{OverflowPolicy::hybrid, 8, cap}, Policy{OverflowPolicy::drop, 8, cap},
                             Policy{OverflowPolicy::error, 1, cap}, Policy{OverflowPolicy::hybrid, 8, 1}}) {
        if (p.capacity == 1 && s.m == 1) continue;  // a block of 1 row holds M = 1: it splits
        const TwellLayout layout{s.tile, p.compression};
        const bool may_split = p.policy != OverflowPolicy::hybrid || p.capacity != 1;
        CAPTURE(static_cast<int>(p.policy));
        CAPTURE(p.capacity);
        ConvertOptions conv;
        conv.overflow = p.policy;
        const HybridMatrix<T> ref = reference::gemm_to_sparse<T>(c.x.view(), c.w.view(), act, layout, conv);
        cuda::GemmToSparsePlan<T> best(s.m, s.k, s.n, act, layout, p.capacity, p.policy, {}, cuda::FusedMainloop::best);
        cuda::GemmToSparsePlan<T> plan(s.m, s.k, s.n, act, layout, p.capacity, p.policy, {},
                                       cuda::FusedMainloop::best_decode_split);
        std::string best_path, path;
        const HybridMatrix<T> want = run_poisoned_twice<T>(best, xd.view(), wd.view(), other.view(), best_path);
        const HybridMatrix<T> got = run_poisoned_twice<T>(plan, xd.view(), wd.view(), other.view(), path);
        CAPTURE(best_path);
        CAPTURE(path);
        CHECK(best_path.find("_ksplit") == std::string::npos);
        const bool split_ran = path.find("_ksplit4") != std::string::npos;
        if (!may_split) CHECK_FALSE(split_ran);
        if (may_split && split) CHECK(split_ran == *split);
        // Every block row came from the gate's own spills.
        if (split_ran && got.overflow_rows() > 0) CHECK(path.find("+overflow:spilled") != std::string::npos);
        if (!split_ran) {
          check_bitwise_equal(got, want);
          continue;
        }
        const MatrixF dense = decode_checked(got);  // shadow counts exact: the block matches the slots
        const Outcome o = compare<T>(decode_checked(ref), dense, prod, abs_prod, act);
        CAPTURE(o.stored);
        CAPTURE(o.ambiguous);
        CHECK(o.wrong == 0);
        CHECK(o.ambiguous <= 2 + o.stored / 1000);
        const Outcome vs_best = compare<T>(decode_checked(want), dense, prod, abs_prod, act);
        CAPTURE(vs_best.ambiguous);
        CHECK(vs_best.wrong == 0);
        CHECK(vs_best.ambiguous <= 2 + vs_best.stored / 1000);

        // The first and last rows alone (M = 1, also split): the same bits as inside M rows.
        if (s.m == 1) continue;
        for (const std::int64_t i : {std::int64_t{0}, s.m - 1}) {
          const DenseView<const T> row{xd.view().data + i * xd.view().ld, 1, s.k, xd.view().ld, MemorySpace::device};
          const DenseView<const T> row_other{other.view().data, 1, s.k, other.view().ld, MemorySpace::device};
          cuda::GemmToSparsePlan<T> one(1, s.k, s.n, act, layout, p.capacity, p.policy, {},
                                        cuda::FusedMainloop::best_decode_split);
          std::string one_path;
          const HybridMatrix<T> alone = run_poisoned_twice<T>(one, row, wd.view(), row_other, one_path);
          CAPTURE(one_path);
          REQUIRE(one_path.find("_ksplit4") != std::string::npos);
          check_row_bits(got, i, alone, 0);
        }
      }
    }
  }
}

// The split's bits contract: K steps in 4 contiguous ranges (here 512 each) added in rank order.
// One row whose four range sums are exact, 2^24, 1, 1 and -2^24, adds to 0 only in that order
// (2^24 + 1 rounds to 2^24, twice): column 0 stores nothing, where the reverse order, or P0 and
// P3 first, would store 2. Column 1 (1 in ranges 1 and 2) must store 2 exactly.
TEST_CASE_TEMPLATE("best_decode_split adds its K ranges in K order", T, bf16, fp16) {
  constexpr std::int64_t k = 2048, n = 256;
  auto c = random_case<T>(1, k, n, testing::fresh_seed());
  auto xv = c.x.view();
  auto wv = c.w.view();
  for (std::int64_t i = 0; i < k; ++i) {
    xv.at(0, i) = from_float<T>(0.0f);
    for (std::int64_t j = 0; j < n; ++j) wv.at(i, j) = from_float<T>(0.0f);
  }
  const auto put = [&](std::int64_t at, float x, float w0, float w1) {
    xv.at(0, at) = from_float<T>(x);
    wv.at(at, 0) = from_float<T>(w0);
    wv.at(at, 1) = from_float<T>(w1);
  };
  put(511, 4096.0f, 4096.0f, 0.0f);    // range 0 (its last k): 2^24
  put(512, 1.0f, 1.0f, 1.0f);          // range 1: 1
  put(1024, 1.0f, 1.0f, 1.0f);         // range 2: 1
  put(1536, 4096.0f, -4096.0f, 0.0f);  // range 3: -2^24
  const auto xd = c.x.to(MemorySpace::device), wd = c.w.to(MemorySpace::device);
  cuda::GemmToSparsePlan<T> plan(1, k, n, kActs[0], TwellLayout{256, 8}, cuda::GemmToSparsePlan<T>::kDefaultCapacity,
                                 OverflowPolicy::drop, {}, cuda::FusedMainloop::best_decode_split);
  plan.run(xd.view(), wd.view());  // a first run, so that the result exists to be poisoned
  (void)plan.sync_overflow_count();
  poison(plan);
  plan.run(xd.view(), wd.view());
  (void)plan.sync_overflow_count();
  const std::string path = plan.path();
  CAPTURE(path);
  if (testing::decode_split_expected(1, k, n, 256).value_or(false)) REQUIRE(path.find("_ksplit4") != std::string::npos);
  const MatrixF got = decode_checked(to_host(plan.result()));
  CHECK(got(0, 0) == 0.0f);
  CHECK(got(0, 1) == 2.0f);
}
