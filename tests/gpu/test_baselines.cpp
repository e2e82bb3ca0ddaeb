// Baselines (cuSPARSE SpMM for every algorithm it accepts, SDDMM, DenseToSparse allocating and into
// a plan's arrays; cuBLAS GEMM, cuBLASLt ReLU GEMM, the dense gated FFN) against twell::reference
// or fp64 loops on the same fresh random input, with outputs poisoned before each run.
#include <doctest/doctest.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <limits>
#include <optional>
#include <string>
#include <vector>

#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <twell/converters/backends.hpp>
#include <twell/formats/copy.hpp>
#include <twell/kernels/backends.hpp>
#include <twell/kernels/baselines.hpp>
#include <twell/kernels/ffn.hpp>

#include "checks.hpp"
#include "device.hpp"
#include "device_pool.hpp"
#include "fixtures.hpp"
#include "random.hpp"

using namespace twell;
namespace ref = twell::reference;

namespace {

constexpr MemorySpace kHost = MemorySpace::host;
constexpr MemorySpace kDevice = MemorySpace::device;

using testing::nan_dense;
using testing::relative_bound;

template <class T>
double rel(const DenseMatrix<T>& got, const DenseMatrix<T>& want) {
  return testing::relative_error<T, T>(got.view(), want.view());
}

// fp64 C = alpha * op(A) op(B) + beta * C0, rounded once into T.
template <class T>
DenseMatrix<T> gemm64(Op op_a, const DenseMatrix<T>& a, Op op_b, const DenseMatrix<T>& b, const DenseMatrix<T>& c0,
                      float alpha, float beta, bool relu = false) {
  const bool ta = op_a == Op::transpose, tb = op_b == Op::transpose;
  const std::int64_t m = ta ? a.cols() : a.rows(), k = ta ? a.rows() : a.cols(), n = tb ? b.rows() : b.cols();
  DenseMatrix<T> out(m, n);
  for (std::int64_t i = 0; i < m; ++i)
    for (std::int64_t j = 0; j < n; ++j) {
      double s = 0.0;
      for (std::int64_t p = 0; p < k; ++p)
        s += double{to_float(ta ? a.view().at(p, i) : a.view().at(i, p))} *
             double{to_float(tb ? b.view().at(j, p) : b.view().at(p, j))};
      double v = alpha * s;
      if (beta != 0.0f) v += beta * double{to_float(c0.view().at(i, j))};
      if (relu && v < 0.0) v = 0.0;
      out.view().at(i, j) = from_float<T>(static_cast<float>(v));
    }
  return out;
}

}  // namespace

TEST_CASE_TEMPLATE("cuSPARSE SpMM plans match the reference for every accepted algorithm", T, bf16, fp16, float) {
  baseline::Handles handles;
  struct Case {
    std::int64_t m, k, n;
    double density;
  };
  const std::vector<Case> cases = {{1, 1, 1, 1.0}, {33, 70, 16, 0.05}, {128, 5632 / 4, 64, 0.005}, {64, 96, 40, 0.5}};
  for (const Case& c : cases) {
    for (const baseline::SparseStorage storage : {baseline::SparseStorage::csr, baseline::SparseStorage::coo}) {
      for (const Op op : {Op::none, Op::transpose}) {
        const std::uint64_t seed = testing::fresh_seed();
        CAPTURE(seed);
        CAPTURE(c.m);
        CAPTURE(c.k);
        CAPTURE(c.n);
        CAPTURE(c.density);
        const bool tr = op == Op::transpose;
        CAPTURE(tr);
        CAPTURE(static_cast<int>(storage));
        testing::SparseDenseOptions so;
        so.density = c.density;
        const auto a_dense = testing::random_sparse_dense<T>(tr ? c.k : c.m, tr ? c.m : c.k, so, seed);
        const CsrMatrix<T> a = ref::dense_to_csr<T>(a_dense.view());
        const auto b = testing::random_dense<T>(c.k, c.n, 1.0f, seed + 1);
        const auto c0 = testing::random_dense<T>(c.m, c.n, 1.0f, seed + 2);
        const auto a_dev = a.to(kDevice);
        const auto b_dev = b.to(kDevice);
        DenseMatrix<T> probe(c.m, c.n, kDevice);
        const auto algorithms =
            baseline::supported_spmm_algorithms<T>(handles, op, a_dev.view(), storage, b_dev.view(), probe.view());
        MESSAGE(to_string(dtype_of<T>), tr ? " op T" : " op N",
                storage == baseline::SparseStorage::csr ? " CSR" : " COO", ": ", algorithms.size(), " of ",
                baseline::spmm_algorithms(storage).size(), " algorithms accepted");
        if (!tr || std::is_same_v<T, float>) CHECK(!algorithms.empty());
        for (const baseline::SpmmAlgorithm alg : algorithms) {
          CAPTURE(std::string(baseline::to_string(alg)));
          for (const auto& [alpha, beta] : {std::pair{1.0f, 0.0f}, std::pair{0.5f, -1.0f}}) {
            CAPTURE(alpha);
            CAPTURE(beta);
            DenseMatrix<T> want = beta == 0.0f ? nan_dense<T>(c.m, c.n) : c0.to(kHost);
            ref::spmm<T>(op, a.view(), b.view(), want.view(), alpha, beta);
            DenseMatrix<T> out = beta == 0.0f ? nan_dense<T>(c.m, c.n).to(kDevice) : c0.to(kDevice);
            baseline::SpmmPlan<T> plan(handles, op, a_dev.view(), storage, alg, b_dev.view(), out.view(), alpha, beta);
            plan.run();
            REQUIRE(cudaDeviceSynchronize() == cudaSuccess);
            CHECK(rel(out.to(kHost), want) <= relative_bound<T>());
          }
        }
      }
    }
  }
}

