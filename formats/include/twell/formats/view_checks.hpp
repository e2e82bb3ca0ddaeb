// Argument checks of the views that every backend and the cuda converters share: the sparse
// views' geometry (dense_checks.hpp has the dense one), and check_view, an operand's memory space
// and geometry.
#pragma once

#include <type_traits>

#include <twell/error.hpp>
#include <twell/formats/csr.hpp>
#include <twell/formats/dense_checks.hpp>
#include <twell/formats/ell.hpp>
#include <twell/formats/hybrid.hpp>
#include <twell/formats/layout.hpp>
#include <twell/formats/twell_matrix.hpp>
#include <twell/types.hpp>

namespace twell::detail {

// Shapes and arrays of the sparse views, what each caller adds to its memory-space check: only
// what the host sees without reading the arrays (the reference backend also checks row_ptr's
// ends, which it can read).
template <class T>
void check_csr_geometry(CsrView<T> v, const char* where, const char* name) {
  require(v.rows >= 0 && v.cols >= 0 && v.nnz >= 0, ErrorCode::invalid_argument, where, name, " has shape ",
          shape(v.rows, v.cols), " and nnz ", v.nnz);
  require(v.row_ptr != nullptr && (v.nnz == 0 || (v.col_idx != nullptr && v.values != nullptr)), ErrorCode::malformed,
          where, name, " has a null array with ", v.rows, " rows and nnz ", v.nnz);
}

template <class T>
void check_ell_geometry(EllView<T> v, const char* where, const char* name) {
  require(v.rows >= 0 && v.cols >= 0 && v.width >= 0, ErrorCode::invalid_argument, where, name, " has shape ",
          shape(v.rows, v.cols), " and width ", v.width);
  require(v.rows == 0 || (v.row_count != nullptr && (v.width == 0 || (v.col_idx != nullptr && v.values != nullptr))),
          ErrorCode::malformed, where, name, " has a null array with ", v.rows, " rows and width ", v.width);
}

template <class T>
void check_twell_geometry(TwellView<T> v, const char* where, const char* name) {
  require(v.rows >= 0 && v.cols >= 0, ErrorCode::invalid_argument, where, name, " has shape ", shape(v.rows, v.cols));
  check_layout(v.layout, where);
  const bool empty = v.rows == 0 || v.cols == 0;  // not rows x width, which can wrap to 0
  require(empty || v.packed != nullptr, ErrorCode::malformed, where, name, " has no packed array");
  require(empty || ValueTraits<std::remove_const_t<T>>::packs_in_slot || v.value_plane != nullptr, ErrorCode::malformed,
          where, name, " is fp32 TwELL without a value plane");
}

// A Hybrid's overflow block and row maps; its TwELL part is check_twell_geometry's, and the
// block's memory space the backend's.
template <class T>
void check_hybrid_overflow_geometry(HybridView<T> v, const char* where, const char* name) {
  require(v.overflow.cols == v.cols() && v.overflow.rows >= 0 && v.overflow.rows <= v.rows(), ErrorCode::shape_mismatch,
          where, name, " has an overflow block of ", shape(v.overflow.rows, v.overflow.cols), " for ",
          shape(v.rows(), v.cols()));
  require(v.overflow.ld >= v.overflow.cols, ErrorCode::invalid_argument, where, name,
          " overflow block has leading dimension ", v.overflow.ld, " below its ", v.overflow.cols, " columns");
  require((v.rows() == 0 || v.row_to_overflow != nullptr) &&
              (v.overflow.rows == 0 ||
               (v.overflow_to_row != nullptr && (v.overflow.cols == 0 || v.overflow.data != nullptr))),
          ErrorCode::malformed, where, name, " has a null map or overflow block with ", v.overflow.rows,
          " overflow rows");
}

// ---- a backend's operand: its memory space, then its geometry -------------------------------------
// `backend` names the caller in the message ("cuda backend", "reference backend",
// "cuSPARSE/cuBLAS baseline"). An empty Hybrid overflow block's space is not checked, as no
// operation reads it (validate() still requires the TwELL part's space there).

inline void require_space(MemorySpace space, MemorySpace want, const char* backend, const char* where, const char* name,
                          const char* part = "") {
  require(space == want, ErrorCode::space_mismatch, where, name, part, " lives in ", to_string(space), " memory; the ",
          backend, " takes ", to_string(want), " operands only");
}

template <class View>
void check_view(View v, MemorySpace want, const char* backend, const char* where, const char* name) {
  if constexpr (requires { v.twell; }) {
    check_view(v.twell, want, backend, where, name);
    if (v.overflow.rows != 0) require_space(v.overflow.space, want, backend, where, name, "'s overflow block");
    check_hybrid_overflow_geometry(v, where, name);
  } else {
    require_space(v.space, want, backend, where, name);
    if constexpr (requires { v.row_ptr; }) {
      check_csr_geometry(v, where, name);
    } else if constexpr (requires { v.row_count; }) {
      check_ell_geometry(v, where, name);
    } else if constexpr (requires { v.packed; }) {
      check_twell_geometry(v, where, name);
    } else {
      check_dense_geometry(v, where, name);
    }
  }
}

// An operand of the cuda backend (its kernels, converters and FFN), checked before any kernel reads it.
template <class View>
void check_device_operand(View v, const char* where, const char* name) {
  check_view(v, MemorySpace::device, "cuda backend", where, name);
}

}  // namespace twell::detail
