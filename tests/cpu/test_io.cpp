// File formats: round trips of every format and value type through .twell, of CSR through
// .mtx and of dense through .npy; and every kind of corrupted input giving the right ErrorCode.
#include <doctest/doctest.h>
#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <clocale>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <random>
#include <string>
#include <utility>
#include <vector>

#if defined(__x86_64__) || defined(__i386__)
#include <xmmintrin.h>
#endif

#include <twell/any_matrix.hpp>
#include <twell/converters/backends.hpp>
#include <twell/io.hpp>

#include "checks.hpp"
#include "random.hpp"
#include "same.hpp"

using namespace twell;

// Under AddressSanitizer (gcc says so by a macro, clang by __has_feature).
#if defined(__SANITIZE_ADDRESS__)
#define TWELL_TEST_ASAN 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define TWELL_TEST_ASAN 1
#endif
#endif

namespace {

std::span<const std::byte> bytes_of(std::string_view s) { return {reinterpret_cast<const std::byte*>(s.data()), s.size()}; }

using testing::code_of;

using testing::identical;
using testing::same_bytes;

bool identical(const AnyMatrix& a, const AnyMatrix& b) {
  if (a.index() != b.index()) return false;
  return std::visit(
      [&](const auto& x) { return identical(x, std::get<std::remove_cvref_t<decltype(x)>>(b)); }, a);
}

struct Shape {
  std::int64_t rows, cols;
};
constexpr Shape kShapes[] = {{0, 0}, {1, 1}, {3, 0}, {7, 19}, {33, 300}, {64, 1000}};
constexpr double kDensities[] = {0.0, 0.02, 0.3, 1.0};

template <Value T>
DenseMatrix<T> random_input(Shape s, double density, std::uint64_t seed) {
  testing::SparseDenseOptions o;
  o.density = density;
  o.specials = density > 0 && density < 1;
  o.empty_row_share = 0.2;
  return testing::random_sparse_dense<T>(s.rows, s.cols, o, seed);
}

// The reference converters build the inputs: the public convert() adds nothing a file test needs.
template <Value T>
AnyMatrix make(const DenseMatrix<T>& d, Format f, TwellLayout layout = {}) {
  ConvertOptions drop;
  drop.overflow = OverflowPolicy::drop;
  switch (f) {
    case Format::dense: return d.to(MemorySpace::host);
    case Format::csr: return reference::dense_to_csr<T>(d.view());
    case Format::ell: return reference::dense_to_ell<T>(d.view());
    case Format::twell: return reference::dense_to_twell<T>(d.view(), layout, drop);
    case Format::hybrid: break;
  }
  return reference::dense_to_hybrid<T>(d.view(), layout);
}

// Every format of a dense input; TwELL at C = 32 with tile 64 (S = 2) overflows often, so the
// hybrid carries a dense block and TwELL drops values.
template <Value T>
std::vector<AnyMatrix> all_formats(const DenseMatrix<T>& d) {
  std::vector<AnyMatrix> out;
  out.push_back(make(d, Format::dense));
  out.push_back(make(d, Format::csr));
  out.push_back(make(d, Format::ell));
  out.push_back(make(d, Format::twell, TwellLayout{64, 8}));
  out.push_back(make(d, Format::twell, TwellLayout{64, 32}));
  out.push_back(make(d, Format::hybrid, TwellLayout{64, 32}));
  out.push_back(make(d, Format::hybrid, TwellLayout{256, 8}));
  return out;
}

}  // namespace

TEST_CASE_TEMPLATE("every format round-trips bit-identically through .twell", T, bf16, fp16, float) {
  for (Shape s : kShapes) {
    for (double density : kDensities) {
      const std::uint64_t seed = testing::fresh_seed();
      CAPTURE(seed);
      CAPTURE(s.rows);
      CAPTURE(s.cols);
      CAPTURE(density);
      for (const AnyMatrix& m : all_formats(random_input<T>(s, density, seed))) {
        CAPTURE(to_string(format(m)));
        const std::vector<std::byte> bytes = encode_twell(m);
        const AnyMatrix back = read_twell(bytes);
        CHECK(identical(m, back));
        CHECK(crc32(std::span(bytes).first(bytes.size() - 4)) != 0);
      }
    }
  }
}

TEST_CASE_TEMPLATE(".npy round-trips dense matrices and matches numpy's layout", T, bf16, fp16, float) {
  for (Shape s : kShapes) {
    const std::uint64_t seed = testing::fresh_seed();
    CAPTURE(seed);
    const auto d = random_input<T>(s, 0.5, seed);
    const auto bytes = encode_npy<T>(d.view());
    // numpy aligns the array to 64 bytes and ends the header with '\n'.
    std::uint16_t header_len;
    std::memcpy(&header_len, bytes.data() + 8, 2);
    CHECK((10 + header_len) % 64 == 0);
    CHECK(static_cast<char>(bytes[9 + header_len]) == '\n');
    const AnyMatrix back = read_npy(bytes);
    REQUIRE(std::holds_alternative<DenseMatrix<T>>(back));
    CHECK(identical(d, std::get<DenseMatrix<T>>(back)));
  }
}

TEST_CASE_TEMPLATE(".mtx round-trips CSR exactly and reads what scipy writes", T, bf16, fp16, float) {
  for (Shape s : kShapes) {
    for (double density : kDensities) {
      const std::uint64_t seed = testing::fresh_seed();
      CAPTURE(seed);
      const AnyMatrix csr = make(random_input<T>(s, density, seed), Format::csr);
      const auto& c = std::get<CsrMatrix<T>>(csr);
      ReadOptions o;
      o.dtype = dtype_of<T>;
      MtxReport report;
      const AnyMatrix back = read_mtx(encode_mtx<T>(c.view()), o, &report);
      CHECK(report.explicit_zeros == 0);
      CHECK(report.entries == c.nnz());
      // NaN payloads are not kept by text; everything else is bit-exact.
      const auto& b = std::get<CsrMatrix<T>>(back);
      REQUIRE(b.nnz() == c.nnz());
      CHECK(same_bytes(c.row_ptr(), b.row_ptr()));
      CHECK(same_bytes(c.col_idx(), b.col_idx()));
      for (std::int64_t k = 0; k < c.nnz(); ++k) {
        const float x = to_float(c.values().data()[k]);
        const float y = to_float(b.values().data()[k]);
        if (std::isnan(x)) {
          CHECK(std::isnan(y));
        } else {
          CHECK(std::memcmp(&x, &y, 4) == 0);
        }
      }
    }
  }
}

// An enumerator cast from anything else is refused where it picks what to build: it once read as
// the last enumerator (a Hybrid, fp32) without a word.
TEST_CASE("a Format or DType outside its enum is invalid_argument, not the last enumerator") {
  const AnyMatrix m = DenseMatrix<float>(2, 3);
  CHECK(code_of([&] { (void)convert(m, static_cast<Format>(42)); }) == ErrorCode::invalid_argument);
  const std::string text = "%%MatrixMarket matrix coordinate real general\n1 1 1\n1 1 2\n";
  CHECK(code_of([&] { (void)read_mtx(bytes_of(text), {.dtype = static_cast<DType>(7)}); }) ==
        ErrorCode::invalid_argument);
  CHECK(std::holds_alternative<CsrMatrix<fp16>>(read_mtx(bytes_of(text), {.dtype = DType::fp16})));
}

