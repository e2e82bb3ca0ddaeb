// Internal to the cuda kernels: the dense GEMM-with-activation entry points that
// gemm_to_sparse.cu implements and the fused FFN reuses (generic paths, overflow rows).
// Not installed.
#pragma once

#include <cstdint>
#include <string>

#include <cuda_runtime.h>

#include <twell/formats/dense.hpp>
#include <twell/kernels/options.hpp>

namespace twell::cuda::detail {

// out(i, :) = act_t(X(rows[i], :) W) for i < m, rounded once to T, where act_t zeroes entries
// whose fp32 activation is <= threshold in magnitude (and results that round to -0 come out +0),
// exactly the stored/not-stored rule of gemm_to_sparse. rows == nullptr means rows[i] = i.
// All operands device-resident; runs on `stream` without synchronising. Picks the tensor-core
// path when T is 16-bit and operands are 16-byte aligned, a CUDA-core path otherwise, and
// returns the path's name.
template <class T>
std::string gemm_activate_dense(DenseView<const T> x, const std::int32_t* rows, std::int64_t m,
                                DenseView<const T> w, ActivationSpec act, DenseView<T> out, cudaStream_t stream);

}  // namespace twell::cuda::detail
