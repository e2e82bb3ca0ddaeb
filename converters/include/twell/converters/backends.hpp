// Declarations of the reference (CPU) and cuda converters; identical signatures by construction.
#pragma once

#include <twell/converters/options.hpp>
#include <twell/formats/csr.hpp>
#include <twell/formats/dense.hpp>
#include <twell/formats/ell.hpp>
#include <twell/formats/hybrid.hpp>
#include <twell/formats/twell_matrix.hpp>

namespace twell::reference {
#include <twell/converters/signatures.inc>
}  // namespace twell::reference

namespace twell::cuda {
#include <twell/converters/signatures.inc>
}  // namespace twell::cuda
