// validate / find_violation: every produced matrix passes, and each invariant, broken alone in
// an otherwise valid matrix, is reported (ErrorCode::malformed, with its coordinates).
#include <doctest/doctest.h>

#include <cmath>
#include <functional>
#include <initializer_list>
#include <limits>
#include <random>
#include <string>

#include <twell/converters/backends.hpp>
#include <twell/twell.hpp>

#include "checks.hpp"
#include "random.hpp"

using namespace twell;
using testing::fresh_seed;

namespace {

bool contains(const std::string& text, const std::string& part) { return text.find(part) != std::string::npos; }

template <class View>
void expect_malformed(View v, const std::string& part, ValidateOptions options = {}) {
  const std::string found = find_violation(v, options);
  CAPTURE(found);
  CHECK(contains(found, part));
  try {
    validate(v, options);
    FAIL("validate accepted a broken matrix");
  } catch (const Error& e) {
    CHECK(e.code() == ErrorCode::malformed);
    CHECK(contains(e.what(), "twell::validate"));
    CHECK(contains(e.what(), part));
  }
}

// 4 x 20 with hand-placed entries; tiles of 8 columns leave a ragged last tile (16..19).
//   row 0: columns 1, 3, 17    row 1: column 9    row 2: empty    row 3: columns 0, 2, 5, 12
// Layout {8, 4} (S = 2, capacity 1) overflows rows 0 and 3 in tile 0; {8, 2} (capacity 3) fits.
template <class T>
DenseMatrix<T> base() {
  DenseMatrix<T> d(4, 20);
  auto v = d.view();
  v.at(0, 1) = from_float<T>(1.5f);
  v.at(0, 3) = from_float<T>(-2.0f);
  v.at(0, 17) = from_float<T>(std::nanf(""));
  v.at(1, 9) = from_float<T>(3.25f);
  v.at(3, 0) = from_float<T>(-0.5f);
  v.at(3, 2) = from_float<T>(std::numeric_limits<float>::infinity());
  v.at(3, 5) = from_float<T>(0.75f);
  v.at(3, 12) = from_float<T>(-4.0f);
  return d;
}

constexpr TwellLayout kFits{8, 2};
constexpr TwellLayout kOverflows{8, 4};

template <class T>
std::int64_t offset(TwellView<T> v, std::int64_t row, std::int64_t tile, std::int32_t slot = 0) {
  return v.layout.slot_offset(row, tile, v.cols) + slot;
}

// Sets the value of a TwELL slot (the high half of the word, or the value plane for fp32).
template <class T>
void set_slot_value(TwellView<T> v, std::int64_t at, float value) {
  if constexpr (ValueTraits<T>::packs_in_slot) {
    std::uint32_t& w = v.packed[at];
    w = TwellLayout::pack(ValueTraits<T>::to_bits(from_float<T>(value)), TwellLayout::slot_column(w));
  } else {
    v.value_plane[at] = value;
  }
}

template <class T>
void set_slot_column(TwellView<T> v, std::int64_t at, std::uint32_t col) {
  std::uint32_t& w = v.packed[at];
  w = ValueTraits<T>::packs_in_slot ? TwellLayout::pack(TwellLayout::slot_value_bits(w), col) : col;
}

// One invariant broken alone: `edit` changes a mutable view of a fresh valid matrix (its fields or
// the arrays it points into), and validation must report `part`.
template <class View>
struct Broken {
  const char* invariant;
  std::function<void(View&)> edit;
  const char* part;
};

template <class Make>
void expect_each_reported(Make make, std::initializer_list<Broken<decltype(make().view())>> cases) {
  for (const auto& c : cases) {
    CAPTURE(c.invariant);
    auto m = make();
    auto v = m.view();
    c.edit(v);
    expect_malformed(v, c.part);
  }
}

}  // namespace

