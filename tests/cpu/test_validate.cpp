// validate / find_violation: every produced matrix passes, and each invariant, broken alone in
// an otherwise valid matrix, is reported (ErrorCode::malformed, with its coordinates).
#include <doctest/doctest.h>

#include <cmath>
#include <random>
#include <string>

#include <twell/twell.hpp>

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
std::int64_t offset(const TwellMatrix<T>& m, std::int64_t row, std::int64_t tile, std::int32_t slot = 0) {
  return m.layout().slot_offset(row, tile, m.cols()) + slot;
}

// Sets the value of a TwELL slot (the high half of the word, or the value plane for fp32).
template <class T>
void set_slot_value(TwellMatrix<T>& m, std::int64_t at, float value) {
  if constexpr (ValueTraits<T>::packs_in_slot) {
    std::uint32_t& w = m.packed().data()[at];
    w = TwellLayout::pack(ValueTraits<T>::to_bits(from_float<T>(value)), TwellLayout::slot_column(w));
  } else {
    m.value_plane().data()[at] = value;
  }
}

template <class T>
void set_slot_column(TwellMatrix<T>& m, std::int64_t at, std::uint32_t col) {
  std::uint32_t& w = m.packed().data()[at];
  w = ValueTraits<T>::packs_in_slot ? TwellLayout::pack(TwellLayout::slot_value_bits(w), col) : col;
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
        rows, cols, {.density = density, .specials = true, .empty_row_share = 0.1, .full_row_share = 0.05}, fresh_seed());
    CHECK(find_violation(d) == "");
    CHECK_NOTHROW(validate(to_csr(d)));
    CHECK_NOTHROW(validate(to_ell(d)));
    CHECK_NOTHROW(validate(to_ell(d, {.overflow = OverflowPolicy::drop, .ell_width = 2})));
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
  expect_malformed(DenseView<const T>{d.view().data, 4, 20, 19, MemorySpace::host}, "ld = 19 is smaller than cols = 20");
  expect_malformed(DenseView<const T>{nullptr, 4, 20, 20, MemorySpace::host}, "data is null");
  CHECK(find_violation(DenseView<const T>{nullptr, 0, 20, 20, MemorySpace::host}) == "");
}

// ---- CSR ----

TEST_CASE_TEMPLATE("CSR: shape and nnz non-negative", T, bf16, fp16, float) {
  auto m = to_csr(base<T>());
  auto v = CsrView<const T>(m.view());
  v.nnz = -2;
  expect_malformed(v, "with nnz -2 is negative");
}

TEST_CASE_TEMPLATE("CSR: arrays present", T, bf16, fp16, float) {
  const auto m = to_csr(base<T>());
  auto v = m.view();
  v.row_ptr = nullptr;
  expect_malformed(v, "row_ptr is null but must hold 5 elements");
  v = m.view();
  v.col_idx = nullptr;
  expect_malformed(v, "col_idx is null but must hold 8 elements");
  v = m.view();
  v.values = nullptr;
  expect_malformed(v, "values is null");
}

TEST_CASE_TEMPLATE("CSR: row_ptr[0] == 0", T, bf16, fp16, float) {
  auto m = to_csr(base<T>());
  m.row_ptr().data()[0] = 1;
  expect_malformed(m.view(), "row_ptr[0] = 1, must be 0");
}

TEST_CASE_TEMPLATE("CSR: row_ptr non-decreasing", T, bf16, fp16, float) {
  auto m = to_csr(base<T>());
  m.row_ptr().data()[2] = 1;  // row 1 would end before it starts (row_ptr[1] = 3)
  expect_malformed(m.view(), "CSR row 1: row_ptr[2] = 1 is smaller than row_ptr[1] = 3");
}

TEST_CASE_TEMPLATE("CSR: row_ptr within nnz", T, bf16, fp16, float) {
  auto m = to_csr(base<T>());
  m.row_ptr().data()[3] = 9;
  m.row_ptr().data()[4] = 9;
  expect_malformed(m.view(), "CSR row 2: row_ptr[3] = 9 exceeds nnz = 8");
}

TEST_CASE_TEMPLATE("CSR: row_ptr[M] == nnz", T, bf16, fp16, float) {
  auto m = to_csr(base<T>());
  m.row_ptr().data()[4] = 7;
  expect_malformed(m.view(), "row_ptr[4] = 7 differs from nnz = 8");
}

TEST_CASE_TEMPLATE("CSR: columns in [0, N)", T, bf16, fp16, float) {
  auto m = to_csr(base<T>());
  m.col_idx().data()[7] = 20;
  expect_malformed(m.view(), "CSR row 3: col_idx[7] = 20 is outside [0, 20)");
  m.col_idx().data()[7] = 12;
  m.col_idx().data()[0] = -1;
  expect_malformed(m.view(), "CSR row 0: col_idx[0] = -1 is outside");
}

