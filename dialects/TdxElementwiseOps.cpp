//===- TdxElementwiseOps.cpp - compare, where, cast, unary ----------------===//

#include "tdx/IR/TdxOps.h"

using namespace mlir;
using namespace mlir::tdx;

LogicalResult CmpOp::inferReturnTypes(MLIRContext *context, std::optional<Location> loc,
                                      Adaptor adaptor, SmallVectorImpl<Type> &inferred) {
  return inferBroadcastResult(loc, getOperationName(), adaptor.getOperands().getTypes(),
                              IntegerType::get(context, 1), inferred);
}

LogicalResult WhereOp::inferReturnTypes(MLIRContext *, std::optional<Location> loc,
                                        Adaptor adaptor, SmallVectorImpl<Type> &inferred) {
  return inferBroadcastResult(loc, getOperationName(), adaptor.getOperands().getTypes(),
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
