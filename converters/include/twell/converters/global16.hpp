// The packing of the paper's reference code (ColumnEncoding::global16): TwELL's geometry, count
// in slot 0, but each slot's low 16 bits hold the GLOBAL column, so it needs cols <= 65536.
// bf16/fp16 only (the reference code packs the value into the slot). Both directions are
// bit-exact and host-side: export copies a device source to the host first, import builds a
// host matrix and validates it.
#pragma once

#include <cstdint>
#include <span>
#include <type_traits>

#include <twell/formats/twell_matrix.hpp>

namespace twell {

template <class T>
concept SlotPackedValue = std::is_same_v<T, bf16> || std::is_same_v<T, fp16>;

// Throws invalid_argument when cols > 65536, malformed when src breaks TwELL's invariants.
Buffer<std::uint32_t> export_global16(TwellView<const bf16> src);
Buffer<std::uint32_t> export_global16(TwellView<const fp16> src);

// `packed` holds rows * layout.packed_width(cols) words (else shape_mismatch). Throws
// invalid_argument for a bad layout or cols > 65536, malformed for a count above capacity (the
// reference code overflowed that tile), a column outside its tile, or any TwELL invariant.
template <SlotPackedValue T>
TwellMatrix<T> import_global16(std::int64_t rows, std::int64_t cols, TwellLayout layout,
                               std::span<const std::uint32_t> packed);

}  // namespace twell
