// twell::cuda converters against twell::reference on the same fresh random inputs: every
// conversion, every value type, tiny / ragged / paper-like shapes, densities 0 to 100 %,
// NaN/Inf/-0.0, thresholds, all overflow policies (same errors, same reports), results compared
// bit for bit (padding and unused slots included) and validated.
#include <doctest/doctest.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include <cuda_runtime.h>

#include <twell/convert.hpp>
#include <twell/converters/backends.hpp>
#include <twell/converters/hybrid_plan.hpp>
#include <twell/formats/copy.hpp>
#include <twell/formats/validate.hpp>
#include <twell/ops.hpp>

#include "checks.hpp"
#include "device.hpp"
#include "random.hpp"
#include "same.hpp"
#include "sweep.hpp"

namespace {

using namespace twell;
using twell::testing::cuda_ok;
using twell::testing::expect_same;
using twell::testing::fresh_seed;
using twell::testing::random_sparse_dense;
using twell::testing::SparseDenseOptions;

constexpr MemorySpace kHost = MemorySpace::host;
constexpr MemorySpace kDevice = MemorySpace::device;

// Device outputs come from twell's pool, which hands out what earlier frees left in it (an
// earlier, correct result of the same conversion among them, in the free part of a chunk that a
// live operand keeps): have every uninitialised device Buffer filled with 0xFF when made, so
// that an output word a kernel forgets to write shows. (TwELL outputs of the cuda converters are
// allocated without zero fill, so this matters for them.)
void poison_new_device_buffers() { twell::detail::set_uninitialized_device_fill(0xff); }

// The message without its "twell::<backend>::<function>: " prefix.
std::string body(const Error& e) {
  const std::string m = e.what();
  const auto colon = m.find(": ");
  return colon == std::string::npos ? m : m.substr(colon + 2);
}

// Runs the reference on host operands and the cuda backend on their device copies, with the
// same options; both must throw the same error or return bit-identical, valid results and the
// same report.
template <class Ref, class Gpu>
void compare(const char* what, const ConvertOptions& options, Ref&& ref, Gpu&& gpu) {
  CAPTURE(what);
  ConvertOptions ref_options = options;
  ConvertOptions gpu_options = options;
  ConvertReport ref_report{-1, -1, -1};
  ConvertReport gpu_report{-2, -2, -2};
  ref_options.report = &ref_report;
  gpu_options.report = &gpu_report;
  bool ref_threw = false;
  ErrorCode ref_code{};
  std::string ref_message;
  decltype(ref(ref_options)) want;
  try {
    want = ref(ref_options);
  } catch (const Error& e) {
    ref_threw = true;
    ref_code = e.code();
    ref_message = body(e);
  }
  poison_new_device_buffers();
  if (ref_threw) {
    bool gpu_threw = false;
    try {
      (void)gpu(gpu_options);
    } catch (const Error& e) {
      gpu_threw = true;
      CHECK(e.code() == ref_code);
      CHECK(body(e) == ref_message);
    }
    CHECK_MESSAGE(gpu_threw, "the reference threw: ", ref_message);
    return;
  }
  const auto got_device = gpu(gpu_options);
  REQUIRE(got_device.space() == kDevice);
  CHECK_NOTHROW(validate(got_device.view()));
  const auto got = got_device.to(kHost);
  expect_same(got, want);
  CHECK(gpu_report.nnz == ref_report.nnz);
  CHECK(gpu_report.dropped == ref_report.dropped);
  CHECK(gpu_report.overflow_rows == ref_report.overflow_rows);
}

// compare() of one conversion: ref::fn on `host` and gpu::fn on `device`, each followed by the
// extra arguments (a layout) and the options. Needs the namespace aliases ref and gpu in scope.
#define COMPARE_CONVERSION(fn, options, host, device, ...)                                     \
  compare(                                                                                     \
      #fn, options, [&](auto opts) { return ref::fn(host, __VA_ARGS__ __VA_OPT__(, ) opts); }, \
      [&](auto opts) { return gpu::fn(device, __VA_ARGS__ __VA_OPT__(, ) opts); })

// Every conversion of the signatures, from sources that all describe the same host matrix.
template <Value T>
void check_all(const DenseMatrix<T>& dense, TwellLayout layout, TwellLayout relayout, const ConvertOptions& options) {
  namespace ref = twell::reference;
  namespace gpu = twell::cuda;
  CAPTURE(dense.rows());
  CAPTURE(dense.cols());
  CAPTURE(layout.tile);
  CAPTURE(layout.compression);
  CAPTURE(options.threshold);
  CAPTURE(static_cast<int>(options.overflow));
  const auto d_dense = dense.to(kDevice);
  const auto h_dense = dense.view();
  const auto g_dense = d_dense.view();

  // Sources of the other formats: built by the reference (drop keeps the TwELL valid).
  ConvertOptions plain;
  ConvertOptions dropping;
  dropping.overflow = OverflowPolicy::drop;
  const auto csr = ref::dense_to_csr(h_dense, plain);
  const auto ell = ref::dense_to_ell(h_dense, plain);
  const auto twell = ref::dense_to_twell(h_dense, layout, dropping);
  const auto hybrid = ref::dense_to_hybrid(h_dense, layout, plain);
  const auto d_csr = csr.to(kDevice);
  const auto d_ell = ell.to(kDevice);
  const auto d_twell = twell.to(kDevice);
  const auto d_hybrid = hybrid.to(kDevice);

  // Into ELL and TwELL the caller's overflow policy applies; elsewhere only the threshold.
  COMPARE_CONVERSION(dense_to_csr, options, h_dense, g_dense);
  COMPARE_CONVERSION(dense_to_ell, options, h_dense, g_dense);
  COMPARE_CONVERSION(dense_to_twell, options, h_dense, g_dense, layout);
  COMPARE_CONVERSION(dense_to_hybrid, options, h_dense, g_dense, layout);

  COMPARE_CONVERSION(csr_to_dense, options, csr.view(), d_csr.view());
  COMPARE_CONVERSION(csr_to_ell, options, csr.view(), d_csr.view());
  COMPARE_CONVERSION(csr_to_csr, options, csr.view(), d_csr.view());
  COMPARE_CONVERSION(csr_to_twell, options, csr.view(), d_csr.view(), layout);
  COMPARE_CONVERSION(csr_to_hybrid, options, csr.view(), d_csr.view(), layout);

  COMPARE_CONVERSION(ell_to_dense, options, ell.view(), d_ell.view());
  COMPARE_CONVERSION(ell_to_csr, options, ell.view(), d_ell.view());

  COMPARE_CONVERSION(twell_to_dense, options, twell.view(), d_twell.view());
  COMPARE_CONVERSION(twell_to_csr, options, twell.view(), d_twell.view());
  COMPARE_CONVERSION(twell_to_hybrid, options, twell.view(), d_twell.view(), relayout);

  COMPARE_CONVERSION(hybrid_to_dense, options, hybrid.view(), d_hybrid.view());
  COMPARE_CONVERSION(hybrid_to_csr, options, hybrid.view(), d_hybrid.view());
  COMPARE_CONVERSION(hybrid_to_twell, options, hybrid.view(), d_hybrid.view(), relayout);
}

ConvertOptions with(float threshold, OverflowPolicy policy, std::int64_t ell_width = -1) {
  ConvertOptions o;
  o.threshold = threshold;
  o.overflow = policy;
  o.ell_width = ell_width;
  return o;
}

constexpr OverflowPolicy kPolicies[] = {OverflowPolicy::error, OverflowPolicy::drop};

// A bf16 matrix at 2 % density with 5 % of its rows full, so that TwELL and Hybrid layouts
// overflow.
DenseMatrix<bf16> overflowing_bf16(std::int64_t rows, std::int64_t cols, std::uint64_t seed) {
  SparseDenseOptions spec;
  spec.density = 0.02;
  spec.full_row_share = 0.05;
  return random_sparse_dense<bf16>(rows, cols, spec, seed);
}

}  // namespace

