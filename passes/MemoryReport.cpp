//===- MemoryReport.cpp - a rank's bytes by kind, and its budget ----------===//

#include "tdx/IR/TdxOps.h"
#include "tdx/Sharding/Layout.h"
#include "tdx/Target/Lifetimes.h"
#include "tdx/Transforms/Passes.h"

#include "mlir/Dialect/Func/IR/FuncOps.h"
#include "mlir/Support/FileUtilities.h"
#include "llvm/Support/JSON.h"
#include "llvm/Support/ToolOutputFile.h"

#include <algorithm>
#include <map>

namespace mlir::tdx {
#define GEN_PASS_DEF_MEMORYREPORT
#include "tdx/Transforms/Passes.h.inc"
} // namespace mlir::tdx

using namespace mlir;
using namespace mlir::tdx;

namespace {

/// The bytes a rank holds of a value of `global` type placed by `sharding`
/// (null: replicated).
int64_t heldBytes(Operation *from, RankedTensorType global, ShardingAttr sharding) {
  if (!global || !global.hasStaticShape())
    return 0;
  if (!sharding)
    return global.getNumElements() * elementBytes(global.getElementType());
  MeshOp mesh = lookupMesh(from, sharding.getMesh());
  if (!mesh)
    return global.getNumElements() * elementBytes(global.getElementType());
  return localBytes(global, layoutOf(sharding), mesh.getShape());
}

struct Consumer {
  std::string name;
  int64_t bytes;
};

std::string describe(Value v) {
  std::string s;
  llvm::raw_string_ostream os(s);
  Operation *def = v.getDefiningOp();
  os << "the result of " << (def ? def->getName().getStringRef() : StringRef("an argument"));
  if (def)
    if (auto aten = dyn_cast<AtenOp>(def))
      os << " " << aten.getSchema();
  if (def)
    if (auto fl = dyn_cast<FileLineColLoc>(def->getLoc()))
      os << " at " << fl.getFilename().getValue() << ":" << fl.getLine();
  os << " (" << v.getType() << ")";
  return s;
}

std::string mib(int64_t bytes) {
  char buf[32];
  snprintf(buf, sizeof(buf), "%.1f MiB", bytes / 1048576.0);
  return buf;
}

struct MemoryReportPass : public mlir::tdx::impl::MemoryReportBase<MemoryReportPass> {
  using MemoryReportBase::MemoryReportBase;

