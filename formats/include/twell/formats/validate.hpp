// Invariant checks of every format. find_violation() names the first broken invariant with its
// coordinates (empty string: valid); validate() throws Error(ErrorCode::malformed) with it.
// Device views are copied to the host first (after their shapes and pointers were checked).
//
// Checked, per format:
//   dense   shape non-negative, ld >= cols, data present and on a value boundary.
//   CSR     shape and nnz non-negative, arrays present, row_ptr[0] == 0, row_ptr non-decreasing
//           and within nnz, row_ptr[M] == nnz, columns in [0, N) strictly increasing per row,
//           no stored zero.
//   ELL     shape and width non-negative, arrays present, row_count in [0, W], columns in range
//           and strictly increasing, no stored zero, padding column and value bits zero.
//   TwELL   layout valid, planes present (value plane for fp32 only), per (row, tile): count in
//           [0, S-1], tile-local columns < the tile's width (the last tile may be ragged) and
//           strictly increasing, no stored zero, unused slots zero (both planes), value-plane
//           slot 0 zero.
//   Hybrid  the TwELL checks, except that a count may exceed S-1 in a row of the overflow block
//           (then all S-1 slots hold entries); the block has the same columns and space; the
//           maps are consistent both ways and overflow_to_row strictly increases; a row is in the
//           block iff one of its tiles overflows; in a block row every tile's shadow equals the
//           dense row: the dense row holds exactly `count` nonzeros in the tile and the slots hold
//           the first min(count, S-1) of them, bit for bit.
// "Stored zero": a stored value with |v| == 0 (incl. -0.0); allowed with allow_explicit_zeros.
#pragma once

#include <string>

#include <twell/formats/csr.hpp>
#include <twell/formats/dense.hpp>
#include <twell/formats/ell.hpp>
#include <twell/formats/hybrid.hpp>
#include <twell/formats/twell_matrix.hpp>
#include <twell/instantiate.hpp>

namespace twell {

struct ValidateOptions {
  // Stored entries may hold zero values: sampled products (sddmm) keep their pattern's
  // structural zeros. Under it, a hybrid block row may hold fewer dense nonzeros than `count`.
  bool allow_explicit_zeros = false;
};

#define TWELL_DECLARE_VALIDATE(T)                                                             \
  std::string find_violation(DenseView<const T> m, const ValidateOptions& options = {});      \
  std::string find_violation(CsrView<const T> m, const ValidateOptions& options = {});        \
  std::string find_violation(EllView<const T> m, const ValidateOptions& options = {});        \
  std::string find_violation(TwellView<const T> m, const ValidateOptions& options = {});      \
  std::string find_violation(HybridView<const T> m, const ValidateOptions& options = {});     \
  void validate(DenseView<const T> m, const ValidateOptions& options = {});                   \
  void validate(CsrView<const T> m, const ValidateOptions& options = {});                     \
  void validate(EllView<const T> m, const ValidateOptions& options = {});                     \
  void validate(TwellView<const T> m, const ValidateOptions& options = {});                   \
  void validate(HybridView<const T> m, const ValidateOptions& options = {});

TWELL_FOR_EACH_VALUE_TYPE(TWELL_DECLARE_VALIDATE)
#undef TWELL_DECLARE_VALIDATE

}  // namespace twell
