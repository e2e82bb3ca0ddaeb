// Umbrella header: everything a user of twell needs.
#pragma once

#include <twell/config.hpp>
#include <twell/error.hpp>
#include <twell/memory.hpp>
#include <twell/types.hpp>

#include <twell/formats/copy.hpp>
#include <twell/formats/csr.hpp>
#include <twell/formats/dense.hpp>
#include <twell/formats/ell.hpp>
#include <twell/formats/hybrid.hpp>
#include <twell/formats/layout.hpp>
#include <twell/formats/twell_matrix.hpp>

#include <twell/converters/global16.hpp>
#include <twell/converters/options.hpp>
#include <twell/kernels/options.hpp>

#include <twell/ffn.hpp>
#include <twell/ops.hpp>

#include <twell/any_matrix.hpp>
#include <twell/convert.hpp>
#include <twell/io.hpp>
#include <twell/stats.hpp>
#include <twell/validate.hpp>
