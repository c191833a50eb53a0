//===- ManualRegions.h - the user's per-rank code in a placed program -*- C++ -*-===//
//
// A manual region (tdx.local_map, tdx.shard_map) is the ops between the
// tdx.to_local that enter it and the tdx.from_local that leave: code the
// user wrote per rank, with the user's collectives. Propagation, partition,
// tdx-check-replication and Module::hasUserCollectives all ask which ops
// those are; this is the one answer.
//
//===----------------------------------------------------------------------===//

#ifndef TDX_IR_MANUALREGIONS_H
#define TDX_IR_MANUALREGIONS_H

#include "tdx/IR/TdxOps.h"

#include "llvm/ADT/DenseSet.h"

namespace mlir::tdx {

/// Whether `op` is a collective the user wrote (`tdx.aten "tdx::..."`, the
/// torch ops of python/tdx/collectives.py), not yet the dialect's.
bool isUserCollective(Operation *op);

/// The mesh axes a user collective names (its `axes` argument).
SmallVector<StringRef> userCollectiveAxes(AtenOp op);

/// The ops of `fn`'s manual regions: every op that computes from a
/// tdx.to_local's result, up to the tdx.from_local that leave (neither is
/// in the set), and every op whose results only region ops read (the
/// constants a region makes; a parameter's read stays outside, placed by
/// propagation and gathered for the region).
DenseSet<Operation *> manualRegionOps(Operation *fn);

/// The user's `file:line` an op's `site` names (a user collective's
/// argument, a region edge's attribute; its adjoint's too) as a location,
/// else the op's own.
Location userSite(Operation *op);

/// Rewrites a user collective (isUserCollective) into the dialect's
/// collective over the axes it names of `mesh` (`tdx::rank` into
/// tdx.mesh_coord), located at the user's `site`; fails with a diagnostic
/// naming what is missing or wrong.
LogicalResult raiseUserCollective(AtenOp op, MeshOp mesh);

} // namespace mlir::tdx

#endif // TDX_IR_MANUALREGIONS_H