// Both Fp32Copies modes; with `once`, A and B are poisoned after the plan is built, so a run that
// still read them (or fp32 copies never made) gives NaN.
TEST_CASE_TEMPLATE("cuSPARSE SDDMM plan matches the reference", T, bf16, float) {
  baseline::Handles handles;
  const std::pair<baseline::Fp32Copies, Op> runs[] = {{baseline::Fp32Copies::every_run, Op::none},
                                                      {baseline::Fp32Copies::every_run, Op::transpose},
                                                      {baseline::Fp32Copies::once, Op::none},
                                                      {baseline::Fp32Copies::once, Op::transpose}};
  for (const auto& [copies, op_b] : runs) {
    CAPTURE(static_cast<int>(copies));
    for (const double density : {0.0, 0.01, 0.2, 1.0}) {
      const std::uint64_t seed = testing::fresh_seed();
      CAPTURE(seed);
      CAPTURE(density);
      const bool tr = op_b == Op::transpose;
      CAPTURE(tr);
      const std::int64_t m = 45, k = 64, n = 70;
      testing::SparseDenseOptions so;
      so.density = density;
      const CsrMatrix<T> pattern = ref::dense_to_csr<T>(testing::random_sparse_dense<T>(m, n, so, seed).view());
      const auto a = testing::random_dense<T>(m, k, 1.0f, seed + 1);
      const auto b =
          tr ? testing::random_dense<T>(n, k, 1.0f, seed + 2) : testing::random_dense<T>(k, n, 1.0f, seed + 2);
      for (const auto& [alpha, beta] : {std::pair{1.0f, 0.0f}, std::pair{-0.5f, 2.0f}}) {
        CsrMatrix<T> want = pattern.to(kHost);
        ref::sddmm<T>(a.view(), op_b, b.view(), pattern.view(), want.view(), alpha, beta);
        CsrMatrix<T> out = pattern.to(kDevice);
        if (beta == 0.0f) testing::poison_device(out.values());
        auto a_dev = a.to(kDevice);
        auto b_dev = b.to(kDevice);
        baseline::SddmmPlan<T> plan(handles, a_dev.view(), op_b, b_dev.view(), out.view(), alpha, beta, copies);
        MESSAGE(to_string(dtype_of<T>), plan.native() ? ": native SDDMM" : ": SDDMM through fp32 copies");
        if (!plan.native() && copies == baseline::Fp32Copies::once) {
          REQUIRE(cudaDeviceSynchronize() == cudaSuccess);  // the copies are made on the handles' stream
          testing::poison_device(a_dev.values());
          testing::poison_device(b_dev.values());
        }
        plan.run();
        REQUIRE(cudaDeviceSynchronize() == cudaSuccess);
        const auto got = ref::csr_to_dense<T>(out.to(kHost).view());
        CHECK(rel(got, ref::csr_to_dense<T>(want.view())) <= relative_bound<T>());
      }
    }
  }
}

