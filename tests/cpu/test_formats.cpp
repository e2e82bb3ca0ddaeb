// Layout math, layout checks, 16-bit float conversions, buffers and view copies.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <functional>
#include <limits>
#include <random>
#include <string>
#include <tuple>
#include <vector>

#include <twell/twell.hpp>

#if defined(__x86_64__) || defined(__i386__)
#include <xmmintrin.h>
#endif

#include "checks.hpp"
#include "random.hpp"

using namespace twell;

namespace {

using testing::code_of;
using testing::message_of;

// Every finite half value, in increasing order of value, for a nearest-value oracle.
std::vector<std::pair<double, std::uint16_t>> finite_halves() {
  std::vector<std::pair<double, std::uint16_t>> v;
  for (std::uint32_t b = 0; b < 0x10000u; ++b) {
    const std::uint32_t exp = (b >> 10) & 0x1f, mant = b & 0x3ff;
    if (exp == 0x1f) continue;
    const double mag = exp == 0 ? std::ldexp(static_cast<double>(mant), -24)
                                : std::ldexp(1.0 + static_cast<double>(mant) / 1024.0, static_cast<int>(exp) - 15);
    v.emplace_back((b & 0x8000u) ? -mag : mag, static_cast<std::uint16_t>(b));
  }
  std::sort(v.begin(), v.end());
  return v;
}

// Round-to-nearest-even half of a finite float, from the value table (independent of the
// bit manipulation in types.hpp). Ties pick the even mantissa; beyond 65520 the result is Inf.
std::uint16_t oracle_fp16(float f, const std::vector<std::pair<double, std::uint16_t>>& halves) {
  const double x = f;
  const std::uint16_t sign = std::signbit(f) ? 0x8000 : 0;
  if (std::fabs(x) >= 65520.0) return static_cast<std::uint16_t>(sign | 0x7c00);
  auto it = std::lower_bound(halves.begin(), halves.end(), std::make_pair(x, std::uint16_t{0}),
                             [](const auto& a, const auto& b) { return a.first < b.first; });
  if (it == halves.end()) --it;
  auto best = it;
  if (it != halves.begin()) {
    auto prev = std::prev(it);
    const double dp = std::fabs(x - prev->first), di = std::fabs(it->first - x);
    if (dp < di || (dp == di && (prev->second & 1u) == 0)) best = prev;
  }
  std::uint16_t b = best->second;
  if (best->first == 0.0) b = sign;  // zero keeps the sign of the input
  return b;
}

// Round-to-nearest-even bf16 of a finite float via double arithmetic on the two neighbours.
std::uint16_t oracle_bf16(float f) {
  std::uint32_t u;
  std::memcpy(&u, &f, 4);
  const std::uint16_t down = static_cast<std::uint16_t>(u >> 16);
  const std::uint16_t up = static_cast<std::uint16_t>(down + 1);
  const auto value = [](std::uint16_t b) {
    const std::uint32_t w = static_cast<std::uint32_t>(b) << 16;
    float g;
    std::memcpy(&g, &w, 4);
    return static_cast<double>(g);
  };
  if ((u & 0xffffu) == 0) return down;
  const double lo = std::fabs(value(down) - f);
  const double hi = std::isinf(value(up)) ? std::fabs(std::ldexp(1.0, 128) * (f < 0 ? -1 : 1) - f)
                                          : std::fabs(value(up) - f);
  if (lo < hi) return down;
  if (hi < lo) return up;
  return (down & 1u) ? up : down;
}

}  // namespace

