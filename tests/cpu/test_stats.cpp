// stats(): distributions, candidate layouts and bytes, checked against direct counts on the
// dense data and against the sizes of the matrices the converters actually build.
#include <doctest/doctest.h>
#include <sys/mman.h>

#include <algorithm>
#include <cmath>
#include <functional>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include <twell/twell.hpp>

#include "checks.hpp"
#include "random.hpp"

using namespace twell;
using testing::fresh_seed;

namespace {

bool contains(const std::string& text, const std::string& part) { return text.find(part) != std::string::npos; }

void check_distribution(const CountDistribution& d, std::vector<std::int64_t> samples) {
  REQUIRE(d.samples == static_cast<std::int64_t>(samples.size()));
  if (samples.empty()) return;
  std::sort(samples.begin(), samples.end());
  const auto n = samples.size();
  const auto nearest_rank = [&](int p) {
    const auto rank = static_cast<std::size_t>((static_cast<std::uint64_t>(p) * n + 99) / 100);
    return samples[std::max<std::size_t>(rank, 1) - 1];
  };
  CHECK(d.min == samples.front());
  CHECK(d.max == samples.back());
  double sum = 0;
  for (auto v : samples) sum += static_cast<double>(v);
  CHECK(d.mean == doctest::Approx(sum / static_cast<double>(n)));
  CHECK(d.p50 == nearest_rank(50));
  CHECK(d.p90 == nearest_rank(90));
  CHECK(d.p99 == nearest_rank(99));
  std::vector<std::int64_t> histogram;
  for (auto v : samples) {
    std::size_t bin = 0;
    for (std::int64_t lo = 1; lo <= v; lo *= 2) ++bin;  // bin k holds [2^(k-1), 2^k)
    if (histogram.size() <= bin) histogram.resize(bin + 1, 0);
    ++histogram[bin];
  }
  CHECK(d.histogram == histogram);
}

template <class T>
std::int64_t tile_count(DenseView<const T> d, std::int64_t i, std::int64_t t0, std::int64_t tile) {
  std::int64_t n = 0;
  for (std::int64_t j = t0; j < std::min(d.cols, t0 + tile); ++j) n += is_stored(d.at(i, j));
  return n;
}

template <class T>
std::int64_t bytes_of(const HybridMatrix<T>& h) {
  return static_cast<std::int64_t>(h.twell().packed().bytes() + h.twell().value_plane().bytes() +
                                   h.overflow().values().bytes() + h.row_to_overflow().bytes() +
                                   h.overflow_to_row().bytes());
}

}  // namespace

