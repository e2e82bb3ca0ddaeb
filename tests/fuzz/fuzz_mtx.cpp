// libFuzzer target: Matrix Market text of any content, read as the value type picked by the
// input's size (all three are reached). What the reader accepts must be a valid CSR of that type
// and survive encode_mtx + read_mtx unchanged: shape, row_ptr and col_idx equal, values bit for
// bit except NaN, which comes back as a NaN (the writer prints "nan", not the payload).
#include <algorithm>
#include <clocale>
#include <cmath>
#include <cstdio>
#include <cstring>

#include <twell/validate.hpp>

#include "fuzz_common.hpp"

namespace {

using namespace twell;

template <Value T>
bool same_value(T a, T b) {
  const bool nan_a = std::isnan(to_float(a));
  if (nan_a || std::isnan(to_float(b))) return nan_a && std::isnan(to_float(b));
  return std::memcmp(&a, &b, sizeof(T)) == 0;
}

template <Value T>
void check_round_trip(const CsrMatrix<T>& x, const ReadOptions& options, std::size_t size) {
  if (dtype_of<T> != options.dtype) fuzz::die("read_mtx returned another value type than ReadOptions::dtype");
  if (!find_violation(x).empty()) fuzz::die("read_mtx returned a matrix that find_violation refuses");
  // The row cap counts against the input's size, and the written text can be shorter than the
  // input (comments, padding): read it back with the allowance the first read had.
  ReadOptions back_options = options;
  back_options.max_implicit_bytes = options.max_implicit_bytes + size;
  AnyMatrix back_any;
  try {
    back_any = read_mtx(encode_mtx<T>(x.view()), back_options);
  } catch (const Error& e) {
    std::fprintf(stderr, "%s\n", e.what());
    fuzz::die("read_mtx refused what encode_mtx wrote");
  }
  const auto* back = std::get_if<CsrMatrix<T>>(&back_any);
  if (back == nullptr) fuzz::die(".mtx round trip changed the format or value type");
  if (back->rows() != x.rows() || back->cols() != x.cols() || back->nnz() != x.nnz())
    fuzz::die(".mtx round trip changed the shape");
  const auto a = x.view();
  const auto b = back->view();
  if (!std::equal(a.row_ptr, a.row_ptr + a.rows + 1, b.row_ptr)) fuzz::die(".mtx round trip changed row_ptr");
  if (!std::equal(a.col_idx, a.col_idx + a.nnz, b.col_idx)) fuzz::die(".mtx round trip changed col_idx");
  if (!std::equal(a.values, a.values + a.nnz, b.values, same_value<T>)) fuzz::die(".mtx round trip changed a value");
}

}  // namespace

// Numbers are read under a comma-decimal locale where one is installed (scripts/setup.sh makes
// de_DE.UTF-8): the reader must not depend on LC_NUMERIC (docs/io.md), and under the C locale a
// dependence would never show.
extern "C" int LLVMFuzzerInitialize(int*, char***) {
  if (std::setlocale(LC_NUMERIC, "de_DE.UTF-8") == nullptr)
    std::fprintf(stderr, "fuzz_mtx: no de_DE.UTF-8 locale; reading under the C locale\n");
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  ReadOptions options;
  options.max_implicit_bytes = fuzz::kImplicitBytes;
  options.dtype = static_cast<DType>(size % 3);
  return fuzz::check_reader<CsrMatrix>(
      data, size, [&](std::span<const std::byte> bytes) { return read_mtx(bytes, options); },
      "read_mtx returned a non-CSR matrix", [&](const auto& x) { check_round_trip(x, options, size); });
}