TEST_CASE("TwellLayout index math matches a direct computation") {
  std::mt19937_64 rng(testing::fresh_seed());
  for (int trial = 0; trial < 200; ++trial) {
    const std::int32_t tile = 8 * static_cast<std::int32_t>(1 + rng() % 64);
    std::int32_t c = 1;
    while (tile % (c * 2) == 0 && tile / (c * 2) >= 2 && rng() % 2) c *= 2;
    const TwellLayout l{tile, c};
    REQUIRE_NOTHROW(check_layout(l, "test"));
    const std::int64_t cols = 1 + static_cast<std::int64_t>(rng() % 3000);
    CAPTURE(tile);
    CAPTURE(c);
    CAPTURE(cols);
    CHECK(l.slots() == tile / c);
    CHECK(l.capacity() == tile / c - 1);
    const std::int64_t tiles = (cols + tile - 1) / tile;
    CHECK(l.tiles(cols) == tiles);
    CHECK(l.packed_width(cols) == tiles * (tile / c));
    std::int64_t covered = 0;
    for (std::int64_t t = 0; t < tiles; ++t) {
      CHECK(l.tile_begin(t) == covered);
      covered += l.tile_cols(t, cols);
      CHECK(l.tile_cols(t, cols) >= 1);
      CHECK(l.tile_cols(t, cols) <= tile);
    }
    CHECK(covered == cols);
    for (int k = 0; k < 20; ++k) {
      const std::int64_t j = static_cast<std::int64_t>(rng() % static_cast<std::uint64_t>(cols));
      CHECK(l.tile_of(j) * tile + l.local_col(j) == j);
      CHECK(l.local_col(j) < l.tile_cols(l.tile_of(j), cols));
      const std::int64_t row = static_cast<std::int64_t>(rng() % 100);
      CHECK(l.slot_offset(row, l.tile_of(j), cols) == row * tiles * (tile / c) + l.tile_of(j) * (tile / c));
    }
    CHECK(!l.overflows(l.capacity()));
    CHECK(l.overflows(l.capacity() + 1));
  }
  const std::uint32_t w = TwellLayout::pack(0xabcd, 0x1234);
  CHECK(w == 0xabcd1234u);
  CHECK(TwellLayout::slot_value_bits(w) == 0xabcd);
  CHECK(TwellLayout::slot_column(w) == 0x1234u);
  CHECK(TwellLayout::pack(0x0001, 0x1ffff) == 0x0001ffffu);  // the column is cut to 16 bits
  CHECK(TwellLayout{}.tile == 256);
  CHECK(TwellLayout{}.compression == 8);
}

TEST_CASE("check_layout rejects every bad layout with invalid_argument") {
  const TwellLayout bad[] = {{0, 1},  {7, 1},    {12, 2},  {-8, 2},   {65544, 8}, {131072, 8},
                             {64, 3}, {64, 0},   {64, -2}, {24, 16},  {8, 8},     {256, 256},
                             {256, 512}, {16, 16}};
  for (const auto& l : bad) {
    CAPTURE(l.tile);
    CAPTURE(l.compression);
    try {
      check_layout(l, "my_function");
      FAIL("accepted");
    } catch (const Error& e) {
      CHECK(e.code() == ErrorCode::invalid_argument);
      CHECK(std::string(e.what()).find("my_function") != std::string::npos);
    }
  }
  for (const TwellLayout l : {TwellLayout{8, 4}, TwellLayout{256, 8}, TwellLayout{128, 64}, TwellLayout{65536, 1},
                              TwellLayout{65536, 32768}, TwellLayout{24, 8}})
    CHECK_NOTHROW(check_layout(l, "test"));
  CHECK(code_of([] { TwellMatrix<bf16>(4, 4, TwellLayout{12, 2}); }) == ErrorCode::invalid_argument);
  CHECK(code_of([] { TwellMatrix<bf16>(-1, 4, TwellLayout{}); }) == ErrorCode::invalid_argument);
  CHECK(code_of([] { DenseMatrix<float>(2, -3); }) == ErrorCode::invalid_argument);
  CHECK(code_of([] { CsrMatrix<float>(2, 3, -1); }) == ErrorCode::invalid_argument);
  CHECK(code_of([] { EllMatrix<float>(2, 3, -4); }) == ErrorCode::invalid_argument);
}

TEST_CASE("an allocation the machine cannot serve is out_of_memory, apart from a bad size") {
  // 2^52 bytes: a valid size (below PTRDIFF_MAX) that no host maps (x86-64 user space is 2^47).
  try {
    DenseMatrix<float> huge(std::int64_t{1} << 40, std::int64_t{1} << 10);
    FAIL("a 4 PiB matrix was allocated");
  } catch (const Error& e) {
    CHECK(e.code() == ErrorCode::out_of_memory);
    CHECK(std::string(e.what()).find("cannot allocate 4503599627370496 bytes of host memory") != std::string::npos);
  }
  CHECK(to_string(ErrorCode::out_of_memory) == "out_of_memory");
  // A std::bad_alloc inside the reference backend (its std::vectors) takes the same code.
  try {
    detail::map_host_allocation_failure("twell::test", []() -> int { throw std::bad_alloc(); });
    FAIL("std::bad_alloc was swallowed");
  } catch (const Error& e) {
    CHECK(e.code() == ErrorCode::out_of_memory);
    CHECK(std::string(e.what()) == "twell::test: a host allocation failed (std::bad_alloc)");
  }
  CHECK(detail::map_host_allocation_failure("twell::test", [] { return 7; }) == 7);
}

