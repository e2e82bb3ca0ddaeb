// libFuzzer target: NumPy .npy bytes of any content.
#include "fuzz_common.hpp"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  using namespace twell;
  ReadOptions options;
  options.max_implicit_bytes = fuzz::kImplicitBytes;
  return fuzz::check_reader<DenseMatrix>(
      data, size, [&](std::span<const std::byte> bytes) { return read_npy(bytes, options); },
      "read_npy returned a non-dense matrix",
      [&](const auto& x) {
        using M = std::remove_cvref_t<decltype(x)>;
        using T = ValueOfMatrix<M>;
        const std::vector<std::byte> once = encode_npy<T>(x.view());
        if (encode_npy<T>(std::get<M>(read_npy(once, options)).view()) != once)
          fuzz::die(".npy round trip changed the bytes");
      });
}
