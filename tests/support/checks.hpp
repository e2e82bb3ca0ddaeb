// Checks shared by the suites.
#pragma once

#include <doctest/doctest.h>

#include <twell/error.hpp>

namespace twell::testing {

// The code of the twell::Error that f() throws; the test case fails when f() returns normally.
template <class F>
ErrorCode code_of(F&& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.code();
  }
  FAIL("no twell::Error thrown");
  return ErrorCode::invalid_argument;
}

}  // namespace twell::testing