TEST_CASE("sizes that overflow a 64-bit count or the address space are refused, not wrapped") {
  // Each of these once wrapped to a small (or zero-byte) block that the first write overran.
  constexpr std::int64_t k31 = std::int64_t{1} << 31;
  CHECK(code_of([] { Buffer<float>(std::size_t{1} << 62); }) == ErrorCode::invalid_argument);
  CHECK(code_of([] { Buffer<float>(std::size_t{1} << 62, MemorySpace::host, Uninitialized{}); }) ==
        ErrorCode::invalid_argument);
  CHECK(code_of([] { DenseMatrix<float>(k31 * 4, k31 * 4); }) == ErrorCode::invalid_argument);
  CHECK(code_of([] { DenseMatrix<float>(k31, k31); }) == ErrorCode::invalid_argument);  // 2^62 floats: 2^64 bytes
  CHECK(code_of([] { EllMatrix<float>(2, 2, INT64_MAX); }) == ErrorCode::invalid_argument);  // before allocating
  CHECK(code_of([] { TwellMatrix<bf16>(1, INT64_MAX, TwellLayout{}); }) == ErrorCode::invalid_argument);
  CHECK(code_of([] { TwellMatrix<bf16>(k31 * 16, k31, TwellLayout{8, 1}); }) == ErrorCode::invalid_argument);
  CHECK(code_of([] { TwellMatrix<bf16>(k31 * 16, k31, TwellLayout{8, 1}, MemorySpace::host, Uninitialized{}); }) ==
        ErrorCode::invalid_argument);
  // Empty shapes stay fine.
  CHECK(DenseMatrix<float>(0, k31 * k31).values().size() == 0);
  CHECK(TwellMatrix<bf16>(0, 4096, TwellLayout{}).packed().size() == 0);
}

TEST_CASE("a MemorySpace outside its enum is invalid_argument wherever it picks a backend") {
  // It once allocated on the host, called itself "device" and leaked on destruction.
  const auto bogus = static_cast<MemorySpace>(2);
  CHECK(to_string(bogus) == "?");
  for (const auto& make : std::vector<std::function<void()>>{
           [&] { Buffer<float>(16, bogus); },
           [&] { Buffer<float>(0, bogus); },
           [&] { Buffer<float>(16, bogus, Uninitialized{}); },
           [&] { DenseMatrix<float>(4, 4, bogus); },
           [&] { (void)Buffer<float>(4).copy_to(bogus); },
       }) {
    try {
      make();
      FAIL("a bogus memory space was accepted");
    } catch (const Error& e) {
      CHECK(e.code() == ErrorCode::invalid_argument);
      CHECK(std::string(e.what()).find("memory space 2 is neither host nor device") != std::string::npos);
    }
  }
  std::vector<float> x(4, 1.0f), y(4);
  const DenseView<const float> view{x.data(), 2, 2, 2, bogus};
  CHECK(code_of([&] { (void)to_csr(view); }) == ErrorCode::invalid_argument);
  CHECK(code_of([&] { transpose(view, DenseView<float>{y.data(), 2, 2, 2, bogus}); }) == ErrorCode::invalid_argument);
  TwellMatrix<float> tw(2, 2, TwellLayout{8, 2});
  TwellView<float> tw_bogus = tw.view();
  tw_bogus.space = bogus;
  CHECK(code_of([&] { to_twell_into(view, tw_bogus); }) == ErrorCode::invalid_argument);
  // validate does not call valid what every operation refuses.
  CHECK(find_violation(view) == "dense: memory space 2 is neither host nor device");
  CHECK(find_violation(TwellView<const float>(tw_bogus)) == "TwELL: memory space 2 is neither host nor device");
}