TEST_CASE_TEMPLATE("CSR: columns strictly increase within a row", T, bf16, fp16, float) {
  auto m = to_csr(base<T>());
  m.col_idx().data()[1] = 1;  // row 0: 1, 1, 17
  expect_malformed(m.view(), "CSR row 0: col_idx[1] = 1 does not follow col_idx[0] = 1");
}

TEST_CASE_TEMPLATE("CSR: no stored zero unless allowed", T, bf16, fp16, float) {
  auto m = to_csr(base<T>());
  m.values().data()[4] = from_float<T>(-0.0f);
  expect_malformed(m.view(), "CSR row 3, column 0: values[4] = -0");
  CHECK(find_violation(m.view(), {.allow_explicit_zeros = true}) == "");
}

// ---- ELL ----

TEST_CASE_TEMPLATE("ELL: shape and width non-negative", T, bf16, fp16, float) {
  const auto m = to_ell(base<T>());
  auto v = m.view();
  v.width = -1;
  expect_malformed(v, "with width -1 is negative");
}

TEST_CASE_TEMPLATE("ELL: arrays present", T, bf16, fp16, float) {
  const auto m = to_ell(base<T>());
  auto v = m.view();
  v.row_count = nullptr;
  expect_malformed(v, "row_count is null");
  v = m.view();
  v.values = nullptr;
  expect_malformed(v, "values is null but must hold 16 elements");
}

TEST_CASE_TEMPLATE("ELL: counts within [0, W]", T, bf16, fp16, float) {
  auto m = to_ell(base<T>());
  m.row_count().data()[2] = 5;
  expect_malformed(m.view(), "ELL row 2: row_count = 5 is outside [0, width = 4]");
  m.row_count().data()[2] = -1;
  expect_malformed(m.view(), "ELL row 2: row_count = -1");
}

TEST_CASE_TEMPLATE("ELL: columns in range", T, bf16, fp16, float) {
  auto m = to_ell(base<T>());
  m.col_idx().data()[4] = 25;  // row 1, slot 0
  expect_malformed(m.view(), "ELL row 1, slot 0: column 25 is outside [0, 20)");
}

TEST_CASE_TEMPLATE("ELL: columns strictly increase", T, bf16, fp16, float) {
  auto m = to_ell(base<T>());
  m.col_idx().data()[12 + 2] = 1;  // row 3: 0, 2, 1, 12
  expect_malformed(m.view(), "ELL row 3, slot 2: column 1 does not follow column 2");
}

TEST_CASE_TEMPLATE("ELL: no stored zero unless allowed", T, bf16, fp16, float) {
  auto m = to_ell(base<T>());
  m.values().data()[4] = T{};
  expect_malformed(m.view(), "ELL row 1, slot 0 (column 9): stored value 0");
  CHECK(find_violation(m.view(), {.allow_explicit_zeros = true}) == "");
}

TEST_CASE_TEMPLATE("ELL: padding columns zero", T, bf16, fp16, float) {
  auto m = to_ell(base<T>());
  m.col_idx().data()[4 + 3] = 7;
  expect_malformed(m.view(), "ELL row 1, padding slot 3: column 7, must be 0");
}

TEST_CASE_TEMPLATE("ELL: padding values zero bits (-0.0 too)", T, bf16, fp16, float) {
  auto m = to_ell(base<T>());
  m.values().data()[8] = from_float<T>(-0.0f);  // row 2 is empty
  expect_malformed(m.view(), "ELL row 2, padding slot 0: value -0");
}

// ---- TwELL ----

TEST_CASE_TEMPLATE("TwELL: layout valid", T, bf16, fp16, float) {
  const auto m = to_twell(base<T>(), kFits);
  auto v = m.view();
  v.layout.compression = 3;
  expect_malformed(v, "layout.compression (C) = 3 must be a power of two");
}

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

TEST_CASE_TEMPLATE("TwELL: count within capacity", T, bf16, fp16, float) {
  auto m = to_twell(base<T>(), kFits);
  m.packed().data()[offset(m, 1, 1)] = 4;
  expect_malformed(m.view(), "TwELL row 1, tile 1: count 4 exceeds the capacity S-1 = 3 of layout (tile 8, C 2)");
}

TEST_CASE_TEMPLATE("TwELL: count within the width of a ragged tile", T, bf16, fp16, float) {
  auto m = to_twell(base<T>(), kFits);
  m.packed().data()[offset(m, 2, 2)] = 5;
  expect_malformed(m.view(), "TwELL row 2, tile 2: count 5 exceeds the tile's 4 columns");
}

