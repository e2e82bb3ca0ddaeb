// libFuzzer target: .twell container bytes of any content. The CRC-32 would stop almost every
// mutation at the checksum, so the target also tries the input with its last four bytes replaced
// by the correct CRC, which lets the fuzzer reach the header and payload checks behind it.
#include <cstring>

#include "fuzz_common.hpp"

namespace {
void attempt(std::span<const std::byte> bytes) {
  using namespace twell;
  ReadOptions options;
  options.max_implicit_bytes = fuzz::kImplicitBytes;
  AnyMatrix m;
  try {
    m = read_twell(bytes, options);
  } catch (const Error&) {
    return;
  }
  if (encode_twell(m) != std::vector<std::byte>(bytes.begin(), bytes.end())) {
    fuzz::die("an accepted .twell file does not re-encode to its own bytes");
  }
}
}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const auto bytes = twell::fuzz::as_bytes(data, size);
  attempt(bytes);
  if (size >= 4) {
    std::vector<std::byte> fixed(bytes.begin(), bytes.end());
    const std::uint32_t crc = twell::crc32(bytes.first(size - 4));
    std::memcpy(fixed.data() + size - 4, &crc, 4);
    attempt(fixed);
  }
  return 0;
}