TEST_CASE_TEMPLATE("stats: distributions, candidates and bytes match direct counts and real sizes", T, bf16, fp16,
                   float) {
  std::mt19937_64 rng(fresh_seed());
  for (const double density : {0.0, 0.005, 0.05, 0.3, 1.0}) {
    const std::int64_t rows = 1 + static_cast<std::int64_t>(rng() % 120);
    const std::int64_t cols = 1 + static_cast<std::int64_t>(rng() % 1100);
    const std::uint64_t seed = fresh_seed();
    CAPTURE(rows);
    CAPTURE(cols);
    CAPTURE(density);
    CAPTURE(seed);
    const auto d = testing::random_sparse_dense<T>(
        rows, cols, {.density = density, .specials = true, .empty_row_share = 0.1, .full_row_share = 0.03}, seed);
    const auto dv = d.view();
    StatsOptions options;
    options.default_layout = rng() % 2 ? TwellLayout{} : TwellLayout{64, 4};
    const MatrixStats s = stats(to_csr(d), options);

    std::vector<std::int64_t> per_row, per_tile;
    std::int64_t nnz = 0;
    for (std::int64_t i = 0; i < rows; ++i) {
      per_row.push_back(tile_count<T>(dv, i, 0, cols));
      nnz += per_row.back();
      for (std::int64_t t0 = 0; t0 < cols; t0 += options.default_layout.tile)
        per_tile.push_back(tile_count<T>(dv, i, t0, options.default_layout.tile));
    }
    CHECK(s.rows == rows);
    CHECK(s.cols == cols);
    CHECK(s.nnz == nnz);
    CHECK(s.dtype == dtype_of<T>);
    CHECK(s.density == doctest::Approx(static_cast<double>(nnz) / static_cast<double>(rows * cols)));
    check_distribution(s.per_row, per_row);
    check_distribution(s.per_row_tile, per_tile);

    REQUIRE(s.candidates.size() == 10);
    const LayoutStats* best = nullptr;
    for (const LayoutStats& c : s.candidates) {
      const TwellLayout l = c.layout;
      CAPTURE(l.tile);
      CAPTURE(l.compression);
      const std::int64_t capacity = l.tile / l.compression - 1;
      std::int64_t overflowed = 0, beyond = 0, overflow_rows = 0;
      for (std::int64_t i = 0; i < rows; ++i) {
        bool row_overflows = false;
        for (std::int64_t t0 = 0; t0 < cols; t0 += l.tile) {
          const std::int64_t n = tile_count<T>(dv, i, t0, l.tile);
          if (n > capacity) {
            ++overflowed;
            beyond += n - capacity;
            row_overflows = true;
          }
        }
        overflow_rows += row_overflows ? 1 : 0;
      }
      CHECK(c.overflowed_tiles == overflowed);
      CHECK(c.values_beyond_capacity == beyond);
      CHECK(c.overflow_rows == overflow_rows);
      const auto tw = to_twell(d, l, {.overflow = OverflowPolicy::drop});
      CHECK(c.twell_bytes == static_cast<std::int64_t>(tw.packed().bytes() + tw.value_plane().bytes()));
      const auto h = to_hybrid(d, l);
      CHECK(c.hybrid_bytes == bytes_of(h));
      if (best == nullptr || c.hybrid_bytes < best->hybrid_bytes ||
          (c.hybrid_bytes == best->hybrid_bytes &&
           (c.overflow_rows < best->overflow_rows ||
            (c.overflow_rows == best->overflow_rows &&
             (c.layout.tile > best->layout.tile ||
              (c.layout.tile == best->layout.tile && c.layout.compression < best->layout.compression))))))
        best = &c;
    }
    CHECK(s.recommended == best->layout);
    CHECK(s.at_default.layout == options.default_layout);

    const auto csr = to_csr(d);
    const auto ell = to_ell(d);
    CHECK(s.bytes.dense == static_cast<std::int64_t>(d.values().bytes()));
    CHECK(s.bytes.csr == static_cast<std::int64_t>(csr.row_ptr().bytes() + csr.col_idx().bytes() + csr.values().bytes()));
    CHECK(s.bytes.ell == static_cast<std::int64_t>(ell.row_count().bytes() + ell.col_idx().bytes() + ell.values().bytes()));
    CHECK(s.max_row_nnz == ell.width());
    const auto tw = to_twell(d, options.default_layout, {.overflow = OverflowPolicy::drop});
    CHECK(s.bytes.twell == static_cast<std::int64_t>(tw.packed().bytes() + tw.value_plane().bytes()));
    CHECK(s.bytes.hybrid == bytes_of(to_hybrid(d, s.recommended)));

    // Every other format (and its view) gives the same statistics.
    for (const MatrixStats& other : {stats(d, options), stats(ell, options), stats(to_hybrid(d, TwellLayout{16, 4}), options),
                                     stats(to_hybrid(d, TwellLayout{16, 4}).view(), options)}) {
      CHECK(other.nnz == s.nnz);
      CHECK(other.per_row.histogram == s.per_row.histogram);
      CHECK(other.per_row_tile.p99 == s.per_row_tile.p99);
      CHECK(other.recommended == s.recommended);
      CHECK(other.bytes.hybrid == s.bytes.hybrid);
    }

    const std::string text = format_stats(s);
    CHECK(contains(text, "matrix " + std::to_string(rows) + " x " + std::to_string(cols)));
    CHECK(contains(text, "nnz " + std::to_string(nnz)));
    CHECK(contains(text, "<- recommended"));
    CHECK(contains(text, "recommended layout: tile " + std::to_string(s.recommended.tile) + ", C " +
                             std::to_string(s.recommended.compression)));
  }
}

