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

int64_t mlir::tdx::floatWidening(Operation *op) {
  auto cast = dyn_cast_or_null<CastOp>(op);
  if (!cast)
    return 0;
  auto from = dyn_cast<FloatType>(getElementTypeOrSelf(cast.getInput().getType()));
  auto to = dyn_cast<FloatType>(getElementTypeOrSelf(cast.getResult().getType()));
  return from && to ? static_cast<int64_t>(to.getWidth()) - from.getWidth() : 0;
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