// The plans' guard against running after a move (their buffers are gone) or on another device: a
// move carries the device and leaves the source reset; assigning into a moved-from object makes
// it live again.
TEST_CASE("ResetOnMove carries its value to a move's destination and resets the source") {
  using twell::detail::PlanDevice;
  PlanDevice a = 3;
  PlanDevice b = std::move(a);
  CHECK(b == 3);
  CHECK(a == -1);  // NOLINT(bugprone-use-after-move): the point of the type
  const std::string moved = message_of([&] { twell::detail::require_plan_device(a, "test"); });
  CHECK(moved.find("moved from") != std::string::npos);
  CHECK(code_of([&] { twell::detail::require_plan_device(a, "test"); }) == ErrorCode::invalid_argument);
  a = std::move(b);
  CHECK(a == 3);
  CHECK(b == -1);  // NOLINT(bugprone-use-after-move)
  PlanDevice& same = a;
  a = std::move(same);  // self-move keeps the value
  CHECK(a == 3);
  // A device that cannot be the current one: space_mismatch, or no_device on a machine without
  // a usable device (the gpu suite checks the mismatch for real).
  const ErrorCode other = code_of([] { twell::detail::require_plan_device(1 << 20, "test"); });
  CHECK((other == ErrorCode::space_mismatch || other == ErrorCode::no_device));
  if (other == ErrorCode::space_mismatch)
    CHECK(message_of([] {
            twell::detail::require_plan_device(1 << 20, "test");
          }).find("made on device 1048576, but device") != std::string::npos);
  enum class State { idle, taken };
  twell::detail::ResetOnMove<State, State::taken> s = State::idle;
  const auto t = std::move(s);
  CHECK(t == State::idle);
  CHECK(s == State::taken);  // NOLINT(bugprone-use-after-move)
}

TEST_CASE("bf16: every bit pattern round-trips through float") {
  for (std::uint32_t b = 0; b < 0x10000u; ++b) {
    const bf16 h{static_cast<std::uint16_t>(b)};
    const float f = bf16_to_float(h);
    const bf16 back = float_to_bf16(f);
    if (std::isnan(f)) {
      REQUIRE(std::isnan(bf16_to_float(back)));
      REQUIRE(std::signbit(bf16_to_float(back)) == std::signbit(f));
    } else {
      REQUIRE(back.bits == h.bits);
    }
  }
}

TEST_CASE("fp16: every bit pattern round-trips through float, subnormals included") {
  for (std::uint32_t b = 0; b < 0x10000u; ++b) {
    const fp16 h{static_cast<std::uint16_t>(b)};
    const float f = fp16_to_float(h);
    const fp16 back = float_to_fp16(f);
    if (std::isnan(f)) {
      REQUIRE(std::isnan(fp16_to_float(back)));
      REQUIRE(std::signbit(fp16_to_float(back)) == std::signbit(f));
    } else {
      REQUIRE(back.bits == h.bits);
    }
  }
  CHECK(fp16_to_float(fp16{0x0001}) == std::ldexp(1.0f, -24));
  CHECK(fp16_to_float(fp16{0x03ff}) == std::ldexp(1023.0f, -24));
  CHECK(fp16_to_float(fp16{0x7bff}) == 65504.0f);
}

TEST_CASE("float -> bf16 / fp16 rounds to nearest even, matching value-table oracles") {
  const auto halves = finite_halves();
  std::mt19937_64 rng(testing::fresh_seed());
  std::vector<float> inputs = {0.0f, -0.0f, 1.0f, -1.0f, 65504.0f, 65519.99f, 65520.0f, -65520.0f, 1e9f,
                               std::ldexp(1.0f, -24), std::ldexp(1.0f, -25), std::ldexp(3.0f, -26),
                               std::ldexp(1.0f, -26), std::ldexp(1.5f, -24), std::ldexp(1.0f, -14),
                               std::numeric_limits<float>::max(), std::numeric_limits<float>::denorm_min(),
                               std::numeric_limits<float>::min(), 1.0f + std::ldexp(1.0f, -8),
                               1.0f + std::ldexp(3.0f, -9), 2049.0f, 2051.0f};
  for (int k = 0; k < 200000; ++k) {
    std::uint32_t u = static_cast<std::uint32_t>(rng());
    if ((u & 0x7f800000u) == 0x7f800000u) continue;
    float f;
    std::memcpy(&f, &u, 4);
    inputs.push_back(f);
    inputs.push_back(std::ldexp(static_cast<float>(rng() % 100000) / 100000.0f, static_cast<int>(rng() % 50) - 30));
  }
  for (const float f : inputs) {
    CAPTURE(f);
    REQUIRE(float_to_bf16(f).bits == oracle_bf16(f));
    REQUIRE(float_to_fp16(f).bits == oracle_fp16(f, halves));
  }
  const float inf = std::numeric_limits<float>::infinity();
  CHECK(float_to_bf16(inf).bits == 0x7f80);
  CHECK(float_to_bf16(-inf).bits == 0xff80);
  CHECK(float_to_fp16(inf).bits == 0x7c00);
  CHECK(float_to_fp16(-inf).bits == 0xfc00);
  CHECK(float_to_bf16(-0.0f).bits == 0x8000);
  CHECK(float_to_fp16(-0.0f).bits == 0x8000);
  CHECK(std::isnan(bf16_to_float(float_to_bf16(std::nanf("")))));
  CHECK(std::isnan(fp16_to_float(float_to_fp16(-std::nanf("")))));
  CHECK(std::signbit(fp16_to_float(float_to_fp16(-std::nanf("")))));
}