// Orders each row's (column, value) pairs by column, in place, on a host CSR.
template <class T>
void sort_columns_within_rows(CsrMatrix<T>& m) {
  auto ptr = m.row_ptr().host_span();
  auto col = m.col_idx().host_span();
  auto val = m.values().host_span();
  std::vector<std::pair<std::int32_t, T>> row;
  for (std::int64_t i = 0; i < m.rows(); ++i) {
    row.clear();
    for (auto e = ptr[i]; e < ptr[i + 1]; ++e) row.emplace_back(col[e], val[e]);
    std::sort(row.begin(), row.end(), [](const auto& a, const auto& b) { return a.first < b.first; });
    for (std::size_t k = 0; k < row.size(); ++k) {
      col[ptr[i] + static_cast<std::int64_t>(k)] = row[k].first;
      val[ptr[i] + static_cast<std::int64_t>(k)] = row[k].second;
    }
  }
}

// A CSR from cuSPARSE against the reference's of the same dense matrix: the same row_ptr, the same
// columns once sorted within rows (cuSPARSE does not promise the order), and values that rebuild
// the dense matrix bit for bit.
template <class T>
void check_csr_of(CsrMatrix<T> got, const DenseMatrix<T>& d) {
  const CsrMatrix<T> want = ref::dense_to_csr<T>(d.view());
  sort_columns_within_rows(got);
  REQUIRE(got.nnz() == want.nnz());
  const auto gp = got.row_ptr().host_span(), wp = want.row_ptr().host_span();
  CHECK(std::equal(gp.begin(), gp.end(), wp.begin(), wp.end()));
  const auto gc = got.col_idx().host_span(), wc = want.col_idx().host_span();
  CHECK(std::equal(gc.begin(), gc.end(), wc.begin(), wc.end()));
  CHECK(testing::bitwise_equal<T>(ref::csr_to_dense<T>(got.view()).view(), d.view()));
}

TEST_CASE_TEMPLATE("cuSPARSE DenseToSparse plan matches the reference converter", T, bf16, fp16, float) {
  baseline::Handles handles;
  for (const double density : {0.0, 0.005, 0.3, 1.0}) {
    const std::uint64_t seed = testing::fresh_seed();
    CAPTURE(seed);
    CAPTURE(density);
    testing::SparseDenseOptions so;
    so.density = density;
    const auto d = testing::random_sparse_dense<T>(77, 301, so, seed);
    const auto d_dev = d.to(kDevice);
    baseline::DenseToCsrPlan<T> plan(handles, d_dev.view());
    check_csr_of(plan.run_allocating().to(kHost), d);
    check_csr_of(copy_to(plan.run(), kHost), d);
  }
}

// One plan over a sequence of matrices written into its source: its arrays grow only when a count
// passes them (to max(nnz, twice their size), at most rows x cols), and each run rewrites all it
// returns (the previous result's arrays are poisoned before the next run).
TEST_CASE_TEMPLATE("cuSPARSE DenseToSparse plan reused: growth and rewritten arrays", T, bf16, fp16, float) {
  baseline::Handles handles;
  for (const auto& [rows, cols] : {std::array<std::int64_t, 2>{1, 1}, std::array<std::int64_t, 2>{130, 257}}) {
    CAPTURE(rows);
    CAPTURE(cols);
    DenseMatrix<T> src(rows, cols, kDevice);
    baseline::DenseToCsrPlan<T> plan(handles, DenseView<const T>(src.view()), 1);
    CHECK(plan.capacity() == 1);
    for (const double density : {0.01, 0.2, 0.05, 1.0, 0.0, 0.5}) {
      const std::uint64_t seed = testing::fresh_seed();
      CAPTURE(seed);
      CAPTURE(density);
      testing::SparseDenseOptions so;
      so.density = density;
      const auto d = testing::random_sparse_dense<T>(rows, cols, so, seed);
      REQUIRE(cudaMemcpy(src.values().data(), d.values().data(), d.values().bytes(), cudaMemcpyHostToDevice) ==
              cudaSuccess);
      const std::int64_t capacity = plan.capacity(), growths = plan.growths();
      const CsrView<const T> got = plan.run();
      check_csr_of(copy_to(got, kHost), d);
      const bool grew = got.nnz > capacity;
      CHECK(plan.growths() == growths + (grew ? 1 : 0));
      CHECK(plan.capacity() == (grew ? std::min(rows * cols, std::max(got.nnz, 2 * capacity)) : capacity));
      REQUIRE(cudaMemset(const_cast<std::int64_t*>(got.row_ptr), 0xFF, static_cast<std::size_t>(rows + 1) * 8) ==
              cudaSuccess);
      REQUIRE(cudaMemset(const_cast<std::int32_t*>(got.col_idx), 0xFF, static_cast<std::size_t>(got.nnz) * 4) ==
              cudaSuccess);
      REQUIRE(cudaMemset(const_cast<T*>(got.values), 0xFF, static_cast<std::size_t>(got.nnz) * sizeof(T)) ==
              cudaSuccess);
    }
    if (rows * cols > 1) CHECK(plan.growths() >= 1);  // a 1 x 1 plan holds its one entry from the start
  }
}

