//===- InitEvaluator.h - one rank's shard of a parameter's init --*- C++ -*-===//
//
// Sharded initialization: evaluates a parameter's init program for just the
// slice of the global tensor one rank holds, element by element from the
// global index (random ops through tdx/Runtime/Philox.h), never building the
// global tensor. The result is bitwise the same whatever the mesh and
// placement. Init programs that are not pointwise in the global index
// (scatters, generic aten ops) are refused with a diagnostic naming the op.
//
//===----------------------------------------------------------------------===//

#ifndef TDX_RUNTIME_INITEVALUATOR_H
#define TDX_RUNTIME_INITEVALUATOR_H

#include "tdx/Dialect/TdxOps.h"

#include <cstdint>
#include <vector>

namespace mlir::tdx {

/// The box of a global tensor one rank holds: offset and size per dim.
struct ShardBox {
  SmallVector<int64_t> offset, size;
  int64_t numElements() const;
};

/// The box that mesh coordinates `coords` hold under `layout` (torch.chunk
/// nesting in mesh-axis order; trailing ranks may hold short or empty chunks).
ShardBox shardBox(RankedTensorType global, ArrayRef<PlacementAttr> layout,
                  ArrayRef<int64_t> meshShape, ArrayRef<int64_t> coords);

/// The elements of `box` of the value `decl` (a tdx.parameter or tdx.buffer
/// with an init region) yields, row-major, as raw bytes of its element type
/// (f64, f32, i64, i32; i1 as one byte).
FailureOr<std::vector<uint8_t>> evaluateInitShard(Operation *decl, const ShardBox &box);

} // namespace mlir::tdx

#endif // TDX_RUNTIME_INITEVALUATOR_H