TEST_CASE_TEMPLATE("cuda converters match the reference: tiny and ragged shapes, all densities", T, bf16, fp16, float) {
  const std::pair<std::int64_t, std::int64_t> shapes[] = {{1, 1},    {1, 7}, {3, 257}, {17, 1000},
                                                          {5, 5633}, {0, 9}, {4, 0}};
  const double densities[] = {0.0, 0.005, 0.05, 0.5, 1.0};
  // 256 and 128 take the tiled 16-bit kernel where rows are 16-byte aligned (cols 1000), the
  // others (and unaligned rows) the generic one.
  const TwellLayout layouts[] = {{256, 8}, {128, 4}, {64, 4}, {8, 4}};
  for (const auto& [rows, cols] : testing::sweep(shapes))
    for (double density : testing::sweep(densities))
      for (const TwellLayout layout : testing::sweep(layouts)) {
        const std::uint64_t seed = fresh_seed();
        CAPTURE(seed);
        CAPTURE(density);
        SparseDenseOptions spec;
        spec.density = density;
        spec.specials = true;
        const auto dense = random_sparse_dense<T>(rows, cols, spec, seed);
        for (OverflowPolicy policy : kPolicies) check_all(dense, layout, TwellLayout{128, 4}, with(0.0f, policy));
      }
}

TEST_CASE_TEMPLATE("cuda converters match the reference: thresholds", T, bf16, fp16, float) {
  for (float threshold : {0.25f, 1.0f, 1.9f})
    for (std::int64_t cols : {700, 704}) {  // unaligned rows (generic kernel), aligned (tiled 16-bit kernel)
      const std::uint64_t seed = fresh_seed();
      CAPTURE(seed);
      CAPTURE(cols);
      SparseDenseOptions spec;
      spec.density = 0.3;
      spec.specials = true;
      const auto dense = random_sparse_dense<T>(33, cols, spec, seed);
      for (OverflowPolicy policy : kPolicies)
        check_all(dense, TwellLayout{256, 16}, TwellLayout{64, 8}, with(threshold, policy));
    }
}

TEST_CASE_TEMPLATE("cuda converters match the reference: skewed rows that overflow", T, bf16, fp16, float) {
  // A share of full rows overflows every tile; sparse rows around them do not.
  for (const auto& [rows, cols] : {std::pair<std::int64_t, std::int64_t>{40, 1000}, {300, 5632}}) {
    const std::uint64_t seed = fresh_seed();
    CAPTURE(seed);
    SparseDenseOptions spec;
    spec.density = 0.01;
    spec.full_row_share = 0.1;
    spec.empty_row_share = 0.1;
    spec.specials = true;
    const auto dense = random_sparse_dense<T>(rows, cols, spec, seed);
    for (OverflowPolicy policy : kPolicies)
      check_all(dense, TwellLayout{256, 8}, TwellLayout{128, 16}, with(0.0f, policy));
  }
}

TEST_CASE_TEMPLATE("cuda converters match the reference: paper-like shape", T, bf16, fp16, float) {
  const std::uint64_t seed = fresh_seed();
  CAPTURE(seed);
  SparseDenseOptions spec;
  spec.density = 0.005;
  spec.full_row_share = 0.002;
  const auto dense = random_sparse_dense<T>(2048, 5632, spec, seed);
  check_all(dense, TwellLayout{256, 8}, TwellLayout{128, 8}, with(0.0f, OverflowPolicy::drop));
  check_all(dense, TwellLayout{256, 4}, TwellLayout{256, 8}, with(0.0f, OverflowPolicy::error));
}

TEST_CASE_TEMPLATE("cuda ELL with a fixed width: error names the same row, drop counts the same", T, bf16, fp16,
                   float) {
  namespace ref = twell::reference;
  namespace gpu = twell::cuda;
  const std::uint64_t seed = fresh_seed();
  CAPTURE(seed);
  SparseDenseOptions spec;
  spec.density = 0.05;
  const auto dense = random_sparse_dense<T>(50, 300, spec, seed);
  const auto d_dense = dense.to(kDevice);
  const auto csr = ref::dense_to_csr(dense.view());
  const auto d_csr = csr.to(kDevice);
  // 300: padded far past the longest row, as wide as the columns; 301 and more is refused.
  for (std::int64_t width : {0, 3, 12, 300})
    for (OverflowPolicy policy : {OverflowPolicy::error, OverflowPolicy::drop, OverflowPolicy::hybrid}) {
      CAPTURE(width);
      const ConvertOptions o = with(0.0f, policy, width);
      COMPARE_CONVERSION(dense_to_ell, o, dense.view(), d_dense.view());
      COMPARE_CONVERSION(csr_to_ell, o, csr.view(), d_csr.view());
    }
  const ConvertOptions too_wide = with(0.0f, OverflowPolicy::drop, 301);
  CHECK(testing::code_of([&] { (void)gpu::dense_to_ell(d_dense.view(), too_wide); }) == ErrorCode::invalid_argument);
  CHECK(testing::code_of([&] { (void)gpu::csr_to_ell(d_csr.view(), too_wide); }) == ErrorCode::invalid_argument);
}

TEST_CASE_TEMPLATE("cuda dense -> TwELL reads strided and unaligned views", T, bf16, fp16, float) {
  namespace ref = twell::reference;
  namespace gpu = twell::cuda;
  const std::uint64_t seed = fresh_seed();
  CAPTURE(seed);
  SparseDenseOptions spec;
  spec.density = 0.2;
  const auto dense = random_sparse_dense<T>(20, 320, spec, seed);
  const auto d_dense = dense.to(kDevice);
  // Column windows: aligned starts with ld 320, then a start one element in (not 16-byte aligned).
  for (std::int64_t first : {0, 8, 1})
    for (std::int64_t cols : {256, 300, 311}) {
      if (first + cols > 320) continue;
      CAPTURE(first);
      CAPTURE(cols);
      const DenseView<const T> h{dense.view().data + first, 20, cols, 320, kHost};
      const DenseView<const T> g{d_dense.view().data + first, 20, cols, 320, kDevice};
      for (OverflowPolicy policy : kPolicies) {
        const ConvertOptions o = with(0.0f, policy);
        COMPARE_CONVERSION(dense_to_twell, o, h, g, TwellLayout{64, 2});
        COMPARE_CONVERSION(dense_to_hybrid, o, h, g, TwellLayout{64, 8});
        // Tiles of 256 and 128: the tiled 16-bit kernel when the window is 16-byte aligned (first
        // 0 or 8), with a lane's chunk cut by the window's end (cols 300, 311).
        COMPARE_CONVERSION(dense_to_twell, o, h, g, TwellLayout{256, 2});
        COMPARE_CONVERSION(dense_to_hybrid, o, h, g, TwellLayout{128, 8});
        COMPARE_CONVERSION(dense_to_csr, o, h, g);
      }
    }
}