TEST_CASE_TEMPLATE("validate accepts every matrix the converters produce", T, bf16, fp16, float) {
  std::mt19937_64 rng(fresh_seed());
  const TwellLayout layouts[] = {{8, 2}, {16, 4}, {64, 8}, {256, 8}, {256, 32}};
  for (int trial = 0; trial < 12; ++trial) {
    const std::int64_t rows = static_cast<std::int64_t>(rng() % 80);
    const std::int64_t cols = static_cast<std::int64_t>(rng() % 700);
    const double density = std::array{0.0, 0.005, 0.05, 0.5, 1.0}[rng() % 5];
    const TwellLayout layout = layouts[rng() % std::size(layouts)];
    CAPTURE(rows);
    CAPTURE(cols);
    CAPTURE(density);
    const auto d = testing::random_sparse_dense<T>(
        rows, cols, {.density = density, .specials = true, .empty_row_share = 0.1, .full_row_share = 0.05},
        fresh_seed());
    CHECK(find_violation(d) == "");
    CHECK_NOTHROW(validate(to_csr(d)));
    CHECK_NOTHROW(validate(to_ell(d)));
    // Width 2 where the columns allow it (an ELL is no wider than its columns).
    const std::int64_t narrow = std::min<std::int64_t>(2, cols);
    CHECK_NOTHROW(validate(to_ell(d, {.overflow = OverflowPolicy::drop, .ell_width = narrow})));
    CHECK_NOTHROW(validate(to_twell(d, layout, {.overflow = OverflowPolicy::drop})));
    CHECK_NOTHROW(validate(to_hybrid(d, layout)));
    CHECK_NOTHROW(validate(to_hybrid(to_csr(d), TwellLayout{8, 4})));
  }
  CHECK_NOTHROW(validate(CsrMatrix<T>()));
  CHECK_NOTHROW(validate(EllMatrix<T>()));
  CHECK_NOTHROW(validate(to_hybrid(base<T>(), kOverflows)));
  CHECK_NOTHROW(validate(to_twell(base<T>(), kFits)));
}

// ---- dense ----

TEST_CASE_TEMPLATE("dense: shape non-negative, ld >= cols, data present", T, bf16, fp16, float) {
  const auto d = base<T>();
  expect_malformed(DenseView<const T>{d.view().data, -1, 20, 20, MemorySpace::host}, "shape -1 x 20 is negative");
  expect_malformed(DenseView<const T>{d.view().data, 4, 20, 19, MemorySpace::host},
                   "ld = 19 is smaller than cols = 20");
  expect_malformed(DenseView<const T>{nullptr, 4, 20, 20, MemorySpace::host}, "data is null");
  CHECK(find_violation(DenseView<const T>{nullptr, 0, 20, 20, MemorySpace::host}) == "");
  // Off a value boundary: what every entry point refuses (ErrorCode::misaligned), validate reports.
  expect_malformed(testing::off_boundary(DenseView<const T>(d.view())), "-byte value boundary");
}

// ---- CSR ----

TEST_CASE_TEMPLATE("CSR: each invariant broken alone is reported", T, bf16, fp16, float) {
  expect_each_reported(
      [] { return to_csr(base<T>()); },
      {
          {"nnz non-negative", [](auto& v) { v.nnz = -2; }, "with nnz -2 is negative"},
          {"row_ptr present", [](auto& v) { v.row_ptr = nullptr; }, "row_ptr is null but must hold 5 elements"},
          {"col_idx present", [](auto& v) { v.col_idx = nullptr; }, "col_idx is null but must hold 8 elements"},
          {"values present", [](auto& v) { v.values = nullptr; }, "values is null"},
          {"row_ptr[0] == 0", [](auto& v) { v.row_ptr[0] = 1; }, "row_ptr[0] = 1, must be 0"},
          // Row 1 would end before it starts (row_ptr[1] = 3).
          {"row_ptr non-decreasing", [](auto& v) { v.row_ptr[2] = 1; },
           "CSR row 1: row_ptr[2] = 1 is smaller than row_ptr[1] = 3"},
          {"row_ptr within nnz", [](auto& v) { v.row_ptr[3] = v.row_ptr[4] = 9; },
           "CSR row 2: row_ptr[3] = 9 exceeds nnz = 8"},
          {"row_ptr[M] == nnz", [](auto& v) { v.row_ptr[4] = 7; }, "row_ptr[4] = 7 differs from nnz = 8"},
          {"columns below N", [](auto& v) { v.col_idx[7] = 20; }, "CSR row 3: col_idx[7] = 20 is outside [0, 20)"},
          {"columns non-negative", [](auto& v) { v.col_idx[0] = -1; }, "CSR row 0: col_idx[0] = -1 is outside"},
          // Row 0: columns 1, 1, 17.
          {"columns strictly increase within a row", [](auto& v) { v.col_idx[1] = 1; },
           "CSR row 0: col_idx[1] = 1 does not follow col_idx[0] = 1"},
      });
}

