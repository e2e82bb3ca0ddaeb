// libFuzzer target: NumPy .npy bytes of any content.
#include "fuzz_common.hpp"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  using namespace twell;
  ReadOptions options;
  options.max_implicit_bytes = fuzz::kImplicitBytes;
  AnyMatrix m;
  try {
    m = read_npy(fuzz::as_bytes(data, size), options);
  } catch (const Error&) {
    return 0;
  }
  fuzz::check_twell_round_trip(m);
  std::visit(
      [&](const auto& x) {
        using M = std::remove_cvref_t<decltype(x)>;
        if constexpr (std::is_same_v<M, DenseMatrix<ValueOfMatrix<M>>>) {
          using T = ValueOfMatrix<M>;
          const std::vector<std::byte> once = encode_npy<T>(x.view());
          if (encode_npy<T>(std::get<M>(read_npy(once, options)).view()) != once) fuzz::die(".npy round trip changed the bytes");
        } else {
          fuzz::die("read_npy returned a non-dense matrix");
        }
      },
      m);
  return 0;
}