TEST_CASE("cuda converters queue their work on options.stream") {
  namespace ref = twell::reference;
  namespace gpu = twell::cuda;
  const testing::NonBlockingStream owned_stream;
  const cudaStream_t stream = owned_stream.get();
  const std::uint64_t seed = fresh_seed();
  CAPTURE(seed);
  const auto dense = overflowing_bf16(500, 3000, seed);
  const auto d_dense = dense.to(kDevice);
  ConvertOptions o;
  o.stream.handle = stream;
  o.overflow = OverflowPolicy::drop;
  // The result is read on the legacy stream, so wait for the conversion's stream first.
  const auto synced = [&](auto m) {
    cuda_ok(cudaStreamSynchronize(stream));
    return m;
  };
  compare(
      "dense_to_twell", o, [&](auto x) { return ref::dense_to_twell(dense.view(), TwellLayout{}, x); },
      [&](auto x) { return synced(gpu::dense_to_twell(d_dense.view(), TwellLayout{}, x)); });
  compare(
      "dense_to_hybrid", o, [&](auto x) { return ref::dense_to_hybrid(dense.view(), TwellLayout{}, x); },
      [&](auto x) { return synced(gpu::dense_to_hybrid(d_dense.view(), TwellLayout{}, x)); });
  compare(
      "dense_to_csr", o, [&](auto x) { return ref::dense_to_csr(dense.view(), x); },
      [&](auto x) { return synced(gpu::dense_to_csr(d_dense.view(), x)); });
  ConvertOptions quiet = o;
  quiet.report = nullptr;  // drop without a report: nothing read back, the call may return early
  const auto twell = synced(gpu::dense_to_twell(d_dense.view(), TwellLayout{}, quiet)).to(kHost);
  expect_same(twell, ref::dense_to_twell(dense.view(), TwellLayout{}, quiet));
}

// Sources as twell's own kernels leave them (sddmm and elementwise outputs): stored zeros, and
// -0.0 in a Hybrid's overflow rows. Every 3rd entry becomes 0, every 15th -0.0.
template <Value T>
void zero_every_third(T* values, std::int64_t n) {
  for (std::int64_t e = 0; e < n; e += 3) values[e] = from_float<T>(e % 5 != 0 ? 0.0f : -0.0f);
}

// The first entry of every other nonempty (row, tile) becomes 0.
template <Value T>
void zero_some_slots(TwellMatrix<T>& tw) {
  const TwellLayout& l = tw.layout();
  std::uint32_t* words = tw.packed().data();
  for (std::int64_t i = 0; i < tw.rows(); ++i)
    for (std::int64_t t = 0; t < l.tiles(tw.cols()); t += 2) {
      const std::int64_t at = l.slot_offset(i, t, tw.cols());
      if (words[at] == 0) continue;
      if constexpr (ValueTraits<T>::packs_in_slot) {
        words[at + 1] = TwellLayout::pack(0, TwellLayout::slot_column(words[at + 1]));
      } else {
        tw.value_plane().data()[at + 1] = 0.0f;
      }
    }
}

TEST_CASE_TEMPLATE("cuda same-format conversions re-build like the reference: stored zeros dropped, -0.0 as +0", T,
                   bf16, fp16, float) {
  const std::uint64_t seed = fresh_seed();
  CAPTURE(seed);
  const auto d = random_sparse_dense<T>(150, 700, {.density = 0.08}, seed);
  auto csr = to_csr(d);
  zero_every_third(csr.values().data(), csr.nnz());
  auto ell = to_ell(d);
  for (std::int64_t i = 0; i < ell.rows(); ++i)  // the stored entries only: padding must stay +0
    zero_every_third(ell.values().data() + i * ell.width(), ell.row_count().data()[i]);
  auto tw = to_twell(d, TwellLayout{256, 1});
  zero_some_slots(tw);
  const TwellLayout layout{32, 4};
  const auto with_full_rows = random_sparse_dense<T>(150, 700, {.density = 0.08, .full_row_share = 0.05}, seed + 1);
  auto hy = to_hybrid(with_full_rows, layout);
  REQUIRE(hy.overflow_rows() > 0);
  DenseView<T> block = hy.overflow().view();
  for (std::int64_t r = 0; r < block.rows; ++r)
    for (std::int64_t j = r % 7; j < block.cols; j += 7)
      if (!is_stored(block.at(r, j))) block.at(r, j) = from_float<T>(-0.0f);
  // The host re-builds these sources (they are not canonical); the device copied them as they were.
  CHECK(to_csr(csr).nnz() < csr.nnz());
  expect_same(to_csr(csr.to(kDevice)).to(kHost), to_csr(csr));
  const ConvertOptions same_width{.ell_width = ell.width()};
  expect_same(to_ell(ell.to(kDevice), same_width).to(kHost), to_ell(ell, same_width));
  expect_same(to_twell(tw.to(kDevice), tw.layout()).to(kHost), to_twell(tw, tw.layout()));
  expect_same(to_hybrid(hy.to(kDevice), layout).to(kHost), to_hybrid(hy, layout));
  expect_same(to_hybrid(hy.to(kDevice), layout).to(kHost), to_hybrid(with_full_rows, layout));
}

TEST_CASE("cuda same-format conversion runs after the work queued on options.stream") {
  const std::uint64_t seed = fresh_seed();
  CAPTURE(seed);
  const auto a = testing::random_dense<bf16>(300, 64, 1.0f, seed).to(kDevice);
  const auto b = testing::random_dense<bf16>(400, 64, 1.0f, seed + 1).to(kDevice);
  const auto pattern = to_csr(random_sparse_dense<bf16>(300, 400, {.density = 0.1}, seed + 2)).to(kDevice);
  auto out = pattern.to(kDevice);
  testing::poison_device(out.values());
  cuda_ok(cudaDeviceSynchronize());
  const testing::NonBlockingStream owned_stream;
  const cudaStream_t stream = owned_stream.get();
  // The stream is held back on the host for 300 ms: a conversion not ordered after the sddmm
  // queued behind that reads the poison (a plain copy on the legacy stream once did).
  cuda_ok(cudaLaunchHostFunc(
      stream, [](void*) { std::this_thread::sleep_for(std::chrono::milliseconds(300)); }, nullptr));
  KernelOptions on_stream;
  on_stream.stream.handle = stream;
  sddmm<bf16>(a.view(), Op::transpose, b.view(), pattern.view(), out.view(), 1.0f, 0.0f, on_stream);
  ConvertOptions convert_on_stream;
  convert_on_stream.stream.handle = stream;
  const auto got_device = to_csr(out.view(), convert_on_stream);
  cuda_ok(cudaStreamSynchronize(stream));  // before the copy to the host, on the legacy stream
  const auto got = got_device.to(kHost);
  const auto settled = to_csr(out.to(kHost));  // the sddmm's result, read after the stream's work
  REQUIRE(settled.nnz() > 0);
  for (std::int64_t e = 0; e < settled.nnz(); ++e) REQUIRE(std::isfinite(to_float(settled.values().data()[e])));
  expect_same(got, settled);
}