  void runOnOperation() override {
    ModuleOp module = getOperation();
    if (format != "table" && format != "json" && format != "none") {
      module.emitError() << "tdx-memory-report: unknown format '" << format
                         << "'; use 'table', 'json' or 'none'";
      return signalPassFailure();
    }
    // format=none only checks a budget (tdx-backend runs it on every step).
    if (format == "none" && !module->hasAttr(TdxDialect::kMemoryBudgetAttrName))
      return markAllAnalysesPreserved();
    if (!module->hasAttr(TdxDialect::kPartitionedAttrName)) {
      module.emitError("tdx-memory-report reports a rank's bytes of a partitioned program; run "
                       "tdx-spmd (tdx-insert-collectives, tdx-partition) first");
      return signalPassFailure();
    }
    func::FuncOp fn = module.lookupSymbol<func::FuncOp>("train_step");
    if (!fn)
      fn = module.lookupSymbol<func::FuncOp>("forward");
    if (!fn)
      for (auto f : module.getOps<func::FuncOp>())
        if (!f.isExternal()) {
          fn = f;
          break;
        }
    if (!fn || !fn.getBody().hasOneBlock()) {
      module.emitError("tdx-memory-report: the module has no function with a body to report");
      return signalPassFailure();
    }
    // State: what each rank stores between steps.
    std::map<std::string, int64_t> stateBytes;
    std::map<std::string, RankedTensorType> stateType;
    int64_t parameters = 0, optimizer = 0;
    std::vector<Consumer> consumers;
    for (Operation &op : module.getOps()) {
      auto state = dyn_cast<StateOpInterface>(&op);
      if (!state || state.getTiedState())
        continue;
      std::string name = SymbolTable::getSymbolName(&op).str();
      int64_t bytes = heldBytes(&op, state.getStateType(), state.getStateSharding());
      stateBytes[name] = bytes;
      stateType[name] = state.getStateType();
      (StringRef(name).starts_with("optimizer.") ? optimizer : parameters) += bytes;
      consumers.push_back({"state " + name, bytes});
    }
    int64_t inputs = 0;
    for (BlockArgument arg : fn.getArguments()) {
      auto global = fn.getArgAttrOfType<TypeAttr>(arg.getArgNumber(),
                                                  TdxDialect::kGlobalTypeAttrName);
      auto sharding = fn.getArgAttrOfType<ShardingAttr>(arg.getArgNumber(),
                                                        TdxDialect::kShardingAttrName);
      auto type = global ? dyn_cast<RankedTensorType>(global.getValue())
                         : dyn_cast<RankedTensorType>(arg.getType());
      inputs += heldBytes(fn, type, global ? sharding : ShardingAttr());
    }
    // Gradients: each written parameter's, placed as the update reads it
    // (as its optimizer state is placed, when it has state of its shape).
    int64_t gradients = 0;
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
      gradients += bytes;
    });
    Lifetimes lifetimes(fn.getBody().front());
    int64_t working = lifetimes.peakBytes();
    if (auto planned = fn->getAttrOfType<IntegerAttr>(TdxDialect::kStepBytesAttrName))
      working = planned.getInt();
    for (auto [v, bytes] : lifetimes.liveAtPeak())
      consumers.push_back({describe(v), bytes});
    std::stable_sort(consumers.begin(), consumers.end(),
                     [](const Consumer &a, const Consumer &b) { return a.bytes > b.bytes; });
    if (consumers.size() > 5)
      consumers.resize(5);
    int64_t activations = std::max<int64_t>(working - gradients, 0);
    int64_t peak = parameters + optimizer + inputs + working;

    if (auto budget = module->getAttrOfType<IntegerAttr>(TdxDialect::kMemoryBudgetAttrName);
        budget && peak > budget.getInt()) {
      InFlightDiagnostic d = mlir::emitError(fn.getLoc());
      d << "the step needs " << peak << " bytes (" << mib(peak) << ") per rank at its peak, over "
        << "its memory budget of " << budget.getInt() << " bytes (" << mib(budget.getInt())
        << "): parameters " << parameters << ", optimizer state " << optimizer << ", inputs "
        << inputs << ", gradients " << gradients << ", activations " << activations
        << ". The largest:";
      for (const Consumer &c : consumers)
        d << "\n  " << c.bytes << " bytes: " << c.name;
      d << "\nSplit more over the mesh (zero=3 stores parameters and optimizer state split "
           "over dp; a tensor-parallel plan splits layers), use smaller batches, checkpoint "
           "blocks (torch.utils.checkpoint), or raise memory_budget";
      return signalPassFailure();
    }
    if (format == "none")
      return markAllAnalysesPreserved();
    std::string error;
    std::unique_ptr<llvm::ToolOutputFile> file = openOutputFile(outputFile, &error);
    if (!file) {
      module.emitError() << "tdx-memory-report: cannot open '" << outputFile << "': " << error;
      return signalPassFailure();
    }
    llvm::raw_ostream &os = file->os();
    std::pair<const char *, int64_t> rows[] = {
        {"parameters", parameters}, {"optimizer", optimizer}, {"inputs", inputs},
        {"gradients", gradients},   {"activations", activations}, {"peak", peak}};
    if (format == "json") {
      llvm::json::Object out;
      for (auto [key, bytes] : rows)
        out[key] = bytes;
      out["working"] = working;
      llvm::json::Array largest;
      for (const Consumer &c : consumers)
        largest.push_back(llvm::json::Object{{"name", c.name}, {"bytes", c.bytes}});
      out["largest"] = std::move(largest);
      os << llvm::json::Value(std::move(out)) << "\n";
    } else {
      os << "memory per rank of @" << fn.getSymName() << "\n";
      for (auto [key, bytes] : rows)
        os << llvm::left_justify(key, 13) << llvm::right_justify(std::to_string(bytes), 14)
           << " bytes\n";
    }
    file->keep();
    markAllAnalysesPreserved();
  }
};

} // namespace
