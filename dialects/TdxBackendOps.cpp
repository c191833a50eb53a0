//===- TdxBackendOps.cpp - fused kernels, started collectives -------------===//
//
// What may form a kernel (the fusability predicates the fusion pass, the
// verifier of tdx.fused and the emitters share), and the verifiers of
// tdx.fused, tdx.start and tdx.wait.
//
//===----------------------------------------------------------------------===//

#include "tdx/IR/TdxOps.h"
#include "tdx/Runtime/Rows.h"

#include "mlir/Dialect/Arith/IR/Arith.h"

using namespace mlir;
using namespace mlir::tdx;

namespace {
RankedTensorType tensorType(Value v) { return dyn_cast<RankedTensorType>(v.getType()); }
bool isFloatType(Type t) { return t.isF32() || t.isF64(); }
} // namespace

std::optional<double> mlir::tdx::splatValue(Value v) {
  Operation *def = v.getDefiningOp();
  if (auto c = dyn_cast_or_null<CastOp>(def))
    return splatValue(c.getInput());
  if (auto full = dyn_cast_or_null<FullOp>(def))
    return full.getValue().convertToDouble();
  if (auto c = dyn_cast_or_null<arith::ConstantOp>(def)) {
    auto dense = dyn_cast<DenseElementsAttr>(c.getValue());
    if (!dense || !dense.isSplat())
      return std::nullopt;
    if (isa<FloatType>(dense.getElementType()))
      return dense.getSplatValue<APFloat>().convertToDouble();
    if (dense.getElementType().isInteger(1))
      return dense.getSplatValue<bool>() ? 1.0 : 0.0;
    if (dense.getElementType().isIntOrIndex())
      return static_cast<double>(dense.getSplatValue<APInt>().getSExtValue());
  }
  return std::nullopt;
}

std::string mlir::tdx::cType(Type t) {
#define TDX_DTYPE(Name, stored, bytes, aten, ctype, mlir, ir, runs)                                  \
  if (mlir)                                                                                \
    return ctype;
#include "tdx/StateFormat/DTypes.def"
  return "";
}

bool mlir::tdx::isElementwise(Operation *op) {
  return op->hasTrait<OpTrait::TdxTableElementwise>() || isa<CmpOp, WhereOp, GeluOp, CastOp>(op);
}

bool mlir::tdx::isFusable(Operation *op) {
  if (!isElementwise(op))
    return false;
  auto result = tensorType(op->getResult(0));
  if (!result || result.getRank() > ::tdx::kern::kMaxRank ||
      cType(result.getElementType()).empty())
    return false;
  for (Value v : op->getOperands()) {
    auto t = tensorType(v);
    if (!t || cType(t.getElementType()).empty())
      return false;
  }
  // Integer division and powers follow torch's type promotion, not C's.
  if (isa<DivOp, PowOp>(op) && !isa<FloatType>(result.getElementType()))
    return false;
  return true;
}

bool mlir::tdx::isRowOp(Operation *op) {
  if (!isa<SoftmaxOp, LogSoftmaxOp, LayerNormOp, RmsNormOp>(op))
    return false;
  auto type = tensorType(op->getOperand(0));
  if (!type || type.getRank() < 1 || type.getRank() > ::tdx::kern::kMaxRank ||
      !isFloatType(type.getElementType()) || op->getResult(0).getType() != type ||
      op->getResult(0).use_empty())
    return false;
  int64_t rank = type.getRank();
  // Over the last dim only; a norm's weight and bias are of that dim.
  if (auto s = dyn_cast<SoftmaxOp>(op))
    return static_cast<int64_t>(s.getDim()) == rank - 1 || static_cast<int64_t>(s.getDim()) == -1;
  if (auto s = dyn_cast<LogSoftmaxOp>(op))
    return static_cast<int64_t>(s.getDim()) == rank - 1 || static_cast<int64_t>(s.getDim()) == -1;
  ArrayRef<int64_t> normalized = isa<LayerNormOp>(op) ? cast<LayerNormOp>(op).getNormalizedShape()
                                                      : cast<RmsNormOp>(op).getNormalizedShape();
  if (normalized.size() != 1)
    return false;
  for (Value v : op->getOperands().drop_front()) {
    auto t = tensorType(v);
    if (!t || t.getRank() != 1 || t.getElementType() != type.getElementType() || splatValue(v))
      return false;
  }
  return true;
}

