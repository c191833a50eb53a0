//===- Fusion.h - elementwise fusion shared by the tdx backends --*- C++ -*-===//
//
// Both backends run every elementwise op (add ... gelu, cmp, where, cast)
// through emitted kernels: the tdx.fused regions of tdx-fuse-elementwise.
// `emitKernelBody` prints a kernel's `__host__ __device__` body against
// include/tdx/Runtime/Kernel.h, the one text the CPU backend loops over
// and the CUDA backend launches. A kernel may end in a row op over the last
// dim, whose input the body computes.
//
//===----------------------------------------------------------------------===//

#ifndef TDX_TARGET_FUSION_H
#define TDX_TARGET_FUSION_H

#include "tdx/IR/TdxOps.h"

#include "mlir/IR/BuiltinTypes.h"
#include "llvm/ADT/DenseMap.h"
#include "llvm/ADT/DenseSet.h"
#include "llvm/Support/raw_ostream.h"

#include <string>
#include <vector>

namespace mlir::tdx {

struct FusedKernel {
  std::string name;
  /// The body's ops that compute, in order (splat constants are written as
  /// literals instead, unless the kernel yields one).
  SmallVector<Operation *> ops;
  /// The body's arguments (what the kernel reads) and the values it yields.
  SmallVector<Value> inputs;
  SmallVector<Value> outputs;
  /// The iteration shape: every member's result shape.
  RankedTensorType space;
  /// Every value in the kernel has one float type: the CPU backend then
  /// also runs the body on vector lanes.
  bool vectorizable = true;
  /// A softmax, log_softmax, layer_norm or rms_norm over the last dim that
  /// ends the kernel (its last member): the body writes the op's input into
  /// the op's result, and the op runs on each row of it in place (the scale
  /// and mask before a softmax, the residual add before a norm).
  Operation *row = nullptr;
};

/// The kernel a tdx.fused runs, named `name`.
FusedKernel fusedKernel(FusedOp op, std::string name);
/// Prints `k`'s body: a function named k.name taking the inputs by value
/// and the outputs by reference (a template over V when vectorizable).
void emitKernelBody(const FusedKernel &k, llvm::raw_ostream &os);

} // namespace mlir::tdx

#endif // TDX_TARGET_FUSION_H
