//===- tdx-cuda-smoke.cu - the CUDA runtime links; runs where a GPU is ----===//
//
// Links the CUDA init kernels with cuBLAS and NCCL and reports their
// versions. With a GPU it initializes a sharded tensor on the device and
// checks it against the same elements computed on the host.
//
//===----------------------------------------------------------------------===//

#include "tdx/Runtime/InitKernels.h"
#include "tdx/Runtime/Philox.h"

#include <cublas_v2.h>
#include <cuda_runtime.h>
#include <nccl.h>

#include <cstdio>
#include <vector>

int main() {
  int nccl = 0, cublasMajor = 0;
  ncclGetVersion(&nccl);
  cublasGetProperty(MAJOR_VERSION, &cublasMajor);
  std::printf("nccl %d, cublas %d\n", nccl, cublasMajor);
  int devices = 0;
  if (cudaGetDeviceCount(&devices) != cudaSuccess || devices == 0) {
    std::printf("no CUDA device: kernels not run\n");
    return 0;
  }
  tdx::cuda::Box box;
  box.rank = 2;
  box.global[0] = 64, box.global[1] = 48;
  box.offset[0] = 16, box.offset[1] = 0;
  box.size[0] = 16, box.size[1] = 48;
  int64_t n = box.numElements();
  float *device = nullptr;
  cudaMalloc(&device, n * sizeof(float));
  if (tdx::cuda::launchUniform(device, box, 42, 7, -1.0, 1.0) != 0)
    return 1;
  std::vector<float> got(n);
  cudaMemcpy(got.data(), device, n * sizeof(float), cudaMemcpyDeviceToHost);
  cudaFree(device);
  for (int64_t i = 0; i < n; ++i) {
    uint64_t g = static_cast<uint64_t>((box.offset[0] + i / 48) * 48 + i % 48);
    float want = static_cast<float>(-1.0 + 2.0 * tdx::rng::uniform01(42, 7, g));
    if (got[i] != want) {
      std::printf("element %lld differs between CUDA and host\n", static_cast<long long>(i));
      return 1;
    }
  }
  std::printf("CUDA uniform shard equals the host bitwise\n");
  return 0;
}
