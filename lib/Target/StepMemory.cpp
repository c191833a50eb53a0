//===- StepMemory.cpp - the bytes a rank holds besides its working memory -===//

#include "tdx/Target/StepMemory.h"
#include "tdx/IR/TdxOps.h"
#include "tdx/Sharding/Layout.h"
#include "tdx/Target/Collectives.h"

#include <map>

using namespace mlir;
using namespace mlir::tdx;

namespace {
/// The bytes a rank holds of a value of `global` type placed by `sharding`
/// (null: replicated).
int64_t heldBytes(Operation *from, RankedTensorType global, ShardingAttr sharding) {
  if (!global || !global.hasStaticShape())
    return 0;
  MeshOp mesh = sharding ? lookupMesh(from, sharding.getMesh()) : MeshOp();
  if (!mesh)
    return global.getNumElements() * elementBytes(global.getElementType());
  return localBytes(global, layoutOf(sharding), mesh.getShape());
}
} // namespace

func::FuncOp mlir::tdx::stepFunction(ModuleOp module) {
  for (StringRef name : {"train_step", "forward"})
    if (auto fn = module.lookupSymbol<func::FuncOp>(name))
      return fn;
  for (auto fn : module.getOps<func::FuncOp>())
    if (!fn.isExternal())
      return fn;
  return {};
}

SmallVector<func::FuncOp> mlir::tdx::stepFunctions(ModuleOp module) {
  SmallVector<func::FuncOp> steps;
  if (auto pipeline = module->getAttrOfType<DictionaryAttr>(TdxDialect::kPipelineAttrName))
    if (auto functions = pipeline.getAs<ArrayAttr>("functions"))
      for (auto name : functions.getAsRange<FlatSymbolRefAttr>())
        if (auto fn = module.lookupSymbol<func::FuncOp>(name.getValue()))
          steps.push_back(fn);
  if (steps.empty())
    if (func::FuncOp fn = stepFunction(module))
      steps.push_back(fn);
  return steps;
}

StepMemory mlir::tdx::stepMemory(ModuleOp module, func::FuncOp fn) {
  StepMemory m;
  std::map<std::string, int64_t> stateBytes;
  std::map<std::string, RankedTensorType> stateType;
  // A pipeline rank's step (tdx-schedule-pipeline's functions, in rank
  // order) holds the state of its own stages only (Stage(r) layouts).
  SmallVector<func::FuncOp> steps = stepFunctions(module);
  auto at = llvm::find(steps, fn);
  int64_t pipelineRank = at == steps.end() ? -1 : at - steps.begin(),
          pipelineRanks = static_cast<int64_t>(steps.size());
  for (Operation &op : module.getOps()) {
    auto state = dyn_cast<StateOpInterface>(&op);
    if (!state || state.getTiedState())
      continue;
    if (auto chunk = op.getAttrOfType<IntegerAttr>(TdxDialect::kStageAttrName);
        chunk && pipelineRank >= 0 && chunk.getInt() % pipelineRanks != pipelineRank &&
        state.getStateType().getRank() > 0)
      continue;
    std::string name = SymbolTable::getSymbolName(&op).str();
    int64_t bytes = heldBytes(&op, state.getStateType(), state.getStateSharding());
    stateBytes[name] = bytes;
    stateType[name] = state.getStateType();
    (StringRef(name).starts_with("optimizer.") ? m.optimizer : m.parameters) += bytes;
    m.states.push_back({name, bytes});
  }
  for (BlockArgument arg : fn.getArguments()) {
    auto global = fn.getArgAttrOfType<TypeAttr>(arg.getArgNumber(),
                                                TdxDialect::kGlobalTypeAttrName);
    auto sharding = fn.getArgAttrOfType<ShardingAttr>(arg.getArgNumber(),
                                                      TdxDialect::kShardingAttrName);
    auto type = global ? dyn_cast<RankedTensorType>(global.getValue())
                       : dyn_cast<RankedTensorType>(arg.getType());
    m.inputs += heldBytes(fn, type, global ? sharding : ShardingAttr());
  }
  fn.walk([&](AssignOp assign) {
    std::string name = assign.getStateName().str();
    Operation *owner = module.lookupSymbol(name);
    if (!owner || !isa<ParameterOp>(owner) || StringRef(name).starts_with("optimizer."))
      return;
    int64_t bytes = stateBytes[name];
    std::string prefix = "optimizer." + name + ".";
    // Its optimizer state, from where the names start in sorted order (not
    // a scan of every state per write: a 70B step has thousands of both).
    for (auto it = stateBytes.lower_bound(prefix);
         it != stateBytes.end() && StringRef(it->first).starts_with(prefix); ++it)
      if (StringRef(it->first).drop_front(prefix.size()).find('.') == StringRef::npos &&
          stateType[it->first] == stateType[name]) {
        bytes = it->second;
        break;
      }
    m.gradients += bytes;
  });
  return m;
}

int64_t mlir::tdx::workingBytes(func::FuncOp step, const Lifetimes &lifetimes) {
  if (auto planned = step->getAttrOfType<IntegerAttr>(TdxDialect::kStepBytesAttrName))
    return planned.getInt();
  return lifetimes.peakBytes();
}

namespace {
// The cost model's defaults (tdx/Sharding/Layout.h): FLOP/s and bytes/s of
// memory.
constexpr double kFlops = 1e11, kMemoryBandwidth = 1e10;

int64_t elementsOf(Value v) {
  auto t = dyn_cast<RankedTensorType>(v.getType());
  return t && t.hasStaticShape() ? t.getNumElements() : 0;
}
} // namespace

SmallVector<Value> mlir::tdx::readsOf(Operation *op) {
  if (auto wait = dyn_cast<WaitOp>(op))
    if (auto start = wait.getToken().getDefiningOp<StartOp>())
      return SmallVector<Value>(start.getCollective()->getOperands());
  if (auto start = dyn_cast<StartOp>(op))
    return SmallVector<Value>(start.getCollective()->getOperands());
  return SmallVector<Value>(op->getOperands());
}

double mlir::tdx::opSeconds(Operation *op) {
  Operation *collective = op;
  if (auto wait = dyn_cast<WaitOp>(op))
    if (auto start = wait.getToken().getDefiningOp<StartOp>())
      collective = start.getCollective();
  if (std::optional<double> seconds = collectiveOpSeconds(collective))
    return *seconds;
  int64_t moved = 0;
  for (Value v : readsOf(op))
    moved += tensorBytes(v);
  for (Value v : op->getResults())
    moved += tensorBytes(v);
  double flops = 0;
  if (isa<MatmulOp, LinearOp>(op)) {
    auto lhs = dyn_cast<RankedTensorType>(op->getOperand(0).getType());
    if (lhs && lhs.getRank() > 0 && !lhs.isDynamicDim(lhs.getRank() - 1))
      flops = 2.0 * elementsOf(op->getResult(0)) * lhs.getShape().back();
  } else if (auto aten = dyn_cast<AtenOp>(op);
             aten && aten.getSchema().starts_with("aten::convolution") &&
             aten.getNumOperands() > 1) {
    auto weight = dyn_cast<RankedTensorType>(aten.getOperand(1).getType());
    if (weight && weight.hasStaticShape() && weight.getRank() > 0 && weight.getShape()[0] > 0)
      flops = 2.0 * elementsOf(op->getResult(0)) * weight.getNumElements() / weight.getShape()[0];
  }
  return flops / kFlops + static_cast<double>(moved) / kMemoryBandwidth;
}