// A Hybrid's overflow ld below its width once read shifted rows, and a null array faulted on the
// device (a sticky error that ends the process's use of the GPU).
TEST_CASE("cuda converters check their source's shape, arrays and leading dimensions before reading it") {
  namespace gpu = twell::cuda;
  const std::uint64_t seed = fresh_seed();
  CAPTURE(seed);
  const TwellLayout layout{32, 4};
  const auto dense = random_sparse_dense<bf16>(40, 100, {.density = 0.1, .full_row_share = 0.2}, seed);
  const auto hybrid = to_hybrid(dense, layout).to(kDevice);
  REQUIRE(hybrid.overflow_rows() >= 2);
  const auto code_of = [](auto call) {
    try {
      call();
    } catch (const Error& e) {
      return e.code();
    }
    FAIL("no twell::Error");
    return ErrorCode::cuda;  // not reached
  };
  HybridView<const bf16> narrow = hybrid.view();
  narrow.overflow.ld = narrow.overflow.cols - 1;
  CHECK(code_of([&] { (void)gpu::hybrid_to_dense(narrow, {}); }) == ErrorCode::invalid_argument);
  CHECK(code_of([&] { (void)gpu::hybrid_to_csr(narrow, {}); }) == ErrorCode::invalid_argument);
  CHECK(code_of([&] { (void)gpu::hybrid_to_twell(narrow, TwellLayout{64, 2}, {}); }) == ErrorCode::invalid_argument);
  CHECK(code_of([&] { (void)to_dense(narrow); }) == ErrorCode::invalid_argument);
  HybridView<const bf16> host_block = hybrid.view();
  host_block.overflow.space = kHost;
  CHECK(code_of([&] { (void)gpu::hybrid_to_csr(host_block, {}); }) == ErrorCode::space_mismatch);
  HybridView<const bf16> no_map = hybrid.view();
  no_map.row_to_overflow = nullptr;
  CHECK(code_of([&] { (void)gpu::hybrid_to_dense(no_map, {}); }) == ErrorCode::malformed);
  const auto csr = to_csr(dense).to(kDevice);
  CsrView<const bf16> no_row_ptr = csr.view();
  no_row_ptr.row_ptr = nullptr;
  CHECK(code_of([&] { (void)gpu::csr_to_twell(no_row_ptr, layout, {}); }) == ErrorCode::malformed);
  CHECK(code_of([&] { (void)gpu::csr_to_dense(no_row_ptr, {}); }) == ErrorCode::malformed);
  const auto tw = to_twell(dense, TwellLayout{128, 1}).to(kDevice);
  TwellView<const bf16> no_words = tw.view();
  no_words.packed = nullptr;
  CHECK(code_of([&] { (void)gpu::twell_to_csr(no_words, {}); }) == ErrorCode::malformed);
  cuda_ok(cudaDeviceSynchronize());  // nothing faulted
}

TEST_CASE("cuda converters refuse bad requests like the reference") {
  namespace gpu = twell::cuda;
  const auto dense = random_sparse_dense<fp16>(4, 40, SparseDenseOptions{}, fresh_seed());
  const auto d_dense = dense.to(kDevice);
  using testing::code_of;
  CHECK(code_of([&] { (void)gpu::dense_to_twell(dense.view(), TwellLayout{}); }) == ErrorCode::space_mismatch);
  CHECK(code_of([&] { (void)gpu::dense_to_csr(dense.view()); }) == ErrorCode::space_mismatch);
  CHECK(code_of([&] {
          (void)gpu::dense_to_twell(d_dense.view(), TwellLayout{256, 3});
        }) == ErrorCode::invalid_argument);
  CHECK(code_of([&] {
          (void)gpu::dense_to_twell(d_dense.view(), TwellLayout{}, with(0.0f, OverflowPolicy::hybrid));
        }) == ErrorCode::invalid_argument);
  CHECK(code_of([&] {
          (void)gpu::dense_to_hybrid(d_dense.view(), TwellLayout{}, with(-1.0f, OverflowPolicy::error));
        }) == ErrorCode::invalid_argument);
  CHECK(code_of([&] { (void)gpu::dense_to_ell(d_dense.view(), with(0.0f, OverflowPolicy::error, -2)); }) ==
        ErrorCode::invalid_argument);
  const DenseView<const fp16> shifted = testing::off_boundary<fp16>(d_dense.view());
  CHECK(code_of([&] { (void)gpu::dense_to_twell(shifted, TwellLayout{}); }) == ErrorCode::misaligned);
  CHECK(code_of([&] { (void)gpu::dense_to_hybrid(shifted, TwellLayout{}); }) == ErrorCode::misaligned);
  CHECK(code_of([&] { (void)gpu::dense_to_csr(shifted); }) == ErrorCode::misaligned);
  CHECK(code_of([&] { (void)gpu::dense_to_ell(shifted); }) == ErrorCode::misaligned);
}

// The cuda re-layouts go through CSR and share its 32-bit column indices; the formats do not, so a
// wider matrix is `unsupported` there (the check comes first: the slots' contents do not matter).
TEST_CASE("cuda TwELL <-> Hybrid re-layouts refuse more than 2^31 - 1 columns, naming the route") {
  namespace gpu = twell::cuda;
  constexpr std::int64_t kCols = (std::int64_t{1} << 31) + 5;
  const TwellLayout wide{256, 128};  // 2 slots a tile: 64 MB of slots for one row
  const TwellMatrix<fp16> twell(1, kCols, wide, kDevice);
  const HybridMatrix<fp16> hybrid(1, kCols, wide, 0, kDevice);
  for (const std::string& message : {testing::message_of([&] { (void)gpu::twell_to_hybrid(twell.view(), wide); }),
                                     testing::message_of([&] { (void)gpu::hybrid_to_twell(hybrid.view(), wide); })}) {
    CAPTURE(message);
    CHECK(message.find("2147483653 is past 2^31 - 1") != std::string::npos);
    CHECK(message.find("through CSR") != std::string::npos);
  }
  CHECK(testing::code_of([&] { (void)gpu::twell_to_hybrid(twell.view(), wide); }) == ErrorCode::unsupported);
}

namespace {

// Every byte of a device TwELL set to 0xFF, so a slot that dense_to_twell_into leaves unwritten
// shows in the bitwise comparison.
template <Value T>
void poison(TwellMatrix<T>& dst) {
  testing::poison_device(dst.packed());
  testing::poison_device(dst.value_plane());
  cuda_ok(cudaDeviceSynchronize());
}

}  // namespace

