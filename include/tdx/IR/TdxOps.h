//===- TdxOps.h - tdx operations ---------------------------------*- C++ -*-===//

#ifndef TDX_DIALECT_TDXOPS_H
#define TDX_DIALECT_TDXOPS_H

#include "mlir/Bytecode/BytecodeOpInterface.h"
#include "mlir/IR/BuiltinTypes.h"
#include "mlir/IR/OpDefinition.h"
#include "mlir/IR/OpImplementation.h"
#include "mlir/Interfaces/ControlFlowInterfaces.h"
#include "mlir/Interfaces/InferTypeOpInterface.h"
#include "mlir/Interfaces/SideEffectInterfaces.h"
#include "tdx/IR/ShardingRule.h"
#include "tdx/IR/TdxDialect.h"
#include "tdx/IR/TypeInference.h"

namespace mlir::OpTrait {
/// An op of the elementwise table (tdx/Runtime/ElementwiseOps.def).
template <typename ConcreteOp>
class TdxTableElementwise : public TraitBase<ConcreteOp, TdxTableElementwise> {};
/// The collective traits (TdxShardingOps.td).
template <typename ConcreteOp>
class TdxCollective : public TraitBase<ConcreteOp, TdxCollective> {};
template <typename ConcreteOp>
class TdxAsyncCollective : public TraitBase<ConcreteOp, TdxAsyncCollective> {};
template <typename ConcreteOp>
class TdxReducing : public TraitBase<ConcreteOp, TdxReducing> {};
} // namespace mlir::OpTrait

namespace mlir::tdx {
/// A collective the runtimes start where it stands and wait for where its
/// result is first read.
inline bool isAsyncCollective(Operation *op) {
  return op && op->hasTrait<OpTrait::TdxAsyncCollective>();
}
/// An asynchronous reduction: started as early as its input allows
/// (tdx-hoist-collectives), waited for as late as its readers allow
/// (tdx-schedule-waits).
inline bool isAsyncReduction(Operation *op) {
  return isAsyncCollective(op) && op->hasTrait<OpTrait::TdxReducing>();
}
} // namespace mlir::tdx

#define GET_OP_CLASSES
#include "tdx/IR/TdxOps.h.inc"

namespace mlir::tdx {
/// The scalar a splat constant holds, if `v` is one (casts of splat
/// constants included: the literal is converted as the cast would).
std::optional<double> splatValue(Value v);
/// The C type of an element type ("float", "int64_t", "bool", ...) or "".
std::string cType(Type elementType);
/// The change in float width a `tdx.cast` makes (to - from, in bits; 0 when
/// either side is not a float): > 0 widens exactly (bf16 -> f32), < 0 rounds
/// (mixed precision's `p.to(bf16)`). Null or another op: 0.
int64_t floatWidening(Operation *op);

/// Bytes of one element of `type` (complex: both parts; index: 8).
inline int64_t elementBytes(Type type) {
  if (type.isIntOrFloat())
    return (type.getIntOrFloatBitWidth() + 7) / 8;
  if (auto complex = llvm::dyn_cast<ComplexType>(type))
    return 2 * elementBytes(complex.getElementType());
  return 8; // index and anything else: a machine word
}
/// Whether `t` is complex<fN> (the dtype table's complex rows).
inline bool isComplexOf(Type t, unsigned width) {
  auto c = llvm::dyn_cast<ComplexType>(t);
  return c && c.getElementType().isFloat(width);
}
/// Whether `op` is one of the elementwise ops (add ... gelu, cmp, where, cast).
bool isElementwise(Operation *op);
/// Whether `op` may run in a fused kernel (tdx.fused): elementwise, on
/// element types with a C type, rank <= 8.
bool isFusable(Operation *op);
/// Whether `op` is a row op that may end a kernel: softmax, log_softmax,
/// layer_norm or rms_norm over the last dim of a float tensor.
bool isRowOp(Operation *op);
/// The placement of a function's value: its argument's `tdx.sharding` or its
/// producer's `tdx.shardings` entry (through a tdx.fused, the yielded
/// value's; through a tdx.wait, the started collective's); null when it has
/// none (replicated).
ShardingAttr valueSharding(Value v);
} // namespace mlir::tdx

#endif // TDX_DIALECT_TDXOPS_H
