// spmm runs shared by the GPU suites: the reference and the cuda C = alpha op(A) B + beta C0 on the
// same operands, C NaN-poisoned when beta == 0. Include only where the CUDA runtime is available.
#pragma once

#include <doctest/doctest.h>

#include <string>
#include <utility>

#include <cuda_runtime.h>

#include <twell/kernels/backends.hpp>

#include "fixtures.hpp"

namespace twell::testing {

inline constexpr std::pair<float, float> kSpmmAlphaBeta[] = {{1.0f, 0.0f}, {-0.75f, 0.0f}, {0.5f, -1.5f}};

// The reference C = alpha op(A) B + beta C0 (NaN-poisoned when beta == 0).
template <class T, class HostM>
DenseMatrix<T> reference_spmm(Op op, const HostM& a_host, const DenseMatrix<T>& b, const DenseMatrix<T>& c0,
                              float alpha, float beta) {
  const std::int64_t rows = op == Op::none ? a_host.rows() : a_host.cols();
  DenseMatrix<T> want = beta == 0.0f ? nan_dense<T>(rows, b.cols()) : c0.to(MemorySpace::host);
  reference::spmm<T>(op, a_host.view(), b.view(), want.view(), alpha, beta);
  return want;
}

// The cuda result and the path it reports.
template <class T>
struct SpmmRun {
  DenseMatrix<T> got;
  std::string path;
};

// The cuda C = alpha op(A) B + beta C0 (C poisoned with NaN when beta == 0) with `algorithm`.
template <class T, class DevM>
SpmmRun<T> run_spmm(Op op, const DevM& a_dev, const DenseMatrix<T>& b_dev, const DenseMatrix<T>& c0, float alpha,
                    float beta, SpmmAlgorithm algorithm) {
  const std::int64_t rows = op == Op::none ? a_dev.rows() : a_dev.cols();
  DenseMatrix<T> c_dev =
      beta == 0.0f ? nan_dense<T>(rows, b_dev.cols()).to(MemorySpace::device) : c0.to(MemorySpace::device);
  KernelReport report;
  KernelOptions options;
  options.report = &report;
  options.spmm_algorithm = algorithm;
  cuda::spmm<T>(op, a_dev.view(), b_dev.view(), c_dev.view(), alpha, beta, options);
  REQUIRE(cudaDeviceSynchronize() == cudaSuccess);
  return {c_dev.to(MemorySpace::host), report.path};
}

}  // namespace twell::testing