TEST_CASE_TEMPLATE("cuda dense_to_twell_into a poisoned destination equals the reference dense_to_twell", T, bf16, fp16,
                   float) {
  namespace ref = twell::reference;
  namespace gpu = twell::cuda;
  const std::pair<std::int64_t, std::int64_t> shapes[] = {{1, 1}, {3, 257}, {17, 1000}, {2048, 5632}};
  const double densities[] = {0.0, 0.005, 0.05, 0.5, 1.0};
  const TwellLayout layouts[] = {{256, 8}, {128, 16}, {64, 4}};
  for (const auto& [rows, cols] : shapes)
    for (double density : densities) {
      const std::uint64_t seed = fresh_seed();
      CAPTURE(seed);
      CAPTURE(rows);
      CAPTURE(cols);
      CAPTURE(density);
      SparseDenseOptions spec;
      spec.density = density;
      spec.specials = true;
      const auto dense = random_sparse_dense<T>(rows, cols, spec, seed);
      const auto d_dense = dense.to(kDevice);
      const auto h = dense.view();
      const auto g = d_dense.view();
      for (const TwellLayout layout : layouts) {
        CAPTURE(layout.tile);
        CAPTURE(layout.compression);
        TwellMatrix<T> dst(rows, cols, layout, kDevice);
        for (OverflowPolicy policy : kPolicies) {
          CAPTURE(static_cast<int>(policy));
          // With a report (the counters are read back) and, error or not, the same outcome.
          compare(
              "dense_to_twell_into", with(0.0f, policy), [&](auto o) { return ref::dense_to_twell(h, layout, o); },
              [&](auto o) {
                poison(dst);
                gpu::dense_to_twell_into(g, dst.view(), o);
                return dst.to(kDevice);
              });
          // Without a report: under drop nothing is read back (no counters at all).
          if (policy != OverflowPolicy::drop) continue;
          poison(dst);
          gpu::dense_to_twell_into(g, dst.view(), with(0.0f, policy));
          expect_same(dst.to(kHost), ref::dense_to_twell(h, layout, with(0.0f, policy)));
          // The public entry point dispatches a device pair to the cuda backend.
          poison(dst);
          twell::to_twell_into(d_dense, dst, with(0.0f, policy));
          expect_same(dst.to(kHost), ref::dense_to_twell(h, layout, with(0.0f, policy)));
        }
      }
    }
}

// docs/api.md: the one conversion that neither waits for the device nor touches the legacy
// stream. It runs on options.stream; global capture mode refuses both a wait and the legacy
// stream, so its capture is the second check, and replays rewrite a poisoned destination.
TEST_CASE("cuda dense_to_twell_into under drop without a report runs on options.stream and is captured into a graph") {
  namespace ref = twell::reference;
  namespace gpu = twell::cuda;
  const testing::NonBlockingStream owned_stream;
  const cudaStream_t stream = owned_stream.get();
  const std::uint64_t seed = fresh_seed();
  CAPTURE(seed);
  const TwellLayout layout{256, 16};
  const auto dense = overflowing_bf16(700, 3000, seed);
  const auto d_dense = dense.to(kDevice);
  TwellMatrix<bf16> dst(700, 3000, layout, kDevice);
  poison(dst);
  ConvertOptions o = with(0.0f, OverflowPolicy::drop);
  o.stream.handle = stream;
  for (int i = 0; i < 3; ++i) gpu::dense_to_twell_into(d_dense.view(), dst.view(), o);
  cuda_ok(cudaStreamSynchronize(stream));
  const auto want = ref::dense_to_twell(dense.view(), layout, with(0.0f, OverflowPolicy::drop));
  expect_same(dst.to(kHost), want);

  cudaGraph_t graph = nullptr;
  cuda_ok(cudaStreamBeginCapture(stream, cudaStreamCaptureModeGlobal));
  gpu::dense_to_twell_into(d_dense.view(), dst.view(), o);
  cuda_ok(cudaStreamEndCapture(stream, &graph));
  cudaGraphExec_t exec = nullptr;
  cuda_ok(cudaGraphInstantiate(&exec, graph, 0));
  for (int replay = 0; replay < 2; ++replay) {
    CAPTURE(replay);
    poison(dst);
    cuda_ok(cudaGraphLaunch(exec, stream));
    cuda_ok(cudaStreamSynchronize(stream));
    expect_same(dst.to(kHost), want);
  }
  cuda_ok(cudaGraphExecDestroy(exec));
  cuda_ok(cudaGraphDestroy(graph));
}

TEST_CASE_TEMPLATE("cuda dense_to_twell_into refuses a destination of the wrong shape, layout, space or policy", T,
                   bf16, fp16, float) {
  namespace gpu = twell::cuda;
  const auto dense = random_sparse_dense<T>(5, 300, SparseDenseOptions{}, fresh_seed());
  const auto d_dense = dense.to(kDevice);
  const auto g = d_dense.view();
  const TwellLayout layout{128, 8};
  using testing::code_of;
  TwellMatrix<T> wrong_rows(4, 300, layout, kDevice);
  TwellMatrix<T> wrong_cols(5, 301, layout, kDevice);
  TwellMatrix<T> dst(5, 300, layout, kDevice);
  TwellMatrix<T> host_dst(5, 300, layout, kHost);
  CHECK(code_of([&] { gpu::dense_to_twell_into(g, wrong_rows.view()); }) == ErrorCode::shape_mismatch);
  CHECK(code_of([&] { gpu::dense_to_twell_into(g, wrong_cols.view()); }) == ErrorCode::shape_mismatch);
  TwellView<T> bad_layout = dst.view();
  bad_layout.layout = TwellLayout{128, 3};
  CHECK(code_of([&] { gpu::dense_to_twell_into(g, bad_layout); }) == ErrorCode::invalid_argument);
  TwellView<T> null_packed = dst.view();
  null_packed.packed = nullptr;
  CHECK(code_of([&] { gpu::dense_to_twell_into(g, null_packed); }) == ErrorCode::invalid_argument);
  CHECK(code_of([&] { gpu::dense_to_twell_into(g, host_dst.view()); }) == ErrorCode::space_mismatch);
  CHECK(code_of([&] { gpu::dense_to_twell_into(dense.view(), dst.view()); }) == ErrorCode::space_mismatch);
  CHECK(code_of([&] { twell::to_twell_into(dense.view(), dst.view()); }) == ErrorCode::space_mismatch);
  CHECK(code_of([&] { gpu::dense_to_twell_into(g, dst.view(), with(0.0f, OverflowPolicy::hybrid)); }) ==
        ErrorCode::invalid_argument);
  CHECK(code_of([&] { gpu::dense_to_twell_into(g, dst.view(), with(-1.0f, OverflowPolicy::error)); }) ==
        ErrorCode::invalid_argument);
}

// A request no GPU can serve is out_of_memory (not a generic cuda error), and it leaves no error
// behind: the next conversion runs and matches the reference.
TEST_CASE("cuda: an allocation the device cannot serve is out_of_memory, and the device stays usable") {
  try {
    const DenseMatrix<float> huge(std::int64_t{1} << 38, std::int64_t{1} << 10, kDevice);  // 2^50 bytes
    FAIL("a 1 PiB device matrix was allocated");
  } catch (const Error& e) {
    CHECK(e.code() == ErrorCode::out_of_memory);
    CHECK(std::string(e.what()).find("out of device memory") != std::string::npos);
  }
  CHECK(cudaGetLastError() == cudaSuccess);
  const auto dense = random_sparse_dense<float>(7, 300, SparseDenseOptions{}, fresh_seed());
  const auto got = twell::cuda::dense_to_csr<float>(dense.to(kDevice).view());
  expect_same(got.to(kHost), twell::reference::dense_to_csr<float>(dense.view()));
}

