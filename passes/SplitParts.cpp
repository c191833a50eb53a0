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
      DenseMap<Type, size_t> typeHash;
      // Where a part ends is decided by the ops themselves (their kinds and
      // types, not their names or places): after an op whose hash is 0
      // modulo half the target size, once half of it has run, or at twice
      // the target. A layer repeated then ends its parts at the same ops in
      // every repetition, so its parts repeat and share one function
      // (shareParts); the parts average about ops-per-part ops.
      int64_t half = std::max<int64_t>(1, opsPerPart / 2);
      int64_t part = 0, ran = 0;
      bool cut = false;
      for (Operation &op : fn.getBody().front()) {
        // A wait goes with the op after it, which reads its result; a state
        // write with the op before it, which makes its value; the return
        // ends the last part.
        if (cut && !isa<AssignOp>(op) && !op.hasTrait<OpTrait::IsTerminator>()) {
          ++part;
          ran = 0;
          cut = false;
        }
        op.setAttr(TdxDialect::kPartAttrName, b.getI64IntegerAttr(part));
        if (isa<WaitOp, AssignOp>(op))
          continue;
        ++ran;
        // Of the types' text, not their addresses: the same cuts every run.
        llvm::hash_code h = llvm::hash_value(op.getName().getStringRef());
        for (TypeRange types : {TypeRange(op.getResultTypes()), TypeRange(op.getOperandTypes())})
          for (Type t : types) {
            auto [it, fresh] = typeHash.try_emplace(t);
            if (fresh) {
              std::string text;
              llvm::raw_string_ostream(text) << t;
              it->second = llvm::hash_value(text);
            }
            h = llvm::hash_combine(h, it->second);
          }
        if ((ran >= half && static_cast<size_t>(h) % half == 0) || ran >= 2 * opsPerPart)
          cut = true;
      }
    });
  }
};

} // namespace
