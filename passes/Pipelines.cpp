//===- Pipelines.cpp - the sharding pipeline, registered once -------------===//
//
// tdx-compile, the Python package (tdx.parallelize, Program.partition,
// comm_report) and tdx-opt all run these two registered pipelines, so the
// pass order is written here and nowhere else.
//
//===----------------------------------------------------------------------===//

#include "tdx/Passes/Passes.h"

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
} // namespace

void mlir::tdx::buildPlacePipeline(OpPassManager &pm, const PropagateShardingOptions &options) {
  // canonicalize first: it folds the reshapes that PyTorch's decomposition
  // of torch.matmul puts around batched matmuls, so heads stay sharded.
  pm.addPass(createCanonicalizerPass());
  pm.addPass(createPropagateSharding(options));
}

void mlir::tdx::buildSpmdPipeline(OpPassManager &pm) {
  pm.addPass(createInsertCollectives());
  pm.addPass(createFoldMesh());
  pm.addPass(createPartition());
  pm.addPass(createPrefetchAllGathers());
  pm.addPass(createHoistCollectives());
  pm.addPass(createScheduleWaits());
}

void mlir::tdx::registerTdxPipelines() {
  PassPipelineRegistration<PlaceOptions>(
      "tdx-place",
      "canonicalize, then tdx-propagate-sharding: every value gets a placement",
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
      "tdx-insert-collectives, tdx-fold-mesh, tdx-partition, tdx-prefetch-all-gathers, "
      "tdx-hoist-collectives, tdx-schedule-waits: the per-rank program",
      buildSpmdPipeline);
}
