//===- WidenReductions.cpp - collectives sum in the reduce type ----------===//

#include "tdx/IR/TdxOps.h"
#include "tdx/Transforms/Passes.h"

#include "mlir/AsmParser/AsmParser.h"
#include "mlir/IR/Builders.h"

namespace mlir::tdx {
#define GEN_PASS_DEF_WIDENREDUCTIONS
#include "tdx/Transforms/Passes.h.inc"
} // namespace mlir::tdx

using namespace mlir;
using namespace mlir::tdx;

static RankedTensorType tensorType(Value v) { return cast<RankedTensorType>(v.getType()); }

namespace {

struct WidenReductionsPass
    : public mlir::tdx::impl::WidenReductionsBase<WidenReductionsPass> {
  using WidenReductionsBase::WidenReductionsBase;

  void runOnOperation() override {
    ModuleOp module = getOperation();
    FloatType wide;
    if (!reduceType.empty()) {
      Type t = parseType(reduceType, module.getContext());
      wide = dyn_cast_or_null<FloatType>(t);
      if (!wide || wide.getWidth() < 32) {
        module.emitError() << "tdx-widen-reductions: reduce-type '" << reduceType
                           << "' is not a float type of 32 bits or more; give f32 or f64";
        return signalPassFailure();
      }
    } else if (auto attr = module->getAttrOfType<TypeAttr>(TdxDialect::kReduceTypeAttrName)) {
      wide = dyn_cast<FloatType>(attr.getValue()); // the dialect verified it
    }
    if (!wide)
      return;
    SmallVector<Operation *> narrow;
    module.walk([&](Operation *op) {
      if (!isa<AllReduceOp, ReduceScatterOp>(op))
        return;
      auto elem = dyn_cast<FloatType>(tensorType(op->getOperand(0)).getElementType());
      if (elem && elem.getWidth() < wide.getWidth())
        narrow.push_back(op);
    });
    for (Operation *op : narrow) {
      OpBuilder b(op);
      Value input = op->getOperand(0);
      auto inType = tensorType(input);
      auto outType = tensorType(op->getResult(0));
      Value up = CastOp::create(b, op->getLoc(), inType.clone(wide), input);
      if (Operation *def = input.getDefiningOp())
        if (auto shardings = def->getAttrOfType<ArrayAttr>(TdxDialect::kShardingsAttrName))
          up.getDefiningOp()->setAttr(
              TdxDialect::kShardingsAttrName,
              b.getArrayAttr({shardings[cast<OpResult>(input).getResultNumber()]}));
      op->setOperand(0, up);
      op->getResult(0).setType(outType.clone(wide));
      b.setInsertionPointAfter(op);
      auto down = CastOp::create(b, op->getLoc(), outType, op->getResult(0));
      op->getResult(0).replaceAllUsesExcept(down, down);
      if (auto shardings = op->getAttrOfType<ArrayAttr>(TdxDialect::kShardingsAttrName))
        down->setAttr(TdxDialect::kShardingsAttrName, shardings);
      // A sum cast back up (a bf16 gradient going to its fp32 parameter)
      // reads the wide sum itself, not its rounding.
      for (Operation *user : llvm::make_early_inc_range(down->getUsers()))
        if (auto up = dyn_cast<CastOp>(user); up && up.getType() == op->getResult(0).getType()) {
          up.getResult().replaceAllUsesWith(op->getResult(0));
          up->erase();
        }
      if (down->use_empty())
        down->erase();
      if (auto bytes = op->getAttrOfType<IntegerAttr>(TdxDialect::kPayloadBytesAttrName))
        op->setAttr(TdxDialect::kPayloadBytesAttrName,
                    b.getI64IntegerAttr(bytes.getInt() / elementBytes(inType.getElementType()) *
                                        elementBytes(wide)));
    }
  }
};

} // namespace