TEST_CASE_TEMPLATE("CSR: no stored zero unless allowed", T, bf16, fp16, float) {
  auto m = to_csr(base<T>());
  m.values().data()[4] = from_float<T>(-0.0f);
  expect_malformed(m.view(), "CSR row 3, column 0: values[4] = -0");
  CHECK(find_violation(m.view(), {.allow_explicit_zeros = true}) == "");
}

// ---- ELL ----

TEST_CASE_TEMPLATE("ELL: each invariant broken alone is reported", T, bf16, fp16, float) {
  expect_each_reported(
      [] { return to_ell(base<T>()); },
      {
          {"width non-negative", [](auto& v) { v.width = -1; }, "with width -1 is negative"},
          {"row_count present", [](auto& v) { v.row_count = nullptr; }, "row_count is null"},
          {"values present", [](auto& v) { v.values = nullptr; }, "values is null but must hold 16 elements"},
          {"counts at most W", [](auto& v) { v.row_count[2] = 5; },
           "ELL row 2: row_count = 5 is outside [0, width = 4]"},
          {"counts non-negative", [](auto& v) { v.row_count[2] = -1; }, "ELL row 2: row_count = -1"},
          // Row 1, slot 0.
          {"columns in range", [](auto& v) { v.col_idx[4] = 25; }, "ELL row 1, slot 0: column 25 is outside [0, 20)"},
          // Row 3: columns 0, 2, 1, 12.
          {"columns strictly increase", [](auto& v) { v.col_idx[12 + 2] = 1; },
           "ELL row 3, slot 2: column 1 does not follow column 2"},
          {"padding columns zero", [](auto& v) { v.col_idx[4 + 3] = 7; },
           "ELL row 1, padding slot 3: column 7, must be 0"},
          // Row 2 is empty.
          {"padding values zero bits (-0.0 too)", [](auto& v) { v.values[8] = from_float<T>(-0.0f); },
           "ELL row 2, padding slot 0: value -0"},
      });
}

TEST_CASE_TEMPLATE("ELL: no stored zero unless allowed", T, bf16, fp16, float) {
  auto m = to_ell(base<T>());
  m.values().data()[4] = T{};
  expect_malformed(m.view(), "ELL row 1, slot 0 (column 9): stored value 0");
  CHECK(find_violation(m.view(), {.allow_explicit_zeros = true}) == "");
}

