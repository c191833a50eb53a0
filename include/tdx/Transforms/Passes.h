//===- Passes.h - tdx passes -------------------------------------*- C++ -*-===//

#ifndef TDX_PASSES_PASSES_H
#define TDX_PASSES_PASSES_H

#include "mlir/IR/BuiltinOps.h"
#include "mlir/Pass/Pass.h"

namespace mlir {
class OpPassManager;
}

namespace mlir::tdx {

#define GEN_PASS_DECL
#include "tdx/Transforms/Passes.h.inc"

#define GEN_PASS_REGISTRATION
#include "tdx/Transforms/Passes.h.inc"

/// The sharding pipeline, registered once as `tdx-place` and `tdx-spmd`:
/// canonicalize + tdx-propagate-sharding, then tdx-insert-collectives +
/// tdx-partition + tdx-prefetch-all-gathers. tdx-compile, the Python package and tdx-opt run these.
void buildPlacePipeline(OpPassManager &pm, const PropagateShardingOptions &options);
void buildSpmdPipeline(OpPassManager &pm);
/// The backend pipeline, registered as `tdx-backend`: tdx-fuse-elementwise,
/// tdx-async-collectives, tdx-overlap-dispatch, tdx-recompute, tdx-plan-memory, the budget's check
/// (tdx-memory-report format=none; `checkBudget` false leaves it out, to
/// report a step over it), tdx-split-parts. Its decisions are what the C++
/// and CUDA emitters print.
constexpr int64_t kDefaultOpsPerPart = 24;
void buildBackendPipeline(OpPassManager &pm, int64_t opsPerPart = kDefaultOpsPerPart,
                          bool checkBudget = true);
/// Runs the backend pipeline on a partitioned module, unless a function of
/// it has a memory plan already (the emitters' precondition).
LogicalResult prepareForEmission(ModuleOp module, int64_t opsPerPart = kDefaultOpsPerPart);
void registerTdxPipelines();

} // namespace mlir::tdx

#endif // TDX_PASSES_PASSES_H