TEST_CASE("cuSPARSE DenseToSparse plan refuses host sources and negative capacities") {
  baseline::Handles handles;
  const DenseMatrix<float> host(3, 4);
  CHECK(testing::code_of([&] { baseline::DenseToCsrPlan<float>(handles, host.view()); }) == ErrorCode::space_mismatch);
  const DenseMatrix<float> dev(3, 4, kDevice);
  CHECK(testing::code_of([&] { baseline::DenseToCsrPlan<float>(handles, dev.view(), -1); }) ==
        ErrorCode::invalid_argument);
}

TEST_CASE_TEMPLATE("cuBLAS GEMM and cuBLASLt ReLU GEMM match fp64", T, bf16, fp16, float) {
  baseline::Handles handles;
  const std::vector<std::array<std::int64_t, 3>> shapes = {{1, 1, 1}, {17, 33, 9}, {128, 256, 64}};
  for (const auto& [m, k, n] : shapes) {
    for (const Op op_a : {Op::none, Op::transpose}) {
      for (const Op op_b : {Op::none, Op::transpose}) {
        const std::uint64_t seed = testing::fresh_seed();
        CAPTURE(seed);
        CAPTURE(m);
        CAPTURE(k);
        CAPTURE(n);
        const bool ta = op_a == Op::transpose, tb = op_b == Op::transpose;
        const auto a = ta ? testing::random_dense<T>(k, m, 1.0f, seed) : testing::random_dense<T>(m, k, 1.0f, seed);
        const auto b =
            tb ? testing::random_dense<T>(n, k, 1.0f, seed + 1) : testing::random_dense<T>(k, n, 1.0f, seed + 1);
        const auto c0 = testing::random_dense<T>(m, n, 1.0f, seed + 2);
        const auto want = gemm64<T>(op_a, a, op_b, b, c0, 0.75f, -0.5f);
        DenseMatrix<T> c = c0.to(kDevice);
        baseline::gemm<T>(handles, op_a, a.to(kDevice).view(), op_b, b.to(kDevice).view(), c.view(), 0.75f, -0.5f);
        REQUIRE(cudaDeviceSynchronize() == cudaSuccess);
        CHECK(rel(c.to(kHost), want) <= relative_bound<T>());
      }
    }
    const std::uint64_t seed = testing::fresh_seed();
    CAPTURE(seed);
    const auto a = testing::random_dense<T>(m, k, 1.0f, seed);
    const auto b = testing::random_dense<T>(k, n, 1.0f, seed + 1);
    const auto want = gemm64<T>(Op::none, a, Op::none, b, a, 1.0f, 0.0f, true);
    DenseMatrix<T> c = nan_dense<T>(m, n).to(kDevice);
    baseline::gemm_relu<T>(handles, a.to(kDevice).view(), b.to(kDevice).view(), c.view());
    REQUIRE(cudaDeviceSynchronize() == cudaSuccess);
    const auto got = c.to(kHost);
    CHECK(rel(got, want) <= relative_bound<T>());
    bool relu_applied = true;
    for (std::int64_t i = 0; i < m; ++i)
      for (std::int64_t j = 0; j < n; ++j) relu_applied = relu_applied && to_float(got.view().at(i, j)) >= 0.0f;
    CHECK(relu_applied);
  }
}

namespace {

// x (m x k) and the gated FFN's weights (wg, wu: k x n; wd: n x k), fresh random values.
template <class T>
std::array<DenseMatrix<T>, 4> random_ffn(std::int64_t m, std::int64_t k, std::int64_t n, std::uint64_t seed) {
  return {testing::random_dense<T>(m, k, 1.0f, seed), testing::random_dense<T>(k, n, 0.5f, seed + 1),
          testing::random_dense<T>(k, n, 0.5f, seed + 2), testing::random_dense<T>(n, k, 0.5f, seed + 3)};
}

}  // namespace

