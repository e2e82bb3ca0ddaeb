// Bit-for-bit comparison of buffers and of whole matrices (every array, not just the values they
// describe), as a bool and as doctest checks that name the first differing element.
#pragma once

#include <doctest/doctest.h>

#include <cstring>
#include <string>

#include <twell/formats/csr.hpp>
#include <twell/formats/dense.hpp>
#include <twell/formats/ell.hpp>
#include <twell/formats/hybrid.hpp>
#include <twell/formats/twell_matrix.hpp>
#include <twell/memory.hpp>

namespace twell::testing {

template <class U>
bool same_bytes(const Buffer<U>& a, const Buffer<U>& b) {
  return a.size() == b.size() && (a.size() == 0 || std::memcmp(a.data(), b.data(), a.bytes()) == 0);
}

template <class U>
std::string first_difference(const Buffer<U>& a, const Buffer<U>& b) {
  if (a.size() != b.size()) return "sizes " + std::to_string(a.size()) + " vs " + std::to_string(b.size());
  const auto* x = reinterpret_cast<const unsigned char*>(a.data());
  const auto* y = reinterpret_cast<const unsigned char*>(b.data());
  for (std::size_t i = 0; i < a.bytes(); ++i)
    if (x[i] != y[i]) return "element " + std::to_string(i / sizeof(U));
  return "none";
}

// Host matrices equal in shape and in every array, bit for bit.
template <Value T>
bool identical(const DenseMatrix<T>& a, const DenseMatrix<T>& b) {
  return a.rows() == b.rows() && a.cols() == b.cols() && same_bytes(a.values(), b.values());
}
template <Value T>
bool identical(const CsrMatrix<T>& a, const CsrMatrix<T>& b) {
  return a.rows() == b.rows() && a.cols() == b.cols() && same_bytes(a.row_ptr(), b.row_ptr()) &&
         same_bytes(a.col_idx(), b.col_idx()) && same_bytes(a.values(), b.values());
}
template <Value T>
bool identical(const EllMatrix<T>& a, const EllMatrix<T>& b) {
  return a.rows() == b.rows() && a.cols() == b.cols() && a.width() == b.width() &&
         same_bytes(a.row_count(), b.row_count()) && same_bytes(a.col_idx(), b.col_idx()) &&
         same_bytes(a.values(), b.values());
}
template <Value T>
bool identical(const TwellMatrix<T>& a, const TwellMatrix<T>& b) {
  return a.rows() == b.rows() && a.cols() == b.cols() && a.layout() == b.layout() &&
         same_bytes(a.packed(), b.packed()) && same_bytes(a.value_plane(), b.value_plane());
}
template <Value T>
bool identical(const HybridMatrix<T>& a, const HybridMatrix<T>& b) {
  return identical(a.twell(), b.twell()) && identical(a.overflow(), b.overflow()) &&
         same_bytes(a.row_to_overflow(), b.row_to_overflow()) && same_bytes(a.overflow_to_row(), b.overflow_to_row());
}

// The same comparisons as checks, each array on its own, naming the first difference.
#define TWELL_EXPECT_SAME_BUFFER(a, b)                                            \
  CHECK_MESSAGE(::twell::testing::same_bytes(a, b), #a, ": first difference at ", \
                ::twell::testing::first_difference(a, b))

template <class M>
void expect_same_shape(const M& got, const M& want) {
  CHECK(got.rows() == want.rows());
  CHECK(got.cols() == want.cols());
}

template <Value T>
void expect_same(const DenseMatrix<T>& got, const DenseMatrix<T>& want) {
  expect_same_shape(got, want);
  TWELL_EXPECT_SAME_BUFFER(got.values(), want.values());
}
template <Value T>
void expect_same(const CsrMatrix<T>& got, const CsrMatrix<T>& want) {
  expect_same_shape(got, want);
  TWELL_EXPECT_SAME_BUFFER(got.row_ptr(), want.row_ptr());
  TWELL_EXPECT_SAME_BUFFER(got.col_idx(), want.col_idx());
  TWELL_EXPECT_SAME_BUFFER(got.values(), want.values());
}
template <Value T>
void expect_same(const EllMatrix<T>& got, const EllMatrix<T>& want) {
  expect_same_shape(got, want);
  CHECK(got.width() == want.width());
  TWELL_EXPECT_SAME_BUFFER(got.row_count(), want.row_count());
  TWELL_EXPECT_SAME_BUFFER(got.col_idx(), want.col_idx());
  TWELL_EXPECT_SAME_BUFFER(got.values(), want.values());
}
template <Value T>
void expect_same(const TwellMatrix<T>& got, const TwellMatrix<T>& want) {
  expect_same_shape(got, want);
  CHECK(got.layout() == want.layout());
  TWELL_EXPECT_SAME_BUFFER(got.packed(), want.packed());
  TWELL_EXPECT_SAME_BUFFER(got.value_plane(), want.value_plane());
}
template <Value T>
void expect_same(const HybridMatrix<T>& got, const HybridMatrix<T>& want) {
  expect_same(got.twell(), want.twell());
  expect_same(got.overflow(), want.overflow());
  TWELL_EXPECT_SAME_BUFFER(got.row_to_overflow(), want.row_to_overflow());
  TWELL_EXPECT_SAME_BUFFER(got.overflow_to_row(), want.overflow_to_row());
}

}  // namespace twell::testing
