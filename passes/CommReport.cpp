//===- CommReport.cpp - the collectives of one forward step ---------------===//

#include "tdx/IR/TdxOps.h"
#include "tdx/Transforms/Passes.h"
#include "tdx/Sharding/Layout.h"

#include "mlir/Support/FileUtilities.h"
#include "llvm/Support/JSON.h"
#include "llvm/Support/ToolOutputFile.h"

namespace mlir::tdx {
#define GEN_PASS_DEF_COMMREPORT
#include "tdx/Transforms/Passes.h.inc"
} // namespace mlir::tdx

using namespace mlir;
using namespace mlir::tdx;

namespace {

struct Entry {
  std::string kind, location, dtype;
  SmallVector<std::string> axes;
  int64_t groupSize = 1;
  int64_t bytes = 0;
};

/// The payload recorded by tdx-partition, or the size of a static input.
int64_t payloadBytes(Operation *op) {
  if (auto attr = op->getAttrOfType<IntegerAttr>(::mlir::tdx::TdxDialect::kPayloadBytesAttrName))
    return attr.getInt();
  auto t = cast<RankedTensorType>(op->getOperand(0).getType());
  if (!t.hasStaticShape())
    return -1;
  return t.getNumElements() * elementBytes(t.getElementType());
}

struct CommReportPass : public mlir::tdx::impl::CommReportBase<CommReportPass> {
  using CommReportBase::CommReportBase;

  void runOnOperation() override {
    ModuleOp module = getOperation();
    if (format != "table" && format != "json") {
      module.emitError() << "tdx-comm-report: unknown format '" << format
                         << "'; use 'table' or 'json'";
      return signalPassFailure();
    }
    std::vector<Entry> entries;
    WalkResult walk = module.walk([&](Operation *op) {
      StringAttr meshName;
      ArrayAttr axes;
      if (auto c = dyn_cast<AllGatherOp>(op))
        meshName = c.getMeshAttr().getAttr(), axes = c.getMeshAxes();
      else if (auto c = dyn_cast<AllReduceOp>(op))
        meshName = c.getMeshAttr().getAttr(), axes = c.getMeshAxes();
      else if (auto c = dyn_cast<ReduceScatterOp>(op))
        meshName = c.getMeshAttr().getAttr(), axes = c.getMeshAxes();
      else if (auto c = dyn_cast<AllToAllOp>(op))
        meshName = c.getMeshAttr().getAttr(), axes = c.getMeshAxes();
      else if (auto c = dyn_cast<BroadcastOp>(op))
        meshName = c.getMeshAttr().getAttr(), axes = c.getMeshAxes();
      else if (isa<RedistributeOp>(op)) {
        op->emitError("tdx-comm-report counts the collectives of a partitioned "
                      "program; run tdx-insert-collectives and tdx-partition first");
        return WalkResult::interrupt();
      } else {
        return WalkResult::advance();
      }
      auto mesh = SymbolTable::lookupNearestSymbolFrom<MeshOp>(
          op, FlatSymbolRefAttr::get(meshName));
      Entry e;
      e.kind = op->getName().stripDialect().str();
      for (StringRef a : axes.getAsValueRange<StringAttr>()) {
        e.axes.push_back(a.str());
        if (mesh && mesh.getAxisIndex(a) >= 0)
          e.groupSize *= mesh.getShape()[mesh.getAxisIndex(a)];
      }
      e.bytes = payloadBytes(op);
      llvm::raw_string_ostream(e.dtype)
          << cast<ShapedType>(op->getOperand(0).getType()).getElementType();
      std::string loc;
      llvm::raw_string_ostream os(loc);
      if (auto fl = dyn_cast<FileLineColLoc>(op->getLoc()))
        os << fl.getFilename().getValue() << ":" << fl.getLine() << ":"
           << fl.getColumn();
      else
        op->getLoc().print(os);
      e.location = loc;
      entries.push_back(e);
      return WalkResult::advance();
    });
    if (walk.wasInterrupted())
      return signalPassFailure();

    std::string error;
    std::unique_ptr<llvm::ToolOutputFile> file = openOutputFile(outputFile, &error);
    if (!file) {
      module.emitError() << "tdx-comm-report: cannot open '" << outputFile
                         << "': " << error;
      return signalPassFailure();
    }
    llvm::raw_ostream &os = file->os();
    int64_t total = 0;
    for (const Entry &e : entries)
      total += std::max<int64_t>(e.bytes, 0);
    if (format == "json") {
      llvm::json::Array array;
      for (const Entry &e : entries) {
        llvm::json::Array axes;
        for (const std::string &a : e.axes)
          axes.push_back(a);
        array.push_back(llvm::json::Object{{"kind", e.kind},
                                           {"mesh_axes", std::move(axes)},
                                           {"group_size", e.groupSize},
                                           {"bytes", e.bytes},
                                           {"dtype", e.dtype},
                                           {"location", e.location}});
      }
      os << llvm::json::Value(std::move(array)) << "\n";
    } else {
      os << llvm::left_justify("collective", 16) << llvm::left_justify("mesh axes", 14)
         << llvm::left_justify("group", 7) << llvm::left_justify("bytes per rank", 16)
         << "dtype\n";
      for (const Entry &e : entries) {
        std::string axes;
        for (auto [i, a] : llvm::enumerate(e.axes))
          axes += (i ? "," : "") + a;
        os << llvm::left_justify(e.kind, 16) << llvm::left_justify(axes, 14)
           << llvm::left_justify(std::to_string(e.groupSize), 7)
           << llvm::left_justify(e.bytes < 0 ? std::string("?") : std::to_string(e.bytes), 16)
           << e.dtype << "\n";
      }
      os << "total: " << entries.size() << " collective(s), " << total
         << " bytes per rank per forward step\n";
    }
    file->keep();
    markAllAnalysesPreserved();
  }
};

} // namespace