TEST_CASE_TEMPLATE("dense gated FFN baseline matches fp64 with the same roundings", T, bf16, fp16, float) {
  baseline::Handles handles;
  for (const auto& [m, k, n] : {std::array<std::int64_t, 3>{5, 16, 24}, std::array<std::int64_t, 3>{64, 96, 160}}) {
    const std::uint64_t seed = testing::fresh_seed();
    CAPTURE(seed);
    CAPTURE(m);
    const auto [x, wg, wu, wd] = random_ffn<T>(m, k, n, seed);
    // Host: g and u rounded into T, h = g * u rounded, y = h wd.
    const auto g = gemm64<T>(Op::none, x, Op::none, wg, x, 1.0f, 0.0f, true);
    const auto u = gemm64<T>(Op::none, x, Op::none, wu, x, 1.0f, 0.0f);
    DenseMatrix<T> h(m, n);
    for (std::int64_t i = 0; i < m; ++i)
      for (std::int64_t j = 0; j < n; ++j)
        h.view().at(i, j) = from_float<T>(to_float(g.view().at(i, j)) * to_float(u.view().at(i, j)));
    const auto want = gemm64<T>(Op::none, h, Op::none, wd, x, 1.0f, 0.0f);

    baseline::DenseFfnWorkspace<T> workspace(handles, m, n);
    DenseMatrix<T> y = nan_dense<T>(m, k).to(kDevice);
    const auto x_dev = x.to(kDevice), wg_dev = wg.to(kDevice), wu_dev = wu.to(kDevice), wd_dev = wd.to(kDevice);
    baseline::dense_gated_ffn_forward<T>(x_dev.view(), wg_dev.view(), wu_dev.view(), wd_dev.view(), y.view(),
                                         workspace);
    REQUIRE(cudaDeviceSynchronize() == cudaSuccess);
    CHECK(rel(y.to(kHost), want) <= 2 * relative_bound<T>());
  }
}

TEST_CASE_TEMPLATE("dense FFN training baseline matches the reference backward", T, bf16, float) {
  // The reference rounds only its outputs; the baseline rounds a, u, h, dh, dg, du to T as well.
  const double tol = std::is_same_v<T, float> ? 1e-4 : 4e-2;
  baseline::Handles handles;
  for (const auto& [m, k, n] : {std::array<std::int64_t, 3>{5, 16, 24}, std::array<std::int64_t, 3>{64, 96, 168},
                                std::array<std::int64_t, 3>{33, 40, 70}}) {
    const std::uint64_t seed = testing::fresh_seed();
    CAPTURE(seed);
    CAPTURE(m);
    const auto [x, wg, wu, wd] = random_ffn<T>(m, k, n, seed);
    auto dy = testing::random_dense<T>(m, k, 1.0f, seed + 4);
    for (std::int64_t j = 0; j < k; ++j) dy.view().at(0, j) = T{};  // only the L1 gradient in token 0
    const float lambda = 0.5f;
    const auto want = reference::gated_ffn_backward<T>(x.view(), wg.view(), wu.view(), wd.view(), dy.view(),
                                                       ActivationSpec{}, lambda, L1Normalization::per_token);
    DenseMatrix<T> y_want(m, k);
    reference::gated_ffn_forward<T>(x.view(), wg.view(), wu.view(), wd.view(), ActivationSpec{}, y_want.view());

    baseline::DenseFfnTrainingWorkspace<T> workspace(handles, m, n);
    const auto x_dev = x.to(kDevice), wg_dev = wg.to(kDevice), wu_dev = wu.to(kDevice), wd_dev = wd.to(kDevice);
    const auto dy_dev = dy.to(kDevice);
    DenseMatrix<T> y = nan_dense<T>(m, k).to(kDevice), dx = nan_dense<T>(m, k).to(kDevice);
    DenseMatrix<T> dwg = nan_dense<T>(k, n).to(kDevice), dwu = nan_dense<T>(k, n).to(kDevice);
    DenseMatrix<T> dwd = nan_dense<T>(n, k).to(kDevice);
    baseline::dense_gated_ffn_training_forward<T>(x_dev.view(), wg_dev.view(), wu_dev.view(), wd_dev.view(), y.view(),
                                                  workspace);
    // Twice: the backward must leave the forward's activations as it found them.
    for (int run = 0; run < 2; ++run)
      baseline::dense_gated_ffn_backward<T>(x_dev.view(), wg_dev.view(), wu_dev.view(), wd_dev.view(),
                                            dy_dev.view(), lambda / static_cast<float>(m), dx.view(), dwg.view(),
                                            dwu.view(), dwd.view(), workspace);
    REQUIRE(cudaDeviceSynchronize() == cudaSuccess);
    CHECK(rel(y.to(kHost), y_want) <= tol);
    CHECK(rel(dx.to(kHost), want.dx) <= tol);
    CHECK(rel(dwg.to(kHost), want.dwg) <= tol);
    CHECK(rel(dwu.to(kHost), want.dwu) <= tol);
    CHECK(rel(dwd.to(kHost), want.dwd) <= tol);
  }
}