// Device buffers come from twell's pool, which keeps what they free (memory_cuda.cpp): a buffer
// of the same size reuses the kept bytes and still starts zeroed; release_cached_device_memory
// returns them; so does an allocation that finds the device out of memory (a failure injected
// once), whose retry then succeeds, but not one no device could serve.
TEST_CASE("cuda: twell's device pool keeps freed memory, reuses it zeroed, and gives it back") {
  // Frees are stream-ordered: the pool counts one once the device has reached it.
  const auto kept = [] {
    REQUIRE(cudaDeviceSynchronize() == cudaSuccess);
    return twell::detail::kept_device_bytes();
  };
  constexpr std::size_t kBytes = std::size_t{64} << 20;
  twell::release_cached_device_memory();
  const std::uint64_t kept0 = kept();  // 0 unless a chunk is shared with a live allocation
  {
    Buffer<unsigned char> written(kBytes, kDevice);
    cuda_ok(cudaMemset(written.data(), 0xab, kBytes));
  }
  CHECK(kept() >= kept0 + kBytes);
  {
    const Buffer<unsigned char> again(kBytes, kDevice);
    CHECK(kept() < kept0 + kBytes);  // served from the kept bytes, not freshly mapped
    const Buffer<unsigned char> back = again.copy_to(kHost);
    const auto bytes = back.host_span();
    CHECK(std::count(bytes.begin(), bytes.end(), static_cast<unsigned char>(0)) == static_cast<std::ptrdiff_t>(kBytes));
  }
  CHECK(kept() >= kept0 + kBytes);
  twell::release_cached_device_memory();
  CHECK(kept() <= kept0);

  SUBCASE("an allocation that fails trims the pool and succeeds on its retry") {
    { const Buffer<unsigned char> freed(kBytes, kDevice); }
    const std::uint64_t before = kept();
    REQUIRE(before >= kept0 + kBytes);
    twell::detail::fail_next_pool_allocations(1);
    const Buffer<float> small(1024, kDevice);
    CHECK(small.data() != nullptr);
    CHECK(kept() + kBytes / 2 <= before);  // the kept block went back before the retry
    CHECK(cudaGetLastError() == cudaSuccess);
  }
  SUBCASE("a cache limit returns what exceeds it at the next synchronisation, and none keeps all") {
    struct RestoreLimit {
      std::uint64_t bytes = twell::device_memory_cache_limit();
      ~RestoreLimit() {
        try {
          twell::set_device_memory_cache_limit(bytes);
        } catch (const Error&) {  // a destructor cannot report it; the next case would
        }
      }
    } const restore;
    CHECK(restore.bytes == std::numeric_limits<std::uint64_t>::max());
    twell::set_device_memory_cache_limit(kBytes / 4);
    CHECK(twell::device_memory_cache_limit() == kBytes / 4);
    { const Buffer<unsigned char> freed(kBytes, kDevice); }
    REQUIRE(cudaDeviceSynchronize() == cudaSuccess);  // the free lands, then the excess goes back
    CHECK(kept() <= kept0 + kBytes / 4);
    twell::set_device_memory_cache_limit(restore.bytes);
    { const Buffer<unsigned char> freed(kBytes, kDevice); }
    REQUIRE(cudaDeviceSynchronize() == cudaSuccess);
    CHECK(kept() >= kept0 + kBytes);
  }
  SUBCASE("a request no device can serve leaves the pool as it was") {
    { const Buffer<unsigned char> freed(kBytes, kDevice); }
    REQUIRE(kept() >= kept0 + kBytes);
    CHECK(testing::code_of([] { const Buffer<float> huge(std::size_t{1} << 48, kDevice); }) ==
          ErrorCode::out_of_memory);
    CHECK(kept() >= kept0 + kBytes);
    CHECK(cudaGetLastError() == cudaSuccess);
  }
}

TEST_CASE_TEMPLATE("cuda dense_to_twell_into refuses a destination on its source and leaves dst empty on overflow", T,
                   bf16, fp16, float) {
  namespace gpu = twell::cuda;
  using testing::code_of;
  const TwellLayout layout{8, 2};  // capacity 3
  // Row 0 fits, row 1 overflows tile 0 (5 nonzeros), row 2 would fit again.
  DenseMatrix<T> dense(3, 16);
  dense.view().at(0, 2) = from_float<T>(1.0f);
  for (std::int64_t j = 0; j < 5; ++j) dense.view().at(1, j) = from_float<T>(2.0f);
  dense.view().at(2, 9) = from_float<T>(3.0f);
  const auto d_dense = dense.to(kDevice);
  TwellMatrix<T> dst(3, 16, layout, kDevice);
  for (int via_public = 0; via_public < 2; ++via_public) {
    CAPTURE(via_public);
    poison(dst);
    try {
      if (via_public != 0) {
        twell::to_twell_into(d_dense, dst);
      } else {
        gpu::dense_to_twell_into(d_dense.view(), dst.view());
      }
      FAIL("no overflow reported");
    } catch (const Error& e) {
      CHECK(e.code() == ErrorCode::overflow);
      CHECK(std::string(e.what()).find("row 1, tile 0") != std::string::npos);
    }
    expect_same(dst.to(kHost), TwellMatrix<T>(3, 16, layout));  // all zeros: no entry, nothing half written
  }
  // The destination's planes on the source's own device memory.
  TwellView<T> on_src = dst.view();
  on_src.packed = reinterpret_cast<std::uint32_t*>(const_cast<T*>(d_dense.view().data));
  CHECK(code_of([&] { gpu::dense_to_twell_into(d_dense.view(), on_src); }) == ErrorCode::invalid_argument);
  CHECK(code_of([&] { twell::to_twell_into(d_dense.view(), on_src); }) == ErrorCode::invalid_argument);
  // A policy outside the enum, refused by every converter (not read as drop).
  ConvertOptions unknown;
  unknown.overflow = static_cast<OverflowPolicy>(7);
  unknown.ell_width = 2;
  CHECK(code_of([&] { gpu::dense_to_twell_into(d_dense.view(), dst.view(), unknown); }) ==
        ErrorCode::invalid_argument);
  CHECK(code_of([&] { (void)gpu::dense_to_ell(d_dense.view(), unknown); }) == ErrorCode::invalid_argument);
  CHECK(code_of([&] { (void)gpu::dense_to_csr(d_dense.view(), unknown); }) == ErrorCode::invalid_argument);
  // An empty source view follows ld >= cols as the reference's validation does.
  const DenseView<const T> none_ld0{nullptr, 0, 16, 0, kDevice};
  CHECK(code_of([&] { (void)gpu::dense_to_csr(none_ld0); }) == ErrorCode::invalid_argument);
}

