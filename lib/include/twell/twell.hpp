// Umbrella header: everything a user of twell needs.
#pragma once

#include <twell/config.hpp>
#include <twell/error.hpp>
#include <twell/memory.hpp>
#include <twell/types.hpp>

#include <twell/formats/csr.hpp>
#include <twell/formats/dense.hpp>
#include <twell/formats/ell.hpp>
#include <twell/formats/hybrid.hpp>
#include <twell/formats/layout.hpp>
#include <twell/formats/twell_matrix.hpp>

#include <twell/converters/options.hpp>
#include <twell/kernels/options.hpp>
