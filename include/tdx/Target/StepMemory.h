//===- StepMemory.h - the bytes a rank holds besides its working memory -*- C++ -*-===//
//
// What tdx-memory-report reports and tdx-recompute plans against: the state
// a rank stores, the batch it is given and the gradients its update reads,
// from the partitioned module's placements.
//
//===----------------------------------------------------------------------===//

#ifndef TDX_TARGET_STEPMEMORY_H
#define TDX_TARGET_STEPMEMORY_H

#include "tdx/Target/Lifetimes.h"

#include "mlir/Dialect/Func/IR/FuncOps.h"
#include "mlir/IR/BuiltinOps.h"
#include "llvm/ADT/SmallVector.h"

#include <algorithm>
#include <string>
#include <utility>
#include <vector>

namespace mlir::tdx {

/// The function a report or a budget is about: `train_step`, else
/// `forward`, else the first with a body (null: none).
func::FuncOp stepFunction(ModuleOp module);
/// The steps a budget holds for: a scheduled pipeline's functions (one per
/// pipeline rank, in rank order), else stepFunction's (none: none).
SmallVector<func::FuncOp> stepFunctions(ModuleOp module);

/// One rank's bytes outside the step's own tensors (its most loaded rank
/// where shards are uneven).
struct StepMemory {
  int64_t parameters = 0; // parameters and buffers stored (a tied name once)
  int64_t optimizer = 0;  // optimizer state stored (`optimizer.*`)
  int64_t inputs = 0;     // the step's arguments (the batch)
  /// Each written parameter's gradient, placed as the update reads it (as
  /// its optimizer state is placed when it has state of its shape). Part
  /// of the working memory, not added to it.
  int64_t gradients = 0;
  /// Each stored state by name, with its bytes.
  std::vector<std::pair<std::string, int64_t>> states;

  /// What the rank holds whatever the step does: state and batch.
  int64_t fixed() const { return parameters + optimizer + inputs; }
  /// Of a working memory, what is not gradients: the activations and
  /// temporaries held at the peak.
  int64_t activations(int64_t working) const { return std::max<int64_t>(working - gradients, 0); }
};
StepMemory stepMemory(ModuleOp module, func::FuncOp step);

/// The step's working memory: the memory plan's figure (tdx.step_bytes)
/// where the step is planned, else the peak of its `lifetimes`.
int64_t workingBytes(func::FuncOp step, const Lifetimes &lifetimes);

/// The values an op reads: a tdx.start's and its tdx.wait's are those of
/// the collective started.
SmallVector<Value> readsOf(Operation *op);
/// The seconds `op` takes by the cost model's defaults: a matmul, linear or
/// convolution by its FLOPs, a collective (or its tdx.wait) by
/// collectiveSeconds (its call, steps and bytes), anything else by the
/// bytes it reads and writes. What
/// tdx-recompute prices running an op again with, and tdx-memory-report
/// reports for what it ran again.
double opSeconds(Operation *op);

} // namespace mlir::tdx

#endif // TDX_TARGET_STEPMEMORY_H
