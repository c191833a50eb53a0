//===- RegatherParameters.cpp - ZeRO-3 gathers again where it reads again --===//

#include "tdx/IR/TdxOps.h"
#include "tdx/Transforms/Passes.h"

#include "mlir/Dialect/Func/IR/FuncOps.h"
#include "mlir/IR/Builders.h"
#include "mlir/IR/IRMapping.h"

namespace mlir::tdx {
#define GEN_PASS_DEF_REGATHERPARAMETERS
#include "tdx/Transforms/Passes.h.inc"
} // namespace mlir::tdx

using namespace mlir;
using namespace mlir::tdx;

namespace {

/// The param_ref a gather's input reads: itself, or through the narrowing
/// cast of mixed precision.
ParamRefOp gatheredState(AllGatherOp g) {
  Value in = g.getInput();
  if (floatWidening(in.getDefiningOp()) < 0)
    in = in.getDefiningOp()->getOperand(0);
  return in.getDefiningOp<ParamRefOp>();
}

struct RegatherParametersPass
    : public mlir::tdx::impl::RegatherParametersBase<RegatherParametersPass> {
  using RegatherParametersBase::RegatherParametersBase;

  void runOnOperation() override {
    if (distance <= 0)
      return;
    getOperation().walk([&](func::FuncOp fn) {
      if (!fn.getBody().hasOneBlock())
        return;
      Block &block = fn.getBody().front();
      DenseMap<Operation *, int64_t> position;
      int64_t n = 0;
      for (Operation &op : block)
        position[&op] = n++;
      SmallVector<AllGatherOp> gathers;
      for (Operation &op : block)
        if (auto g = dyn_cast<AllGatherOp>(op); g && gatheredState(g))
          gathers.push_back(g);
      for (AllGatherOp g : gathers) {
        ParamRefOp ref = gatheredState(g);
        // The readers in program order; one that comes `distance` ops after
        // the reader before it reads a gather of its own, made there.
        SmallVector<Operation *> readers;
        for (Operation *user : g.getResult().getUsers())
          if (user->getBlock() == &block)
            readers.push_back(user);
        llvm::sort(readers, [&](Operation *a, Operation *b) { return position[a] < position[b]; });
        readers.erase(std::unique(readers.begin(), readers.end()), readers.end());
        for (size_t i = 1; i < readers.size(); ++i) {
          Operation *reader = readers[i];
          if (position[reader] - position[readers[i - 1]] < distance)
            continue;
          // The state must not be written between its read and this reader.
          bool written = false;
          for (Operation *op = ref->getNextNode(); op && op != reader; op = op->getNextNode())
            if (auto a = dyn_cast<AssignOp>(op); a && a.getNameAttr() == ref.getNameAttr())
              written = true;
          if (written)
            break;
          IRMapping map;
          OpBuilder b(reader);
          b.clone(*ref, map);
          if (Operation *cast = g.getInput().getDefiningOp(); floatWidening(cast) < 0)
            b.clone(*cast, map);
          Value again = b.clone(*g, map)->getResult(0);
          // This reader and the later ones read the new gather.
          for (size_t j = i; j < readers.size(); ++j)
            readers[j]->replaceUsesOfWith(g.getResult(), again);
          break; // one gather again per parameter: the backward's
        }
      }
    });
  }
};

} // namespace