TEST_CASE("Matrix Market reader: fields, order, explicit zeros, duplicates and bad input") {
  const std::string text =
      "%%MatrixMarket matrix coordinate real general\n%\n% comment\n3 4 5\n3 4 -2.5e0\n1 2 1\n1 1 0\n2 3 -0\n1 4 "
      "inf\n";
  MtxReport report;
  const AnyMatrix m = read_mtx(bytes_of(text), {}, &report);
  const auto& c = std::get<CsrMatrix<float>>(m);
  CHECK(report.entries == 5);
  CHECK(report.explicit_zeros == 2);
  CHECK(report.field == "real");
  REQUIRE(c.nnz() == 3);
  CHECK(c.row_ptr().data()[1] == 2);
  CHECK(c.col_idx().data()[0] == 1);
  CHECK(c.col_idx().data()[1] == 3);
  CHECK(std::isinf(c.values().data()[1]));
  CHECK(c.values().data()[2] == -2.5f);

  // symmetric and skew-symmetric files hold the lower triangle; the reader mirrors it.
  const auto sym = read_mtx(bytes_of("%%MatrixMarket matrix coordinate real symmetric\n3 3 2\n2 1 4\n3 3 5\n"));
  const auto& sc = std::get<CsrMatrix<float>>(sym);
  REQUIRE(sc.nnz() == 3);
  CHECK(sc.col_idx().data()[0] == 1);
  CHECK(sc.values().data()[0] == 4.0f);
  CHECK(sc.col_idx().data()[1] == 0);
  const auto skew = read_mtx(bytes_of("%%MatrixMarket matrix coordinate real skew-symmetric\n2 2 1\n2 1 3\n"));
  CHECK(std::get<CsrMatrix<float>>(skew).values().data()[0] == -3.0f);
  CHECK(std::get<CsrMatrix<float>>(skew).values().data()[1] == 3.0f);

  const auto pattern = read_mtx(bytes_of("%%MatrixMarket matrix coordinate pattern general\n2 2 2\n2 1\n1 2\n"));
  CHECK(std::get<CsrMatrix<float>>(pattern).values().data()[0] == 1.0f);
  ReadOptions bf;
  bf.dtype = DType::bf16;
  const auto integer = read_mtx(bytes_of("%%matrixmarket MATRIX coordinate integer general\n1 3 1\n1 3 -7\n"), bf);
  CHECK(bf16_to_float(std::get<CsrMatrix<bf16>>(integer).values().data()[0]) == -7.0f);

  const auto bad = [](const std::string& s) { return code_of([&] { read_mtx(bytes_of(s)); }); };
  const std::string head = "%%MatrixMarket matrix coordinate real general\n";
  CHECK(bad("") == ErrorCode::io);
  CHECK(bad("%%NotMatrixMarket matrix coordinate real general\n1 1 0\n") == ErrorCode::io);
  CHECK(bad(head) == ErrorCode::io);                                      // no size line
  CHECK(bad(head + "2 2 3\n1 1 1\n") == ErrorCode::io);                   // truncated entries
  CHECK(bad(head + "2000 2000 1000000\n1 1 1\n") == ErrorCode::io);             // more entries than bytes
  CHECK(bad(head + "2 2 2\n1 1 1\n1 1 2\n") == ErrorCode::malformed);     // duplicate
  CHECK(bad(head + "2 2 1\n3 1 1\n") == ErrorCode::malformed);            // row out of range
  CHECK(bad(head + "2 2 1\n1 0 1\n") == ErrorCode::malformed);            // column out of range
  CHECK(bad(head + "2 2 1\n1 1 x\n") == ErrorCode::malformed);            // bad value
  CHECK(bad(head + "2 2 1\n1 1\n") == ErrorCode::malformed);              // missing value
  CHECK(bad(head + "2 2 1\n1 1 1 1\n") == ErrorCode::malformed);          // extra token
  CHECK(bad(head + "2 2 1\n1 1 1\n2 2 1\n") == ErrorCode::malformed);     // extra entry
  CHECK(bad(head + "2 2 5\n1 1 1\n1 2 1\n2 1 1\n2 2 1\n") == ErrorCode::malformed);  // entries > cells
  CHECK(bad(head + "-2 2 0\n") == ErrorCode::malformed);
  CHECK(bad(head + "2 2\n") == ErrorCode::malformed);
  CHECK(bad(head + "2 3000000000 0\n") == ErrorCode::unsupported);       // 32-bit columns
  CHECK(bad(head + "4000000000000 1 0\n") == ErrorCode::out_of_memory);  // row_ptr beyond the cap
  CHECK(bad("%%MatrixMarket matrix coordinate real hermitian\n1 1 0\n") == ErrorCode::unsupported);
  CHECK(bad("%%MatrixMarket matrix coordinate real symmetric\n2 2 1\n1 2 1\n") == ErrorCode::malformed);  // upper
  CHECK(bad("%%MatrixMarket matrix coordinate real symmetric\n2 3 0\n") == ErrorCode::malformed);  // not square
  CHECK(bad("%%MatrixMarket matrix coordinate real skew-symmetric\n2 2 1\n1 1 1\n") == ErrorCode::malformed);
  try {  // the specification forbids pattern with skew-symmetric: no value to negate
    read_mtx(bytes_of("%%MatrixMarket matrix coordinate pattern skew-symmetric\n3 3 1\n2 1\n"));
    FAIL("pattern skew-symmetric was read");
  } catch (const Error& e) {
    CHECK(e.code() == ErrorCode::malformed);
    CHECK(std::string(e.what()).find("line 1 (byte 41): field 'pattern' with symmetry 'skew-symmetric'") !=
          std::string::npos);
  }
  CHECK(bad("%%MatrixMarket matrix array real general\n1 1\n1\n") == ErrorCode::unsupported);
  CHECK(bad("%%MatrixMarket matrix coordinate complex general\n1 1 0\n") == ErrorCode::unsupported);
}

TEST_CASE("Matrix Market reader: a symmetric or skew-symmetric file in any line order is its mirrored matrix") {
  // Lower-triangle lines in a random order (the diagonal too where symmetric), some explicit
  // zeros and some values that round to zero in fp32: the CSR result is the dense matrix built
  // from the lines, its rows sorted, the zeros dropped and both kinds counted per element (an
  // off-diagonal one twice).
  for (const bool skew : {false, true}) {
    const std::uint64_t seed = testing::fresh_seed();
    CAPTURE(seed);
    CAPTURE(skew);
    std::mt19937_64 rng(seed);
    const int n = 37;
    std::vector<std::pair<int, int>> cells;
    for (int i = 0; i < n; ++i)
      for (int j = 0; j < (skew ? i : i + 1); ++j)
        if (rng() % 4 == 0) cells.emplace_back(i, j);
    std::shuffle(cells.begin(), cells.end(), rng);
    std::vector<float> want(static_cast<std::size_t>(n * n), 0.0f);
    std::string text = std::string("%%MatrixMarket matrix coordinate real ") + (skew ? "skew-symmetric" : "symmetric") +
                       "\n" + std::to_string(n) + " " + std::to_string(n) + " " + std::to_string(cells.size()) + "\n";
    std::int64_t zeros = 0, rounded = 0;
    for (const auto& [i, j] : cells) {
      const int v = static_cast<int>(rng() % 8) - 3;  // 4: a value that rounds to zero
      const bool tiny = v == 4;
      text += std::to_string(i + 1) + " " + std::to_string(j + 1) + " " + (tiny ? "1e-50" : std::to_string(v)) + "\n";
      const float value = tiny ? 0.0f : static_cast<float>(v);
      want[static_cast<std::size_t>(i * n + j)] = value;
      want[static_cast<std::size_t>(j * n + i)] = skew ? -value : value;
      const std::int64_t elements = i == j ? 1 : 2;
      zeros += v == 0 ? elements : 0;
      rounded += tiny ? elements : 0;
    }
    MtxReport report;
    const auto got = std::get<CsrMatrix<float>>(read_mtx(bytes_of(text), {}, &report));
    CHECK(report.entries == static_cast<std::int64_t>(cells.size()));
    CHECK(report.explicit_zeros == zeros);
    CHECK(report.rounded_to_zero == rounded);
    REQUIRE(got.rows() == n);
    std::vector<float> dense(want.size(), 0.0f);
    for (std::int64_t r = 0; r < n; ++r)
      for (std::int64_t k = got.row_ptr().data()[r]; k < got.row_ptr().data()[r + 1]; ++k) {
        CHECK(got.values().data()[k] != 0.0f);
        if (k > got.row_ptr().data()[r]) CHECK(got.col_idx().data()[k - 1] < got.col_idx().data()[k]);
        dense[static_cast<std::size_t>(r * n + got.col_idx().data()[k])] = got.values().data()[k];
      }
    CHECK(dense == want);
  }
}

