//===- LocalTypes.cpp - per-rank shapes of sharded tensors ----------------===//

#include "tdx/IR/LocalTypes.h"

using namespace mlir;
using namespace mlir::tdx;

ChunkSize mlir::tdx::chunkSize(int64_t size, ArrayRef<int64_t> groupSizes) {
  ChunkSize c{size, !ShapedType::isDynamic(size)};
  for (int64_t k : groupSizes) {
    if (ShapedType::isDynamic(c.max))
      return c;
    if (c.max % k != 0)
      c.exact = false;
    c.max = (c.max + k - 1) / k;
  }
  return c;
}

SmallVector<int64_t> mlir::tdx::shardGroupsOfDim(ArrayRef<PlacementAttr> layout,
                                        ArrayRef<int64_t> meshShape, int64_t dim) {
  SmallVector<int64_t> groups;
  for (auto [axis, p] : llvm::enumerate(layout))
    if (p.isShard() && p.getDim() == dim)
      groups.push_back(meshShape[axis]);
  return groups;
}

RankedTensorType mlir::tdx::localType(RankedTensorType global,
                                      ArrayRef<PlacementAttr> layout,
                                      ArrayRef<int64_t> meshShape) {
  SmallVector<int64_t> shape(global.getShape());
  for (int64_t d = 0; d < global.getRank(); ++d) {
    SmallVector<int64_t> groups = shardGroupsOfDim(layout, meshShape, d);
    if (groups.empty())
      continue;
    ChunkSize c = chunkSize(shape[d], groups);
    shape[d] = c.exact ? c.max : ShapedType::kDynamic;
  }
  return RankedTensorType::get(shape, global.getElementType());
}

