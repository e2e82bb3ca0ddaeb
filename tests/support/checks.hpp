// Checks shared by the suites.
#pragma once

#include <doctest/doctest.h>

#include <twell/error.hpp>
#include <twell/formats/dense.hpp>

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

// v starting one byte into its buffer, shape unchanged: no longer on a value boundary, which every
// entry point must refuse (ErrorCode::misaligned) before reading anything.
template <class T>
DenseView<const T> off_boundary(DenseView<const T> v) {
  v.data = reinterpret_cast<const T*>(reinterpret_cast<const char*>(v.data) + 1);
  return v;
}

}  // namespace twell::testing