TEST_CASE("Matrix Market reader: a duplicate names both of its lines and where they start") {
  const auto message = [](const std::string& text) {
    try {
      read_mtx(bytes_of(text));
    } catch (const Error& e) {
      CHECK(e.code() == ErrorCode::malformed);
      return std::string(e.what());
    }
    FAIL_CHECK("a file with a duplicate was read");
    return std::string();
  };
  // Out of column order, a comment between, a zero duplicating a value (zeros are dropped only
  // after the check), the second line without its newline.
  const std::string general =
      "%%MatrixMarket matrix coordinate real general\n3 3 4\n2 2 1\n% note\n1 3 5\n3 1 2\n2 2 0";
  const std::string got = message(general);
  CHECK(got.find(detail::concat("duplicate entry (2, 2) on line 3 (byte ", general.find("2 2 1"), ") and line 7 (byte ",
                                general.rfind("2 2 0"), ")")) != std::string::npos);
  // In a symmetric file the first clash is between mirrored copies (row 1); the message names the
  // entry as written.
  const std::string symmetric = "%%MatrixMarket matrix coordinate real symmetric\n3 3 3\n3 1 1\n2 2 1\n3 1 4\n";
  CHECK(message(symmetric).find(detail::concat("duplicate entry (3, 1) on line 3 (byte ", symmetric.find("3 1 1"),
                                               ") and line 5 (byte ", symmetric.rfind("3 1 4"), ")")) !=
        std::string::npos);
  // (1, 2) and (2, 1) are distinct elements of a general file.
  CHECK(std::get<CsrMatrix<float>>(read_mtx(bytes_of("%%MatrixMarket matrix coordinate real general\n2 2 2\n1 2 1\n2 1 "
                                                     "1\n")))
            .nnz() == 2);
}

TEST_CASE("Matrix Market reader: a value beyond the value type is an error, one that rounds to zero is counted") {
  const std::string head = "%%MatrixMarket matrix coordinate real general\n";
  const auto read_as = [](DType dtype, const std::string& text, MtxReport* report = nullptr) {
    ReadOptions o;
    o.dtype = dtype;
    return read_mtx(bytes_of(text), o, report);
  };
  const auto message = [&](DType dtype, const std::string& text) {
    try {
      read_as(dtype, text);
    } catch (const Error& e) {
      CHECK(e.code() == ErrorCode::unsupported);
      return std::string(e.what());
    }
    FAIL_CHECK("read_mtx took a value beyond ", to_string(dtype));
    return std::string();
  };
  // Finite decimals past the largest finite value of the type were read as Inf; the message
  // names the line, the value as written and the type.
  const std::string fp16_big = message(DType::fp16, head + "2 2 2\n1 1 1\n2 2 1e6\n");
  CHECK(fp16_big.find("line 4") != std::string::npos);
  CHECK(fp16_big.find("1e6") != std::string::npos);
  CHECK(fp16_big.find("fp16") != std::string::npos);
  CHECK(message(DType::fp16, head + "1 1 1\n1 1 -65520\n").find("-65520") != std::string::npos);  // rounds to -Inf
  CHECK(message(DType::bf16, head + "1 1 1\n1 1 1e39\n").find("bf16") != std::string::npos);
  CHECK(message(DType::fp32, head + "1 1 1\n1 1 1e39\n").find("fp32") != std::string::npos);
  CHECK(message(DType::fp32, head + "1 1 1\n1 1 1e400\n").find("1e400") != std::string::npos);  // beyond fp64
  CHECK(message(DType::fp16, "%%MatrixMarket matrix coordinate integer general\n1 1 1\n1 1 70000\n").find("70000") !=
        std::string::npos);
  // An integer past 64 bits is an integer all the same: beyond fp16, and held by fp32.
  const std::string huge_int = "%%MatrixMarket matrix coordinate integer general\n1 1 1\n1 1 -99999999999999999999\n";
  CHECK(message(DType::fp16, huge_int).find("-99999999999999999999") != std::string::npos);
  CHECK(std::get<CsrMatrix<float>>(read_as(DType::fp32, huge_int)).values().host_span()[0] == -1e20f);
  // The largest finite values themselves, and what rounds down to them, are kept; Inf and NaN
  // written as such stay what they are.
  const auto fp16_edge = read_as(DType::fp16, head + "1 4 4\n1 1 65504\n1 2 -65519.9\n1 3 inf\n1 4 nan\n");
  const auto edge = std::get<CsrMatrix<fp16>>(fp16_edge).values().host_span();
  REQUIRE(edge.size() == 4);
  CHECK(fp16_to_float(edge[0]) == 65504.0f);
  CHECK(fp16_to_float(edge[1]) == -65504.0f);
  CHECK(std::isinf(fp16_to_float(edge[2])));
  CHECK(std::isnan(fp16_to_float(edge[3])));
  const auto fp32_max = read_as(DType::fp32, head + "1 1 1\n1 1 3.4028234663852886e38\n");
  CHECK(std::get<CsrMatrix<float>>(fp32_max).values().host_span()[0] == std::numeric_limits<float>::max());
  // Rounded once, to the nearest value of the type: through fp32 to nearest, each of these (just
  // past a tie of the 16-bit type, by less than half an fp32 ulp) landed on the tie and went to
  // even, the first to Inf.
  const auto near_ties =
      read_as(DType::fp16, head + "1 2 2\n1 1 65519.9999999\n1 2 1.000488282181322574615478515625\n");
  CHECK(fp16_to_float(std::get<CsrMatrix<fp16>>(near_ties).values().host_span()[0]) == 65504.0f);
  CHECK(fp16_to_float(std::get<CsrMatrix<fp16>>(near_ties).values().host_span()[1]) == 1.0009765625f);
  const auto bf16_tie = read_as(DType::bf16, head + "1 1 1\n1 1 1.003906250931322574615478515625\n");
  CHECK(bf16_to_float(std::get<CsrMatrix<bf16>>(bf16_tie).values().host_span()[0]) == 1.0078125f);

  // A nonzero that rounds to zero in the type is neither stored nor passed off as an explicit
  // zero: it is dropped and counted apart.
  MtxReport report;
  const auto tiny = read_as(DType::fp16, head + "2 3 3\n1 1 1e-30\n2 2 0\n2 3 0.5\n", &report);
  const auto& t = std::get<CsrMatrix<fp16>>(tiny);
  REQUIRE(t.nnz() == 1);
  CHECK(t.col_idx().host_span()[0] == 2);
  CHECK(report.explicit_zeros == 1);
  CHECK(report.rounded_to_zero == 1);
  MtxReport below_fp64;
  const auto denormal = read_as(DType::fp32, head + "1 2 2\n1 1 -1e-400\n1 2 1e-40\n", &below_fp64);
  CHECK(std::get<CsrMatrix<float>>(denormal).nnz() == 1);  // 1e-40 is a subnormal fp32
  CHECK(below_fp64.explicit_zeros == 0);
  CHECK(below_fp64.rounded_to_zero == 1);
}

