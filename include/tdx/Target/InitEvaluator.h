//===- InitEvaluator.h - one rank's shard of a parameter's init --*- C++ -*-===//
//
// Sharded initialization from the IR: a parameter's init region becomes an
// InitProgram (tdx/Runtime/InitProgram.h, what model binaries evaluate),
// which gives the slice of the global tensor one rank holds element by
// element from the global index, never building the global tensor. The
// result is bitwise the same whatever the mesh and placement.
//
//===----------------------------------------------------------------------===//

#ifndef TDX_TARGET_INITEVALUATOR_H
#define TDX_TARGET_INITEVALUATOR_H

#include "tdx/IR/TdxOps.h"
#include "tdx/Runtime/InitProgram.h"

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

/// The init region of `decl` (a tdx.parameter or tdx.buffer) as an
/// InitProgram; ops that are not pointwise in the global index (scatters,
/// transposes, generic aten ops) are refused with a diagnostic naming them.
FailureOr<::tdx::rt::InitProgram> buildInitProgram(Operation *decl);

/// The program of `value` and the ops it reads (a random op of a function:
/// its global shape, from `global_shape` once partitioned).
FailureOr<::tdx::rt::InitProgram> buildValueProgram(Value value);

/// The elements of `box` of the value `decl` (a tdx.parameter or tdx.buffer
/// with an init region) yields, row-major, as raw bytes of its element type
/// (f64, f32, i64, i32; i1 as one byte).
FailureOr<std::vector<uint8_t>> evaluateInitShard(Operation *decl, const ShardBox &box);

} // namespace mlir::tdx

#endif // TDX_TARGET_INITEVALUATOR_H
