//===- PipelineStages.h - what the pipeline passes share ---------*- C++ -*-===//
//
// tdx-split-stages and tdx-schedule-pipeline read the module's
// `tdx.pipeline` dictionary (tdx.parallelize's pipeline=) the same way, and
// agree on which ops of the step are a stage's and which every stage makes
// for itself; tdx-explain and tdx-pipeline-report read what they wrote
// there the same way.
//
//===----------------------------------------------------------------------===//

#ifndef TDX_PASSES_PIPELINESTAGES_H
#define TDX_PASSES_PIPELINESTAGES_H

#include "tdx/IR/TdxOps.h"

#include "mlir/Dialect/Func/IR/FuncOps.h"
#include "mlir/IR/BuiltinOps.h"
#include "llvm/ADT/SetVector.h"

#include <optional>
#include <string>

namespace mlir::tdx {

/// The pipeline a module asks for.
struct PipelineSpec {
  std::string axis;         // the mesh axis the stages are on
  int64_t ranks = 1;        // its size
  int64_t microbatches = 1; // the step's micro-batches
  std::string schedule;     // "gpipe", "1f1b" or "interleaved-1f1b"
  int64_t stagesPerRank = 1;
  MeshOp mesh;
  /// Stages in all: the model's chunks, chunk c on pipeline rank c % ranks.
  int64_t chunks() const { return ranks * stagesPerRank; }
};

/// The module's pipeline and the step it splits (@train_step, alone in the
/// module): none when the module asks for no pipeline, failure after a
/// diagnostic naming `pass`.
struct Pipelined {
  PipelineSpec spec;
  func::FuncOp step;
};
FailureOr<std::optional<Pipelined>> pipelinedStep(ModuleOp module, StringRef pass);

/// The chunk an op or a state symbol was given by tdx-split-stages; none:
/// every stage that reads it makes it for itself (it reads only the batch
/// and constants).
inline std::optional<int64_t> stageOf(Operation *op) {
  if (auto a = op->getAttrOfType<IntegerAttr>(TdxDialect::kStageAttrName))
    return a.getInt();
  return std::nullopt;
}

/// The ops the step's result (the loss) is computed from: its forward.
llvm::SetVector<Operation *> forwardOf(func::FuncOp step);

/// One task of a scheduled pipeline: the forward (0), backward (1) or
/// weights' gradients (2, zero bubble) of a chunk on a micro-batch, on a
/// rank, from `start` to `end` seconds by the cost model.
struct PipelineTask {
  int64_t rank, phase, chunk, microbatch;
  double start, end;
};

/// A pipeline as the passes left it in `tdx.pipeline`: what
/// tdx-split-stages split (stages, seconds) and tdx-schedule-pipeline timed
/// (the timeline). What tdx-explain draws and tdx-pipeline-report prints.
struct PipelinePlan {
  std::string axis, schedule;
  int64_t ranks = 1, microbatches = 1, stagesPerRank = 1;
  SmallVector<SmallVector<std::string>> stages; // each chunk's layers
  SmallVector<double> layerSeconds, chunkSeconds;
  SmallVector<PipelineTask> timeline;
  /// When the last task ends.
  double end() const;
  /// Each rank's seconds in tasks.
  SmallVector<double> busy() const;
  /// Each rank's bubble: its idle over its busy time until end().
  SmallVector<double> bubbles() const;
  /// The schedule's ideal, (p - 1) / (v m).
  double idealBubble() const {
    return static_cast<double>(ranks - 1) / static_cast<double>(stagesPerRank * microbatches);
  }
};
/// The module's scheduled pipeline; none before tdx-schedule-pipeline ran
/// (or without a pipeline).
std::optional<PipelinePlan> scheduledPipeline(ModuleOp module);

} // namespace mlir::tdx

#endif // TDX_PASSES_PIPELINESTAGES_H
