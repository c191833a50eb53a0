//===- InitKernels.cu - sharded random init on CUDA -----------------------===//
//
// The CUDA side of sharded initialization: one thread per local element
// computes the element's global index and calls the very same
// __host__ __device__ functions (tdx/Runtime/Philox.h) that the CPU runtime
// and the tests run, so both backends share one definition of randomness.
//
//===----------------------------------------------------------------------===//

#include "tdx/Runtime/InitKernels.h"
#include "tdx/Runtime/Philox.h"

#include <cuda_runtime.h>

namespace {

/// The global linear index of local element `n` of a box in a row-major
/// tensor of rank <= 8.
__device__ uint64_t globalIndex(int64_t n, const tdx::cuda::Box &box) {
  uint64_t g = 0, stride = 1;
  for (int d = box.rank - 1; d >= 0; --d) {
    int64_t local = n % box.size[d];
    n /= box.size[d];
    g += static_cast<uint64_t>(box.offset[d] + local) * stride;
    stride *= static_cast<uint64_t>(box.global[d]);
  }
  return g;
}

__global__ void uniformKernel(float *out, tdx::cuda::Box box, uint64_t seed, uint64_t stream,
                              double low, double high) {
  int64_t n = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (n >= box.numElements())
    return;
  out[n] = static_cast<float>(low + (high - low) *
                                        tdx::rng::uniform01(seed, stream, globalIndex(n, box)));
}

__global__ void normalKernel(float *out, tdx::cuda::Box box, uint64_t seed, uint64_t stream,
                             double mean, double std) {
  int64_t n = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (n >= box.numElements())
    return;
  out[n] = static_cast<float>(mean + std * tdx::rng::standardNormal(seed, stream,
                                                                    globalIndex(n, box)));
}

__global__ void truncNormalKernel(float *out, tdx::cuda::Box box, uint64_t seed, uint64_t stream,
                                  double mean, double std, double a, double b) {
  int64_t n = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (n >= box.numElements())
    return;
  out[n] = static_cast<float>(
      tdx::rng::truncNormal(seed, stream, globalIndex(n, box), mean, std, a, b));
}

int blocksFor(int64_t n) { return static_cast<int>((n + 255) / 256); }

} // namespace

namespace tdx::cuda {

int launchUniform(float *out, const Box &box, uint64_t seed, uint64_t stream, double low,
                  double high, cudaStream_t cudaStream) {
  if (box.numElements() == 0)
    return 0;
  uniformKernel<<<blocksFor(box.numElements()), 256, 0, cudaStream>>>(out, box, seed, stream,
                                                                         low, high);
  return static_cast<int>(cudaGetLastError());
}

int launchNormal(float *out, const Box &box, uint64_t seed, uint64_t stream, double mean,
                 double std, cudaStream_t cudaStream) {
  if (box.numElements() == 0)
    return 0;
  normalKernel<<<blocksFor(box.numElements()), 256, 0, cudaStream>>>(out, box, seed, stream,
                                                                        mean, std);
  return static_cast<int>(cudaGetLastError());
}

int launchTruncNormal(float *out, const Box &box, uint64_t seed, uint64_t stream, double mean,
                      double std, double a, double b, cudaStream_t cudaStream) {
  if (box.numElements() == 0)
    return 0;
  truncNormalKernel<<<blocksFor(box.numElements()), 256, 0, cudaStream>>>(out, box, seed, stream,
                                                                           mean, std, a, b);
  return static_cast<int>(cudaGetLastError());
}

} // namespace tdx::cuda
