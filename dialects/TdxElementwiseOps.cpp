//===- TdxElementwiseOps.cpp - compare, where, cast, unary ----------------===//

#include "tdx/Dialect/TdxOps.h"

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


//===----------------------------------------------------------------------===//
// The elementwise table and ODS agree (tdx/Runtime/ElementwiseOps.def)
//===----------------------------------------------------------------------===//

namespace {
// Every row names an op built on Tdx_UnaryOp / Tdx_BinaryOp ...
#define TDX_UNARY(Name, fn, aten, linear)                                                  \
  static_assert(Name##Op::hasTrait<OpTrait::TdxTableElementwise>(),                        \
                "tdx." #Name " is in ElementwiseOps.def but its ODS def is not a "         \
                "Tdx_UnaryOp");
#define TDX_BINARY(Name, fn, aten)                                                         \
  static_assert(Name##Op::hasTrait<OpTrait::TdxTableElementwise>(),                        \
                "tdx." #Name " is in ElementwiseOps.def but its ODS def is not a "         \
                "Tdx_BinaryOp");
#include "tdx/Runtime/ElementwiseOps.def"

// ... and every such op has a row.
constexpr int kRows = 0
#define TDX_UNARY(Name, fn, aten, linear) +1
#define TDX_BINARY(Name, fn, aten) +1
#include "tdx/Runtime/ElementwiseOps.def"
    ;
template <typename... Ops> constexpr int countTableOps() {
  return (0 + ... + (Ops::template hasTrait<OpTrait::TdxTableElementwise>() ? 1 : 0));
}
static_assert(countTableOps<
#define GET_OP_LIST
#include "tdx/Dialect/TdxOps.cpp.inc"
                  >() == kRows,
              "an op built on Tdx_UnaryOp / Tdx_BinaryOp (dialects/TdxElementwiseOps.td) has "
              "no row in include/tdx/Runtime/ElementwiseOps.def: add one");
} // namespace