namespace {

// 0xFF over everything a Hybrid view of the device covers, so that a later conversion into the
// same storage must write every word itself.
template <Value T>
void poison(HybridView<T> v) {
  const auto words = static_cast<std::size_t>(v.rows() * v.twell.packed_width());
  if (words > 0) cuda_ok(cudaMemset(v.twell.packed, 0xff, words * 4));
  if (v.twell.value_plane != nullptr && words > 0) cuda_ok(cudaMemset(v.twell.value_plane, 0xff, words * sizeof(T)));
  if (v.rows() > 0) cuda_ok(cudaMemset(v.row_to_overflow, 0xff, static_cast<std::size_t>(v.rows()) * 4));
  if (v.overflow_rows() > 0) {
    cuda_ok(cudaMemset(v.overflow_to_row, 0xff, static_cast<std::size_t>(v.overflow_rows()) * 4));
    cuda_ok(cudaMemset(v.overflow.data, 0xff, static_cast<std::size_t>(v.overflow_rows() * v.cols()) * sizeof(T)));
  }
  cuda_ok(cudaDeviceSynchronize());
}

// A random matrix at `density` whose rows are full with probability `full_rows`, NaN, Inf and -0.0
// among its values.
template <Value T>
DenseMatrix<T> random_with_full_rows(std::int64_t rows, std::int64_t cols, double density, double full_rows,
                                     std::uint64_t seed) {
  SparseDenseOptions spec;
  spec.density = density;
  spec.full_row_share = full_rows;
  spec.specials = true;
  return random_sparse_dense<T>(rows, cols, spec, seed);
}

// plan.run(device, options) against the reference dense_to_hybrid of `host`; the plan's storage
// is poisoned once its result is copied, so the next run must write every word itself.
template <Value T>
void check_plan_run(cuda::DenseToHybridPlan<T>& plan, DenseView<const T> host, DenseView<const T> device,
                    TwellLayout layout, const ConvertOptions& options) {
  compare(
      "DenseToHybridPlan::run", options, [&](auto o) { return reference::dense_to_hybrid(host, layout, o); },
      [&](auto o) {
        const HybridView<T> got = plan.run(device, o);
        auto copy = copy_to(got, kDevice);
        poison(got);
        return copy;
      });
}

// dense_to_twell and dense_to_twell_into (into dst, poisoned first) against the reference under
// both policies TwELL takes, at `threshold`.
template <Value T>
void check_into_twell(DenseView<const T> host, DenseView<const T> device, TwellMatrix<T>& dst, float threshold) {
  namespace ref = twell::reference;
  namespace gpu = twell::cuda;
  const TwellLayout layout = dst.layout();
  for (OverflowPolicy policy : kPolicies) {
    CAPTURE(static_cast<int>(policy));
    const ConvertOptions o = with(threshold, policy);
    COMPARE_CONVERSION(dense_to_twell, o, host, device, layout);
    compare(
        "dense_to_twell_into", o, [&](auto opts) { return ref::dense_to_twell(host, layout, opts); },
        [&](auto opts) {
          poison(dst);
          gpu::dense_to_twell_into(device, dst.view(), opts);
          return dst.to(kDevice);
        });
  }
}

}  // namespace

TEST_CASE_TEMPLATE("cuda DenseToHybridPlan equals dense_to_hybrid run after run, growing only when R does", T, bf16,
                   fp16, float) {
  namespace ref = twell::reference;
  namespace gpu = twell::cuda;
  const std::pair<std::int64_t, std::int64_t> shapes[] = {{0, 9}, {4, 0}, {1, 1}, {3, 257}, {17, 1000}, {700, 3000}};
  const TwellLayout layouts[] = {{256, 16}, {128, 8}, {64, 4}};
  // One plan converts a sequence of matrices: no overflow, some, every row (R = M), fewer again.
  struct Step {
    double density, full_rows;
    float threshold;
  };
  const Step steps[] = {{0.0, 0.0, 0.0f}, {0.05, 0.1, 0.0f}, {1.0, 0.0, 0.0f}, {0.005, 0.02, 0.0f}, {0.3, 0.05, 0.5f}};
  for (const auto& [rows, cols] : shapes)
    for (const TwellLayout layout : layouts) {
      CAPTURE(rows);
      CAPTURE(cols);
      CAPTURE(layout.tile);
      CAPTURE(layout.compression);
      gpu::DenseToHybridPlan<T> plan(rows, cols, layout);
      CHECK(plan.overflow_capacity() == 0);
      // The block the plan must hold: past its capacity, max(R, twice the capacity), at most M.
      std::int64_t capacity = 0;
      std::int64_t growths = 0;
      for (const Step& step : steps) {
        const std::uint64_t seed = fresh_seed();
        CAPTURE(seed);
        CAPTURE(step.density);
        const auto dense = random_with_full_rows<T>(rows, cols, step.density, step.full_rows, seed);
        const auto d_dense = dense.to(kDevice);
        ConvertOptions options;
        options.threshold = step.threshold;
        check_plan_run<T>(plan, dense.view(), d_dense.view(), layout, options);
        // Without a report the result is the same (no counters are read back).
        const auto want = ref::dense_to_hybrid(dense.view(), layout, options);
        expect_same(copy_to(plan.run(d_dense.view(), options), kHost), want);
        if (want.overflow_rows() > capacity) {
          capacity = std::min(rows, std::max(want.overflow_rows(), 2 * capacity));
          ++growths;
        }
        CHECK(plan.overflow_capacity() == capacity);
        CHECK(plan.growths() == growths);
      }
    }
}

TEST_CASE("cuda DenseToHybridPlan runs on options.stream and refuses bad requests") {
  namespace ref = twell::reference;
  namespace gpu = twell::cuda;
  using testing::code_of;
  const TwellLayout layout{256, 16};
  gpu::DenseToHybridPlan<bf16> plan(300, 2000, layout, 300);  // room for every row: no growth
  const std::uint64_t seed = fresh_seed();
  CAPTURE(seed);
  const auto dense = overflowing_bf16(300, 2000, seed);
  const auto d_dense = dense.to(kDevice);
  const testing::NonBlockingStream owned_stream;
  const cudaStream_t stream = owned_stream.get();
  ConvertOptions on_stream;
  on_stream.stream.handle = stream;
  const HybridView<bf16> got = plan.run(d_dense.view(), on_stream);
  cuda_ok(cudaStreamSynchronize(stream));
  const auto want = ref::dense_to_hybrid(dense.view(), layout);
  CHECK(want.overflow_rows() > 0);
  expect_same(copy_to(got, kHost), want);
  CHECK(plan.growths() == 0);

  CHECK(code_of([&] { (void)plan.run(dense.view()); }) == ErrorCode::space_mismatch);
  const auto other = overflowing_bf16(300, 2001, seed).to(kDevice);
  CHECK(code_of([&] { (void)plan.run(other.view()); }) == ErrorCode::shape_mismatch);
  CHECK(code_of([&] { (void)plan.run(d_dense.view(), with(-1.0f, OverflowPolicy::error)); }) ==
        ErrorCode::invalid_argument);
  CHECK(code_of([&] { gpu::DenseToHybridPlan<bf16>(10, 10, TwellLayout{256, 3}); }) == ErrorCode::invalid_argument);
  CHECK(code_of([&] { gpu::DenseToHybridPlan<bf16>(10, 10, layout, -1); }) == ErrorCode::invalid_argument);
  CHECK(gpu::DenseToHybridPlan<bf16>(10, 10, layout, 50).overflow_capacity() == 10);  // at most every row
  gpu::DenseToHybridPlan<bf16> moved_to = std::move(plan);
  CHECK(code_of([&] { (void)plan.run(d_dense.view()); }) == ErrorCode::invalid_argument);  // NOLINT(bugprone-use-after-move)
  expect_same(copy_to(moved_to.run(d_dense.view()), kHost), want);
}