//===----------------------------------------------------------------------===//
// tdx.fused
//===----------------------------------------------------------------------===//

Operation *FusedOp::getRowOp() {
  Operation *yield = getBody().front().getTerminator();
  Operation *last = yield ? yield->getPrevNode() : nullptr;
  return last && isRowOp(last) ? last : nullptr;
}

LogicalResult FusedOp::verifyRegions() {
  Block &body = getBody().front();
  if (body.getNumArguments() != getInputs().size())
    return emitOpError() << "has " << getInputs().size() << " inputs but its body takes "
                         << body.getNumArguments() << " arguments";
  for (auto [i, arg, input] : llvm::enumerate(body.getArguments(), getInputs()))
    if (arg.getType() != input.getType())
      return emitOpError() << "body argument #" << i << " is " << arg.getType()
                           << " but input #" << i << " is " << input.getType();
  if (getResults().empty())
    return emitOpError("makes no results; a kernel nothing reads is dead code, erase it");
  if (static_cast<int64_t>(getInputs().size() + getResults().size()) > ::tdx::kern::kMaxOperands)
    return emitOpError() << "has " << getInputs().size() + getResults().size()
                         << " inputs and results; a kernel launch takes at most "
                         << ::tdx::kern::kMaxOperands;
  auto yield = dyn_cast<YieldOp>(body.getTerminator());
  if (!yield)
    return emitOpError("body must end in tdx.yield");
  if (yield.getValues().getTypes() != getResultTypes())
    return emitOpError("yields types other than its results'");
  RankedTensorType space = getSpace();
  for (Type t : getResultTypes())
    if (cast<RankedTensorType>(t).getShape() != space.getShape())
      return emitOpError("results of different shapes; every result has the iteration shape");
  for (Operation &op : body.without_terminator()) {
    if (op.getNumResults() == 1 && splatValue(op.getResult(0)) &&
        (op.getNumOperands() == 0 || isa<CastOp>(op)))
      continue; // a splat constant, written into the kernel as a literal
    bool row = isRowOp(&op) && op.getNextNode() == yield;
    if (!isFusable(&op) && !row)
      return op.emitOpError("cannot run in a fused kernel: a kernel holds elementwise ops on C "
                            "types, splat constants and one row op over the last dim at its end");
    if (cast<RankedTensorType>(op.getResult(0).getType()).getShape() != space.getShape())
      return op.emitOpError() << "has result type " << op.getResult(0).getType()
                              << " but the kernel iterates over " << space;
  }
  return success();
}

//===----------------------------------------------------------------------===//
// tdx.start and tdx.wait
//===----------------------------------------------------------------------===//

WaitOp StartOp::getWait() {
  for (Operation *user : getToken().getUsers())
    if (auto wait = dyn_cast<WaitOp>(user))
      return wait;
  return {};
}

LogicalResult StartOp::verifyRegions() {
  Block &body = getBody().front();
  auto yield = dyn_cast<YieldOp>(body.getTerminator());
  if (!yield || body.getOperations().size() != 2 || !isAsyncCollective(&body.front()))
    return emitOpError("body must be one asynchronous collective (all_gather, all_reduce, "
                       "reduce_scatter) and the tdx.yield of its result");
  if (yield.getValues().size() != 1 || yield.getValues()[0] != body.front().getResult(0))
    return emitOpError("must yield the result of its collective");
  size_t waits = std::distance(getToken().getUsers().begin(), getToken().getUsers().end());
  if (waits != 1)
    return emitOpError() << "token is waited for " << waits
                         << " times; each started collective is waited for exactly once";
  return success();
}

LogicalResult WaitOp::verify() {
  auto start = getToken().getDefiningOp<StartOp>();
  if (!start)
    return emitOpError("waits for a token that no tdx.start makes");
  if (start->getBlock() != (*this)->getBlock() || !start->isBeforeInBlock(*this))
    return emitOpError("must follow its tdx.start in the same block");
  Type started = start.getCollective()->getResult(0).getType();
  if (getResult().getType() != started)
    return emitOpError() << "result type " << getResult().getType()
                         << " is not the started collective's " << started;
  return success();
}
