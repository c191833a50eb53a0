//===- PipelineStages.cpp - what the pipeline passes share ----------------===//

#include "PipelineStages.h"

using namespace mlir;
using namespace mlir::tdx;

/// The module's pipeline (null: it has none), or failure after a
/// diagnostic naming `pass`.
static FailureOr<std::optional<PipelineSpec>> pipelineOf(ModuleOp module, StringRef pass) {
  auto d = module->getAttrOfType<DictionaryAttr>(TdxDialect::kPipelineAttrName);
  if (!d)
    return std::optional<PipelineSpec>();
  // The dialect verified the entries' kinds.
  PipelineSpec spec;
  spec.axis = d.getAs<StringAttr>("axis").getValue().str();
  spec.microbatches = d.getAs<IntegerAttr>("microbatches").getInt();
  spec.schedule = d.getAs<StringAttr>("schedule").getValue().str();
  spec.stagesPerRank = d.getAs<IntegerAttr>("stages_per_rank").getInt();
  SmallVector<MeshOp> meshes(module.getOps<MeshOp>());
  if (meshes.size() != 1)
    return module.emitError() << pass << ": a pipeline runs on one tdx.mesh, the module has "
                              << meshes.size();
  spec.mesh = meshes.front();
  int64_t axis = spec.mesh.getAxisIndex(spec.axis);
  if (axis < 0)
    return module.emitError() << pass << ": the pipeline's axis \"" << spec.axis
                              << "\" is not an axis of mesh @" << spec.mesh.getSymName();
  spec.ranks = spec.mesh.getShape()[axis];
  if (spec.schedule != "interleaved-1f1b" && spec.stagesPerRank != 1)
    return module.emitError() << pass << ": stages_per_rank=" << spec.stagesPerRank
                              << " is for schedule=\"interleaved-1f1b\"; the " << spec.schedule
                              << " schedule runs one stage per rank";
  if (spec.schedule == "interleaved-1f1b" && spec.microbatches % spec.ranks)
    return module.emitError() << pass << ": the interleaved 1F1B schedule runs the micro-batches "
                              << "in rounds of the pipeline's " << spec.ranks
                              << " ranks; microbatches=" << spec.microbatches
                              << " is not a multiple of " << spec.ranks;
  return std::optional<PipelineSpec>(spec);
}

FailureOr<std::optional<Pipelined>> mlir::tdx::pipelinedStep(ModuleOp module, StringRef pass) {
  FailureOr<std::optional<PipelineSpec>> spec = pipelineOf(module, pass);
  if (failed(spec))
    return failure();
  if (!*spec)
    return std::optional<Pipelined>();
  auto fn = module.lookupSymbol<func::FuncOp>("train_step");
  if (!fn || !fn.getBody().hasOneBlock())
    return module.emitError() << pass << ": a pipeline splits a training step "
                              << "(tdx.trace_train_step's @train_step), which the module "
                                 "does not have";
  for (auto other : module.getOps<func::FuncOp>())
    if (other != fn)
      return other.emitError() << pass << ": a pipelined program has one entry, @train_step; "
                               << "compile other entries (prog.add_entry) without pipeline=";
  return std::optional<Pipelined>(Pipelined{**spec, fn});
}

llvm::SetVector<Operation *> mlir::tdx::forwardOf(func::FuncOp step) {
  llvm::SetVector<Operation *> forward;
  SmallVector<Operation *> work;
  auto visit = [&](Value v) {
    if (Operation *def = v.getDefiningOp())
      if (forward.insert(def))
        work.push_back(def);
  };
  for (Value v : step.getBody().front().getTerminator()->getOperands())
    visit(v);
  while (!work.empty())
    for (Value v : work.pop_back_val()->getOperands())
      visit(v);
  return forward;
}
