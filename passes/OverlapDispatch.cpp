//===- OverlapDispatch.cpp - work that hides a ragged all-to-all ----------===//

#include "tdx/IR/TdxOps.h"
#include "tdx/Transforms/Passes.h"

#include "mlir/Dialect/Func/IR/FuncOps.h"
#include "mlir/Interfaces/SideEffectInterfaces.h"

namespace mlir::tdx {
#define GEN_PASS_DEF_OVERLAPDISPATCH
#include "tdx/Transforms/Passes.h.inc"
} // namespace mlir::tdx

using namespace mlir;
using namespace mlir::tdx;

namespace {

/// Whether `op` may run earlier than it stands: compute with no effect
/// (kernels included) that draws no number from torch's generator.
/// Collectives, their starts and waits, state writes and the return stay.
bool movable(Operation *op) {
  if (isa<StartOp, WaitOp, func::ReturnOp>(op) || op->hasTrait<OpTrait::TdxCollective>())
    return false;
  if (auto aten = dyn_cast<AtenOp>(op))
    return !aten.isRandom() && isMemoryEffectFree(op);
  return isa<FusedOp>(op) || isMemoryEffectFree(op);
}

struct OverlapDispatchPass : public mlir::tdx::impl::OverlapDispatchBase<OverlapDispatchPass> {
  void runOnOperation() override {
    getOperation().walk([&](func::FuncOp fn) {
      if (!fn.getBody().hasOneBlock())
        return;
      SmallVector<WaitOp> waits;
      for (Operation &op : fn.getBody().front())
        if (auto wait = dyn_cast<WaitOp>(op))
          if (auto start = wait.getToken().getDefiningOp<StartOp>())
            if (isa<RaggedAllToAllOp>(start.getCollective()))
              waits.push_back(wait);
      for (WaitOp wait : waits) {
        // The ops after the wait up to the first that must stay: those
        // that need the wait's result (through others) stay after it, the
        // rest run before it, in their order, while the rows move.
        DenseSet<Value> needsWait{wait.getResult()};
        SmallVector<Operation *> before;
        for (Operation *op = wait->getNextNode(); op && movable(op); op = op->getNextNode()) {
          bool needs = false;
          op->walk([&](Operation *inner) {
            for (Value v : inner->getOperands())
              needs |= needsWait.contains(v);
          });
          if (needs)
            needsWait.insert(op->result_begin(), op->result_end());
          else
            before.push_back(op);
        }
        for (Operation *op : before)
          op->moveBefore(wait);
      }
    });
  }
};

} // namespace
