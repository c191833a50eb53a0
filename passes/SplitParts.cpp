//===- SplitParts.cpp - the step's ops numbered by the part they run in ---===//

#include "tdx/IR/TdxOps.h"
#include "tdx/Transforms/Passes.h"

#include "mlir/Dialect/Func/IR/FuncOps.h"
#include "mlir/IR/Builders.h"

namespace mlir::tdx {
#define GEN_PASS_DEF_SPLITPARTS
#include "tdx/Transforms/Passes.h.inc"
} // namespace mlir::tdx

using namespace mlir;
using namespace mlir::tdx;

namespace {

struct SplitPartsPass : public mlir::tdx::impl::SplitPartsBase<SplitPartsPass> {
  using SplitPartsBase::SplitPartsBase;

  void runOnOperation() override {
    if (opsPerPart < 1) {
      getOperation().emitError() << "tdx-split-parts: ops-per-part must be positive, got "
                                 << static_cast<int64_t>(opsPerPart);
      return signalPassFailure();
    }
    getOperation().walk([&](func::FuncOp fn) {
      if (!fn.getBody().hasOneBlock())
        return;
      Builder b(fn.getContext());
      int64_t part = 0, ran = 0;
      for (Operation &op : fn.getBody().front()) {
        // A part ends after opsPerPart ops that run (a wait goes with the op
        // after it, which reads its result; a state write with the op
        // before it, which makes its value); the return ends the last part.
        if (ran == opsPerPart && !isa<AssignOp>(op) && !op.hasTrait<OpTrait::IsTerminator>()) {
          ++part;
          ran = 0;
        }
        op.setAttr(TdxDialect::kPartAttrName, b.getI64IntegerAttr(part));
        if (!isa<WaitOp, AssignOp>(op))
          ++ran;
      }
    });
  }
};

} // namespace
