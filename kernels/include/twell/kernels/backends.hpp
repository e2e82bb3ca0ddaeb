// Declarations of the reference (CPU) and cuda kernels; identical signatures by construction.
#pragma once

#include <twell/converters/options.hpp>
#include <twell/formats/csr.hpp>
#include <twell/formats/dense.hpp>
#include <twell/formats/ell.hpp>
#include <twell/formats/hybrid.hpp>
#include <twell/formats/twell_matrix.hpp>
#include <twell/kernels/options.hpp>

namespace twell::reference {
#include <twell/kernels/signatures.inc>
}  // namespace twell::reference

namespace twell::cuda {
#include <twell/kernels/signatures.inc>
}  // namespace twell::cuda
