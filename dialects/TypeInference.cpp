//===- TypeInference.cpp - PyTorch shape rules shared by tdx ops ----------===//

#include "tdx/IR/TypeInference.h"

#include "mlir/Dialect/Traits.h"
#include "mlir/IR/Diagnostics.h"
#include "llvm/ADT/SmallSet.h"

using namespace mlir;

std::string mlir::tdx::formatNumber(double value) {
  char buf[32];
  std::snprintf(buf, sizeof(buf), "%g", value);
  return buf;
}

std::optional<int64_t> mlir::tdx::normalizeDim(int64_t dim, int64_t rank) {
  int64_t d = dim < 0 ? dim + rank : dim;
  if (d < 0 || d >= rank)
    return std::nullopt;
  return d;
}

LogicalResult mlir::tdx::inferBroadcastResult(
    std::optional<Location> loc, StringRef opName, TypeRange operandTypes,
    Type resultElementType, SmallVectorImpl<Type> &inferred,
    bool firstIsCondition) {
  SmallVector<int64_t> shape;
  Type elementType;
  for (auto [i, type] : llvm::enumerate(operandTypes)) {
    auto ranked = dyn_cast<RankedTensorType>(type);
    if (!ranked)
      return emitOptionalError(loc, "'", opName, "' op operand #", i,
                               " must be a ranked tensor, got ", type);
    bool isCondition = firstIsCondition && i == 0;
    if (!isCondition) {
      if (!elementType)
        elementType = ranked.getElementType();
      else if (elementType != ranked.getElementType())
        return emitOptionalError(
            loc, "'", opName, "' op operand #", i, " has element type ",
            ranked.getElementType(), " but an earlier operand has ",
            elementType, "; insert a 'tdx.cast' so both have one dtype");
    }
    SmallVector<int64_t> next;
    if (i == 0) {
      shape.assign(ranked.getShape().begin(), ranked.getShape().end());
      continue;
    }
    if (!OpTrait::util::getBroadcastedShape(shape, ranked.getShape(), next)) {
      std::string lhs, rhs;
      llvm::raw_string_ostream l(lhs), r(rhs);
      llvm::interleave(shape, l, "x");
      llvm::interleave(ranked.getShape(), r, "x");
      return emitOptionalError(
          loc, "'", opName, "' op operand shapes [", lhs, "] and [", rhs,
          "] do not broadcast: trailing dims must be equal or 1");
    }
    shape = std::move(next);
  }
  inferred.push_back(RankedTensorType::get(
      shape, resultElementType ? resultElementType : elementType));
  return success();
}

LogicalResult mlir::tdx::inferReduceResult(
    std::optional<Location> loc, StringRef opName, Type inputType,
    std::optional<ArrayRef<int64_t>> dims, bool keepdim,
    SmallVectorImpl<Type> &inferred) {
  auto ranked = dyn_cast<RankedTensorType>(inputType);
  if (!ranked)
    return emitOptionalError(loc, "'", opName,
                             "' op input must be a ranked tensor");
  int64_t rank = ranked.getRank();
  llvm::SmallSet<int64_t, 4> reduced;
  if (!dims || dims->empty()) {
    for (int64_t d = 0; d < rank; ++d)
      reduced.insert(d);
  } else {
    for (int64_t dim : *dims) {
      std::optional<int64_t> d = normalizeDim(dim, rank);
      if (!d)
        return emitOptionalError(loc, "'", opName, "' op reduction dim ", dim,
                                 " is out of range for a tensor of rank ",
                                 rank, "; valid dims are ", -rank, " to ",
                                 rank - 1);
      if (!reduced.insert(*d).second)
        return emitOptionalError(loc, "'", opName, "' op reduction dim ", dim,
                                 " appears more than once in dims");
    }
  }
  SmallVector<int64_t> shape;
  for (int64_t d = 0; d < rank; ++d) {
    if (!reduced.contains(d))
      shape.push_back(ranked.getDimSize(d));
    else if (keepdim)
      shape.push_back(1);
  }
  inferred.push_back(RankedTensorType::get(shape, ranked.getElementType()));
  return success();
}
