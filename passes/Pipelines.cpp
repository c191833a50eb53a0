//===- Pipelines.cpp - the sharding pipeline, registered once -------------===//
//
// tdx-compile, tdx-translate, the Python package (tdx.parallelize,
// Program.partition, comm_report) and tdx-opt all run these registered
// pipelines, so the pass order is written here and nowhere else.
//
//===----------------------------------------------------------------------===//

#include "tdx/Transforms/Passes.h"
#include "tdx/IR/TdxDialect.h"

#include "mlir/Dialect/Func/IR/FuncOps.h"

#include "mlir/Pass/PassManager.h"
#include "mlir/Pass/PassOptions.h"
#include "mlir/Pass/PassRegistry.h"
#include "mlir/Transforms/Passes.h"

using namespace mlir;

namespace {
struct PlaceOptions : public PassPipelineOptions<PlaceOptions> {
  ListOption<double> bandwidth{*this, "bandwidth",
                               llvm::cl::desc("Bytes per second of each mesh axis")};
  ListOption<double> latency{*this, "latency",
                             llvm::cl::desc("Seconds per collective step on each mesh axis")};
  Option<double> flops{*this, "flops", llvm::cl::desc("FLOP/s of one device"),
                       llvm::cl::init(1e11)};
  Option<double> memory{*this, "memory",
                        llvm::cl::desc("Seconds per byte a rank holds of a result"),
                        llvm::cl::init(1e-10)};
  Option<bool> explain{*this, "explain", llvm::cl::desc("Explain contested placements"),
                       llvm::cl::init(false)};
};
struct BackendOptions : public PassPipelineOptions<BackendOptions> {
  Option<int64_t> opsPerPart{*this, "ops-per-part",
                             llvm::cl::desc("Ops that run in one part of the step"),
                             llvm::cl::init(mlir::tdx::kDefaultOpsPerPart)};
  Option<bool> checkBudget{*this, "check-budget",
                           llvm::cl::desc("Refuse a step over its tdx.memory_budget (off: "
                                          "plan it as it is, to report it)"),
                           llvm::cl::init(true)};
};
} // namespace

void mlir::tdx::buildPlacePipeline(OpPassManager &pm, const PropagateShardingOptions &options) {
  // canonicalize first: it folds the reshapes that PyTorch's decomposition
  // of torch.matmul puts around batched matmuls, so heads stay sharded.
  pm.addPass(createCheckReplication());
  pm.addPass(createExpandBatchNorm());
  pm.addPass(createCanonicalizerPass());
  pm.addPass(createPropagateSharding(options));
}

void mlir::tdx::buildSpmdPipeline(OpPassManager &pm) {
  pm.addPass(createInsertCollectives());
  pm.addPass(createFoldMesh());
  pm.addPass(createPartition());
  pm.addPass(createWidenReductions());
  pm.addPass(createRegatherParameters());
  pm.addPass(createPrefetchAllGathers());
  pm.addPass(createHoistCollectives());
  pm.addPass(createScheduleWaits());
  // A pipeline's stages and each stage rank's step (nothing without one).
  pm.addPass(createSplitStages());
  pm.addPass(createSchedulePipeline());
  // Every rank's messages and collectives complete (pipelines' ranks).
  pm.addPass(createCheckMessages());
}

void mlir::tdx::buildBackendPipeline(OpPassManager &pm, int64_t opsPerPart, bool checkBudget) {
  pm.addPass(createFuseElementwise());
  pm.addPass(createAsyncCollectives());
  pm.addPass(createOverlapDispatch());
  pm.addPass(createRecompute());
  pm.addPass(createPlanMemory());
  if (checkBudget) {
    MemoryReportOptions budget;
    budget.format = "none";
    pm.addPass(createMemoryReport(budget));
  }
  SplitPartsOptions parts;
  parts.opsPerPart = opsPerPart;
  pm.addPass(createSplitParts(parts));
}

LogicalResult mlir::tdx::prepareForEmission(ModuleOp module, int64_t opsPerPart) {
  bool planned = false;
  module.walk([&](func::FuncOp fn) { planned |= fn->hasAttr(TdxDialect::kStepBytesAttrName); });
  if (planned)
    return success();
  auto pm = PassManager::on<ModuleOp>(module.getContext());
  buildBackendPipeline(pm, opsPerPart);
  return pm.run(module);
}

void mlir::tdx::registerTdxPipelines() {
  PassPipelineRegistration<PlaceOptions>(
      "tdx-place",
      "tdx-check-replication, tdx-expand-batch-norm, canonicalize, then tdx-propagate-sharding: "
      "every value gets a "
      "placement",
      [](OpPassManager &pm, const PlaceOptions &o) {
        PropagateShardingOptions p;
        p.bandwidth.assign(o.bandwidth.begin(), o.bandwidth.end());
        p.latency.assign(o.latency.begin(), o.latency.end());
        p.flops = o.flops;
        p.memory = o.memory;
        p.explain = o.explain;
        buildPlacePipeline(pm, p);
      });
  PassPipelineRegistration<>(
      "tdx-spmd",
      "tdx-insert-collectives, tdx-fold-mesh, tdx-partition, tdx-widen-reductions, "
      "tdx-regather-parameters, tdx-prefetch-all-gathers, tdx-hoist-collectives, "
      "tdx-schedule-waits, tdx-split-stages, tdx-schedule-pipeline, tdx-check-messages: the "
      "per-rank program",
      buildSpmdPipeline);
  PassPipelineRegistration<BackendOptions>(
      "tdx-backend",
      "tdx-fuse-elementwise, tdx-async-collectives, tdx-overlap-dispatch, tdx-recompute (the budget), "
      "tdx-plan-memory, tdx-memory-report (the budget), tdx-split-parts: the decisions the C++ and CUDA emitters print",
      [](OpPassManager &pm, const BackendOptions &o) {
        buildBackendPipeline(pm, o.opsPerPart, o.checkBudget);
      });
}