TEST_CASE_TEMPLATE("TwELL: local columns inside their (ragged) tile", T, bf16, fp16, float) {
  auto m = to_twell(base<T>(), kFits);
  set_slot_column(m, offset(m, 0, 2, 1), 4);  // global 17 -> local 4 of a 4-column tile
  expect_malformed(m.view(), "TwELL row 0, tile 2, slot 1: column 4 is outside the tile's 4 columns");
}

TEST_CASE_TEMPLATE("TwELL: columns strictly increase", T, bf16, fp16, float) {
  auto m = to_twell(base<T>(), kFits);
  set_slot_column(m, offset(m, 3, 0, 3), 2);  // row 3, tile 0: 0, 2, 2
  expect_malformed(m.view(), "TwELL row 3, tile 0, slot 3: column 2 does not follow column 2 of slot 2");
}

TEST_CASE_TEMPLATE("TwELL: no stored zero unless allowed", T, bf16, fp16, float) {
  auto m = to_twell(base<T>(), kFits);
  set_slot_value(m, offset(m, 3, 1, 1), -0.0f);
  expect_malformed(m.view(), "TwELL row 3, tile 1, slot 1 (column 12): stored value -0");
  CHECK(find_violation(m.view(), {.allow_explicit_zeros = true}) == "");
  set_slot_value(m, offset(m, 3, 1, 1), 0.0f);
  expect_malformed(m.view(), "stored value 0 (bits 0x0) is zero");
}

TEST_CASE_TEMPLATE("TwELL: unused slots zero", T, bf16, fp16, float) {
  auto m = to_twell(base<T>(), kFits);
  m.packed().data()[offset(m, 1, 1, 2)] = 0x10000u;
  expect_malformed(m.view(), "TwELL row 1, tile 1, slot 2: unused slot holds 0x10000, must be 0 (count 1)");
}

TEST_CASE("TwELL fp32: unused value-plane slots zero bits") {
  auto m = to_twell(base<float>(), kFits);
  m.value_plane().data()[offset(m, 2, 0, 1)] = -0.0f;
  expect_malformed(m.view(), "TwELL row 2, tile 0, slot 1: unused value-plane slot holds -0");
}

TEST_CASE("TwELL fp32: value-plane slot 0 zero") {
  auto m = to_twell(base<float>(), kFits);
  m.value_plane().data()[offset(m, 1, 2)] = 1.0f;
  expect_malformed(m.view(), "TwELL row 1, tile 2: value-plane slot 0 holds 1");
}

// ---- Hybrid ----

TEST_CASE_TEMPLATE("Hybrid: the TwELL part's invariants", T, bf16, fp16, float) {
  auto h = to_hybrid(base<T>(), kOverflows);
  REQUIRE(h.overflow_rows() == 2);
  h.twell().packed().data()[offset(h.twell(), 2, 1, 1)] = 3;
  expect_malformed(h.view(), "Hybrid TwELL part row 2, tile 1, slot 1: unused slot holds 0x3");
}

TEST_CASE_TEMPLATE("Hybrid: block shape and space match the matrix", T, bf16, fp16, float) {
  const auto h = to_hybrid(base<T>(), kOverflows);
  auto v = h.view();
  v.overflow.cols = 19;
  expect_malformed(v, "the overflow block has 19 columns but the matrix has 20");
  v = h.view();
  v.overflow.rows = 5;
  expect_malformed(v, "the overflow block has 5 rows, more than the matrix's 4");
  v = h.view();
  v.overflow.space = MemorySpace::device;
  expect_malformed(v, "the overflow block lives in device memory, the TwELL part in host");
  v = h.view();
  v.overflow.ld = 3;
  expect_malformed(v, "Hybrid overflow block: ld = 3 is smaller than cols = 20");
}

TEST_CASE_TEMPLATE("Hybrid: maps present", T, bf16, fp16, float) {
  const auto h = to_hybrid(base<T>(), kOverflows);
  auto v = h.view();
  v.row_to_overflow = nullptr;
  expect_malformed(v, "row_to_overflow is null but must hold 4 elements");
  v = h.view();
  v.overflow_to_row = nullptr;
  expect_malformed(v, "overflow_to_row is null but must hold 2 elements");
}

TEST_CASE_TEMPLATE("Hybrid: overflow_to_row in range", T, bf16, fp16, float) {
  auto h = to_hybrid(base<T>(), kOverflows);
  h.overflow_to_row().data()[1] = 4;
  expect_malformed(h.view(), "overflow_to_row[1] = 4 is outside [0, 4)");
}

TEST_CASE_TEMPLATE("Hybrid: overflow_to_row strictly increasing", T, bf16, fp16, float) {
  auto h = to_hybrid(base<T>(), kOverflows);
  h.overflow_to_row().data()[0] = 3;
  h.overflow_to_row().data()[1] = 0;
  h.row_to_overflow().data()[3] = 0;
  h.row_to_overflow().data()[0] = 1;
  expect_malformed(h.view(), "overflow_to_row[1] = 0 does not follow overflow_to_row[0] = 3");
}

