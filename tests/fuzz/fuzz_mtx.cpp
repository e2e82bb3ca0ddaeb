// libFuzzer target: Matrix Market text of any content.
#include "fuzz_common.hpp"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  using namespace twell;
  ReadOptions options;
  options.max_implicit_bytes = fuzz::kImplicitBytes;
  options.dtype = static_cast<DType>(size % 3);
  // Text written by twell must read back to the same structure.
  return fuzz::check_reader<CsrMatrix>(
      data, size, [&](std::span<const std::byte> bytes) { return read_mtx(bytes, options); },
      "read_mtx returned a non-CSR matrix",
      [&](const auto& x) {
        using M = std::remove_cvref_t<decltype(x)>;
        const AnyMatrix back = read_mtx(encode_mtx<ValueOfMatrix<M>>(x.view()), options);
        const auto& y = std::get<M>(back);
        if (y.nnz() != x.nnz() || y.rows() != x.rows() || y.cols() != x.cols())
          fuzz::die(".mtx round trip changed the shape");
      });
}