#if defined(__x86_64__) || defined(__i386__)
// Under flush-to-zero and denormals-are-zero (torch's set_flush_denormal) the hardware's
// double -> float narrowing flushed a subnormal result to 0 (read, dropped and counted as rounded
// to zero) and float -> double widening read a stored subnormal as 0 (written as "0", then
// dropped as an explicit zero). Reading and writing go on the bits now; .npy and .twell copy them.
// narrow() under FTZ and DAZ, out of line, its input and result pinned inside the mode: inlined,
// GCC at -O2 moved the conversions across _mm_setcsr and the old narrow() passed.
template <class T>
[[gnu::noinline]] T narrow_flushing(double v, bool& zeroed) {
  const unsigned saved = _mm_getcsr();
  _mm_setcsr(saved | 0x8040u);  // FTZ (bit 15) and DAZ (bit 6)
  asm volatile("" : "+x"(v));
  T got = narrow<T>(
      v, "test", [] { return std::string("x"); }, zeroed);
  asm volatile("" : "+m"(got));
  _mm_setcsr(saved);
  return got;
}

TEST_CASE_TEMPLATE(".mtx keeps subnormal values whatever the host's flush-to-zero mode", T, bf16, float) {
  const std::string text =
      "%%MatrixMarket matrix coordinate real general\n1 4 4\n1 1 1e-40\n1 2 -9.2e-41\n1 3 1.5e-45\n1 4 1e-400\n";
  ReadOptions o;
  o.dtype = dtype_of<T>;
  MtxReport plain_report, ftz_report;
  const auto plain = std::get<CsrMatrix<T>>(read_mtx(bytes_of(text), o, &plain_report));
  const unsigned saved = _mm_getcsr();
  _mm_setcsr(saved | 0x8040u);  // FTZ (bit 15) and DAZ (bit 6)
  const auto ftz = std::get<CsrMatrix<T>>(read_mtx(bytes_of(text), o, &ftz_report));
  const auto written = encode_mtx(plain.view());
  _mm_setcsr(saved);
  CHECK(identical(ftz, plain));
  CHECK(ftz_report.rounded_to_zero == plain_report.rounded_to_zero);
  CHECK(plain.nnz() >= 2);  // 1e-40 and -9.2e-41 are subnormal in both types
  const auto back = std::get<CsrMatrix<T>>(read_mtx(written, o));
  CHECK(identical(back, plain));
  // narrow() in fp32's subnormal range, against the hardware's rounding without flush-to-zero
  // (fp32 to nearest even; for bf16 through fp32 rounded to odd, then to nearest even).
  const auto by_hardware = [](double v) {
    float wide = static_cast<float>(v);
    if constexpr (!std::is_same_v<T, float>) {
      if (static_cast<double>(wide) != v && (float_bits(wide) & 1u) == 0)
        wide = std::nextafter(wide, v < static_cast<double>(wide) ? -INFINITY : INFINITY);
    }
    return from_float<T>(wide);
  };
  std::mt19937_64 rng(testing::fresh_seed());
  std::uniform_real_distribution<double> exponent(-152.0, -124.0);
  for (int i = 0; i < 20000; ++i) {
    const double v = (i % 2 ? -1.0 : 1.0) * std::exp2(exponent(rng));
    CAPTURE(v);
    const T want = by_hardware(v);
    bool zeroed = false;
    const T got = narrow_flushing<T>(v, zeroed);
    if (std::memcmp(&got, &want, sizeof(T)) != 0) FAIL_CHECK("narrow differs from the hardware's rounding at ", v);
    CHECK(zeroed == ((float_bits(to_float(want)) & 0x7fffffffu) == 0u));
  }
}
#endif

TEST_CASE("Matrix Market reader: a value carries at most one sign") {
  // "+-5" once read as -5: the '+' was stripped and from_chars took the '-'.
  const auto read = [](const std::string& field, const std::string& value) {
    return read_mtx(bytes_of("%%MatrixMarket matrix coordinate " + field + " general\n1 1 1\n1 1 " + value + "\n"));
  };
  for (const std::string field : {"real", "integer"}) {
    CAPTURE(field);
    for (const std::string value : {"+-5", "++5", "-+5", "--5", "+"}) {
      CAPTURE(value);
      CHECK(code_of([&] { read(field, value); }) == ErrorCode::malformed);
    }
    CHECK(std::get<CsrMatrix<float>>(read(field, "+5")).values().host_span()[0] == 5.0f);
    CHECK(std::get<CsrMatrix<float>>(read(field, "-5")).values().host_span()[0] == -5.0f);
  }
}

// Bytes of the file that an error message quotes are escaped and cut: a NUL once ended the
// message where it stood, and a long token filled the terminal.
TEST_CASE("readers' error messages show the file's bytes escaped and at most 64 of them") {
  using namespace std::string_literals;
  const std::string mtx = "%%MatrixMarket matrix coordinate real general\n1 1 1\n1 1 1\0x\x1b[2J\n"s;
  const std::string m = testing::message_of([&] { read_mtx(bytes_of(mtx)); });
  CHECK(m.find("value '1\\x00x\\x1b[2J' is not a real number") != std::string::npos);
  CHECK(m.find('\0') == std::string::npos);
  const std::string long_field = "%%MatrixMarket matrix coordinate " + std::string(100, 'q') + " general\n1 1 0\n";
  const std::string f = testing::message_of([&] { read_mtx(bytes_of(long_field)); });
  CHECK(f.find("field '" + std::string(64, 'q') + "...'") != std::string::npos);
  // A .npy header of 118 bytes (10 + 118 = 128) whose descr holds a NUL.
  std::string npy = "\x93NUMPY\x01\x00\x76\x00{'descr': '<f\x00" "8', 'fortran_order': False, 'shape': (1, 1), }"s;
  npy += std::string(127 - npy.size(), ' ') + "\n" + std::string(4, '\0');
  const std::string n = testing::message_of([&] { read_npy(bytes_of(npy)); });
  CAPTURE(n);
  CHECK(n.find("'<f\\x008'") != std::string::npos);
  // A value beyond the type, as long as the file: the message once quoted all of it.
  const std::string digits = "1" + std::string(100000, '0') + "e-400";
  const std::string v = testing::message_of(
      [&] { read_mtx(bytes_of("%%MatrixMarket matrix coordinate real general\n1 1 1\n1 1 " + digits + "\n")); });
  CHECK(v.size() < 400);
  CHECK(v.find("value " + digits.substr(0, 64) + "...") != std::string::npos);
  // An entry without a column names that, not its row token as the column.
  const std::string c =
      testing::message_of([&] { read_mtx(bytes_of("%%MatrixMarket matrix coordinate real general\n3 3 1\n2    \n")); });
  CHECK(c.find("entry has no column index") != std::string::npos);
}

