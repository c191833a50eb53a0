//===- HoistCollectives.cpp - reductions started where their input is made ===//

#include "tdx/IR/TdxOps.h"
#include "tdx/Transforms/Passes.h"

#include "mlir/Dialect/Func/IR/FuncOps.h"
#include "llvm/ADT/STLExtras.h"

namespace mlir::tdx {
#define GEN_PASS_DEF_HOISTCOLLECTIVES
#include "tdx/Transforms/Passes.h.inc"
} // namespace mlir::tdx

using namespace mlir;
using namespace mlir::tdx;

namespace {

struct HoistCollectivesPass
    : public mlir::tdx::impl::HoistCollectivesBase<HoistCollectivesPass> {
  using HoistCollectivesBase::HoistCollectivesBase;

  void runOnOperation() override {
    getOperation().walk([&](func::FuncOp fn) {
      if (fn.getBody().empty())
        return;
      Block &body = fn.getBody().front();
      SmallVector<Operation *> reductions;
      for (Operation &op : body)
        if (isAsyncReduction(&op))
          reductions.push_back(&op);
      // Where the next op hoisted to each root goes after (the root's
      // definition, then the last one moved there), so that what meets
      // there keeps its program order; arguments' share the top.
      DenseMap<Value, Operation *> last;
      Operation *top = nullptr;
      for (Operation *op : reductions) {
        // The views (reshape, transpose) that only reshape the input for
        // this reduction move with it: autograd leaves a gradient's view
        // (a bias gradient's reshape) where the optimizer reads it.
        SmallVector<Operation *> views;
        Value root = op->getOperand(0);
        while (Operation *def = root.getDefiningOp()) {
          if (!isa<ReshapeOp, TransposeOp>(def) || !def->hasOneUse() || def->getBlock() != &body)
            break;
          views.push_back(def);
          root = def->getOperand(0);
        }
        Operation *def = root.getDefiningOp();
        if (def ? def->getBlock() != &body : cast<BlockArgument>(root).getOwner() != &body)
          continue; // made in a nested region: stays where it is
        Operation *after = def ? last.lookup(root) : top;
        if (def && !after)
          after = def;
        for (Operation *moved : llvm::reverse(views)) {
          after ? moved->moveAfter(after) : moved->moveBefore(&body, body.begin());
          after = moved;
        }
        after ? op->moveAfter(after) : op->moveBefore(&body, body.begin());
        (def ? last[root] : top) = op;
      }
    });
  }
};

} // namespace
