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
#include "tdx/Dialect/ShardingRule.h"
#include "tdx/Dialect/TdxDialect.h"
#include "tdx/Dialect/TypeInference.h"

namespace mlir::OpTrait {
/// An op of the elementwise table (tdx/Runtime/ElementwiseOps.def).
template <typename ConcreteOp>
class TdxTableElementwise : public TraitBase<ConcreteOp, TdxTableElementwise> {};
} // namespace mlir::OpTrait

#define GET_OP_CLASSES
#include "tdx/Dialect/TdxOps.h.inc"

#endif // TDX_DIALECT_TDXOPS_H
