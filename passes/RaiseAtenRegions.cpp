//===- RaiseAtenRegions.cpp - tdx-raise-aten's rows: manual regions -------===//
//
// `tdx::to_local` and `tdx::from_local` (python/tdx/regions.py: the edges of
// tdx.local_map and tdx.shard_map) become tdx.to_local and tdx.from_local,
// declaring the region's mesh when the module has none of that name. A row
// whose mesh disagrees with the module's declines (the op stays generic and
// the program's verifier names it).
//
//===----------------------------------------------------------------------===//

#include "RaiseAtenCall.h"
#include "tdx/IR/ManualRegions.h"

#include "mlir/AsmParser/AsmParser.h"
#include "mlir/IR/BuiltinOps.h"
#include "mlir/IR/SymbolTable.h"

using namespace mlir;
using namespace mlir::tdx;

namespace mlir::tdx::raise {

/// The `sharding` argument of a region edge, its mesh declared.
static ShardingAttr regionSharding(Call &c) {
  auto text = dyn_cast_or_null<StringAttr>(c.arg("sharding"));
  auto axesText = dyn_cast_or_null<StringAttr>(c.arg("mesh_axes"));
  std::optional<ArrayRef<int64_t>> shape = c.ints("mesh_shape");
  if (!text || !axesText || !shape || c.plain.size() != 1)
    return {};
  MLIRContext *ctx = c.op->getContext();
  auto sharding = dyn_cast_or_null<ShardingAttr>(parseAttribute(text.getValue(), ctx));
  if (!sharding)
    return {};
  SmallVector<StringRef> axes;
  axesText.getValue().split(axes, ',', -1, /*KeepEmpty=*/false);
  auto module = c.op->getParentOfType<ModuleOp>();
  StringRef name = sharding.getMesh().getValue();
  if (Operation *found = SymbolTable::lookupSymbolIn(module, name)) {
    auto mesh = dyn_cast<MeshOp>(found);
    if (!mesh || mesh.getShape() != *shape ||
        !llvm::equal(mesh.getAxes().getAsValueRange<StringAttr>(), axes))
      return {};
    return sharding;
  }
  OpBuilder b(ctx);
  b.setInsertionPointToStart(module.getBody());
  MeshOp::create(b, module.getLoc(), b.getStringAttr(name), b.getDenseI64ArrayAttr(*shape),
                 b.getStrArrayAttr(axes), DenseI64ArrayAttr());
  return sharding;
}

Value raiseToLocal(Call &c) {
  ShardingAttr sharding = regionSharding(c);
  if (!sharding)
    return {};
  return ToLocalOp::create(c.b, userSite(c.op), c.resultType(), c.plain[0], sharding,
                           dyn_cast_or_null<StringAttr>(c.arg("site")));
}

Value raiseFromLocal(Call &c) {
  ShardingAttr sharding = regionSharding(c);
  if (!sharding)
    return {};
  return FromLocalOp::create(c.b, userSite(c.op), c.resultType(), c.plain[0], sharding,
                             c.boolean("unchecked").value_or(false),
                             dyn_cast_or_null<StringAttr>(c.arg("site")));
}

} // namespace mlir::tdx::raise
