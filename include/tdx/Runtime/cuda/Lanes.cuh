//===- Lanes.cuh - a thread block shares a row --------------------*- CUDA -*-===//
//
// The lanes of tdx/Runtime/Rows.h on a thread block (warp shuffles and
// shared memory) and the launch shape of row kernels: the runtime's row ops
// (lib/Runtime/cuda) and the emitted kernels that end in a row op
// (lib/Target/Fusion.cpp) launch one block per row with them.
//
//===----------------------------------------------------------------------===//

#ifndef TDX_RUNTIME_CUDA_LANES_CUH
#define TDX_RUNTIME_CUDA_LANES_CUH

#include "tdx/Runtime/Rows.h"

#include <cstddef>
#include <cstdint>

namespace tdx::cu {

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

} // namespace tdx::cu

#endif // TDX_RUNTIME_CUDA_LANES_CUH
