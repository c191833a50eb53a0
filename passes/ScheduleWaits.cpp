//===- ScheduleWaits.cpp - work after the last start, in the order it waits ===//

#include "tdx/IR/TdxOps.h"
#include "tdx/Transforms/Passes.h"

#include "mlir/Dialect/Func/IR/FuncOps.h"
#include "mlir/IR/SymbolTable.h"
#include "llvm/ADT/STLExtras.h"

#include <algorithm>
#include <climits>

namespace mlir::tdx {
#define GEN_PASS_DEF_SCHEDULEWAITS
#include "tdx/Transforms/Passes.h.inc"
} // namespace mlir::tdx

using namespace mlir;
using namespace mlir::tdx;

namespace {

struct ScheduleWaitsPass : public mlir::tdx::impl::ScheduleWaitsBase<ScheduleWaitsPass> {
  using ScheduleWaitsBase::ScheduleWaitsBase;

  void runOnOperation() override {
    getOperation().walk([&](func::FuncOp fn) {
      if (!fn.getBody().hasOneBlock())
        return;
      Block &body = fn.getBody().front();
      DenseMap<Operation *, int64_t> pos;
      Operation *lastStart = nullptr;
      for (Operation &op : body) {
        pos[&op] = static_cast<int64_t>(pos.size());
        if (isAsyncReduction(&op))
          lastStart = &op;
      }
      if (!lastStart)
        return;
      SmallVector<Operation *> tail;
      for (Operation *op = lastStart->getNextNode(); op && op != body.getTerminator();
           op = op->getNextNode())
        tail.push_back(op);
      DenseSet<Operation *> inTail(tail.begin(), tail.end());

      // Edges between tail ops: SSA uses (also from nested regions), plus
      // program order between the param_refs and assigns of one state and
      // among generic ops (whose effects tdx does not see).
      DenseMap<Operation *, SmallVector<Operation *>> deps, users;
      auto edge = [&](Operation *from, Operation *to) {
        deps[to].push_back(from);
        users[from].push_back(to);
      };
      DenseMap<StringAttr, Operation *> lastOfState;
      Operation *lastGeneric = nullptr;
      for (Operation *op : tail) {
        op->walk([&](Operation *inner) {
          for (Value v : inner->getOperands())
            if (Operation *d = v.getDefiningOp(); d && d->getBlock() == &body &&
                                                  (inTail.contains(d) || isAsyncReduction(d)))
              edge(d, op);
        });
        StringAttr state;
        if (auto access = dyn_cast<StateAccessOpInterface>(op))
          state = access.getStateName();
        if (state) {
          if (Operation *prev = lastOfState.lookup(state))
            edge(prev, op);
          lastOfState[state] = op;
        }
        if (isa<AtenOp>(op)) {
          if (lastGeneric)
            edge(lastGeneric, op);
          lastGeneric = op;
        }
      }

      // An op's key: the latest start among the collectives it waits for,
      // through the tail; an op that waits for none goes with the first op
      // that needs it (or last, if none does).
      DenseMap<Operation *, int64_t> key;
      for (Operation *op : tail) {
        int64_t k = -1;
        for (Operation *d : deps[op])
          k = std::max(k, isAsyncReduction(d) && !inTail.contains(d) ? pos[d] : key.lookup(d));
        key[op] = k;
      }
      for (Operation *op : llvm::reverse(tail)) {
        if (key[op] >= 0)
          continue;
        int64_t k = LLONG_MAX;
        for (Operation *u : users[op])
          k = std::min(k, key[u]);
        key[op] = k;
      }
      SmallVector<Operation *> order(tail);
      std::stable_sort(order.begin(), order.end(),
                       [&](Operation *a, Operation *b) { return key[a] < key[b]; });
      for (Operation *op : order)
        op->moveBefore(body.getTerminator());
    });
  }
};

} // namespace
