//===- MemoryReport.cpp - a rank's bytes by kind, and its budget ----------===//

#include "tdx/IR/TdxOps.h"
#include "tdx/Target/Lifetimes.h"
#include "tdx/Target/StepMemory.h"
#include "tdx/Transforms/Passes.h"
#include "ReportPass.h"

#include "mlir/Dialect/Func/IR/FuncOps.h"
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
    if (!knownFormat(module, getArgument(), format, {"table", "json", "none"}))
      return signalPassFailure();
    // format=none only checks a budget (tdx-backend runs it on every step).
    if (format == "none" && !module->hasAttr(TdxDialect::kMemoryBudgetAttrName))
      return markAllAnalysesPreserved();
    if (!module->hasAttr(TdxDialect::kPartitionedAttrName)) {
      module.emitError("tdx-memory-report reports a rank's bytes of a partitioned program; run "
                       "tdx-spmd (tdx-insert-collectives, tdx-partition) first");
      return signalPassFailure();
    }
    func::FuncOp fn = stepWithBody(module, getArgument(), "report");
    if (!fn)
      return signalPassFailure();
    // A pipeline's ranks run different steps: the one whose peak is the
    // largest (each holds its own stages' state).
    auto peakOf = [&](func::FuncOp f) {
      Lifetimes l(f.getBody().front());
      return stepMemory(module, f).fixed() + workingBytes(f, l);
    };
    SmallVector<func::FuncOp> steps = stepFunctions(module);
    if (steps.size() > 1) {
      int64_t most = peakOf(fn);
      for (func::FuncOp f : steps)
        if (f != fn && f.getBody().hasOneBlock())
          if (int64_t peak = peakOf(f); peak > most)
            fn = f, most = peak;
    }
    StepMemory held = stepMemory(module, fn);
    int64_t parameters = held.parameters, optimizer = held.optimizer, inputs = held.inputs,
            gradients = held.gradients;
    std::vector<Consumer> consumers;
    for (auto &[name, bytes] : held.states)
      consumers.push_back({"state " + name, bytes});
    Lifetimes lifetimes(fn.getBody().front());
    int64_t working = workingBytes(fn, lifetimes);
    for (auto [v, bytes] : lifetimes.liveAtPeak())
      consumers.push_back({describe(v), bytes});
    std::stable_sort(consumers.begin(), consumers.end(),
                     [](const Consumer &a, const Consumer &b) { return a.bytes > b.bytes; });
    if (consumers.size() > 5)
      consumers.resize(5);
    int64_t activations = held.activations(working);
    int64_t peak = parameters + optimizer + inputs + working;

    // What tdx-recompute runs again.
    int64_t recomputedOps = 0, recomputedBytes = 0;
    double recomputedSeconds = 0;
    std::map<std::string, int64_t> recomputedKinds; // a started collective by its name
    for (Operation &op : fn.getBody().front())
      if (op.hasAttr(TdxDialect::kRecomputedAttrName)) {
        if (isa<WaitOp>(op))
          continue;
        ++recomputedOps;
        Operation *kind = isa<StartOp>(op) ? cast<StartOp>(op).getCollective() : &op;
        recomputedSeconds += opSeconds(kind);
        ++recomputedKinds[kind->getName().getStringRef().str()];
        for (Value r : kind->getResults())
          recomputedBytes += tensorBytes(r);
      }
    auto budget = module->getAttrOfType<IntegerAttr>(TdxDialect::kMemoryBudgetAttrName);
    if (format == "none" && budget && peak > budget.getInt()) {
      InFlightDiagnostic d = mlir::emitError(fn.getLoc());
      d << "the step needs " << peak << " bytes (" << mib(peak) << ") per rank at its peak, over "
        << "its memory budget of " << budget.getInt() << " bytes (" << mib(budget.getInt())
        << "): parameters " << parameters << ", optimizer state " << optimizer << ", inputs "
        << inputs << ", gradients " << gradients << ", activations " << activations
        << ". The largest:";
      for (const Consumer &c : consumers)
        d << "\n  " << c.bytes << " bytes: " << c.name;
      if (recomputedOps)
        d << "\nThat is after running " << recomputedOps << " ops again after the peak "
          << "(tdx-recompute) instead of holding " << recomputedBytes << " bytes of results.";
      d << "\nSplit more over the mesh (zero=3 stores parameters and optimizer state split "
           "over dp; a tensor-parallel plan splits layers), use smaller batches, checkpoint "
           "blocks (torch.utils.checkpoint), or raise memory_budget";
      return signalPassFailure();
    }
    if (format == "none")
      return markAllAnalysesPreserved();
    std::unique_ptr<llvm::ToolOutputFile> file = openReport(module, getArgument(), outputFile);
    if (!file)
      return signalPassFailure();
    llvm::raw_ostream &os = file->os();
    std::pair<const char *, int64_t> rows[] = {
        {"parameters", parameters}, {"optimizer", optimizer}, {"inputs", inputs},
        {"gradients", gradients},   {"activations", activations}, {"peak", peak}};
    if (format == "json") {
      llvm::json::Object out;
      for (auto [key, bytes] : rows)
        out[key] = bytes;
      out["working"] = working;
      llvm::json::Object kinds;
      for (auto &[name, n] : recomputedKinds)
        kinds[name] = n;
      out["recomputed"] = llvm::json::Object{{"ops", recomputedOps},
                                             {"bytes", recomputedBytes},
                                             {"seconds", recomputedSeconds},
                                             {"kinds", std::move(kinds)}};
      if (budget)
        out["budget"] = budget.getInt();
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
      if (budget)
        os << llvm::left_justify("budget", 13)
           << llvm::right_justify(std::to_string(budget.getInt()), 14) << " bytes"
           << (peak > budget.getInt() ? ": over it\n" : "\n");
      if (recomputedOps)
        os << "recomputed   " << recomputedOps << " ops run again after the peak, making "
           << recomputedBytes << " bytes again\n";
    }
    file->keep();
    markAllAnalysesPreserved();
  }
};

} // namespace