TEST_CASE("Matrix Market reader: decimals beyond fp64 are read alike under every locale") {
  const std::string head = "%%MatrixMarket matrix coordinate real general\n";
  // Past the largest fp64: unsupported, naming the value as written; below the smallest nonzero:
  // dropped and counted as rounded to zero (docs/io.md). Under a comma-decimal locale, strtod
  // read "1.5e400" as 1 and "-2.5e-400" as -2.
  const auto check_beyond_fp64 = [&] {
    for (const std::string value : {"1.5e400", "-1.5e+400"}) {
      CAPTURE(value);
      try {
        read_mtx(bytes_of(head + "1 1 1\n1 1 " + value + "\n"));
        FAIL_CHECK("a value beyond fp64 was read");
      } catch (const Error& e) {
        CHECK(e.code() == ErrorCode::unsupported);
        CHECK(std::string(e.what()).find(value) != std::string::npos);
      }
    }
    MtxReport report;
    const auto m = read_mtx(bytes_of(head + "1 2 2\n1 1 -2.5e-400\n1 2 0.5\n"), {}, &report);
    const auto& c = std::get<CsrMatrix<float>>(m);
    REQUIRE(c.nnz() == 1);
    CHECK(c.values().host_span()[0] == 0.5f);
    CHECK(report.rounded_to_zero == 1);
  };
  check_beyond_fp64();
  struct RestoreLocale {
    std::string saved = std::setlocale(LC_NUMERIC, nullptr);
    ~RestoreLocale() { std::setlocale(LC_NUMERIC, saved.c_str()); }
  } restore;
  for (const char* name : {"de_DE.UTF-8", "de_DE.utf8", "fr_FR.UTF-8", "fr_FR.utf8", "de_DE", "fr_FR"}) {
    if (std::setlocale(LC_NUMERIC, name) == nullptr) continue;
    const std::string locale = name;
    CAPTURE(locale);
    REQUIRE(std::string(std::localeconv()->decimal_point) == ",");
    check_beyond_fp64();
    return;
  }
  MESSAGE("no comma-decimal locale (de_DE, fr_FR) is installed: the reader was checked under the C locale only");
}

TEST_CASE("Matrix Market reader: the row budget counts the row offsets it keeps") {
  // The result's row_ptr, (rows + 1) x 8 bytes, is the only per-row array since the sixty-fifth
  // session (three until then, 24 bytes a row, and the budget once charged only one of them).
  const std::string head = "%%MatrixMarket matrix coordinate real general\n";
  const auto read = [&](std::int64_t n, std::uint64_t budget) {
    ReadOptions o;
    o.max_implicit_bytes = budget;
    return read_mtx(bytes_of(head + std::to_string(n) + " 0 0\n"), o);
  };
  // A 55-byte input: (8197 + 1) x 8 <= 55 + 65536 < (8198 + 1) x 8.
  CHECK(rows(read(8197, 65536)) == 8197);
  CHECK(code_of([&] { read(8198, 65536); }) == ErrorCode::out_of_memory);
  // Just past the default budget (2^30 bytes beyond a 60-byte input): refused before 1 GiB is taken.
  CHECK(code_of([&] { read((std::int64_t{1} << 27) + 8, ReadOptions{}.max_implicit_bytes); }) ==
        ErrorCode::out_of_memory);
}

TEST_CASE("matrix_as: the held matrix by type, or an error naming what is held") {
  const auto d = random_input<bf16>(Shape{5, 7}, 0.5, testing::fresh_seed());
  AnyMatrix any = read_npy(encode_npy<bf16>(d.view()));
  CHECK(identical(d, matrix_as<DenseMatrix<bf16>>(std::as_const(any))));
  CHECK(&matrix_as<DenseMatrix<bf16>>(any) == &std::get<DenseMatrix<bf16>>(any));
  CHECK(code_of([&] { matrix_as<DenseMatrix<float>>(any); }) == ErrorCode::dtype_mismatch);
  CHECK(code_of([&] { matrix_as<CsrMatrix<bf16>>(any); }) == ErrorCode::invalid_argument);
  try {
    matrix_as<DenseMatrix<fp16>>(any);
    FAIL("no error");
  } catch (const Error& e) {
    CHECK(std::string(e.what()).find("holds bf16 values, not fp16") != std::string::npos);
  }
  try {
    matrix_as<TwellMatrix<bf16>>(any);
    FAIL("no error");
  } catch (const Error& e) {
    CHECK(std::string(e.what()).find("is dense (bf16), not twell") != std::string::npos);
  }
  const DenseMatrix<bf16> moved = matrix_as<DenseMatrix<bf16>>(std::move(any));
  CHECK(identical(d, moved));
}

TEST_CASE(".npy reader rejects every malformed header") {
  const auto d = random_input<float>({3, 5}, 0.5, testing::fresh_seed());
  const std::vector<std::byte> good = encode_npy<float>(d.view());
  const auto with_header = [&](const std::string& dict, std::size_t data_bytes = 60) {
    std::string h = dict;
    h.push_back('\n');
    std::string s = std::string("\x93NUMPY\x01\x00", 8);
    s.push_back(static_cast<char>(h.size() & 0xff));
    s.push_back(static_cast<char>(h.size() >> 8));
    s += h;
    s.append(data_bytes, '\0');
    return code_of([&] { read_npy(bytes_of(s)); });
  };
  CHECK(with_header("{'descr': '<f4', 'fortran_order': False, 'shape': (3, 5), }", 59) == ErrorCode::io);
  CHECK(with_header("{'descr': '<f4', 'fortran_order': False, 'shape': (3, 5), }", 61) == ErrorCode::malformed);
  CHECK(with_header("{'descr': '>f4', 'fortran_order': False, 'shape': (3, 5), }") == ErrorCode::unsupported);
  CHECK(with_header("{'descr': '<f8', 'fortran_order': False, 'shape': (3, 5), }") == ErrorCode::unsupported);
  CHECK(with_header("{'descr': '<f4', 'fortran_order': True, 'shape': (3, 5), }") == ErrorCode::unsupported);
  CHECK(with_header("{'descr': '<f4', 'fortran_order': False, 'shape': (15,), }") == ErrorCode::unsupported);
  // A record array is valid .npy that twell does not read: unsupported, as '>f4' is (was malformed).
  CHECK(with_header("{'descr': [('a', '<f4')], 'fortran_order': False, 'shape': (3, 5), }") == ErrorCode::unsupported);
  CHECK(with_header("{'descr': '<f4', 'fortran_order': False, 'shape': (3, -5), }") == ErrorCode::malformed);
  CHECK(with_header("{'descr': '<f4', 'fortran_order': False, 'shape': (3, 5), 'x': 1}") == ErrorCode::malformed);
  CHECK(with_header("{'descr': '<f4', 'shape': (3, 5), }") == ErrorCode::malformed);
  CHECK(with_header("{'descr': '<f4', 'descr': '<f4', 'fortran_order': False, 'shape': (3, 5)}") ==
        ErrorCode::malformed);
  CHECK(with_header("{'descr': '<f4', 'fortran_order': False, 'shape': (3, 5), } x") == ErrorCode::malformed);
  CHECK(with_header("{'descr': '<f4', 'fortran_order': False, 'shape': (4611686018427387904, 4), }") ==
        ErrorCode::io);
  // Truncation inside each fixed field, and a header length past the end.
  for (std::size_t cut : {0, 3, 6, 7, 9, 20, 70}) {
    CAPTURE(cut);
    CHECK(code_of([&] { read_npy(std::span(good).first(cut)); }) == ErrorCode::io);
  }
  CHECK(code_of([&] { read_npy(std::span(good).first(good.size() - 1)); }) == ErrorCode::io);
  std::vector<std::byte> version = good;
  version[6] = std::byte{4};
  CHECK(code_of([&] { read_npy(version); }) == ErrorCode::unsupported);
}

