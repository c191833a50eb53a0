//===- LocalTypes.h - per-rank shapes of sharded tensors ---------*- C++ -*-===//
//
// The local (per-rank) shape of a global tensor under one placement per mesh
// axis, with torch.chunk's uneven splits. The verifiers of partitioned IR
// and the sharding passes share these.
//
//===----------------------------------------------------------------------===//

#ifndef TDX_DIALECT_LOCALTYPES_H
#define TDX_DIALECT_LOCALTYPES_H

#include "tdx/IR/TdxDialect.h"

namespace mlir::tdx {

/// The size of a dim of `size` after chunking over groups of `groupSizes`
/// ranks in turn, as torch.chunk does: `max` is the largest chunk; `exact`
/// is false when ranks hold different sizes (the local dim is `?`).
struct ChunkSize {
  int64_t max;
  bool exact;
};
ChunkSize chunkSize(int64_t size, ArrayRef<int64_t> groupSizes);

/// The sizes of the mesh axes that shard `dim` under `layout`, in mesh order.
SmallVector<int64_t> shardGroupsOfDim(ArrayRef<PlacementAttr> layout,
                                      ArrayRef<int64_t> meshShape, int64_t dim);

/// The local type of `global` under `layout` on a mesh of `meshShape`: a
/// sharded dim becomes its chunk size, or `?` when the split is uneven.
RankedTensorType localType(RankedTensorType global, ArrayRef<PlacementAttr> layout,
                           ArrayRef<int64_t> meshShape);

} // namespace mlir::tdx

#endif // TDX_DIALECT_LOCALTYPES_H