TEST_CASE_TEMPLATE("ELL: no wider than its columns, in the validator and the converters", T, bf16, fp16, float) {
  // A row holds at most one entry per column: slots beyond cols are padding no row can use. The
  // converters took any ell_width (the twell tool wrote 1.6 GB for a 2 x 3 matrix at 10^8).
  const EllMatrix<T> wide(2, 3, 4);
  expect_malformed(wide.view(), "ELL: width = 4 exceeds cols = 3");
  CHECK(find_violation(EllMatrix<T>(2, 3, 3).view()) == "");
  const auto d = base<T>();
  const auto csr = to_csr(d);
  for (const std::int64_t width : {std::int64_t{21}, std::int64_t{100000000}}) {
    CAPTURE(width);
    const std::string why = "options.ell_width = " + std::to_string(width) + " exceeds cols = 20";
    const ConvertOptions o{.ell_width = width};
    for (const auto& convert :
         std::initializer_list<std::function<void()>>{[&] { (void)to_ell(d, o); }, [&] { (void)to_ell(csr, o); },
                                                      [&] { (void)reference::dense_to_ell<T>(d.view(), o); },
                                                      [&] { (void)reference::csr_to_ell<T>(csr.view(), o); }}) {
      CHECK(testing::code_of(convert) == ErrorCode::invalid_argument);
      CHECK(contains(testing::message_of(convert), why));
    }
  }
  CHECK(to_ell(d, {.ell_width = 20}).width() == 20);
  // rows x width past 2^63 - 1 is reported, not wrapped to an empty view whose arrays go unchecked.
  const EllView<const T> huge{
      std::int64_t{1} << 62, std::numeric_limits<std::int32_t>::max(), 4, nullptr, nullptr, nullptr};
  expect_malformed(huge, "ELL: shape 4611686018427387904 x width 4 holds more than 2^63 - 1 slots");
}

// ---- 32-bit column indices ----

TEST_CASE("CSR and ELL: at most 2^31 - 1 columns, what their 32-bit column indices serve") {
  constexpr std::int64_t kWidest = std::numeric_limits<std::int32_t>::max();
  const std::int64_t row_ptr[] = {0};
  for (const std::int64_t cols : {kWidest + 1, std::numeric_limits<std::int64_t>::max()}) {
    CAPTURE(cols);
    const std::string why = "cols = " + std::to_string(cols) + " exceeds 2147483647";
    expect_malformed(CsrView<const float>{0, cols, 0, row_ptr, nullptr, nullptr}, "CSR: " + why);
    expect_malformed(EllView<const float>{0, cols, 0, nullptr, nullptr, nullptr}, "ELL: " + why);
  }
  CHECK(find_violation(CsrView<const float>{0, kWidest, 0, row_ptr, nullptr, nullptr}) == "");
  CHECK(find_violation(EllView<const float>{0, kWidest, 0, nullptr, nullptr, nullptr}) == "");
}

// ---- TwELL ----

TEST_CASE_TEMPLATE("TwELL: planes present, value plane for fp32 only", T, bf16, fp16, float) {
  const auto m = to_twell(base<T>(), kFits);
  auto v = m.view();
  v.packed = nullptr;
  expect_malformed(v, "packed is null but must hold 48 elements");
  v = m.view();
  if constexpr (ValueTraits<T>::packs_in_slot) {
    v.value_plane = reinterpret_cast<const T*>(m.packed().data());
    expect_malformed(v, "value_plane is set");
  } else {
    v.value_plane = nullptr;
    expect_malformed(v, "value_plane is null");
  }
}

TEST_CASE_TEMPLATE("TwELL: each invariant broken alone is reported", T, bf16, fp16, float) {
  expect_each_reported(
      [] { return to_twell(base<T>(), kFits); },
      {
          {"layout valid", [](auto& v) { v.layout.compression = 3; },
           "layout.compression (C) = 3 must be a power of two"},
          {"count within capacity", [](auto& v) { v.packed[offset(v, 1, 1)] = 4; },
           "TwELL row 1, tile 1: count 4 exceeds the capacity S-1 = 3 of layout (tile 8, C 2)"},
          {"count within the width of a ragged tile", [](auto& v) { v.packed[offset(v, 2, 2)] = 5; },
           "TwELL row 2, tile 2: count 5 exceeds the tile's 4 columns"},
          // Global column 17 becomes local 4 of a 4-column tile.
          {"local columns inside their (ragged) tile", [](auto& v) { set_slot_column(v, offset(v, 0, 2, 1), 4); },
           "TwELL row 0, tile 2, slot 1: column 4 is outside the tile's 4 columns"},
          // Row 3, tile 0: columns 0, 2, 2.
          {"columns strictly increase", [](auto& v) { set_slot_column(v, offset(v, 3, 0, 3), 2); },
           "TwELL row 3, tile 0, slot 3: column 2 does not follow column 2 of slot 2"},
          {"unused slots zero", [](auto& v) { v.packed[offset(v, 1, 1, 2)] = 0x10000u; },
           "TwELL row 1, tile 1, slot 2: unused slot holds 0x10000, must be 0 (count 1)"},
      });
}