TEST_CASE(".twell reader: truncation at every field, magic, checksum, sizes and inconsistent shapes") {
  const auto d = random_input<fp16>({9, 70}, 0.1, testing::fresh_seed());
  const AnyMatrix csr = make(d, Format::csr);
  const AnyMatrix hyb = make(d, Format::hybrid, TwellLayout{8, 4});
  REQUIRE(std::get<HybridMatrix<fp16>>(hyb).overflow_rows() > 0);
  for (const AnyMatrix* m : {&csr, &hyb}) {
    const std::vector<std::byte> good = encode_twell(*m);
    CHECK(identical(*m, read_twell(good)));
    const auto code = [](std::span<const std::byte> b) { return code_of([&] { read_twell(b); }); };
    // Every prefix: truncated inside the magic, a header field, a section or the checksum.
    for (std::size_t cut = 0; cut < good.size(); ++cut) {
      CAPTURE(cut);
      CHECK(code(std::span(good).first(cut)) == ErrorCode::io);
    }
    std::vector<std::byte> b = good;
    b[0] = std::byte{'X'};
    CHECK(code(b) == ErrorCode::io);  // magic
    b = good;
    b[8] = std::byte{2};
    CHECK(code(b) == ErrorCode::unsupported);  // version
    b = good;
    b[10] = std::byte{9};
    CHECK(code(b) == ErrorCode::malformed);  // format code
    b = good;
    b[11] = std::byte{7};
    CHECK(code(b) == ErrorCode::malformed);  // dtype code
    b = good;
    b[13] = std::byte{1};
    CHECK(code(b) == ErrorCode::malformed);  // section count
    b = good;
    b[good.size() - 10] ^= std::byte{0x40};
    CHECK(code(b) == ErrorCode::io);  // payload bit flip: checksum
    b = good;
    b[good.size() - 1] ^= std::byte{1};
    CHECK(code(b) == ErrorCode::io);  // the checksum itself
    b = good;
    b.push_back(std::byte{0});
    CHECK(code(b) == ErrorCode::malformed);  // trailing bytes
    b = good;
    b[16] = std::byte{0xff};  // rows = 255: section sizes no longer match the shape
    CHECK(code(b) == ErrorCode::malformed);
    b = good;
    b[23] = std::byte{0x80};  // rows negative
    CHECK(code(b) == ErrorCode::malformed);
    b = good;
    b[48 + 8 + 6] = std::byte{0x7f};  // a section size larger than the file
    CHECK(code(b) == ErrorCode::malformed);
  }
  // A section size and the shape changed together (sizes larger than the file): truncated.
  std::vector<std::byte> big = encode_twell(AnyMatrix(DenseMatrix<float>(2, 2)));
  const std::int64_t rows = std::int64_t{1} << 40;
  const std::uint64_t bytes = static_cast<std::uint64_t>(rows) * 2 * 4;
  std::memcpy(big.data() + 16, &rows, 8);
  std::memcpy(big.data() + 48, &bytes, 8);
  CHECK(code_of([&] { read_twell(big); }) == ErrorCode::io);
  // Rows that take no bytes (N = 0) are capped like implicit allocations (a fuzzer finding).
  std::vector<std::byte> wide = encode_twell(AnyMatrix(DenseMatrix<fp16>(0, 0)));
  const std::int64_t many = std::int64_t{0x23} << 40;
  std::memcpy(wide.data() + 16, &many, 8);
  const std::uint32_t wide_crc = crc32(std::span(wide).first(wide.size() - 4));
  std::memcpy(wide.data() + wide.size() - 4, &wide_crc, 4);
  CHECK(code_of([&] { read_twell(wide); }) == ErrorCode::out_of_memory);
  ReadOptions small;
  small.max_implicit_bytes = 0;
  std::vector<std::byte> tall = encode_npy<float>(DenseMatrix<float>(1000, 0).view());
  CHECK(code_of([&] { read_npy(tall, small); }) == ErrorCode::out_of_memory);
  CHECK(std::get<DenseMatrix<float>>(read_npy(tall)).rows() == 1000);
  // Consistent sizes, valid checksum, but content breaking an invariant: validate() rejects it.
  std::vector<std::byte> bad = encode_twell(csr);
  const auto& c = std::get<CsrMatrix<fp16>>(csr);
  REQUIRE(c.nnz() >= 2);
  const std::size_t col0 = 48 + 3 * 8 + static_cast<std::size_t>(c.rows() + 1) * 8;
  std::memcpy(bad.data() + col0, "\xff\xff\xff\x7f", 4);
  const std::uint32_t crc = crc32(std::span(bad).first(bad.size() - 4));
  std::memcpy(bad.data() + bad.size() - 4, &crc, 4);
  CHECK(code_of([&] { read_twell(bad); }) == ErrorCode::malformed);
  // A 0 x 8 Hybrid that claims one overflow row, its sections sized to match: a block row with
  // no row to belong to is malformed content, refused by the header check.
  std::vector<std::byte> orphan = encode_twell(AnyMatrix(HybridMatrix<bf16>(0, 8, TwellLayout{8, 2}, 0)));
  const std::int64_t one_row = 1;
  const std::uint64_t map_bytes = 4, block_bytes = 8 * sizeof(bf16);
  std::memcpy(orphan.data() + 32, &one_row, 8);
  std::memcpy(orphan.data() + 48 + 2 * 8, &map_bytes, 8);  // overflow_to_row
  std::memcpy(orphan.data() + 48 + 3 * 8, &block_bytes, 8);  // overflow
  orphan.insert(orphan.end() - 4, map_bytes + block_bytes, std::byte{0});
  const std::uint32_t orphan_crc = crc32(std::span(orphan).first(orphan.size() - 4));
  std::memcpy(orphan.data() + orphan.size() - 4, &orphan_crc, 4);
  // Refused by the header check at its field, not by the validation of what was built from it.
  try {
    read_twell(orphan);
    FAIL_CHECK("a Hybrid with more overflow rows than rows was read");
  } catch (const Error& e) {
    CHECK(e.code() == ErrorCode::malformed);
    CHECK(std::string(e.what()).find("byte 32: aux = 1 overflow rows exceed the 0 rows") != std::string::npos);
  }
}

TEST_CASE(".npy and .twell: rows of 0 columns are charged 8 bytes each against max_implicit_bytes") {
  // 2^30 - 24 rows of no bytes: the row count itself was compared with the input's size plus the
  // 1 GiB budget and passed, and later steps spend 8 to 16 bytes a row (16.8 GB for a .npy of 79).
  const std::int64_t many = (std::int64_t{1} << 30) - 24;
  CHECK(code_of([&] { read_npy(encode_npy<float>(DenseMatrix<float>(many, 0).view())); }) == ErrorCode::out_of_memory);
  CHECK(code_of([&] { read_twell(encode_twell(AnyMatrix(DenseMatrix<fp16>(many, 0)))); }) == ErrorCode::out_of_memory);
  // The budget is exact: 8 bytes a row beyond the input's own size.
  const auto at_budget = [](const std::vector<std::byte>& file, std::int64_t n, std::uint64_t extra) {
    ReadOptions o;
    o.max_implicit_bytes = static_cast<std::uint64_t>(n) * 8 - file.size() + extra;
    return o;
  };
  const std::vector<std::byte> npy = encode_npy<float>(DenseMatrix<float>(1000, 0).view());
  CHECK(rows(read_npy(npy, at_budget(npy, 1000, 0))) == 1000);
  CHECK(code_of([&] { read_npy(npy, at_budget(npy, 999, 7)); }) == ErrorCode::out_of_memory);
  const std::vector<std::byte> tw = encode_twell(AnyMatrix(DenseMatrix<bf16>(1000, 0)));
  CHECK(rows(read_twell(tw, at_budget(tw, 1000, 0))) == 1000);
  CHECK(code_of([&] { read_twell(tw, at_budget(tw, 999, 7)); }) == ErrorCode::out_of_memory);
}

