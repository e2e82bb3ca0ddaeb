// libFuzzer target: arbitrary bytes laid into a matrix of any format (shape, layout and the
// stored-zero option from the first bytes, every array filled from the rest), then
// find_violation(). A matrix it calls valid must convert to dense and CSR without error, crash or
// sanitizer report: validate() is the contract that lets every other function trust its input.
#include <cstring>

#include <twell/converters/backends.hpp>
#include <twell/formats/validate.hpp>

#include "fuzz_common.hpp"

namespace {

using namespace twell;

// Hands out the input's bytes in order, then zeros.
class Source {
 public:
  Source(const std::uint8_t* data, std::size_t size) : data_(data), size_(size) {}
  std::uint8_t byte() { return pos_ < size_ ? data_[pos_++] : 0; }
  template <class U>
  void fill(Buffer<U>& b) {
    auto* out = reinterpret_cast<std::uint8_t*>(b.data());
    const std::size_t n = std::min(b.bytes(), size_ - std::min(size_, pos_));
    if (n != 0) std::memcpy(out, data_ + pos_, n);
    pos_ += n;
  }

 private:
  const std::uint8_t* data_;
  std::size_t size_;
  std::size_t pos_ = 0;
};

// Under `options` (allow_explicit_zeros: sddmm's results keep their pattern's structural zeros).
template <Value T>
void check_valid_converts(const AnyMatrix& m, const ValidateOptions& options) {
  std::visit(
      [&](const auto& x) {
        using M = std::remove_cvref_t<decltype(x)>;
        const auto v = x.view();
        if (!find_violation(v, options).empty()) return;
        try {
          if constexpr (std::is_same_v<M, CsrMatrix<T>>) {
            (void)reference::csr_to_dense<T>(v);
            (void)reference::csr_to_twell<T>(v, TwellLayout{8, 2}, {.overflow = OverflowPolicy::drop});
            (void)reference::csr_to_hybrid<T>(v, TwellLayout{8, 2});
          } else if constexpr (std::is_same_v<M, EllMatrix<T>>) {
            (void)reference::ell_to_dense<T>(v);
            (void)reference::ell_to_csr<T>(v);
          } else if constexpr (std::is_same_v<M, TwellMatrix<T>>) {
            (void)reference::twell_to_dense<T>(v);
            (void)reference::twell_to_csr<T>(v);
            (void)reference::twell_to_hybrid<T>(v, TwellLayout{8, 4});
          } else if constexpr (std::is_same_v<M, HybridMatrix<T>>) {
            (void)reference::hybrid_to_dense<T>(v);
            (void)reference::hybrid_to_csr<T>(v);
            (void)reference::hybrid_to_twell<T>(v, TwellLayout{8, 4}, {.overflow = OverflowPolicy::drop});
          }
        } catch (const Error& e) {
          std::fprintf(stderr, "%s\n", e.what());
          fuzz::die("a matrix that validate() accepts failed to convert");
        }
        // .twell holds no stored zero (its writer refuses one, by name): only a strictly valid
        // matrix goes through it.
        if (find_violation(v).empty()) fuzz::check_twell_round_trip(AnyMatrix(x.to(MemorySpace::host)));
      },
      m);
}

template <Value T>
void run(Source& in, int format, const ValidateOptions& options, std::int64_t rows, std::int64_t cols) {
  const std::int64_t aux = in.byte() % 24;
  const TwellLayout layout{8 * (1 + in.byte() % 8), 1 << (in.byte() % 4)};
  AnyMatrix m;
  try {
    switch (format) {
      case 0: {
        CsrMatrix<T> x(rows, cols, aux);
        in.fill(x.row_ptr());
        in.fill(x.col_idx());
        in.fill(x.values());
        m = std::move(x);
        break;
      }
      case 1: {
        EllMatrix<T> x(rows, cols, aux % 6);
        in.fill(x.row_count());
        in.fill(x.col_idx());
        in.fill(x.values());
        m = std::move(x);
        break;
      }
      case 2: {
        TwellMatrix<T> x(rows, cols, layout);
        in.fill(x.packed());
        in.fill(x.value_plane());
        m = std::move(x);
        break;
      }
      default: {
        HybridMatrix<T> x(rows, cols, layout, std::min<std::int64_t>(aux % 4, rows));
        in.fill(x.twell().packed());
        in.fill(x.twell().value_plane());
        in.fill(x.row_to_overflow());
        in.fill(x.overflow_to_row());
        in.fill(x.overflow().values());
        m = std::move(x);
        break;
      }
    }
  } catch (const Error&) {
    return;  // an invalid layout drawn from the bytes
  }
  check_valid_converts<T>(m, options);
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  Source in(data, size);
  // The first byte: the format (bits 0-1) and whether stored zeros are allowed (bit 2).
  const std::uint8_t head = in.byte();
  const int format = head % 4;
  const ValidateOptions options{.allow_explicit_zeros = (head & 4) != 0};
  const int dtype = in.byte() % 3;
  const std::int64_t rows = in.byte() % 9;
  const std::int64_t cols = in.byte() % 80;
  dispatch_dtype(static_cast<DType>(dtype), [&]<class T>() { run<T>(in, format, options, rows, cols); });
  return 0;
}
