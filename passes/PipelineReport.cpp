//===- PipelineReport.cpp - a scheduled pipeline's stages and timeline ----===//

#include "PipelineStages.h"
#include "ReportPass.h"
#include "tdx/Transforms/Passes.h"

#include "llvm/Support/Format.h"
#include "llvm/Support/JSON.h"

namespace mlir::tdx {
#define GEN_PASS_DEF_PIPELINEREPORT
#include "tdx/Transforms/Passes.h.inc"
} // namespace mlir::tdx

using namespace mlir;
using namespace mlir::tdx;

namespace {

struct PipelineReportPass : public mlir::tdx::impl::PipelineReportBase<PipelineReportPass> {
  using PipelineReportBase::PipelineReportBase;

  void runOnOperation() override {
    ModuleOp module = getOperation();
    if (!knownFormat(module, getArgument(), format, {"table", "json"}))
      return signalPassFailure();
    std::optional<PipelinePlan> plan = scheduledPipeline(module);
    if (!plan) {
      module.emitError() << "tdx-pipeline-report: the module has no scheduled pipeline; "
                            "parallelize with pipeline= and run tdx-split-stages and "
                            "tdx-schedule-pipeline (tdx-spmd) first";
      return signalPassFailure();
    }
    std::unique_ptr<llvm::ToolOutputFile> file = openReport(module, getArgument(), outputFile);
    if (!file)
      return signalPassFailure();
    llvm::raw_ostream &os = file->os();
    SmallVector<double> busy = plan->busy(), bubbles = plan->bubbles();
    if (format == "json") {
      llvm::json::Array stages, timeline;
      for (const SmallVector<std::string> &layers : plan->stages)
        stages.push_back(llvm::json::Array(layers));
      static const char *kPhases[] = {"F", "B", "W"};
      for (const PipelineTask &t : plan->timeline)
        timeline.push_back(llvm::json::Object{
            {"rank", t.rank},
            {"phase", kPhases[std::clamp<int64_t>(t.phase, 0, 2)]},
            {"stage", t.chunk},
            {"microbatch", t.microbatch},
            {"start", t.start},
            {"end", t.end}});
      os << llvm::json::Value(llvm::json::Object{
                {"axis", plan->axis},
                {"schedule", plan->schedule},
                {"ranks", plan->ranks},
                {"microbatches", plan->microbatches},
                {"stages_per_rank", plan->stagesPerRank},
                {"stages", std::move(stages)},
                {"layer_seconds", llvm::json::Array(plan->layerSeconds)},
                {"stage_seconds", llvm::json::Array(plan->chunkSeconds)},
                {"timeline", std::move(timeline)},
                {"end", plan->end()},
                {"busy", llvm::json::Array(busy)},
                {"bubble", llvm::json::Array(bubbles)},
                {"ideal_bubble", plan->idealBubble()}})
         << "\n";
    } else {
      os << "pipeline on \"" << plan->axis << "\": " << plan->ranks << " ranks, "
         << plan->schedule << ", " << plan->microbatches << " micro-batches, "
         << plan->stagesPerRank << " stage(s) per rank\n";
      for (auto [c, layers] : llvm::enumerate(plan->stages)) {
        os << "stage " << c << " on rank " << c % plan->ranks << ": "
           << llvm::format("%.3g", c < plan->chunkSeconds.size() ? plan->chunkSeconds[c] : 0.0)
           << " s forward:";
        for (const std::string &l : layers)
          os << " " << (l.empty() ? "(root)" : l);
        os << "\n";
      }
      os << "schedule by the cost model: " << plan->timeline.size() << " tasks, "
         << llvm::format("%.3g", plan->end()) << " s\n";
      for (int64_t r = 0; r < plan->ranks; ++r)
        os << "rank " << r << ": busy " << llvm::format("%.3g", busy[r]) << " s, bubble "
           << llvm::format("%.3f", bubbles[r]) << "\n";
      os << "ideal bubble (p-1)/(v m): " << llvm::format("%.3f", plan->idealBubble()) << "\n";
    }
    file->keep();
    markAllAnalysesPreserved();
  }
};

} // namespace
