//===- CommReport.cpp - the collectives of one forward step ---------------===//

#include "tdx/IR/TdxOps.h"
#include "tdx/Transforms/Passes.h"
#include "tdx/Target/Collectives.h"
#include "ReportPass.h"

#include "llvm/Support/JSON.h"
#include "llvm/Support/ToolOutputFile.h"

namespace mlir::tdx {
#define GEN_PASS_DEF_COMMREPORT
#include "tdx/Transforms/Passes.h.inc"
} // namespace mlir::tdx

using namespace mlir;
using namespace mlir::tdx;

namespace {

struct CommReportPass : public mlir::tdx::impl::CommReportBase<CommReportPass> {
  using CommReportBase::CommReportBase;

  void runOnOperation() override {
    ModuleOp module = getOperation();
    if (!knownFormat(module, getArgument(), format, {"table", "json"}))
      return signalPassFailure();
    // A redistribution left means the program is not partitioned.
    WalkResult walk = module.walk([&](RedistributeOp op) {
      op->emitError("tdx-comm-report counts the collectives of a partitioned "
                    "program; run tdx-insert-collectives and tdx-partition first");
      return WalkResult::interrupt();
    });
    if (walk.wasInterrupted())
      return signalPassFailure();
    std::vector<CollectiveUse> entries = collectivesIn(module);

    std::unique_ptr<llvm::ToolOutputFile> file = openReport(module, getArgument(), outputFile);
    if (!file)
      return signalPassFailure();
    llvm::raw_ostream &os = file->os();
    int64_t total = 0;
    for (const CollectiveUse &e : entries)
      total += std::max<int64_t>(e.bytes, 0);
    if (format == "json") {
      llvm::json::Array array;
      for (const CollectiveUse &e : entries) {
        llvm::json::Array axes;
        for (const std::string &a : e.axes)
          axes.push_back(a);
        array.push_back(llvm::json::Object{{"kind", e.kind},
                                           {"mesh_axes", std::move(axes)},
                                           {"group_size", e.groupSize},
                                           {"bytes", e.bytes},
                                           {"dtype", e.dtype},
                                           {"seconds", e.seconds},
                                           {"location", e.location}});
      }
      os << llvm::json::Value(std::move(array)) << "\n";
    } else {
      os << llvm::left_justify("collective", 16) << llvm::left_justify("mesh axes", 14)
         << llvm::left_justify("group", 7) << llvm::left_justify("bytes per rank", 16)
         << "dtype\n";
      for (const CollectiveUse &e : entries) {
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
