#include <twell/converters/global16.hpp>

#include <twell/formats/copy.hpp>
#include <twell/formats/validate.hpp>

namespace twell {
namespace {

constexpr std::int64_t kMaxGlobal16Cols = 65536;

void check_cols(std::int64_t cols, const char* where) {
  require(cols <= kMaxGlobal16Cols, ErrorCode::invalid_argument, where, "cols = ", cols,
          " does not fit the 16-bit global columns of the reference layout (at most ", kMaxGlobal16Cols, ")");
}

// Rewrites the column half of every used slot: local -> global (to_global) or back. Slot 0 and
// unused slots are copied as they are.
template <class ColumnMap>
void recode(std::int64_t rows, std::int64_t cols, const TwellLayout& layout, const std::uint32_t* in,
            std::uint32_t* out, ColumnMap&& map) {
  for (std::int64_t i = 0; i < rows; ++i)
    for (std::int64_t t = 0; t < layout.tiles(cols); ++t) {
      const std::int64_t offset = layout.slot_offset(i, t, cols);
      const std::uint32_t count = in[offset];
      for (std::int32_t s = 0; s < layout.slots(); ++s) {
        const std::uint32_t word = in[offset + s];
        out[offset + s] = (s == 0 || static_cast<std::uint32_t>(s) > count)
                              ? word
                              : TwellLayout::pack(TwellLayout::slot_value_bits(word),
                                                  map(i, t, s, TwellLayout::slot_column(word)));
      }
    }
}

template <class T>
Buffer<std::uint32_t> export_any(TwellView<const T> src) {
  constexpr const char* kWhere = "twell::export_global16";
  validate(src);
  check_cols(src.cols, kWhere);
  TwellMatrix<T> host;
  if (src.space == MemorySpace::device) {
    host = copy_to(src, MemorySpace::host);
    src = host.view();
  }
  const TwellLayout& layout = src.layout;
  Buffer<std::uint32_t> out(static_cast<std::size_t>(src.rows * src.packed_width()));
  recode(src.rows, src.cols, layout, src.packed, out.data(),
         [&](std::int64_t, std::int64_t t, std::int32_t, std::uint32_t local) {
           return static_cast<std::uint32_t>(layout.tile_begin(t) + local);
         });
  return out;
}

}  // namespace

Buffer<std::uint32_t> export_global16(TwellView<const bf16> src) { return export_any(src); }
Buffer<std::uint32_t> export_global16(TwellView<const fp16> src) { return export_any(src); }

template <SlotPackedValue T>
TwellMatrix<T> import_global16(std::int64_t rows, std::int64_t cols, TwellLayout layout,
                               std::span<const std::uint32_t> packed) {
  constexpr const char* kWhere = "twell::import_global16";
  check_layout(layout, kWhere);
  require(rows >= 0 && cols >= 0, ErrorCode::invalid_argument, kWhere, "shape ", rows, " x ", cols, " is negative");
  check_cols(cols, kWhere);
  const auto words = static_cast<std::int64_t>(detail::checked_elements(rows, layout.packed_width(cols), kWhere));
  require(static_cast<std::int64_t>(packed.size()) == words, ErrorCode::shape_mismatch, kWhere, "packed holds ",
          packed.size(), " words but a ", rows, " x ", cols, " matrix at layout (tile ", layout.tile, ", C ",
          layout.compression, ") needs ", words);
  for (std::int64_t i = 0; i < rows; ++i)
    for (std::int64_t t = 0; t < layout.tiles(cols); ++t) {
      const std::uint32_t count = packed[static_cast<std::size_t>(layout.slot_offset(i, t, cols))];
      require(!layout.overflows(count), ErrorCode::malformed, kWhere, "row ", i, ", tile ", t, ": count ", count,
              " exceeds the capacity S-1 = ", layout.capacity(),
              " (the reference code overflowed this tile, so its entries are incomplete)");
    }
  TwellMatrix<T> out(rows, cols, layout);
  recode(rows, cols, layout, packed.data(), out.packed().data(),
         [&](std::int64_t i, std::int64_t t, std::int32_t s, std::uint32_t global) {
           const std::int64_t begin = layout.tile_begin(t);
           const std::int64_t end = begin + layout.tile_cols(t, cols);
           require(global >= begin && global < end, ErrorCode::malformed, kWhere, "row ", i, ", tile ", t, ", slot ",
                   s, ": global column ", global, " lies outside the tile's columns ", begin, "..", end - 1);
           return static_cast<std::uint32_t>(global - begin);
         });
  if (auto v = find_violation(TwellView<const T>(out.view())); !v.empty()) fail(ErrorCode::malformed, kWhere, v);
  return out;
}

template TwellMatrix<bf16> import_global16<bf16>(std::int64_t, std::int64_t, TwellLayout, std::span<const std::uint32_t>);
template TwellMatrix<fp16> import_global16<fp16>(std::int64_t, std::int64_t, TwellLayout, std::span<const std::uint32_t>);

}  // namespace twell