TEST_CASE("writers refuse a view that breaks its format, before reading it") {
  // Each of these was once read out of bounds or written as a file that the readers refuse.
  const std::int64_t row_ptr[] = {0, 1000000, 1};
  const std::int32_t col_idx[] = {0};
  const float values[] = {1.0f};
  const CsrView<const float> far_row_ptr{2, 4, 1, row_ptr, col_idx, values};
  CHECK(code_of([&] { (void)encode_mtx(far_row_ptr); }) == ErrorCode::malformed);
  CHECK(code_of([&] { (void)encode_twell(far_row_ptr); }) == ErrorCode::malformed);
  const std::int64_t one_row[] = {0, 2};
  const std::int32_t unsorted[] = {2, 1};
  const float two[] = {1.0f, 2.0f};
  const CsrView<const float> unsorted_columns{1, 4, 2, one_row, unsorted, two};
  try {
    (void)encode_mtx(unsorted_columns);
    FAIL("unsorted columns written");
  } catch (const Error& e) {
    CHECK(e.code() == ErrorCode::malformed);
    CHECK(std::string(e.what()).find("twell::encode_mtx") != std::string::npos);
  }
  // An explicit zero is what the Matrix Market reader takes (and counts), so it is written.
  const float zero_and_one[] = {0.0f, 1.0f};
  const std::int32_t sorted[] = {1, 2};
  CHECK(!encode_mtx(CsrView<const float>{1, 4, 2, one_row, sorted, zero_and_one}).empty());

  const float d[8] = {};
  CHECK(code_of([&] { (void)encode_npy(DenseView<const float>{d, 2, 8, 4}); }) == ErrorCode::malformed);  // ld < cols
  CHECK(code_of([&] { (void)encode_npy(DenseView<const float>{d, -1, 8, 8}); }) == ErrorCode::malformed);
  CHECK(code_of([&] { (void)encode_npy(DenseView<const float>{nullptr, 2, 2, 2}); }) == ErrorCode::malformed);
  CHECK(code_of([&] { (void)encode_twell(DenseView<const float>{d, 2, 8, 4}); }) == ErrorCode::malformed);
  CHECK(!encode_npy(DenseView<const float>{nullptr, 0, 8, 8}).empty());
  // 2^31 x 2^31 fp32 is 2^64 bytes, which wrapped to 0: a 128-byte .npy and a 60-byte .twell that
  // their readers refused.
  constexpr std::int64_t kHuge = std::int64_t{1} << 31;
  CHECK(code_of([&] { (void)encode_npy(DenseView<const float>{d, kHuge, kHuge, kHuge}); }) == ErrorCode::malformed);
  CHECK(code_of([&] { (void)encode_twell(DenseView<const float>{d, kHuge, kHuge, kHuge}); }) == ErrorCode::malformed);

  TwellMatrix<bf16> over(1, 16, TwellLayout{8, 2});  // capacity 3
  over.packed().host_span()[0] = 5;
  CHECK(code_of([&] { (void)encode_twell(std::as_const(over).view()); }) == ErrorCode::malformed);
}

TEST_CASE("writers refuse a sparse matrix wider than the readers take (2^31 - 1 columns)") {
  // No reader takes the file, which the writers used to write: a TwELL or Hybrid is valid in memory
  // at that width, a CSR or ELL is not (its column indices are 32-bit), and each is refused alike.
  constexpr std::int64_t kWidest = std::numeric_limits<std::int32_t>::max();
  const TwellLayout layout{TwellLayout::kMaxTile, TwellLayout::kMaxTile / 2};  // S = 2: 2^16 words a row
  const auto refused = [](auto&& encode) {
    try {
      (void)encode();
    } catch (const Error& e) {
      CHECK(e.code() == ErrorCode::unsupported);
      CHECK(std::string(e.what()).find("2147483648 columns") != std::string::npos);
      return;
    }
    FAIL_CHECK("a matrix of 2^31 columns was written");
  };
  const CsrMatrix<float> csr(1, kWidest + 1, 0);
  refused([&] { return encode_mtx(csr.view()); });
  refused([&] { return encode_twell(csr.view()); });
  const EllMatrix<float> ell(1, kWidest + 1, 0);
  refused([&] { return encode_twell(ell.view()); });
  const TwellMatrix<bf16> twell(1, kWidest + 1, layout);
  refused([&] { return encode_twell(twell.view()); });
  const HybridMatrix<bf16> hybrid(1, kWidest + 1, layout, 0);
  refused([&] { return encode_twell(std::as_const(hybrid).view()); });

  // 2^31 - 1 columns are written and read back; dense matrices have no such limit.
  const CsrMatrix<float> widest(1, kWidest, 0);
  CHECK(cols(read_mtx(encode_mtx(widest.view()))) == kWidest);
  CHECK(cols(read_twell(encode_twell(widest.view()))) == kWidest);
  const DenseMatrix<float> wide_dense(0, kWidest + 1);
  CHECK(cols(read_npy(encode_npy(wide_dense.view()))) == kWidest + 1);
  CHECK(cols(read_twell(encode_twell(wide_dense.view()))) == kWidest + 1);
}

TEST_CASE("CRC-32 matches the IEEE check value and zlib") {
  CHECK(crc32(bytes_of("123456789")) == 0xCBF43926u);
  CHECK(crc32(bytes_of("")) == 0u);
  CHECK(crc32(bytes_of("6789"), crc32(bytes_of("12345"))) == 0xCBF43926u);
}

TEST_CASE("files: by extension, atomic writes, errors name the path") {
  const auto dir = std::filesystem::temp_directory_path() / ("twell_test_io_" + std::to_string(testing::fresh_seed()));
  std::filesystem::create_directories(dir);
  const auto d = random_input<float>({5, 40}, 0.2, testing::fresh_seed());
  const AnyMatrix dense = d.to(MemorySpace::host);
  const AnyMatrix csr = make(d, Format::csr);
  write_matrix(dir / "a.npy", dense);
  write_matrix(dir / "a.mtx", csr);
  write_matrix(dir / "a.twell", csr);
  CHECK(identical(read_matrix(dir / "a.npy"), dense));
  CHECK(identical(read_matrix(dir / "a.twell"), csr));
  CHECK(format(read_matrix(dir / "a.mtx")) == Format::csr);
  CHECK(code_of([&] { write_matrix(dir / "a.mtx", dense); }) == ErrorCode::invalid_argument);
  CHECK(code_of([&] { write_matrix(dir / "a.txt", dense); }) == ErrorCode::invalid_argument);
  CHECK(code_of([&] { read_matrix(dir / "missing.twell"); }) == ErrorCode::io);
  std::vector<std::byte> cut = read_file(dir / "a.twell");
  cut.resize(cut.size() / 2);
  write_file(dir / "cut.twell", cut);
  try {
    read_matrix(dir / "cut.twell");
    FAIL("truncated file was read");
  } catch (const Error& e) {
    CHECK(e.code() == ErrorCode::io);
    CHECK(std::string(e.what()).find("cut.twell") != std::string::npos);
  }
  std::filesystem::remove_all(dir);
}