TEST_CASE("stats: empty shapes and a hand-made matrix") {
  const MatrixStats empty = stats(CsrMatrix<float>());
  CHECK(empty.rows == 0);
  CHECK(empty.nnz == 0);
  CHECK(empty.density == 0.0);
  CHECK(empty.per_row.samples == 0);
  CHECK(empty.per_row.histogram.empty());

  // Row 0: 5 nonzeros in columns 0..4; row 1: 1 nonzero; row 2: none. Tiles of 8 at C 4 hold 1.
  DenseMatrix<bf16> d(3, 16);
  for (int j = 0; j < 5; ++j) d.view().at(0, j) = from_float<bf16>(1.0f + static_cast<float>(j));
  d.view().at(1, 15) = from_float<bf16>(-3.0f);
  StatsOptions options;
  options.tiles = {8};
  options.compressions = {2, 4, 8};  // C = 8 gives S = 1: skipped
  options.default_layout = TwellLayout{8, 4};
  const MatrixStats s = stats(d, options);
  REQUIRE(s.candidates.size() == 2);
  CHECK(s.per_row.min == 0);
  CHECK(s.per_row.max == 5);
  CHECK(s.per_row.p50 == 1);
  CHECK(s.per_row.histogram == std::vector<std::int64_t>{1, 1, 0, 1});
  CHECK(s.per_row_tile.samples == 6);
  CHECK(s.at_default.overflowed_tiles == 1);
  CHECK(s.at_default.overflow_rows == 1);
  CHECK(s.at_default.values_beyond_capacity == 4);
  CHECK(s.candidates[0].layout == TwellLayout{8, 2});  // capacity 3: 2 values beyond
  CHECK(s.candidates[0].values_beyond_capacity == 2);
  // TwELL(8, 2): 3 rows x 2 tiles x 4 slots x 4 bytes = 96; its block: 1 row x 16 x 2 + maps 16.
  CHECK(s.candidates[0].twell_bytes == 96);
  CHECK(s.candidates[0].hybrid_bytes == 96 + 32 + 12 + 4);
  CHECK(s.candidates[1].hybrid_bytes == 48 + 32 + 12 + 4);
  CHECK(s.recommended == TwellLayout{8, 4});
}

// An sddmm output may hold explicit zeros; the converters drop them, and stats counts them as the
// converters do (it once took every stored entry, reporting overflow no conversion has).
TEST_CASE("stats: explicit zeros in a CSR are not nonzeros") {
  // One row of 8 columns: 3 nonzeros and an explicit zero in one tile of 8, at C 2 (capacity 3).
  const std::int64_t row_ptr[] = {0, 4, 4};
  const std::int32_t col_idx[] = {0, 1, 2, 3};
  const float values[] = {1.0f, 0.0f, 2.0f, -0.0f};
  const std::int32_t col_idx2[] = {0, 1, 2, 3};
  const float values2[] = {1.0f, 2.0f, 3.0f, 0.0f};
  for (const CsrView<const float> m : {CsrView<const float>{2, 8, 4, row_ptr, col_idx, values},
                                       CsrView<const float>{2, 8, 4, row_ptr, col_idx2, values2}}) {
    StatsOptions options;
    options.tiles = {8};
    options.compressions = {2};
    options.default_layout = TwellLayout{8, 2};
    const MatrixStats s = stats(m, options);
    const MatrixStats converted = stats(to_csr(m), options);  // to_csr drops the zeros
    CHECK(s.nnz == converted.nnz);
    CHECK(s.nnz < 4);
    CHECK(s.density == converted.density);
    CHECK(s.max_row_nnz == converted.max_row_nnz);
    CHECK(s.per_row.histogram == converted.per_row.histogram);
    CHECK(s.per_row_tile.samples == converted.per_row_tile.samples);
    CHECK(s.per_row_tile.histogram == converted.per_row_tile.histogram);
    CHECK(s.at_default.overflowed_tiles == 0);
    CHECK(s.at_default.overflow_rows == 0);
    CHECK(s.bytes.csr == converted.bytes.csr);
    CHECK(s.bytes.ell == converted.bytes.ell);
    CHECK(s.bytes.hybrid == converted.bytes.hybrid);
    CHECK(s.recommended == converted.recommended);
  }
}

// A valid TwELL or Hybrid wider than CSR's 32-bit columns: stats says it cannot count it, in its
// own name (it once passed on the inner conversion's invalid_argument).
TEST_CASE("stats: a valid matrix past 2^31 - 1 columns is unsupported, said by stats") {
  const std::int64_t wide = std::int64_t{std::numeric_limits<std::int32_t>::max()} + 9;
  const TwellView<const bf16> tw{0, wide, TwellLayout{}, nullptr, nullptr};
  const DenseView<const float> dense{nullptr, 0, wide, wide, MemorySpace::host};
  for (const auto& call : std::vector<std::function<void()>>{[&] { (void)stats(tw); }, [&] { (void)stats(dense); }}) {
    CHECK(testing::code_of(call) == ErrorCode::unsupported);
    CHECK(contains(testing::message_of(call), "twell::stats: cols = 2147483656 exceeds 2147483647"));
  }
}

