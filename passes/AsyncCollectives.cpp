//===- AsyncCollectives.cpp - start/wait pairs for async collectives ------===//

#include "tdx/IR/TdxOps.h"
#include "tdx/Transforms/Passes.h"

#include "mlir/Dialect/Func/IR/FuncOps.h"
#include "mlir/IR/Builders.h"

namespace mlir::tdx {
#define GEN_PASS_DEF_ASYNCCOLLECTIVES
#include "tdx/Transforms/Passes.h.inc"
} // namespace mlir::tdx

using namespace mlir;
using namespace mlir::tdx;

namespace {

struct AsyncCollectivesPass : public mlir::tdx::impl::AsyncCollectivesBase<AsyncCollectivesPass> {
  void runOnOperation() override {
    getOperation().walk([&](func::FuncOp fn) {
      if (!fn.getBody().hasOneBlock())
        return;
      Block &block = fn.getBody().front();
      // Collectives started and not yet waited for, in the order they start.
      SmallVector<std::pair<StartOp, Value>> inFlight;
      auto wait = [&](size_t i, Operation *before) {
        auto [start, result] = inFlight[i];
        OpBuilder b(before);
        auto w = WaitOp::create(b, result.getLoc(), result.getType(), start.getToken());
        result.replaceAllUsesExcept(w.getResult(), start.getBody().front().getTerminator());
        inFlight.erase(inFlight.begin() + i);
      };
      for (Operation &op : llvm::make_early_inc_range(block)) {
        // The results op reads (in its nested regions too), in operand order.
        SmallVector<Value> reads;
        op.walk([&](Operation *inner) { reads.append(inner->operand_begin(), inner->operand_end()); });
        for (Value v : reads)
          for (size_t i = 0; i < inFlight.size(); ++i)
            if (inFlight[i].second == v) {
              wait(i, &op);
              break;
            }
        if (isa<func::ReturnOp>(op))
          while (!inFlight.empty())
            wait(0, &op);
        if (!isAsyncCollective(&op))
          continue;
        OpBuilder b(&op);
        auto start = StartOp::create(b, op.getLoc(), TokenType::get(op.getContext()));
        Block *body = b.createBlock(&start.getBody());
        op.moveBefore(body, body->end());
        b.setInsertionPointToEnd(body);
        YieldOp::create(b, op.getLoc(), op.getResult(0));
        inFlight.push_back({start, op.getResult(0)});
      }
    });
  }
};

} // namespace
