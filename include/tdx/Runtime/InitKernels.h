//===- InitKernels.h - sharded random init on CUDA ---------------*- C++ -*-===//

#ifndef TDX_RUNTIME_INITKERNELS_H
#define TDX_RUNTIME_INITKERNELS_H

#include <cstdint>

typedef struct CUstream_st *cudaStream_t;

namespace tdx::cuda {

/// One rank's box of a global tensor (rank <= 8).
struct Box {
  int rank = 0;
  int64_t global[8] = {0};
  int64_t offset[8] = {0};
  int64_t size[8] = {0};
#if defined(__CUDACC__)
  __host__ __device__
#endif
  int64_t numElements() const {
    int64_t n = 1;
    for (int d = 0; d < rank; ++d)
      n *= size[d];
    return n;
  }
};

/// Fill `out` (device memory, box.numElements() floats) with the box's
/// elements of uniform / normal (seed, stream). Return a cudaError_t.
int launchUniform(float *out, const Box &box, uint64_t seed, uint64_t stream, double low,
                  double high, cudaStream_t stream_ = nullptr);
int launchNormal(float *out, const Box &box, uint64_t seed, uint64_t stream, double mean,
                 double std, cudaStream_t stream_ = nullptr);
int launchTruncNormal(float *out, const Box &box, uint64_t seed, uint64_t stream, double mean,
                      double std, double a, double b, cudaStream_t stream_ = nullptr);

} // namespace tdx::cuda

#endif // TDX_RUNTIME_INITKERNELS_H
