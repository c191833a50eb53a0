//===- Nccl.cuh - NCCL result checks shared by the CUDA runtime -*- CUDA -*-===//
//
// Private to lib/Runtime/cuda: collectives (Context.cu) and pipeline
// channels (PointToPoint.cu) check NCCL's results the same way.
//
//===----------------------------------------------------------------------===//

#ifndef TDX_LIB_RUNTIME_CUDA_NCCL_CUH
#define TDX_LIB_RUNTIME_CUDA_NCCL_CUH

#include <nccl.h>

#include <stdexcept>
#include <string>

namespace tdx::cu {

/// Throws naming `what` unless `r` is a success, or (a nonblocking
/// communicator's) an operation still being enqueued.
inline void checkNccl(ncclResult_t r, const char *what) {
  if (r != ncclSuccess && r != ncclInProgress)
    throw std::runtime_error(std::string("tdx: NCCL ") + what + " failed: " +
                             ncclGetErrorString(r));
}

} // namespace tdx::cu

#endif // TDX_LIB_RUNTIME_CUDA_NCCL_CUH
