//===- Collectives.cpp - the collectives a partitioned program runs -------===//

#include "tdx/Target/Collectives.h"
#include "tdx/IR/TdxOps.h"
#include "tdx/Sharding/Layout.h"

using namespace mlir;
using namespace mlir::tdx;

namespace {
/// What a collective moves: its input (a recv's: its result).
Value messageOf(Operation *op) {
  return op->getNumOperands() ? op->getOperand(0) : op->getResult(0);
}

/// The payload recorded by tdx-partition, or the size of a static input.
/// A ragged all-to-all moves at most the smaller of its two buffers: an
/// expert-parallel dispatch sends its routed rows (the input, the worst
/// case received), the combine receives them back (the result).
int64_t payloadBytes(Operation *op) {
  if (auto attr = op->getAttrOfType<IntegerAttr>(TdxDialect::kPayloadBytesAttrName))
    return attr.getInt();
  if (auto ragged = dyn_cast<RaggedAllToAllOp>(op)) {
    auto in = cast<RankedTensorType>(ragged.getInput().getType());
    auto out = cast<RankedTensorType>(ragged.getType());
    if (!in.hasStaticShape() || !out.hasStaticShape())
      return -1;
    return std::min(in.getNumElements(), out.getNumElements()) *
           elementBytes(in.getElementType());
  }
  auto t = cast<RankedTensorType>(messageOf(op).getType());
  if (!t.hasStaticShape())
    return -1;
  return t.getNumElements() * elementBytes(t.getElementType());
}

/// A collective's mesh axes and the ranks in its group; none for an op
/// that is not a collective with a mesh and axes.
std::optional<std::pair<ArrayAttr, int64_t>> groupOf(Operation *op) {
  if (!op->hasTrait<OpTrait::TdxCollective>())
    return std::nullopt;
  auto meshName = op->getAttrOfType<FlatSymbolRefAttr>("mesh");
  auto axes = op->getAttrOfType<ArrayAttr>("mesh_axes");
  if (!meshName || !axes)
    return std::nullopt;
  auto mesh = SymbolTable::lookupNearestSymbolFrom<MeshOp>(op, meshName);
  int64_t size = 1;
  for (StringRef a : axes.getAsValueRange<StringAttr>())
    if (mesh && mesh.getAxisIndex(a) >= 0)
      size *= mesh.getShape()[mesh.getAxisIndex(a)];
  return std::make_pair(axes, size);
}
} // namespace

std::optional<double> mlir::tdx::collectiveOpSeconds(Operation *op) {
  std::optional<std::pair<ArrayAttr, int64_t>> group = groupOf(op);
  if (!group)
    return std::nullopt;
  return collectiveSeconds(op->getName().stripDialect(), payloadBytes(op), group->second);
}

std::optional<CollectiveUse> mlir::tdx::collectiveUse(Operation *op) {
  std::optional<std::pair<ArrayAttr, int64_t>> group = groupOf(op);
  if (!group)
    return std::nullopt;
  CollectiveUse u;
  u.op = op;
  u.kind = op->getName().stripDialect().str();
  for (StringRef a : group->first.getAsValueRange<StringAttr>())
    u.axes.push_back(a.str());
  u.groupSize = group->second;
  u.bytes = payloadBytes(op);
  u.seconds = collectiveSeconds(u.kind, u.bytes, u.groupSize);
  llvm::raw_string_ostream(u.dtype)
      << cast<ShapedType>(messageOf(op).getType()).getElementType();
  llvm::raw_string_ostream os(u.location);
  if (auto fl = dyn_cast<FileLineColLoc>(op->getLoc()))
    os << fl.getFilename().getValue() << ":" << fl.getLine() << ":" << fl.getColumn();
  else
    op->getLoc().print(os);
  return u;
}

std::vector<CollectiveUse> mlir::tdx::collectivesIn(Operation *root) {
  std::vector<CollectiveUse> uses;
  root->walk([&](Operation *op) {
    if (std::optional<CollectiveUse> u = collectiveUse(op))
      uses.push_back(std::move(*u));
  });
  return uses;
}
