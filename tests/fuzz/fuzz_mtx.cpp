// libFuzzer target: Matrix Market text of any content.
#include "fuzz_common.hpp"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  using namespace twell;
  ReadOptions options;
  options.max_implicit_bytes = fuzz::kImplicitBytes;
  options.dtype = static_cast<DType>(size % 3);
  AnyMatrix m;
  try {
    m = read_mtx(fuzz::as_bytes(data, size), options);
  } catch (const Error&) {
    return 0;
  }
  fuzz::check_twell_round_trip(m);
  // Text written by twell must read back to the same structure.
  std::visit(
      [&](const auto& x) {
        using M = std::remove_cvref_t<decltype(x)>;
        if constexpr (std::is_same_v<M, CsrMatrix<ValueOfMatrix<M>>>) {
          using T = ValueOfMatrix<M>;
          const AnyMatrix back = read_mtx(encode_mtx<T>(x.view()), options);
          const auto& y = std::get<M>(back);
          if (y.nnz() != x.nnz() || y.rows() != x.rows() || y.cols() != x.cols()) fuzz::die(".mtx round trip changed the shape");
        } else {
          fuzz::die("read_mtx returned a non-CSR matrix");
        }
      },
      m);
  return 0;
}
