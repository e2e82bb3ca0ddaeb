// Public invariant checks: twell::find_violation / twell::validate for every view (declared in
// twell/formats/validate.hpp, which lists what each format must satisfy) and every owning matrix.
#pragma once

#include <string>

#include <twell/convert.hpp>
#include <twell/formats/validate.hpp>

namespace twell {

template <OwningMatrix M>
std::string find_violation(const M& m, const ValidateOptions& options = {}) {
  return find_violation(m.view(), options);
}

template <OwningMatrix M>
void validate(const M& m, const ValidateOptions& options = {}) {
  validate(m.view(), options);
}

}  // namespace twell