TEST_CASE("stats: bad options and malformed input throw") {
  const auto csr = to_csr(testing::random_sparse_dense<float>(5, 50, {}, fresh_seed()));
  using testing::code_of;
  CHECK(code_of([&] { (void)stats(csr, StatsOptions{.tiles = {12}}); }) == ErrorCode::invalid_argument);
  CHECK(code_of([&] { (void)stats(csr, StatsOptions{.compressions = {3}}); }) == ErrorCode::invalid_argument);
  CHECK(code_of([&] { (void)stats(csr, StatsOptions{.default_layout = TwellLayout{256, 256}}); }) ==
        ErrorCode::invalid_argument);
  auto broken = to_csr(csr);
  broken.row_ptr().data()[5] = 0;
  CHECK(code_of([&] { (void)stats(broken); }) == ErrorCode::malformed);
}

// col_idx is 32-bit: a CSR of more columns is malformed, and stats says so before its figures
// (TwellLayout::tiles overflowed on INT64_MAX columns). A TwELL has no such limit, but its packed
// geometry must fit int64: the validation that its conversion to CSR starts with says so.
TEST_CASE("stats: a CSR wider than 2^31 - 1 columns, or a TwELL past int64 index math, is refused first") {
  constexpr std::int64_t kMax = std::numeric_limits<std::int64_t>::max();
  const std::int64_t row_ptr[] = {0};
  const CsrView<const float> wide{0, kMax, 0, row_ptr, nullptr, nullptr, MemorySpace::host};
  CHECK(testing::code_of([&] { (void)stats(wide); }) == ErrorCode::malformed);
  CHECK(testing::message_of([&] { (void)stats(wide); }).find("cols = 9223372036854775807 exceeds 2147483647") !=
        std::string::npos);
  for (const TwellView<const bf16> tw : {TwellView<const bf16>{0, kMax, TwellLayout{}, nullptr, nullptr},
                                         TwellView<const bf16>{kMax / 4, 1 << 20, TwellLayout{}, nullptr, nullptr}}) {
    CAPTURE(tw.rows);
    CHECK(testing::code_of([&] { (void)stats(tw); }) == ErrorCode::malformed);
    CHECK(testing::message_of([&] { (void)stats(tw); }).find("holds more than 2^63 - 1 packed words") !=
          std::string::npos);
  }
}

// A CSR of 2^30 + 1 empty fp32 rows by 2^31 - 1 columns is valid, but its dense copy would take
// more than 2^63 - 1 bytes: stats refuses it instead of wrapping the figure. Its 8 GiB row_ptr is
// a zero mapping that is never written (MAP_NORESERVE), so the test costs no memory.
TEST_CASE("stats: byte figures past 2^63 - 1 are refused, not wrapped") {
  const std::int64_t rows = (std::int64_t{1} << 30) + 1;
  const std::size_t bytes = static_cast<std::size_t>(rows + 1) * sizeof(std::int64_t);
  void* zeros = mmap(nullptr, bytes, PROT_READ, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  REQUIRE(zeros != MAP_FAILED);
  const std::int32_t col = 0;
  const float value = 1.0f;
  const CsrView<const float> huge{rows, std::int64_t{INT32_MAX}, 0, static_cast<const std::int64_t*>(zeros), &col,
                                  &value, MemorySpace::host};
  const StatsOptions one_layout{.tiles = {256}, .compressions = {8}};
  CHECK(testing::code_of([&] { (void)stats(huge, one_layout); }) == ErrorCode::unsupported);
  // A 64th of the rows fits: every figure is counted exactly.
  const CsrView<const float> part{rows / 64, std::int64_t{INT32_MAX}, 0, static_cast<const std::int64_t*>(zeros), &col,
                                  &value, MemorySpace::host};
  const MatrixStats s = stats(part, one_layout);
  CHECK(s.bytes.dense == (rows / 64) * std::int64_t{INT32_MAX} * 4);
  CHECK(s.bytes.csr == (rows / 64 + 1) * 8);
  munmap(zeros, bytes);
}