TEST_CASE_TEMPLATE("is_stored: -0.0 is zero, NaN and Inf are stored, threshold is inclusive", T, bf16, fp16, float) {
  CHECK(!is_stored(from_float<T>(0.0f)));
  CHECK(!is_stored(from_float<T>(-0.0f)));
  CHECK(is_stored(from_float<T>(std::nanf(""))));
  CHECK(is_stored(from_float<T>(std::numeric_limits<float>::infinity())));
  CHECK(is_stored(from_float<T>(-std::numeric_limits<float>::infinity())));
  CHECK(is_stored(from_float<T>(0.5f)));
  CHECK(!is_stored(from_float<T>(0.5f), 0.5f));
  CHECK(!is_stored(from_float<T>(-0.5f), 0.5f));
  CHECK(is_stored(from_float<T>(0.75f), 0.5f));
  CHECK(is_stored(from_float<T>(std::nanf("")), 1e30f));
}

#if defined(__x86_64__) || defined(__i386__)
// Under flush-to-zero and denormals-are-zero (a process built with -ffast-math, or torch's
// set_flush_denormal) a subnormal compared as a float reads as 0: it was dropped by every
// converter and made validate call a valid CSR malformed. The smallest subnormal of each type.
TEST_CASE_TEMPLATE("a subnormal is stored whatever the host's flush-to-zero mode", T, bf16, fp16, float) {
  T tiny{};
  if constexpr (std::is_same_v<T, float>) {
    tiny = bits_float(1u);
  } else {
    tiny = ValueTraits<T>::from_bits(1u);
  }
  DenseMatrix<T> d(1, 8);
  d.view().at(0, 2) = tiny;
  const unsigned saved = _mm_getcsr();
  _mm_setcsr(saved | 0x8040u);  // FTZ (bit 15) and DAZ (bit 6)
  const bool stored = is_stored(tiny);
  const auto csr = to_csr(d);
  const std::string violation = find_violation(csr);
  const auto tw = to_twell(d, TwellLayout{8, 2});
  _mm_setcsr(saved);
  CHECK(stored);
  CHECK(csr.nnz() == 1);
  CHECK(violation == "");
  const auto back = to_dense(tw);
  CHECK(std::memcmp(back.values().data(), d.values().data(), d.values().bytes()) == 0);
}
#endif

TEST_CASE("Buffer: zero-filled, aligned, move-only semantics, deep copies") {
  Buffer<std::uint32_t> a(1000);
  CHECK(a.size() == 1000);
  CHECK(a.bytes() == 4000);
  CHECK(reinterpret_cast<std::uintptr_t>(a.data()) % 64 == 0);
  CHECK(std::all_of(a.data(), a.data() + 1000, [](std::uint32_t v) { return v == 0; }));
  for (std::size_t i = 0; i < 1000; ++i) a.data()[i] = static_cast<std::uint32_t>(i * 7);
  std::uint32_t* p = a.data();

  Buffer<std::uint32_t> b(std::move(a));
  CHECK(b.data() == p);
  CHECK(b.size() == 1000);
  CHECK(a.data() == nullptr);
  CHECK(a.size() == 0);
  CHECK(a.empty());

  Buffer<std::uint32_t> c(5);
  c = std::move(b);
  CHECK(c.data() == p);
  CHECK(b.data() == nullptr);
  auto& alias = c;
  c = std::move(alias);  // self-move keeps the contents
  CHECK(c.data() == p);
  CHECK(c.size() == 1000);

  const Buffer<std::uint32_t> d = c.copy_to(MemorySpace::host);
  CHECK(d.data() != c.data());
  CHECK(std::equal(d.data(), d.data() + 1000, c.data()));
  CHECK(d.host_span().size() == 1000);
  CHECK(Buffer<float>(0).data() == nullptr);
  CHECK(Buffer<float>().copy_to(MemorySpace::host).empty());
}