// twell's pool keeps what its buffers free (memory.hpp), so at a process's peak it may hold nearly
// all of the device's memory when another library asks for some: cuSPARSE's, cuBLAS's and
// cuBLASLt's handles are made with one retry after the pool is trimmed (or get their memory from
// the driver, which has served cudaMalloc from a full pool's unused memory, docs/api.md; the case
// checks that they work, not which way), and the baselines' cuBLASLt workspace (32 MiB),
// allocated before them, comes from the pool itself.
TEST_CASE("baseline Handles can be made while twell's pool keeps nearly all device memory") {
  const testing::FilledDevice filled;
  CAPTURE(filled.free_bytes());
  std::optional<baseline::Handles> handles;
  CHECK_NOTHROW(handles.emplace());
  CHECK(cudaGetLastError() == cudaSuccess);
  // Whether a handle needed memory, and so a trim (the log says; cuBLAS's and cuSPARSE's needs
  // are theirs to change).
  MESSAGE("kept by the pool after the handles were made: ", twell::detail::kept_device_bytes(), " bytes");
  // The handles work, also on another stream (set_stream gives cuBLAS twell's workspace again).
  // Launches are not retried (a kernel's module, loaded lazily at its first launch, may need
  // memory too: docs/api.md), so the pool is emptied first.
  twell::release_cached_device_memory();
  REQUIRE(handles.has_value());
  cudaStream_t stream = nullptr;
  testing::cuda_ok(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  handles->set_stream(Stream{stream});
  const std::uint64_t seed = testing::fresh_seed();
  CAPTURE(seed);
  const auto a = testing::random_dense<float>(33, 17, 1.0f, seed);
  const auto b = testing::random_dense<float>(17, 9, 1.0f, seed + 1);
  DenseMatrix<float> c = nan_dense<float>(33, 9).to(kDevice);
  baseline::gemm<float>(*handles, Op::none, a.to(kDevice).view(), Op::none, b.to(kDevice).view(), c.view(), 1.0f, 0.0f);
  REQUIRE(cudaDeviceSynchronize() == cudaSuccess);
  CHECK(rel(c.to(kHost), gemm64<float>(Op::none, a, Op::none, b, c.to(kHost), 1.0f, 0.0f)) <= relative_bound<float>());
  handles.reset();
  testing::cuda_ok(cudaStreamDestroy(stream));
}

// White-box (lib/src/device_pool.hpp): a library call that reports out-of-memory is run once more
// after the current device's pool gave its kept memory back; one that succeeds, or fails for
// another reason, runs once.
TEST_CASE("a library call that runs out of memory is retried once after twell's pool is trimmed") {
  constexpr std::size_t kBytes = std::size_t{64} << 20;
  { const Buffer<unsigned char> freed(kBytes, kDevice); }
  testing::cuda_ok(cudaDeviceSynchronize());
  const std::uint64_t before = twell::detail::kept_device_bytes();
  REQUIRE(before >= kBytes);
  int calls = 0;
  std::uint64_t kept_at_retry = before;
  const auto fails_once = [&] {
    if (++calls == 1) return CUBLAS_STATUS_ALLOC_FAILED;
    kept_at_retry = twell::detail::kept_device_bytes();
    return CUBLAS_STATUS_SUCCESS;
  };
  CHECK(twell::detail::retry_after_trim(fails_once, CUBLAS_STATUS_ALLOC_FAILED, "test") == CUBLAS_STATUS_SUCCESS);
  CHECK(calls == 2);
  CHECK(kept_at_retry + kBytes / 2 <= before);
  calls = 0;
  const auto fails_otherwise = [&] {
    ++calls;
    return CUBLAS_STATUS_NOT_SUPPORTED;
  };
  CHECK(twell::detail::retry_after_trim(fails_otherwise, CUBLAS_STATUS_ALLOC_FAILED, "test") ==
        CUBLAS_STATUS_NOT_SUPPORTED);
  CHECK(calls == 1);
}