namespace {

std::string text_of(const std::filesystem::path& path) {
  const std::vector<std::byte> bytes = read_file(path);
  return {reinterpret_cast<const char*>(bytes.data()), bytes.size()};
}

std::size_t entries_in(const std::filesystem::path& dir) {
  const std::filesystem::directory_iterator all(dir);
  return static_cast<std::size_t>(std::distance(begin(all), end(all)));
}

}  // namespace

TEST_CASE("write_file writes a fresh temporary beside the target, and leaves none behind") {
  const auto dir =
      std::filesystem::temp_directory_path() / ("twell_test_write_" + std::to_string(testing::fresh_seed()));
  std::filesystem::create_directories(dir);
  // A link planted at the temporary's old fixed name: fopen("wb") followed it and truncated the
  // file it points at, and the rename then made the target that link.
  const auto victim = dir / "victim.txt";
  std::ofstream(victim) << "keep me";
  std::filesystem::create_symlink(victim, dir / "m.npy.partial");
  write_file(dir / "m.npy", bytes_of("new"));
  CHECK(text_of(victim) == "keep me");
  CHECK(!std::filesystem::is_symlink(dir / "m.npy"));
  CHECK(text_of(dir / "m.npy") == "new");
  write_file(dir / "m.npy", bytes_of("newer"));  // replaces the target
  CHECK(text_of(dir / "m.npy") == "newer");
  CHECK(entries_in(dir) == 3);  // victim, link, target: no temporary left
  // A target that is not a regular file (a directory) or a missing folder is refused, and no
  // temporary is left behind.
  std::filesystem::create_directory(dir / "d.npy");
  CHECK(code_of([&] { write_file(dir / "d.npy", bytes_of("x")); }) == ErrorCode::io);
  CHECK(code_of([&] { write_file(dir / "missing" / "m.npy", bytes_of("x")); }) == ErrorCode::io);
  CHECK(entries_in(dir) == 4);
  std::filesystem::remove_all(dir);
}

TEST_CASE("write_file keeps the replaced file's permissions and writes through a symlink") {
  const auto dir =
      std::filesystem::temp_directory_path() / ("twell_test_replace_" + std::to_string(testing::fresh_seed()));
  std::filesystem::create_directories(dir);
  using std::filesystem::perms;
  const auto mode_of = [](const std::filesystem::path& p) {
    return std::filesystem::status(p).permissions() & perms::mask;
  };
  // A private file stays private: the temporary took 0666 less the umask.
  const auto secret = dir / "secret.npy";
  write_file(secret, bytes_of("old"));
  std::filesystem::permissions(secret, perms::owner_read | perms::owner_write);
  write_file(secret, bytes_of("new"));
  CHECK(text_of(secret) == "new");
  CHECK(mode_of(secret) == (perms::owner_read | perms::owner_write));
  // The link stays a link, and the file it leads to is what is replaced (mode kept too).
  const auto target = dir / "target.mtx";
  const auto link = dir / "link.mtx";
  write_file(target, bytes_of("old"));
  std::filesystem::permissions(target, perms::owner_all | perms::group_read);
  std::filesystem::create_symlink(target.filename(), link);
  write_file(link, bytes_of("through the link"));
  CHECK(std::filesystem::is_symlink(link));
  CHECK(text_of(target) == "through the link");
  CHECK(mode_of(target) == (perms::owner_all | perms::group_read));
  CHECK(entries_in(dir) == 3);  // secret, target, link: no temporary left
  // Not setuid or setgid: the replacement is new content, and a root process would otherwise
  // make a root-owned setuid file of a user's.
  const auto setuid_file = dir / "setuid.mtx";
  write_file(setuid_file, bytes_of("old"));
  std::filesystem::permissions(setuid_file, perms::set_uid | perms::set_gid | perms::owner_all | perms::group_read);
  REQUIRE((std::filesystem::status(setuid_file).permissions() & perms::set_uid) == perms::set_uid);
  write_file(setuid_file, bytes_of("new"));
  CHECK(text_of(setuid_file) == "new");
  CHECK(mode_of(setuid_file) == (perms::owner_all | perms::group_read));
  std::filesystem::remove_all(dir);
}

TEST_CASE("write_file takes any name the file system takes: the temporary's is short") {
  const auto dir =
      std::filesystem::temp_directory_path() / ("twell_test_long_" + std::to_string(testing::fresh_seed()));
  std::filesystem::create_directories(dir);
  // 255 bytes, NAME_MAX: "<name>.partial.<16 hex digits>" beside it was 280.
  const auto longest = dir / (std::string(251, 'a') + ".npy");
  write_file(longest, bytes_of("x"));
  CHECK(text_of(longest) == "x");
  write_file(longest, bytes_of("y"));
  CHECK(text_of(longest) == "y");
  CHECK(entries_in(dir) == 1);
  std::filesystem::remove_all(dir);
}

TEST_CASE("read_file refuses what is not a regular file, naming it: its size bounds the read") {
  // A device that ends at once (/dev/zero, which never ends, took memory until the process was
  // killed), and a directory.
  const std::filesystem::path paths[] = {"/dev/null", std::filesystem::temp_directory_path()};
  for (const std::filesystem::path& path : paths) {
    try {
      (void)read_file(path);
      FAIL("read ", path);
    } catch (const Error& e) {
      CHECK(e.code() == ErrorCode::io);
      const std::string named = path.string() + "': not a regular file";
      CHECK(std::string(e.what()).find(named) != std::string::npos);
    }
  }
}

TEST_CASE("read_file: a file larger than the memory it may take is out_of_memory, not std::bad_alloc") {
#if defined(TWELL_TEST_ASAN)
  MESSAGE("skipped under AddressSanitizer, whose allocator aborts rather than throw std::bad_alloc");
#else
  const auto path =
      std::filesystem::temp_directory_path() / ("twell_test_big_" + std::to_string(testing::fresh_seed()));
  std::ofstream(path).close();
  std::filesystem::resize_file(path, std::uintmax_t{1} << 30);  // sparse: no disk taken
  // Address space for what the process maps now plus 256 MiB: the file's 1 GiB cannot be allocated.
  std::uint64_t pages = 0;
  std::ifstream("/proc/self/statm") >> pages;
  rlimit old{};
  REQUIRE(getrlimit(RLIMIT_AS, &old) == 0);
  rlimit low = old;
  low.rlim_cur = pages * static_cast<std::uint64_t>(sysconf(_SC_PAGESIZE)) + (std::uint64_t{256} << 20);
  if (old.rlim_cur != RLIM_INFINITY && old.rlim_cur < low.rlim_cur) low.rlim_cur = old.rlim_cur;
  REQUIRE(setrlimit(RLIMIT_AS, &low) == 0);
  ErrorCode code = ErrorCode::invalid_argument;
  bool other = false;
  try {
    (void)read_file(path);
  } catch (const Error& e) {
    code = e.code();
  } catch (...) {
    other = true;
  }
  setrlimit(RLIMIT_AS, &old);
  std::filesystem::remove(path);
  CHECK_FALSE(other);
  CHECK(code == ErrorCode::out_of_memory);
#endif
}