TEST_CASE_TEMPLATE("Hybrid: overflow_to_row agrees with row_to_overflow", T, bf16, fp16, float) {
  auto h = to_hybrid(base<T>(), kOverflows);
  h.row_to_overflow().data()[3] = -1;
  expect_malformed(h.view(), "overflow_to_row[1] = 3 but row_to_overflow[3] = -1");
}

TEST_CASE_TEMPLATE("Hybrid: row_to_overflow in [-1, R)", T, bf16, fp16, float) {
  auto h = to_hybrid(base<T>(), kOverflows);
  h.row_to_overflow().data()[1] = 2;
  expect_malformed(h.view(), "row_to_overflow[1] = 2 is outside [-1, 2)");
}

TEST_CASE_TEMPLATE("Hybrid: row_to_overflow agrees with overflow_to_row", T, bf16, fp16, float) {
  auto h = to_hybrid(base<T>(), kOverflows);
  h.row_to_overflow().data()[1] = 0;
  expect_malformed(h.view(), "row_to_overflow[1] = 0 but overflow_to_row[0] = 0");
}

TEST_CASE_TEMPLATE("Hybrid: a row with an overflowed tile is in the block", T, bf16, fp16, float) {
  auto h = to_hybrid(base<T>(), kOverflows);
  h.row_to_overflow().data()[3] = -1;
  auto v = h.view();
  v.overflow.rows = 1;  // drop row 3 from the block, consistently
  expect_malformed(v, "Hybrid row 3, tile 0: count 3 exceeds the capacity S-1 = 1 but the row is not in the overflow block");
}

TEST_CASE_TEMPLATE("Hybrid: a block row has an overflowed tile", T, bf16, fp16, float) {
  auto h = to_hybrid(base<T>(), kOverflows);
  h.twell().packed().data()[offset(h.twell(), 0, 0)] = 1;  // row 0, tile 0 held 2
  expect_malformed(h.view(), "Hybrid row 0 is in the overflow block (block row 0) but none of its tiles");
}

TEST_CASE_TEMPLATE("Hybrid: shadow count equals the dense row's nonzeros per tile", T, bf16, fp16, float) {
  auto h = to_hybrid(base<T>(), kOverflows);
  h.twell().packed().data()[offset(h.twell(), 3, 0)] = 4;
  expect_malformed(h.view(), "Hybrid row 3 (overflow block row 1), tile 0: slot 0 says count 4 but the dense row holds 3");
  h = to_hybrid(base<T>(), kOverflows);
  h.overflow().view().at(0, 16) = from_float<T>(1.0f);  // tile 2 of row 0 now holds 2 in the dense row
  expect_malformed(h.view(), "Hybrid row 0 (overflow block row 0), tile 2: slot 0 says count 1 but the dense row holds 2");
}

TEST_CASE_TEMPLATE("Hybrid: shadow entries equal the dense row's first nonzeros, bit for bit", T, bf16, fp16, float) {
  auto h = to_hybrid(base<T>(), kOverflows);
  set_slot_value(h.twell(), offset(h.twell(), 3, 0, 1), 0.25f);
  expect_malformed(h.view(), "Hybrid row 3 (overflow block row 1), tile 0, slot 1: shadow entry (column 0, value 0.25");
  h = to_hybrid(base<T>(), kOverflows);
  auto block = h.overflow().view();
  block.at(0, 0) = block.at(0, 1);  // row 0's first nonzero moves from column 1 to column 0
  block.at(0, 1) = T{};
  expect_malformed(h.view(), "shadow entry (column 1, value 1.5 (bits");
}

TEST_CASE_TEMPLATE("Hybrid with explicit zeros: dense nonzeros lie in the pattern", T, bf16, fp16, float) {
  const ValidateOptions lenient{.allow_explicit_zeros = true};
  auto h = to_hybrid(base<T>(), kOverflows);
  CHECK(find_violation(h.view(), lenient) == "");
  // A structural zero in the shadow (row 0, column 1), +0 in the dense row: fine when allowed.
  set_slot_value(h.twell(), offset(h.twell(), 0, 0, 1), 0.0f);
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
  set_slot_value(h.twell(), offset(h.twell(), 3, 1, 1), 0.0f);
  h.overflow().view().at(1, 12) = T{};
  h.overflow().view().at(1, 8) = from_float<T>(2.0f);
  expect_malformed(h.view(), "Hybrid row 3 (overflow block row 1), tile 1: the dense row's nonzero at column 8", lenient);
  // Shadow values still match the dense row bit for bit.
  h = to_hybrid(base<T>(), kOverflows);
  set_slot_value(h.twell(), offset(h.twell(), 3, 0, 1), 0.0f);
  expect_malformed(h.view(), "differs from the dense row's value", lenient);
}
