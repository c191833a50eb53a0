//===- Propagation.h - a placement for every tensor value --------*- C++ -*-===//
//
// Sharding propagation as a library (lib/Sharding/Propagation.cpp and
// Decision.cpp); tdx-propagate-sharding is a thin pass over it, and the unit
// tests (test/unit/PropagationTest.cpp) call it on small graphs.
//
//===----------------------------------------------------------------------===//

#ifndef TDX_SHARDING_PROPAGATION_H
#define TDX_SHARDING_PROPAGATION_H

#include "tdx/IR/TdxOps.h"
#include "tdx/Sharding/Layout.h"

namespace mlir::tdx {

/// Places every tensor value of `fn` on `mesh`: propagates the user's
/// placements (fixed, by priority level) and preferences through the ops'
/// sharding rules in both directions to a fixed point, then lets each op
/// pick the cheapest layout under `cost` and inserts tdx.redistribute where
/// an operand's layout differs. Results carry `tdx.shardings`, arguments,
/// parameters and buffers their placement; annotations are dropped. With
/// `explain`, contested choices are reported as remarks.
LogicalResult propagateShardings(func::FuncOp fn, MeshOp mesh, const CostModel &cost,
                                 bool explain, SymbolTableCollection &symbols);

/// The mesh `fn` is placed on: the one its annotations, argument shardings
/// and state placements name; null when it names none; failure (reported)
/// when it names two or one that is not in scope.
FailureOr<MeshOp> meshOfFunction(func::FuncOp fn, SymbolTableCollection &symbols);

} // namespace mlir::tdx

#endif // TDX_SHARDING_PROPAGATION_H
