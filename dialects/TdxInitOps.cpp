//===- TdxInitOps.cpp - tensor creation and random init -------------------===//

#include "tdx/IR/TdxOps.h"

#include <cmath>

using namespace mlir;
using namespace mlir::tdx;

static std::string num(double v) { return formatNumber(v); }

/// A partitioned creation op's `global_shape` holds its (local) result.
static LogicalResult verifyGlobalShape(Operation *op, std::optional<ArrayRef<int64_t>> global) {
  if (!global)
    return success();
  auto type = cast<RankedTensorType>(op->getResult(0).getType());
  if (static_cast<int64_t>(global->size()) != type.getRank())
    return op->emitOpError() << "global_shape has " << global->size()
                             << " dims but the result has rank " << type.getRank();
  for (auto [d, g] : llvm::enumerate(*global))
    if (g < 0 || (!type.isDynamicDim(d) && type.getDimSize(d) > g))
      return op->emitOpError() << "result dim " << d << " of size " << type.getDimSize(d)
                               << " is not a part of global size " << g;
  return success();
}

LogicalResult FullOp::verify() {
  if (failed(verifyGlobalShape(*this, getGlobalShape())))
    return failure();
  double v = getValue().convertToDouble();
  Type et = getType().getElementType();
  if (auto it = dyn_cast<IntegerType>(et)) {
    if (!std::isfinite(v) || std::trunc(v) != v)
      return emitOpError() << "fills an integer tensor with " << num(v)
                           << "; the value must be integral";
    if (it.getWidth() == 1 && v != 0.0 && v != 1.0)
      return emitOpError() << "fills a boolean tensor with " << num(v)
                           << "; the value must be 0 or 1";
  }
  return success();
}

LogicalResult ArangeOp::verify() {
  double start = getStart().convertToDouble();
  double end = getEnd().convertToDouble();
  double step = getStep().convertToDouble();
  if (step == 0.0 || !std::isfinite(step))
    return emitOpError("step must be finite and non-zero");
  if ((step > 0 && end < start) || (step < 0 && end > start))
    return emitOpError() << "range [" << num(start) << ", " << num(end) << ") with step "
                         << num(step) << " runs the wrong way";
  RankedTensorType type = getType();
  if (type.getRank() != 1)
    return emitOpError() << "result must be 1-D, got " << type;
  double exact = std::ceil((end - start) / step);
  if (!(exact < 9.0e18))
    return emitOpError() << "range [" << num(start) << ", " << num(end)
                         << ") with step " << num(step)
                         << " has too many elements to index";
  auto count = static_cast<int64_t>(exact);
  if (!type.isDynamicDim(0) && type.getDimSize(0) != count)
    return emitOpError() << "produces " << count
                         << " elements (ceil((end - start) / step)) but the "
                            "result type "
                         << type << " has " << type.getDimSize(0);
  return success();
}

LogicalResult EmptyOp::verify() { return verifyGlobalShape(*this, getGlobalShape()); }

LogicalResult UniformOp::verify() {
  if (failed(verifyGlobalShape(*this, getGlobalShape())))
    return failure();
  double low = getLow().convertToDouble(), high = getHigh().convertToDouble();
  if (!(low <= high) || !std::isfinite(low) || !std::isfinite(high))
    return emitOpError() << "needs finite low <= high, got [" << num(low) << ", "
                         << num(high) << ")";
  return success();
}

LogicalResult NormalOp::verify() {
  if (failed(verifyGlobalShape(*this, getGlobalShape())))
    return failure();
  double std = getStd().convertToDouble();
  if (!(std >= 0) || !std::isfinite(std) ||
      !std::isfinite(getMean().convertToDouble()))
    return emitOpError() << "needs a finite mean and a finite std >= 0, got std "
                         << num(std);
  return success();
}

LogicalResult TruncNormalOp::verify() {
  if (failed(verifyGlobalShape(*this, getGlobalShape())))
    return failure();
  double std = getStd().convertToDouble();
  double a = getA().convertToDouble(), b = getB().convertToDouble();
  if (!(std >= 0) || !std::isfinite(std))
    return emitOpError() << "needs a finite std >= 0, got " << num(std);
  if (!(a < b))
    return emitOpError() << "needs truncation bounds a < b, got [" << num(a) << ", "
                         << num(b) << "]";
  return success();
}

LogicalResult BernoulliOp::verify() {
  if (failed(verifyGlobalShape(*this, getGlobalShape())))
    return failure();
  double p = getP().convertToDouble();
  if (!(p >= 0.0 && p <= 1.0))
    return emitOpError() << "needs a probability p in [0, 1], got " << num(p);
  return success();
}
