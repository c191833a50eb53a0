//===- PrintShardingRules.cpp - report every op's factor mapping ----------===//

#include "tdx/IR/TdxOps.h"
#include "tdx/Transforms/Passes.h"

namespace mlir::tdx {
#define GEN_PASS_DEF_PRINTSHARDINGRULES
#include "tdx/Transforms/Passes.h.inc"
} // namespace mlir::tdx

using namespace mlir;
using namespace mlir::tdx;

namespace {
struct PrintShardingRulesPass
    : public mlir::tdx::impl::PrintShardingRulesBase<PrintShardingRulesPass> {
  void runOnOperation() override {
    getOperation()->walk([](Operation *op) {
      if (op->getNumResults() == 0 && op->getNumOperands() == 0)
        return;
      if (op->hasTrait<OpTrait::IsTerminator>())
        return;
      std::string text;
      llvm::raw_string_ostream os(text);
      getShardingRuleOrReplicated(op).print(os);
      op->emitRemark() << "sharding rule: " << text;
    });
    markAllAnalysesPreserved();
  }
};
} // namespace
