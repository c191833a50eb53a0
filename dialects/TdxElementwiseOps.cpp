//===- TdxElementwiseOps.cpp - compare, where, cast, unary ----------------===//

#include "tdx/Dialect/TdxOps.h"

using namespace mlir;
using namespace mlir::tdx;

LogicalResult CmpOp::inferReturnTypes(MLIRContext *context,
                                      std::optional<Location> loc,
                                      ValueRange operands, DictionaryAttr,
                                      OpaqueProperties, RegionRange,
                                      SmallVectorImpl<Type> &inferred) {
  return inferBroadcastResult(loc, getOperationName(), operands.getTypes(),
                              IntegerType::get(context, 1), inferred);
}

LogicalResult WhereOp::inferReturnTypes(MLIRContext *, std::optional<Location> loc,
                                        ValueRange operands, DictionaryAttr,
                                        OpaqueProperties, RegionRange,
                                        SmallVectorImpl<Type> &inferred) {
  return inferBroadcastResult(loc, getOperationName(), operands.getTypes(),
                              /*resultElementType=*/nullptr, inferred,
                              /*firstIsCondition=*/true);
}

LogicalResult CastOp::verify() {
  auto in = cast<RankedTensorType>(getInput().getType());
  auto out = cast<RankedTensorType>(getType());
  if (in.getShape() != out.getShape())
    return emitOpError() << "changes the shape from " << in << " to " << out
                         << "; a cast only changes the element type (use "
                            "'tdx.reshape' for the shape)";
  return success();
}

LogicalResult DropoutOp::verify() {
  double p = getP().convertToDouble();
  if (!(p >= 0.0 && p < 1.0))
    return emitOpError() << "drop probability p = " << formatNumber(p)
                         << " must be in [0, 1); p = 1 zeroes everything: use "
                            "'tdx.full 0.0' instead";
  return success();
}

LogicalResult CmpOp::verify() { return verifyInferredType(*this); }
LogicalResult WhereOp::verify() { return verifyInferredType(*this); }
