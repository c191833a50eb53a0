//===- Blas.cuh - cuBLAS and dtype dispatch shared by the CUDA ops -*- CUDA -*-===//
//
// Private to lib/Runtime/cuda: the cuBLAS handle, the strided-batched gemm
// that matmul, linear and convolution call, and float-type dispatch.
//
//===----------------------------------------------------------------------===//

#ifndef TDX_LIB_RUNTIME_CUDA_BLAS_CUH
#define TDX_LIB_RUNTIME_CUDA_BLAS_CUH

#include "tdx/Runtime/cuda/Runtime.h"

#include <cublas_v2.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <stdexcept>
#include <string>
#include <type_traits>

namespace tdx::cu::detail {

inline void checkBlas(cublasStatus_t s, const char *what) {
  if (s != CUBLAS_STATUS_SUCCESS)
    throw std::runtime_error(std::string("tdx: cuBLAS ") + what + " failed with status " +
                             std::to_string(static_cast<int>(s)));
}

inline cublasHandle_t blas() {
  static cublasHandle_t handle = [] {
    cublasHandle_t h = nullptr;
    checkBlas(cublasCreate(&h), "cublasCreate");
    return h;
  }();
  return handle;
}

/// Calls f(T()) for the float type of `t`; other types are refused naming `op`.
template <class F> inline void floatTypes(DType t, const char *op, F f) {
  if (t == DType::F32)
    f(float());
  else if (t == DType::F64)
    f(double());
  else
    throw std::runtime_error(std::string("tdx: ") + op + " on " + tdx::rt::dtypeName(t) +
                             " tensors is not supported by the CUDA backend (use F32 or F64)");
}

/// floatTypes, and bf16 and f16: the GEMMs (cuBLAS multiplies them with
/// fp32 accumulation) and the row kernels (tdx/Runtime/Rows.h: softmax,
/// norms, reductions, cross entropy and their backward, computed in double
/// and rounded once), which mixed precision runs in bf16.
template <class F> inline void anyFloatTypes(DType t, const char *op, F f) {
  if (t == DType::BF16)
    f(tdx::kern::bf16());
  else if (t == DType::F16)
    f(tdx::kern::f16());
  else if (t == DType::F32 || t == DType::F64)
    floatTypes(t, op, f);
  else
    throw std::runtime_error(std::string("tdx: ") + op + " on " + tdx::rt::dtypeName(t) +
                             " tensors is not supported by the CUDA backend (use F32, F64, "
                             "BF16 or F16)");
}

inline int64_t product(const std::vector<int64_t> &xs, size_t begin, size_t end) {
  int64_t p = 1;
  for (size_t i = begin; i < end; ++i)
    p *= xs[i];
  return p;
}

/// Row-major C[i] = op(A[i]) op(B[i]) + beta C[i] for `count` matrices
/// (strides between them in elements), through cuBLAS's column-major view
/// (C^T = op(B)^T op(A)^T). op(A) is [m x k]: A is stored [m x k], or
/// [k x m] with transA; op(B) is [k x n]: B is stored [k x n], or [n x k]
/// with transB.
template <class T>
void gemm(bool transA, bool transB, int64_t m, int64_t n, int64_t k, const T *a, int64_t strideA,
          const T *b, int64_t strideB, T *c, int64_t strideC, int64_t count, T beta = T(0.0f)) {
  const T one = T(1.0f);
  cublasOperation_t opA = transA ? CUBLAS_OP_T : CUBLAS_OP_N;
  cublasOperation_t opB = transB ? CUBLAS_OP_T : CUBLAS_OP_N;
  int lda = static_cast<int>(transA ? m : k), ldb = static_cast<int>(transB ? k : n);
  if constexpr (sizeof(T) == 2) {
    // bf16 / f16 inputs and output, fp32 accumulation and scalars.
    constexpr cudaDataType_t type =
        std::is_same_v<T, __nv_bfloat16> ? CUDA_R_16BF : CUDA_R_16F;
    const float alpha = 1.0f, beta32 = static_cast<float>(beta);
    checkBlas(cublasGemmStridedBatchedEx(blas(), opB, opA, static_cast<int>(n),
                                         static_cast<int>(m), static_cast<int>(k), &alpha, b,
                                         type, ldb, strideB, a, type, lda, strideA, &beta32, c,
                                         type, static_cast<int>(n), strideC,
                                         static_cast<int>(count), CUBLAS_COMPUTE_32F,
                                         CUBLAS_GEMM_DEFAULT),
              std::is_same_v<T, __nv_bfloat16> ? "bf16 gemm" : "f16 gemm");
  } else if constexpr (sizeof(T) == 4)
    checkBlas(cublasSgemmStridedBatched(blas(), opB, opA, static_cast<int>(n),
                                        static_cast<int>(m), static_cast<int>(k), &one, b, ldb,
                                        strideB, a, lda, strideA, &beta, c, static_cast<int>(n),
                                        strideC, static_cast<int>(count)),
              "sgemm");
  else
    checkBlas(cublasDgemmStridedBatched(blas(), opB, opA, static_cast<int>(n),
                                        static_cast<int>(m), static_cast<int>(k), &one, b, ldb,
                                        strideB, a, lda, strideA, &beta, c, static_cast<int>(n),
                                        strideC, static_cast<int>(count)),
              "dgemm");
}

/// Row-major C[i] = A[i] op(B[i]) for `count` dense matrices, one after
/// another. weightTransposed: B is stored [n x k] (linear's weight).
template <class T>
void gemm(const T *a, const T *b, T *c, int64_t m, int64_t n, int64_t k, int64_t count,
          bool weightTransposed) {
  gemm<T>(false, weightTransposed, m, n, k, a, m * k, b, k * n, c, m * n, count);
}

} // namespace tdx::cu::detail

#endif // TDX_LIB_RUNTIME_CUDA_BLAS_CUH
