//===- RowLaunch.cuh - one thread block per row, shared by the CUDA ops -*- CUDA -*-===//
//
// Private to lib/Runtime/cuda: the loop of a row kernel over its rows (the
// lanes and launch shape are tdx/Runtime/cuda/Lanes.cuh) and the device
// flag through which kernels report bad indices.
//
//===----------------------------------------------------------------------===//

#ifndef TDX_LIB_RUNTIME_CUDA_ROWLAUNCH_CUH
#define TDX_LIB_RUNTIME_CUDA_ROWLAUNCH_CUH

#include "tdx/Runtime/cuda/Lanes.cuh"
#include "tdx/Runtime/cuda/Runtime.h"

#include <stdexcept>

namespace tdx::cu::detail {

#define TDX_FOR_ROWS(r, rows)                                                                  \
  extern __shared__ double rowScratch[];                                                     \
  BlockLanes lanes{rowScratch};                                                              \
  for (int64_t r = blockIdx.x; r < (rows); r += gridDim.x)

/// A device int set to 0; kernels set it to report an error.
inline int *newFlag() {
  int *flag = nullptr;
  checkCuda(cudaMalloc(&flag, sizeof(int)), "cudaMalloc");
  checkCuda(cudaMemset(flag, 0, sizeof(int)), "cudaMemset");
  return flag;
}

/// Frees `flag`; throws `message` if a kernel set it.
inline void checkFlag(int *flag, const char *message) {
  int host = 0;
  checkCuda(cudaMemcpy(&host, flag, sizeof(int), cudaMemcpyDeviceToHost), "cudaMemcpy");
  cudaFree(flag);
  if (host)
    throw std::runtime_error(message);
}

} // namespace tdx::cu::detail

#endif // TDX_LIB_RUNTIME_CUDA_ROWLAUNCH_CUH
