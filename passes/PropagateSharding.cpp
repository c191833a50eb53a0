//===- PropagateSharding.cpp - a placement for every tensor value ---------===//
//
// The pass over lib/Sharding's propagation (tdx/Sharding/Propagation.h):
// per function, the mesh its placements name, the cost model from the
// pass's options, then propagation and decision.
//
//===----------------------------------------------------------------------===//

#include "tdx/IR/TdxOps.h"
#include "tdx/Transforms/Passes.h"
#include "tdx/Sharding/Layout.h"
#include "tdx/Sharding/Propagation.h"

namespace mlir::tdx {
#define GEN_PASS_DEF_PROPAGATESHARDING
#include "tdx/Transforms/Passes.h.inc"
} // namespace mlir::tdx

using namespace mlir;
using namespace mlir::tdx;

namespace {

struct PropagateShardingPass
    : public mlir::tdx::impl::PropagateShardingBase<PropagateShardingPass> {
  using PropagateShardingBase::PropagateShardingBase;

  void runOnOperation() override {
    if (getOperation()->hasAttr(::mlir::tdx::TdxDialect::kPartitionedAttrName)) {
      getOperation().emitError("tdx-propagate-sharding runs on the global view, "
                               "but this module is already partitioned");
      return signalPassFailure();
    }
    SymbolTableCollection symbols;
    for (auto fn : llvm::make_early_inc_range(getOperation().getOps<func::FuncOp>())) {
      if (fn.isExternal())
        continue;
      FailureOr<MeshOp> mesh = meshOfFunction(fn, symbols);
      if (failed(mesh))
        return signalPassFailure();
      if (!*mesh)
        continue;
      FailureOr<CostModel> cost =
          CostModel::fromOptions(*mesh, bandwidth, latency, flops, memory);
      if (failed(cost))
        return signalPassFailure();
      if (failed(propagateShardings(fn, *mesh, *cost, explain, symbols)))
        return signalPassFailure();
    }
  }
};

} // namespace
