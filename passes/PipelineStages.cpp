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

std::optional<PipelinePlan> mlir::tdx::scheduledPipeline(ModuleOp module) {
  auto d = module->getAttrOfType<DictionaryAttr>(TdxDialect::kPipelineAttrName);
  auto timeline = d ? d.getAs<ArrayAttr>("timeline") : ArrayAttr();
  if (!timeline)
    return std::nullopt;
  // The dialect verified the entries' kinds.
  PipelinePlan plan;
  plan.axis = d.getAs<StringAttr>("axis").getValue().str();
  plan.schedule = d.getAs<StringAttr>("schedule").getValue().str();
  plan.microbatches = d.getAs<IntegerAttr>("microbatches").getInt();
  plan.stagesPerRank = d.getAs<IntegerAttr>("stages_per_rank").getInt();
  if (auto stages = d.getAs<ArrayAttr>("stages"))
    for (Attribute chunk : stages) {
      plan.stages.emplace_back();
      for (StringRef layer : cast<ArrayAttr>(chunk).getAsValueRange<StringAttr>())
        plan.stages.back().push_back(layer.str());
    }
  plan.ranks = std::max<int64_t>(1, static_cast<int64_t>(plan.stages.size()) / plan.stagesPerRank);
  if (auto s = d.getAs<DenseF64ArrayAttr>("layer_seconds"))
    plan.layerSeconds.assign(s.asArrayRef().begin(), s.asArrayRef().end());
  if (auto s = d.getAs<DenseF64ArrayAttr>("chunk_seconds"))
    plan.chunkSeconds.assign(s.asArrayRef().begin(), s.asArrayRef().end());
  for (auto t : timeline.getAsRange<DenseF64ArrayAttr>())
    plan.timeline.push_back({static_cast<int64_t>(t[0]), static_cast<int64_t>(t[1]),
                             static_cast<int64_t>(t[2]), static_cast<int64_t>(t[3]), t[4], t[5]});
  return plan;
}

double PipelinePlan::end() const {
  double end = 0;
  for (const PipelineTask &t : timeline)
    end = std::max(end, t.end);
  return end;
}

SmallVector<double> PipelinePlan::busy() const {
  SmallVector<double> busy(ranks, 0.0);
  for (const PipelineTask &t : timeline)
    if (t.rank >= 0 && t.rank < ranks)
      busy[t.rank] += t.end - t.start;
  return busy;
}

SmallVector<double> PipelinePlan::bubbles() const {
  double last = end();
  SmallVector<double> bubbles;
  for (double b : busy())
    bubbles.push_back(b > 0 ? (last - b) / b : 0.0);
  return bubbles;
}
