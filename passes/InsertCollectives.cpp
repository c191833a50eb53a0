//===- InsertCollectives.cpp - layout changes as single-collective steps --===//

#include "tdx/IR/TdxOps.h"
#include "tdx/Transforms/Passes.h"
#include "tdx/Sharding/Layout.h"

#include "mlir/IR/Builders.h"

namespace mlir::tdx {
#define GEN_PASS_DEF_INSERTCOLLECTIVES
#include "tdx/Transforms/Passes.h.inc"
} // namespace mlir::tdx

using namespace mlir;
using namespace mlir::tdx;

namespace {

struct InsertCollectivesPass
    : public mlir::tdx::impl::InsertCollectivesBase<InsertCollectivesPass> {
  using InsertCollectivesBase::InsertCollectivesBase;

  void runOnOperation() override {
    SmallVector<RedistributeOp> worklist;
    getOperation().walk([&](RedistributeOp op) { worklist.push_back(op); });
    DenseMap<Operation *, CostModel> costs;
    for (RedistributeOp op : worklist) {
      MeshOp mesh = lookupMesh(op, op.getSource().getMesh());
      if (!mesh) {
        op.emitOpError() << "refers to mesh " << op.getSource().getMesh()
                         << ", which is not a 'tdx.mesh' in scope";
        return signalPassFailure();
      }
      auto it = costs.find(mesh);
      if (it == costs.end()) {
        FailureOr<CostModel> cost =
            CostModel::fromOptions(mesh, bandwidth, latency, 1e11);
        if (failed(cost))
          return signalPassFailure();
        it = costs.try_emplace(mesh, *cost).first;
      }
      auto type = cast<RankedTensorType>(op.getType());
      Layout source = layoutOf(op.getSource()), target = layoutOf(op.getTarget());
      SmallVector<RedistributionStep> plan =
          planRedistribution(type, source, target, mesh.getShape(), it->second);
      if (plan.size() == 1 && !report)
        continue;
      OpBuilder b(op);
      Value v = op.getInput();
      Layout layout = source;
      for (const RedistributionStep &step : plan) {
        Layout next = layout;
        next[step.axis] = step.to;
        auto r = RedistributeOp::create(b, op.getLoc(), v, shardingOf(mesh, layout),
                                        shardingOf(mesh, next));
        r->setAttr(::mlir::tdx::TdxDialect::kShardingsAttrName, b.getArrayAttr({shardingOf(mesh, next)}));
        if (report)
          mlir::emitRemark(r.getLoc()) << stringifyStepKind(step.kind) << " on mesh axis \""
                         << cast<StringAttr>(mesh.getAxes()[step.axis]).getValue()
                         << "\": " << step.bytes << " bytes per rank";
        v = r.getResult();
        layout = next;
      }
      op.getResult().replaceAllUsesWith(v);
      op.erase();
    }
  }
};

} // namespace
