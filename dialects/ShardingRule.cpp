//===- ShardingRule.cpp - factor mappings: common code --------------------===//

#include "tdx/IR/ShardingRule.h"
#include "tdx/IR/TdxOps.h"

using namespace mlir;
using namespace mlir::tdx;

#include "tdx/IR/TdxInterfaces.cpp.inc"

int64_t ShardingRule::dimOfFactor(const TensorFactors &factors, int64_t factor) {
  for (auto [d, fs] : llvm::enumerate(factors))
    if (!fs.empty() && fs.front() == factor)
      return d;
  return -1;
}

static TensorFactors ownReplicatedFactors(ShardingRule &rule, Type type) {
  TensorFactors dims;
  if (auto t = dyn_cast<RankedTensorType>(type))
    for (int64_t size : t.getShape())
      dims.push_back({rule.addFactor(size, FactorKind::Replicated)});
  return dims;
}

ShardingRule ShardingRule::replicated(Operation *op) {
  ShardingRule rule;
  for (Type t : op->getOperandTypes()) {
    rule.operands.push_back(ownReplicatedFactors(rule, t));
    rule.addedAfterReduction.push_back(false);
  }
  for (Type t : op->getResultTypes())
    rule.results.push_back(ownReplicatedFactors(rule, t));
  return rule;
}

TensorFactors ShardingRule::broadcastFactors(RankedTensorType operand, RankedTensorType result,
                                             const TensorFactors &resultDims) {
  TensorFactors dims;
  for (int64_t d = 0; d < operand.getRank(); ++d) {
    int64_t r = d + result.getRank() - operand.getRank();
    if (operand.getDimSize(d) == 1 && result.getDimSize(r) != 1)
      dims.push_back({});
    else
      dims.push_back(resultDims[r]);
  }
  return dims;
}

/// Elementwise with numpy broadcasting: one factor per result dim; an operand
/// dim of size 1 that is broadcast has no factor.
ShardingRule ShardingRule::broadcast(Operation *op) {
  ShardingRule rule;
  auto result = cast<RankedTensorType>(op->getResult(0).getType());
  TensorFactors resultDims;
  for (int64_t size : result.getShape())
    resultDims.push_back({rule.addFactor(size)});
  for (Value operand : op->getOperands()) {
    rule.operands.push_back(
        broadcastFactors(cast<RankedTensorType>(operand.getType()), result, resultDims));
    rule.addedAfterReduction.push_back(false);
  }
  rule.results.push_back(resultDims);
  return rule;
}

ShardingRule mlir::tdx::getShardingRuleOrReplicated(Operation *op) {
  if (auto iface = dyn_cast<ShardingRuleOpInterface>(op))
    return iface.getShardingRule();
  return ShardingRule::replicated(op);
}

static std::string factorName(int64_t f) {
  // i, j, k, l, m, n, o, p, ... then f26, f27, ...
  static const char *names = "ijklmnopqrstuvwxyzabcdefgh";
  if (f < 26)
    return std::string(1, names[f]);
  return "f" + std::to_string(f);
}

void ShardingRule::print(llvm::raw_ostream &os) const {
  auto printTensors = [&](ArrayRef<TensorFactors> tensors) {
    os << "(";
    llvm::interleaveComma(tensors, os, [&](const TensorFactors &dims) {
      os << "[";
      llvm::interleaveComma(dims, os, [&](const DimFactors &fs) {
        if (fs.empty()) {
          os << "1";
          return;
        }
        llvm::interleave(
            fs, os, [&](int64_t f) { os << factorName(f); }, "");
      });
      os << "]";
    });
    os << ")";
  };
  printTensors(operands);
  os << " -> ";
  printTensors(results);
  os << " {";
  for (int64_t f = 0; f < numFactors(); ++f)
    os << (f ? ", " : "") << factorName(f) << "=" << factorSizes[f];
  os << "}";
  auto printKind = [&](FactorKind kind, StringRef label) {
    SmallVector<std::string> names;
    for (int64_t f = 0; f < numFactors(); ++f)
      if (factorKinds[f] == kind)
        names.push_back(factorName(f));
    if (names.empty())
      return;
    os << " " << label << "={";
    llvm::interleaveComma(names, os);
    os << "}";
  };
  printKind(FactorKind::Reduction, "reduction");
  if (llvm::is_contained(factorKinds, FactorKind::Reduction))
    os << " partial=" << stringifyReduceKind(reduction);
  printKind(FactorKind::Replicated, "replicated");
}
