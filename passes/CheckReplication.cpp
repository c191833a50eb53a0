//===- CheckReplication.cpp - a manual region's Replicate claims ----------===//
//
// Which mesh axes each value of a manual region varies over (forward
// dataflow from the region's inputs and the user's collectives), then every
// tdx.from_local that claims Replicate is checked against it (see
// Passes.td).
//
//===----------------------------------------------------------------------===//

#include "tdx/IR/ManualRegions.h"
#include "tdx/IR/TdxOps.h"
#include "tdx/Transforms/Passes.h"

#include "mlir/Dialect/Func/IR/FuncOps.h"

namespace mlir::tdx {
#define GEN_PASS_DEF_CHECKREPLICATION
#include "tdx/Transforms/Passes.h.inc"
} // namespace mlir::tdx

using namespace mlir;
using namespace mlir::tdx;

namespace {

/// Per mesh axis, the op that makes a value differ across it (null: equal).
using Varies = SmallVector<Operation *, 4>;

struct CheckReplicationPass
    : public mlir::tdx::impl::CheckReplicationBase<CheckReplicationPass> {
  void runOnOperation() override {
    SymbolTableCollection symbols;
    for (auto fn : getOperation().getOps<func::FuncOp>())
      if (!fn.isExternal() && failed(check(fn, symbols)))
        return signalPassFailure();
  }

  LogicalResult check(func::FuncOp fn, SymbolTableCollection &symbols) {
    MeshOp mesh;
    fn.walk([&](ToLocalOp op) {
      mesh = symbols.lookupNearestSymbolFrom<MeshOp>(op, op.getSharding().getMesh());
      return WalkResult::interrupt();
    });
    if (!mesh)
      return success();
    size_t rank = mesh.getShape().size();
    DenseMap<Value, Varies> varies;
    auto of = [&](Value v) {
      auto it = varies.find(v);
      return it == varies.end() ? Varies(rank, nullptr) : it->second;
    };
    LogicalResult result = success();
    fn.walk([&](Operation *op) {
      if (op == fn.getOperation() || (op->getNumResults() == 0 && !isa<FromLocalOp>(op)))
        return;
      if (auto enter = dyn_cast<ToLocalOp>(op)) {
        Varies v(rank, nullptr);
        for (auto [axis, p] : llvm::enumerate(enter.getSharding().getPlacements()))
          if (!p.isReplicate())
            v[axis] = op;
        varies[enter.getResult()] = v;
        return;
      }
      if (auto leave = dyn_cast<FromLocalOp>(op)) {
        Varies v = of(leave.getInput());
        for (auto [axis, p] : llvm::enumerate(leave.getSharding().getPlacements())) {
          if (!p.isReplicate() || !v[axis] || leave.getUnchecked())
            continue;
          StringRef name = cast<StringAttr>(mesh.getAxes()[axis]).getValue();
          InFlightDiagnostic diag =
              mlir::emitError(userSite(op))
              << "'tdx.from_local' op declares the region's output Replicate over mesh axis \"" << name
              << "\", but it differs across \"" << name
              << "\"; reduce it there (all_reduce), declare it Shard or Partial, or turn "
                 "the check off (check_replication=False)";
          diag.attachNote(userSite(v[axis])) << "it differs across \"" << name << "\" from here";
          result = failure();
        }
        return;
      }
      Varies v(rank, nullptr);
      for (Value operand : op->getOperands()) {
        Varies in = of(operand);
        for (size_t axis = 0; axis < rank; ++axis)
          if (!v[axis])
            v[axis] = in[axis];
      }
      if (isUserCollective(op)) {
        auto aten = cast<AtenOp>(op);
        StringRef kind = aten.getSchema().drop_front(5);
        bool equalizes = kind == "all_reduce" || kind == "all_gather" || kind == "broadcast";
        for (StringRef name : userCollectiveAxes(aten))
          if (int64_t axis = mesh.getAxisIndex(name); axis >= 0)
            v[axis] = equalizes ? nullptr : op;
      }
      if (llvm::any_of(v, [](Operation *o) { return o != nullptr; }))
        for (Value r : op->getResults())
          varies[r] = v;
    });
    return result;
  }
};

} // namespace