TEST_CASE_TEMPLATE("TwELL: no stored zero unless allowed", T, bf16, fp16, float) {
  auto m = to_twell(base<T>(), kFits);
  set_slot_value(m.view(), offset(m.view(), 3, 1, 1), -0.0f);
  expect_malformed(m.view(), "TwELL row 3, tile 1, slot 1 (column 12): stored value -0");
  CHECK(find_violation(m.view(), {.allow_explicit_zeros = true}) == "");
  set_slot_value(m.view(), offset(m.view(), 3, 1, 1), 0.0f);
  expect_malformed(m.view(), "stored value 0 (bits 0x0) is zero");
}

TEST_CASE("TwELL fp32: the value plane's unused slots and slot 0 hold zero bits") {
  expect_each_reported(
      [] { return to_twell(base<float>(), kFits); },
      {
          {"unused value-plane slots zero bits", [](auto& v) { v.value_plane[offset(v, 2, 0, 1)] = -0.0f; },
           "TwELL row 2, tile 0, slot 1: unused value-plane slot holds -0"},
          {"value-plane slot 0 zero", [](auto& v) { v.value_plane[offset(v, 1, 2)] = 1.0f; },
           "TwELL row 1, tile 2: value-plane slot 0 holds 1"},
      });
}

// ---- Hybrid ----

TEST_CASE_TEMPLATE("Hybrid: each invariant broken alone is reported", T, bf16, fp16, float) {
  REQUIRE(to_hybrid(base<T>(), kOverflows).overflow_rows() == 2);
  expect_each_reported(
      [] { return to_hybrid(base<T>(), kOverflows); },
      {
          {"the TwELL part's invariants", [](auto& v) { v.twell.packed[offset(v.twell, 2, 1, 1)] = 3; },
           "Hybrid TwELL part row 2, tile 1, slot 1: unused slot holds 0x3"},
          {"block columns match the matrix", [](auto& v) { v.overflow.cols = 19; },
           "the overflow block has 19 columns but the matrix has 20"},
          {"block rows at most the matrix's", [](auto& v) { v.overflow.rows = 5; },
           "the overflow block has 5 rows, more than the matrix's 4"},
          {"block space matches", [](auto& v) { v.overflow.space = MemorySpace::device; },
           "the overflow block lives in device memory, the TwELL part in host"},
          {"block ld >= cols", [](auto& v) { v.overflow.ld = 3; },
           "Hybrid overflow block: ld = 3 is smaller than cols = 20"},
          {"row_to_overflow present", [](auto& v) { v.row_to_overflow = nullptr; },
           "row_to_overflow is null but must hold 4 elements"},
          {"overflow_to_row present", [](auto& v) { v.overflow_to_row = nullptr; },
           "overflow_to_row is null but must hold 2 elements"},
          {"overflow_to_row in range", [](auto& v) { v.overflow_to_row[1] = 4; },
           "overflow_to_row[1] = 4 is outside [0, 4)"},
          {"overflow_to_row strictly increasing",
           [](auto& v) {
             v.overflow_to_row[0] = 3;
             v.overflow_to_row[1] = 0;
             v.row_to_overflow[3] = 0;
             v.row_to_overflow[0] = 1;
           },
           "overflow_to_row[1] = 0 does not follow overflow_to_row[0] = 3"},
          {"overflow_to_row agrees with row_to_overflow", [](auto& v) { v.row_to_overflow[3] = -1; },
           "overflow_to_row[1] = 3 but row_to_overflow[3] = -1"},
          {"row_to_overflow in [-1, R)", [](auto& v) { v.row_to_overflow[1] = 2; },
           "row_to_overflow[1] = 2 is outside [-1, 2)"},
          {"row_to_overflow agrees with overflow_to_row", [](auto& v) { v.row_to_overflow[1] = 0; },
           "row_to_overflow[1] = 0 but overflow_to_row[0] = 0"},
          // Row 3 dropped from the block, consistently.
          {"a row with an overflowed tile is in the block",
           [](auto& v) {
             v.row_to_overflow[3] = -1;
             v.overflow.rows = 1;
           },
           "Hybrid row 3, tile 0: count 3 exceeds the capacity S-1 = 1 but the row is not in the overflow block"},
          // Row 0, tile 0 held 2.
          {"a block row has an overflowed tile", [](auto& v) { v.twell.packed[offset(v.twell, 0, 0)] = 1; },
           "Hybrid row 0 is in the overflow block (block row 0) but none of its tiles"},
          {"shadow count equals the dense row's nonzeros per tile",
           [](auto& v) { v.twell.packed[offset(v.twell, 3, 0)] = 4; },
           "Hybrid row 3 (overflow block row 1), tile 0: slot 0 says count 4 but the dense row holds 3"},
          // Tile 2 of row 0 now holds 2 in the dense row.
          {"dense nonzeros per tile equal the shadow count",
           [](auto& v) { v.overflow.at(0, 16) = from_float<T>(1.0f); },
           "Hybrid row 0 (overflow block row 0), tile 2: slot 0 says count 1 but the dense row holds 2"},
          {"shadow entries equal the dense row's, bit for bit",
           [](auto& v) { set_slot_value(v.twell, offset(v.twell, 3, 0, 1), 0.25f); },
           "Hybrid row 3 (overflow block row 1), tile 0, slot 1: shadow entry (column 0, value 0.25"},
          // Row 0's first nonzero moves from column 1 to column 0.
          {"shadow columns equal the dense row's first nonzeros",
           [](auto& v) {
             v.overflow.at(0, 0) = v.overflow.at(0, 1);
             v.overflow.at(0, 1) = T{};
           },
           "shadow entry (column 1, value 1.5 (bits"},
      });
}

