//===- LinearPairs.cpp - Megatron's column/row pairs, found in the graph ---===//
//
// A linear layer (tdx.linear, tdx.matmul by a transposed parameter, or
// tdx.matmul of a 2-D input by a parameter stored (in, out): Hugging Face's
// Conv1D, reported under "in_out") of the forward whose output reaches another linear's input through no third
// linear is the first of a pair: split by its output features (column
// parallel), the second by its input features (row parallel), the partial
// sums reduced once after the pair. Read in program order: a linear fed by a
// column-parallel one is row parallel; one that feeds another linear and is
// fed by none is column parallel; the rest (an output head, a lone
// projection) stays whole. Names are the weights'.
//
//===----------------------------------------------------------------------===//

#include "tdx/IR/TdxOps.h"
#include "tdx/Target/StepMemory.h"
#include "tdx/Transforms/Passes.h"
#include "ReportPass.h"

#include "mlir/Dialect/Func/IR/FuncOps.h"
#include "llvm/Support/JSON.h"
#include "llvm/Support/ToolOutputFile.h"

#include <set>

namespace mlir::tdx {
#define GEN_PASS_DEF_LINEARPAIRS
#include "tdx/Transforms/Passes.h.inc"
} // namespace mlir::tdx

using namespace mlir;
using namespace mlir::tdx;

namespace {

/// The parameter `v` reads (through a cast), or null.
ParamRefOp parameterOf(Value v) {
  Operation *def = v.getDefiningOp();
  if (def && isa<CastOp>(def))
    def = def->getOperand(0).getDefiningOp();
  return dyn_cast_or_null<ParamRefOp>(def);
}

/// The 2-D weight a linear layer multiplies its input by: tdx.linear's, a
/// tdx.matmul's transposed parameter (nn.Linear without bias, as PyTorch's
/// decomposition records it), or a tdx.matmul's parameter itself, stored
/// (in, out) (Hugging Face's Conv1D, an addmm; `inOut` set).
ParamRefOp weightOf(Operation *op, bool *inOut = nullptr) {
  ParamRefOp w;
  bool transposedStore = false;
  if (auto linear = dyn_cast<LinearOp>(op)) {
    w = parameterOf(linear->getOperand(1));
  } else if (auto matmul = dyn_cast<MatmulOp>(op)) {
    if (auto t = matmul->getOperand(1).getDefiningOp<TransposeOp>()) {
      w = parameterOf(t->getOperand(0));
    } else {
      auto lhs = dyn_cast<RankedTensorType>(matmul->getOperand(0).getType());
      w = lhs && lhs.getRank() == 2 ? parameterOf(matmul->getOperand(1)) : ParamRefOp();
      transposedStore = true;
    }
  }
  auto type = w ? dyn_cast<RankedTensorType>(w.getType()) : RankedTensorType();
  if (!type || type.getRank() != 2)
    return ParamRefOp();
  if (inOut)
    *inOut = transposedStore;
  return w;
}

struct LinearPairsPass : public mlir::tdx::impl::LinearPairsBase<LinearPairsPass> {
  using LinearPairsBase::LinearPairsBase;

  void runOnOperation() override {
    ModuleOp module = getOperation();
    func::FuncOp fn = stepWithBody(module, getArgument(), "read");
    if (!fn)
      return signalPassFailure();
    std::unique_ptr<llvm::ToolOutputFile> file = openReport(module, getArgument(), outputFile);
    if (!file)
      return signalPassFailure();
    Block &block = fn.getBody().front();
    // The forward: what the first result (a step's loss) is computed from;
    // a backward's matmuls by a transposed weight are not linear layers.
    DenseSet<Operation *> forward;
    SmallVector<Operation *> work;
    Operation *ret = block.getTerminator();
    if (ret->getNumOperands())
      if (Operation *def = ret->getOperand(0).getDefiningOp())
        work.push_back(def);
    while (!work.empty()) {
      Operation *op = work.pop_back_val();
      if (op->getBlock() != &block || !forward.insert(op).second)
        continue;
      for (Value v : op->getOperands())
        if (Operation *def = v.getDefiningOp())
          work.push_back(def);
    }
    SmallVector<Operation *> linears;
    for (Operation &op : block)
      if (forward.contains(&op) && weightOf(&op))
        linears.push_back(&op);
    DenseSet<Operation *> isLinear(linears.begin(), linears.end());
    // Which linears each one's output reaches as their input, through no
    // other linear.
    DenseMap<Operation *, SmallVector<Operation *>> feeds, fedBy;
    for (Operation *from : linears) {
      DenseSet<Operation *> seen;
      SmallVector<Value> frontier(from->getResults());
      while (!frontier.empty()) {
        Value v = frontier.pop_back_val();
        for (OpOperand &use : v.getUses()) {
          Operation *user = use.getOwner();
          if (!forward.contains(user) || !seen.insert(user).second)
            continue;
          if (isLinear.contains(user)) {
            if (use.getOperandNumber() == 0) {
              feeds[from].push_back(user);
              fedBy[user].push_back(from);
            }
            continue;
          }
          frontier.append(user->result_begin(), user->result_end());
        }
      }
    }
    enum Kind { None, Column, Row };
    DenseMap<Operation *, Kind> kind;
    llvm::json::Array column, row, inOutNames;
    std::set<std::string> columnNames, rowNames, inOut;
    for (Operation *op : linears) {
      Kind k = None;
      if (llvm::any_of(fedBy[op], [&](Operation *p) { return kind[p] == Column; }))
        k = Row;
      else if (!feeds[op].empty())
        k = Column;
      kind[op] = k;
      bool stored = false;
      std::string name = weightOf(op, &stored).getStateName().str();
      if (stored && k != None)
        inOut.insert(name);
      if (k == Column)
        columnNames.insert(name);
      else if (k == Row)
        rowNames.insert(name);
    }
    // The norm each column-parallel layer reads its input from: the op
    // that makes the input (through views and casts) and reads a 1-D
    // parameter (LayerNorm's weight, RMSNorm's scale): what sequence
    // parallelism keeps split between the pairs.
    std::set<std::string> normNames;
    for (Operation *op : linears) {
      if (kind[op] != Column)
        continue;
      Value in = op->getOperand(0);
      Operation *def = in.getDefiningOp();
      while (def && isa<ReshapeOp, CastOp>(def))
        def = def->getOperand(0).getDefiningOp();
      if (!def || !forward.contains(def))
        continue;
      for (Value v : def->getOperands())
        if (ParamRefOp p = parameterOf(v)) {
          auto type = dyn_cast<RankedTensorType>(p.getType());
          if (type && type.getRank() == 1)
            normNames.insert(p.getStateName().str());
        }
    }
    llvm::json::Array norms;
    for (const std::string &name : normNames)
      norms.push_back(name);
    // A weight read by layers of both kinds (shared) stays whole.
    for (const std::string &name : columnNames)
      if (!rowNames.count(name))
        column.push_back(name);
    for (const std::string &name : rowNames)
      if (!columnNames.count(name))
        row.push_back(name);
    for (const std::string &name : inOut)
      inOutNames.push_back(name);
    file->os() << llvm::json::Value(llvm::json::Object{{"column", std::move(column)},
                                                       {"row", std::move(row)},
                                                       {"norm", std::move(norms)},
                                                       {"in_out", std::move(inOutNames)}})
               << "\n";
    file->keep();
    markAllAnalysesPreserved();
  }
};

} // namespace
