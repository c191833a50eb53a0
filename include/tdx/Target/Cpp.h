//===- Cpp.h - tdx programs as C++ on the CPU runtime ------------*- C++ -*-===//

#ifndef TDX_TARGET_CPP_H
#define TDX_TARGET_CPP_H

#include "mlir/IR/BuiltinOps.h"
#include "llvm/Support/raw_ostream.h"

#include <string>

namespace mlir::tdx {

enum class Backend { CPU, CUDA };

/// Emits a partitioned module as one self-contained source: C++ for the CPU
/// runtime (include/tdx/Runtime/Runtime.h: ATen and MPI) or CUDA C++ for the
/// CUDA runtime (include/tdx/Runtime/cuda/Runtime.h: cuBLAS, NCCL and row
/// kernels). Both get an init entry that makes each parameter's local shard
/// from its init program, a forward entry, the fused elementwise kernels
/// (one __host__ __device__ body each, looped on CPU, launched on CUDA) and
/// main(). The runtimes offer the same calls (`namespace T` is `at` or
/// `tdx::cu`), so one emitter writes both. Reports unsupported ops at their
/// location.
/// The step's memory plan as emitted (per rank): the most bytes of the
/// step's tensors alive at once, and the arena the tensors it makes and
/// drops are placed in.
struct MemoryPlan {
  int64_t workingBytes = 0, arenaBytes = 0, arenaTensors = 0;
};

/// The module must have been through the backend pipeline (`tdx-backend`:
/// kernels, started collectives, the memory plan and the parts are its
/// decisions, which the emitter prints).
LogicalResult emitCpp(ModuleOp module, llvm::raw_ostream &os, Backend backend = Backend::CPU,
                      MemoryPlan *plan = nullptr);

/// Rewrites the emitted step functions `body` so that parts (tdx.part) that
/// differ only in local names and literals (state names, carry slots, arena
/// offsets: the same layer repeated) share one function taking what
/// differs; parts whose text is shorter than `minBytes` stay as they are.
void shareParts(std::string &body, int64_t minBytes = 512);

} // namespace mlir::tdx

#endif // TDX_TARGET_CPP_H