TEST_CASE_TEMPLATE("Hybrid with explicit zeros: dense nonzeros lie in the pattern", T, bf16, fp16, float) {
  const ValidateOptions lenient{.allow_explicit_zeros = true};
  auto h = to_hybrid(base<T>(), kOverflows);
  CHECK(find_violation(h.view(), lenient) == "");
  // A structural zero in the shadow (row 0, column 1), +0 in the dense row: fine when allowed.
  set_slot_value(h.twell().view(), offset(h.twell().view(), 0, 0, 1), 0.0f);
  h.overflow().view().at(0, 1) = T{};
  CHECK(find_violation(h.view(), lenient) == "");
  expect_malformed(h.view(), "Hybrid TwELL part row 0, tile 0, slot 1 (column 1): stored value 0");
  // More dense nonzeros in a tile than its pattern holds.
  h = to_hybrid(base<T>(), kOverflows);
  h.overflow().view().at(1, 1) = from_float<T>(2.0f);
  expect_malformed(h.view(),
                   "Hybrid row 3 (overflow block row 1), tile 0: the dense row holds 4 nonzeros in the tile, more than "
                   "its count 3",
                   lenient);
  // A dense nonzero outside the pattern: row 3, tile 1 holds column 12 (now a structural zero);
  // column 8 is not in it.
  h = to_hybrid(base<T>(), kOverflows);
  set_slot_value(h.twell().view(), offset(h.twell().view(), 3, 1, 1), 0.0f);
  h.overflow().view().at(1, 12) = T{};
  h.overflow().view().at(1, 8) = from_float<T>(2.0f);
  expect_malformed(h.view(), "Hybrid row 3 (overflow block row 1), tile 1: the dense row's nonzero at column 8",
                   lenient);
  // Shadow values still match the dense row bit for bit.
  h = to_hybrid(base<T>(), kOverflows);
  set_slot_value(h.twell().view(), offset(h.twell().view(), 3, 0, 1), 0.0f);
  expect_malformed(h.view(), "differs from the dense row's value", lenient);
}
