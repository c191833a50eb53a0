//===- PrefetchAllGathers.cpp - parameters gathered ahead of their use ----===//

#include "tdx/IR/TdxOps.h"
#include "tdx/Transforms/Passes.h"

#include "mlir/Dialect/Func/IR/FuncOps.h"

namespace mlir::tdx {
#define GEN_PASS_DEF_PREFETCHALLGATHERS
#include "tdx/Transforms/Passes.h.inc"
} // namespace mlir::tdx

using namespace mlir;
using namespace mlir::tdx;

namespace {

/// The first op that reads `v` (all in one block), or null.
Operation *firstReader(Value v) {
  Operation *first = nullptr;
  for (Operation *user : v.getUsers())
    if (!first || user->isBeforeInBlock(first))
      first = user;
  return first;
}

/// Whether `ref` may read its state right after `after` instead of where it
/// stands: no write of the state lies in between.
bool canReadEarlier(ParamRefOp ref, Operation *after) {
  for (Operation *op = after->getNextNode(); op && op != ref; op = op->getNextNode())
    if (auto assign = dyn_cast<AssignOp>(op); assign && assign.getNameAttr() == ref.getNameAttr())
      return false;
  return true;
}

struct PrefetchAllGathersPass
    : public mlir::tdx::impl::PrefetchAllGathersBase<PrefetchAllGathersPass> {
  using PrefetchAllGathersBase::PrefetchAllGathersBase;

  void runOnOperation() override {
    if (ahead == 0)
      return;
    getOperation().walk([&](func::FuncOp fn) {
      if (!fn.getBody().hasOneBlock())
        return;
      SmallVector<AllGatherOp> gathers;
      for (Operation &op : fn.getBody().front())
        if (auto g = dyn_cast<AllGatherOp>(op))
          gathers.push_back(g);
      // The first readers, before anything moves: readers never move.
      SmallVector<Operation *> readers;
      for (AllGatherOp g : gathers)
        readers.push_back(firstReader(g.getResult()));
      for (size_t k = ahead; k < gathers.size(); ++k) {
        AllGatherOp g = gathers[k];
        auto ref = g.getInput().getDefiningOp<ParamRefOp>();
        Operation *after = readers[k - ahead];
        if (!ref || ref->getBlock() != g->getBlock() || !after ||
            after->getBlock() != g->getBlock() || !after->isBeforeInBlock(g))
          continue;
        if (after->isBeforeInBlock(ref)) {
          if (!canReadEarlier(ref, after))
            continue;
          ref->moveAfter(after);
          g->moveAfter(ref);
        } else {
          g->moveAfter(after);
        }
      }
    });
  }
};

} // namespace
