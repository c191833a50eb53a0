//===- RowLaunch.cuh - one thread block per row, shared by the CUDA ops -*- CUDA -*-===//
//
// Private to lib/Runtime/cuda: the lanes of tdx/Runtime/Rows.h on a thread
// block (warp shuffles and shared memory), the launch shape of row kernels,
// and the device flag through which kernels report bad indices.
//
//===----------------------------------------------------------------------===//

#ifndef TDX_LIB_RUNTIME_CUDA_ROWLAUNCH_CUH
#define TDX_LIB_RUNTIME_CUDA_ROWLAUNCH_CUH

#include "tdx/Runtime/cuda/Runtime.h"

#include <stdexcept>

namespace tdx::cu::detail {

/// The threads of a block share a row (tdx/Runtime/Rows.h's lanes): a
/// warp combines by shuffles, the warps through shared memory.
struct BlockLanes {
  double *scratch; // one double per warp
  __device__ int lane() const { return threadIdx.x; }
  __device__ int count() const { return blockDim.x; }
  __device__ double sum(double v) const { return combine(v, false); }
  __device__ double max(double v) const { return combine(v, true); }
  __device__ double combine(double v, bool isMax) const {
    auto op = [isMax](double a, double b) { return isMax ? tdx::kern::maxNaN(a, b) : a + b; };
    for (int o = 16; o > 0; o >>= 1)
      v = op(v, __shfl_down_sync(0xffffffffu, v, o));
    int warp = threadIdx.x / 32, warps = (blockDim.x + 31) / 32;
    __syncthreads(); // the previous combine's scratch is read
    if (threadIdx.x % 32 == 0)
      scratch[warp] = v;
    __syncthreads();
    if (warp == 0) {
      v = threadIdx.x < warps ? scratch[threadIdx.x] : (isMax ? -INFINITY : 0.0);
      for (int o = 16; o > 0; o >>= 1)
        v = op(v, __shfl_down_sync(0xffffffffu, v, o));
      if (threadIdx.x == 0)
        scratch[0] = v;
    }
    __syncthreads();
    return scratch[0];
  }
};

/// Row kernels run one block of kRowThreads per row (rows beyond the grid
/// loop), with a double of shared memory per warp.
constexpr int kRowThreads = 256;
constexpr size_t kRowShared = kRowThreads / 32 * sizeof(double);
inline unsigned rowBlocks(int64_t rows) {
  return static_cast<unsigned>(rows < 65535 ? (rows > 0 ? rows : 1) : 65535);
}
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