// The tiled 16-bit kernel packs a warp whose lanes each hold at most one stored entry by one
// ballot (pack_slot_groups' fast path), else by a scan. Here every lane's chunk of every tile holds
// one large value (at a word and half that move with the lane and the row, so every position of a
// chunk is the lone entry somewhere) and, in odd rows, a small one: threshold 0 stores both (the
// scan), threshold 0.5 only the large one (the fast path). Even rows fill all 16 lanes of a tile,
// past the capacities of 15 and 7, so the fast path's overflow runs too; 520 columns give a last
// tile of 8 (chunks cut by the row's end) and an odd number of tiles a row (a half-warp without a
// pair).
TEST_CASE_TEMPLATE("cuda dense -> TwELL: one entry per lane's chunk, every position, tiles past capacity", T, bf16,
                   fp16) {
  namespace ref = twell::reference;
  namespace gpu = twell::cuda;
  constexpr std::int64_t kRows = 7, kCols = 520;
  for (const TwellLayout layout : {TwellLayout{256, 16}, TwellLayout{256, 8}, TwellLayout{128, 16}, TwellLayout{128, 8}}) {
    CAPTURE(layout.tile);
    CAPTURE(layout.compression);
    const std::int64_t per_lane = layout.tile / 16;
    DenseMatrix<T> filled(kRows, kCols);
    const auto v = filled.view();
    for (std::int64_t i = 0; i < kRows; ++i)
      for (std::int64_t j = 0; j < kCols; j += per_lane) {
        const std::int64_t lane = (j % layout.tile) / per_lane;
        if (i % 2 == 1 && (lane + i) % 3 == 0) continue;  // odd rows: some lanes empty
        const std::int64_t big = (lane + 3 * i) % per_lane;
        if (j + big < kCols) v.at(i, j + big) = from_float<T>((lane % 2 == 0 ? 1.0f : -1.5f) * static_cast<float>(1 + i));
        const std::int64_t small = (big + 1 + i) % per_lane;
        if (i % 2 == 1 && j + small < kCols) v.at(i, j + small) = from_float<T>(0.25f);
      }
    const DenseMatrix<T>& dense = filled;
    const auto d_dense = dense.to(kDevice);
    TwellMatrix<T> dst(kRows, kCols, layout, kDevice);
    for (float threshold : {0.0f, 0.5f}) {
      CAPTURE(threshold);
      COMPARE_CONVERSION(dense_to_hybrid, with(threshold, OverflowPolicy::error), dense.view(), d_dense.view(), layout);
      check_into_twell<T>(dense.view(), d_dense.view(), dst, threshold);
    }
  }
}

// The tiled 16-bit kernel launches at most kMaxBlocks x 8 = 32768 warps (converters/cuda/common.cuh)
// and walks rows past that grid-stride, so only more rows than that make a warp pack a second row
// (and, with an odd number of tiles a row, its two halves pack pairs of different rows). 33001 rows
// do: warps 0-232 take rows 32768-33000. 520 columns give 3 tiles of 256 (the last 8 wide) or 5 of
// 128. Every path the kernel feeds: dense_to_twell, dense_to_twell_into (poisoned), dense_to_hybrid
// and DenseToHybridPlan, at a density that fits and one whose full rows overflow, thresholds 0 and
// 0.5.
TEST_CASE_TEMPLATE("cuda dense -> TwELL: more rows than the launch has warps", T, bf16, fp16) {
  namespace ref = twell::reference;
  namespace gpu = twell::cuda;
  constexpr std::int64_t kRows = 33001, kCols = 520;
  struct Data {
    double density, full_rows;
  };
  for (const Data data : {Data{0.005, 0.0}, Data{0.05, 0.01}}) {
    const std::uint64_t seed = fresh_seed();
    CAPTURE(seed);
    CAPTURE(data.density);
    const auto dense = random_with_full_rows<T>(kRows, kCols, data.density, data.full_rows, seed);
    const auto d_dense = dense.to(kDevice);
    for (const TwellLayout layout : {TwellLayout{256, 8}, TwellLayout{128, 16}}) {
      CAPTURE(layout.tile);
      CAPTURE(layout.compression);
      TwellMatrix<T> dst(kRows, kCols, layout, kDevice);
      gpu::DenseToHybridPlan<T> plan(kRows, kCols, layout);
      for (float threshold : {0.0f, 0.5f}) {
        CAPTURE(threshold);
        const ConvertOptions hybrid_options = with(threshold, OverflowPolicy::error);
        COMPARE_CONVERSION(dense_to_hybrid, hybrid_options, dense.view(), d_dense.view(), layout);
        check_plan_run<T>(plan, dense.view(), d_dense.view(), layout, hybrid_options);
        check_into_twell<T>(dense.view(), d_dense.view(), dst, threshold);
      }
    }
  }
}

// The tiled 16-bit kernel takes a row's offset as a 32-bit row index times a 32-bit stride, so the
// launch sends a source whose stride passes 2^31 - 1 to the generic kernel
// (converters/cuda/twell_pack.cuh, launch_dense_to_twell). A stride of 2^32 + 8 cut to 32 bits is
// 8: without the guard, row 1 would be read from row 0's column 8 on. Rows stay 16-byte aligned,
// so only that guard decides. Two rows of 520 columns at that stride span 8 GiB, of which only
// the 2 x 520 of the view are written (no fill). Skipped, with a message, on a GPU with less free
// memory.
TEST_CASE("cuda dense sources with a row stride past 2^32 convert like the reference") {
  namespace ref = twell::reference;
  namespace gpu = twell::cuda;
  constexpr std::int64_t kRows = 2, kCols = 520, kLd = (std::int64_t{1} << 32) + 8;
  const std::size_t elements = static_cast<std::size_t>((kRows - 1) * kLd + kCols);
  std::size_t free_bytes = 0, total_bytes = 0;
  cuda_ok(cudaMemGetInfo(&free_bytes, &total_bytes));
  if (free_bytes < elements * sizeof(bf16) + (std::size_t{1} << 30)) {
    MESSAGE("skipped: needs ", elements * sizeof(bf16) / (1 << 20), " MiB of free device memory, has ",
            free_bytes / (1 << 20));
    return;
  }
  const std::uint64_t seed = fresh_seed();
  CAPTURE(seed);
  // Full rows at 5 %: tiles of capacity 8 overflow, and row 1 is unlike row 0 from column 8 on.
  const auto dense = random_with_full_rows<bf16>(kRows, kCols, 0.05, 0.5, seed);
  Buffer<bf16> strided(elements, kDevice, Uninitialized{});
  for (std::int64_t i = 0; i < kRows; ++i)
    cuda_ok(cudaMemcpy(strided.data() + i * kLd, dense.view().data + i * dense.view().ld, kCols * sizeof(bf16),
                       cudaMemcpyHostToDevice));
  const DenseView<const bf16> device{strided.data(), kRows, kCols, kLd, kDevice};
  const DenseView<const bf16> host = dense.view();
  const ConvertOptions plain;
  COMPARE_CONVERSION(dense_to_csr, plain, host, device);
  COMPARE_CONVERSION(dense_to_ell, plain, host, device);
  for (const TwellLayout layout : {TwellLayout{256, 8}, TwellLayout{128, 16}}) {
    CAPTURE(layout.tile);
    CAPTURE(layout.compression);
    COMPARE_CONVERSION(dense_to_hybrid, plain, host, device, layout);
    gpu::DenseToHybridPlan<bf16> plan(kRows, kCols, layout);
    check_plan_run<bf16>(plan, host, device, layout, plain);
    TwellMatrix<bf16> dst(kRows, kCols, layout, kDevice);
    for (float threshold : {0.0f, 0.5f}) check_into_twell<bf16>(host, device, dst, threshold);
  }
}
