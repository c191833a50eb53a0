//===- PlanMemory.cpp - arena offsets and state writes into the IR --------===//

#include "tdx/IR/TdxOps.h"
#include "tdx/Transforms/Passes.h"
#include "tdx/Target/Lifetimes.h"

#include "mlir/Dialect/Func/IR/FuncOps.h"
#include "mlir/IR/Builders.h"

namespace mlir::tdx {
#define GEN_PASS_DEF_PLANMEMORY
#include "tdx/Transforms/Passes.h.inc"
} // namespace mlir::tdx

using namespace mlir;
using namespace mlir::tdx;

namespace {

struct PlanMemoryPass : public mlir::tdx::impl::PlanMemoryBase<PlanMemoryPass> {
  void runOnOperation() override {
    getOperation().walk([&](func::FuncOp fn) {
      if (!fn.getBody().hasOneBlock())
        return;
      Block &block = fn.getBody().front();
      // The plan of a step planned before is planned anew.
      for (Operation &op : block)
        op.removeAttr(TdxDialect::kArenaAttrName);
      Lifetimes lifetimes(block);
      Builder b(fn.getContext());
      SmallVector<Operation *> ops;
      for (Operation &op : block)
        ops.push_back(&op);
      for (Operation *op : ops) {
        if (ArrayRef<int64_t> offsets = lifetimes.offsetsAt(op); !offsets.empty())
          op->setAttr(TdxDialect::kArenaAttrName, b.getDenseI64ArrayAttr(offsets));
        Operation *after = op;
        for (AssignOp write : lifetimes.writesAt(op)) {
          write->moveAfter(after);
          after = write;
        }
      }
      for (AssignOp write : lifetimes.writesAtReturn())
        write->moveBefore(block.getTerminator());
      fn->setAttr(TdxDialect::kArenaBytesAttrName, b.getI64IntegerAttr(lifetimes.arenaBytes()));
      fn->setAttr(TdxDialect::kStepBytesAttrName, b.getI64IntegerAttr(lifetimes.peakBytes()));
    });
  }
};

} // namespace