TEST_CASE("device memory without the cuda backend is ErrorCode::no_device") {
  if (cuda_available()) return;
  CHECK(code_of([] { Buffer<float>(16, MemorySpace::device); }) == ErrorCode::no_device);
  Buffer<float> host(4);
  CHECK(code_of([&] { (void)host.copy_to(MemorySpace::device); }) == ErrorCode::no_device);
  const DenseView<const float> device_view{nullptr, 2, 2, 2, MemorySpace::device};
  CHECK(code_of([&] { (void)to_csr(device_view); }) == ErrorCode::no_device);
  // validate and stats copy a device view's arrays to the host; that copy says no_device too
  // (it said cuda in a build with the backend). The address is never read: the copy fails first.
  const auto* nowhere = reinterpret_cast<const std::int64_t*>(std::uintptr_t{4096});
  const CsrView<const float> device_csr{2, 2, 0, nowhere, nullptr, nullptr, MemorySpace::device};
  CHECK(code_of([&] { validate(device_csr); }) == ErrorCode::no_device);
  CHECK(code_of([&] { (void)stats(device_csr); }) == ErrorCode::no_device);
  // No device allocation was made, so twell's pools hold nothing and releasing them is a no-op.
  CHECK_NOTHROW(release_cached_device_memory());
  CHECK(twell::detail::kept_device_bytes() == 0);
  // The pools' bound is kept for pools made later, and read back, without a device too.
  const std::uint64_t unbounded = device_memory_cache_limit();
  CHECK(unbounded == std::numeric_limits<std::uint64_t>::max());
  CHECK_NOTHROW(set_device_memory_cache_limit(1u << 20));
  CHECK(device_memory_cache_limit() == 1u << 20);
  set_device_memory_cache_limit(unbounded);
}

TEST_CASE_TEMPLATE("copy_to compacts a strided dense view and deep-copies every format", T, bf16, fp16, float) {
  const auto big = testing::random_sparse_dense<T>(9, 40, {.density = 0.3}, testing::fresh_seed());
  const DenseView<const T> strided{big.view().data + 3, 9, 30, 40, MemorySpace::host};
  const auto compact = copy_to(strided, MemorySpace::host);
  REQUIRE(compact.ld() == 30);
  for (std::int64_t i = 0; i < 9; ++i)
    CHECK(std::memcmp(&compact.view().at(i, 0), &strided.at(i, 0), 30 * sizeof(T)) == 0);

  const auto hybrid = to_hybrid(compact, TwellLayout{8, 2});
  const auto copy = copy_to(hybrid.view(), MemorySpace::host);
  CHECK(copy.twell().packed().data() != hybrid.twell().packed().data());
  CHECK(std::equal(copy.twell().packed().data(), copy.twell().packed().data() + copy.twell().packed().size(),
                   hybrid.twell().packed().data()));
  CHECK(copy.overflow_rows() == hybrid.overflow_rows());
  CHECK(testing::bitwise_equal<T>(to_dense(copy).view(), to_dense(hybrid).view()));
}

TEST_CASE_TEMPLATE("a fresh HybridMatrix maps no row to its block and holds at most one block row per row", T, bf16,
                   fp16, float) {
  const TwellLayout layout{8, 2};
  const HybridMatrix<T> empty(5, 40, layout, 0);
  CHECK(std::all_of(empty.row_to_overflow().data(), empty.row_to_overflow().data() + 5,
                    [](std::int32_t r) { return r == -1; }));
  CHECK(find_violation(empty.view()).empty());  // an all-zero matrix, as a fresh TwellMatrix is
  const HybridMatrix<T> full_block(5, 40, layout, 5);
  CHECK(std::all_of(full_block.row_to_overflow().data(), full_block.row_to_overflow().data() + 5,
                    [](std::int32_t r) { return r == -1; }));
  // R is checked before any storage: the last shape's TwELL part alone would take 2^44 bytes or more.
  for (const auto& [rows, cols, r] : {std::tuple<std::int64_t, std::int64_t, std::int64_t>{5, 40, 6}, {5, 40, -1},
                                      {std::int64_t{1} << 21, std::int64_t{1} << 22, -1}}) {
    CAPTURE(r);
    try {
      (void)HybridMatrix<T>(rows, cols, layout, r);
      FAIL("overflow rows outside [0, rows] accepted");
    } catch (const Error& e) {
      const std::string what = e.what();
      CAPTURE(what);
      CHECK(e.code() == ErrorCode::invalid_argument);
      CHECK(what.rfind("twell::HybridMatrix: ", 0) == 0);
      CHECK(what.find(std::to_string(r) + " overflow rows") != std::string::npos);
    }
  }
}
