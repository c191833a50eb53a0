//===- StepMemory.cpp - the bytes a rank holds besides its working memory -===//

#include "tdx/Target/StepMemory.h"
#include "tdx/IR/TdxOps.h"
#include "tdx/Sharding/Layout.h"

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

StepMemory mlir::tdx::stepMemory(ModuleOp module, func::FuncOp fn) {
  StepMemory m;
  std::map<std::string, int64_t> stateBytes;
  std::map<std::string, RankedTensorType> stateType;
  for (Operation &op : module.getOps()) {
    auto state = dyn_cast<StateOpInterface>(&op);
    if (!state || state.getTiedState())
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
