//===- Fusion.h - elementwise fusion shared by the tdx backends --*- C++ -*-===//
//
// Both backends run every elementwise op (add ... gelu, cmp, where, cast)
// through emitted kernels. `planFusion` groups chains of them over one
// iteration shape into kernels; `emitKernelBody` prints a kernel's
// `__host__ __device__` body against include/tdx/Runtime/Kernel.h, the one
// text the CPU backend loops over and the CUDA backend launches. A kernel
// may end in a row op over the last dim, whose input the body computes.
//
//===----------------------------------------------------------------------===//

#ifndef TDX_TARGET_FUSION_H
#define TDX_TARGET_FUSION_H

#include "mlir/IR/Block.h"
#include "mlir/IR/BuiltinTypes.h"
#include "llvm/ADT/DenseMap.h"
#include "llvm/ADT/DenseSet.h"
#include "llvm/Support/raw_ostream.h"

#include <string>
#include <vector>

namespace mlir::tdx {

struct FusedKernel {
  std::string name;
  /// Members in program order; the kernel runs where the last one stood.
  SmallVector<Operation *> ops;
  /// Tensors the kernel reads (splat constants are inlined instead).
  SmallVector<Value> inputs;
  /// Member results used after the kernel, in program order.
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
  /// Inputs that are the result of a linear whose bias the kernel adds
  /// (FusionPlan::biasOf), with that bias (also an input).
  SmallVector<std::pair<Value, Value>> biased;
};

struct FusionPlan {
  std::vector<FusedKernel> kernels;
  DenseMap<Operation *, unsigned> kernelOf;
  /// Splat constants whose every user is a kernel member (no tensor made).
  DenseSet<Operation *> inlinedConstants;
  /// The result of each linear whose every reader is a kernel member, and
  /// its bias: the linear runs without it and each kernel that reads the
  /// result adds it (the bias + activation epilogue of a linear).
  DenseMap<Value, Value> biasOf;
};

/// Whether `op` is one of the elementwise ops (add ... gelu, cmp, where, cast).
bool isElementwise(Operation *op);
/// Whether the backends run `op` as part of a kernel: elementwise, on
/// element types with a C type, rank <= 8.
bool isFusable(Operation *op);
/// The C type of an element type ("float", "int64_t", "bool", ...) or "".
std::string cType(Type elementType);
/// Whether `op` is a row op that may end a kernel (see FusedKernel::row).
bool isRowOp(Operation *op);
/// Groups the fusable ops of `block` into kernels.
FusionPlan planFusion(Block &block);
/// Prints `k`'s body: a function named k.name taking the inputs by value
/// and the outputs by reference (a template over V when vectorizable).
void emitKernelBody(const FusedKernel &k, llvm::raw_ostream &os);

} // namespace mlir::tdx

#endif // TDX_TARGET_FUSION_H
