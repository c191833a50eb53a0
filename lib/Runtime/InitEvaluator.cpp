//===- InitEvaluator.cpp - one rank's shard of a parameter's init ---------===//

#include "tdx/Runtime/InitEvaluator.h"
#include "tdx/Runtime/Philox.h"

#include "mlir/Dialect/Arith/IR/Arith.h"
#include "llvm/ADT/TypeSwitch.h"

#include <cstring>

using namespace mlir;
using namespace mlir::tdx;

int64_t ShardBox::numElements() const {
  int64_t n = 1;
  for (int64_t s : size)
    n *= s;
  return n;
}

ShardBox mlir::tdx::shardBox(RankedTensorType global, ArrayRef<PlacementAttr> layout,
                             ArrayRef<int64_t> meshShape, ArrayRef<int64_t> coords) {
  ShardBox box;
  for (int64_t d = 0; d < global.getRank(); ++d) {
    int64_t start = 0, size = global.getDimSize(d);
    for (auto [axis, p] : llvm::enumerate(layout)) {
      if (!p.isShard() || p.getDim() != d)
        continue;
      int64_t k = meshShape[axis];
      int64_t chunk = (size + k - 1) / k;
      int64_t begin = std::min(size, coords[axis] * chunk);
      start += begin;
      size = std::min(chunk, size - begin);
    }
    box.offset.push_back(start);
    box.size.push_back(size);
  }
  return box;
}

namespace {

/// Rounds a value to what an element of `type` can hold.
double roundTo(Type type, double v) {
  if (type.isF32())
    return static_cast<double>(static_cast<float>(v));
  if (type.isF64())
    return v;
  if (auto it = dyn_cast<IntegerType>(type)) {
    if (it.getWidth() == 1)
      return v != 0.0 ? 1.0 : 0.0;
    return std::trunc(v);
  }
  return v;
}

int64_t linearIndex(ArrayRef<int64_t> index, ArrayRef<int64_t> shape) {
  int64_t i = 0;
  for (auto [x, n] : llvm::zip(index, shape))
    i = i * n + x;
  return i;
}

class Evaluator {
public:
  explicit Evaluator(Operation *decl) : decl(decl) {}

  /// The value of `v` at global multi-index `index` (of v's shape).
  FailureOr<double> at(Value v, ArrayRef<int64_t> index) {
    Operation *op = v.getDefiningOp();
    if (!op)
      return fail(decl, "reads a block argument");
    auto type = cast<RankedTensorType>(v.getType());
    Type elem = type.getElementType();
    auto seedOf = [](IntegerAttr a) { return static_cast<uint64_t>(a.getValue().getZExtValue()); };
    uint64_t i = static_cast<uint64_t>(linearIndex(index, type.getShape()));
    auto operandAt = [&](Value operand) -> FailureOr<double> {
      // Broadcasting: align trailing dims; a dim of 1 reads index 0.
      auto ot = cast<RankedTensorType>(operand.getType());
      SmallVector<int64_t> sub;
      int64_t lead = type.getRank() - ot.getRank();
      for (int64_t d = 0; d < ot.getRank(); ++d)
        sub.push_back(ot.getDimSize(d) == 1 ? 0 : index[d + lead]);
      return at(operand, sub);
    };
    auto binary = [&](auto fn) -> FailureOr<double> {
      FailureOr<double> l = operandAt(op->getOperand(0)), r = operandAt(op->getOperand(1));
      if (failed(l) || failed(r))
        return failure();
      return roundTo(elem, fn(*l, *r));
    };
    auto unary = [&](auto fn) -> FailureOr<double> {
      FailureOr<double> x = at(op->getOperand(0), index);
      if (failed(x))
        return failure();
      return roundTo(elem, fn(*x));
    };
    return llvm::TypeSwitch<Operation *, FailureOr<double>>(op)
        .Case([&](EmptyOp) -> FailureOr<double> { return 0.0; })
        .Case([&](FullOp o) -> FailureOr<double> {
          return roundTo(elem, o.getValue().convertToDouble());
        })
        .Case([&](ArangeOp o) -> FailureOr<double> {
          return roundTo(elem, o.getStart().convertToDouble() +
                                   static_cast<double>(index[0]) * o.getStep().convertToDouble());
        })
        .Case([&](UniformOp o) -> FailureOr<double> {
          double lo = o.getLow().convertToDouble(), hi = o.getHigh().convertToDouble();
          return roundTo(elem, lo + (hi - lo) * ::tdx::rng::uniform01(seedOf(o.getSeedAttr()),
                                                               seedOf(o.getStreamAttr()), i));
        })
        .Case([&](NormalOp o) -> FailureOr<double> {
          return roundTo(elem, o.getMean().convertToDouble() +
                                   o.getStd().convertToDouble() *
                                       ::tdx::rng::standardNormal(seedOf(o.getSeedAttr()),
                                                           seedOf(o.getStreamAttr()), i));
        })
        .Case([&](TruncNormalOp o) -> FailureOr<double> {
          return roundTo(elem, ::tdx::rng::truncNormal(seedOf(o.getSeedAttr()), seedOf(o.getStreamAttr()), i,
                                                o.getMean().convertToDouble(),
                                                o.getStd().convertToDouble(),
                                                o.getA().convertToDouble(),
                                                o.getB().convertToDouble()));
        })
        .Case([&](CastOp) { return unary([](double x) { return x; }); })
        .Case([&](NegOp) { return unary([](double x) { return -x; }); })
        .Case([&](AbsOp) { return unary([](double x) { return std::fabs(x); }); })
        .Case([&](ReluOp) { return unary([](double x) { return x > 0 ? x : 0.0; }); })
        .Case([&](ExpOp) { return unary([](double x) { return std::exp(x); }); })
        .Case([&](LogOp) { return unary([](double x) { return std::log(x); }); })
        .Case([&](SqrtOp) { return unary([](double x) { return std::sqrt(x); }); })
        .Case([&](RsqrtOp) { return unary([](double x) { return 1.0 / std::sqrt(x); }); })
        .Case([&](TanhOp) { return unary([](double x) { return std::tanh(x); }); })
        .Case([&](SinOp) { return unary([](double x) { return std::sin(x); }); })
        .Case([&](CosOp) { return unary([](double x) { return std::cos(x); }); })
        .Case([&](AddOp) { return binary([](double a, double b) { return a + b; }); })
        .Case([&](SubOp) { return binary([](double a, double b) { return a - b; }); })
        .Case([&](MulOp) { return binary([](double a, double b) { return a * b; }); })
        .Case([&](DivOp) { return binary([](double a, double b) { return a / b; }); })
        .Case([&](MaximumOp) { return binary([](double a, double b) { return a > b ? a : b; }); })
        .Case([&](MinimumOp) { return binary([](double a, double b) { return a < b ? a : b; }); })
        .Case([&](PowOp) { return binary([](double a, double b) { return std::pow(a, b); }); })
        .Case([&](arith::ConstantOp o) -> FailureOr<double> {
          auto dense = dyn_cast<DenseElementsAttr>(o.getValue());
          if (!dense)
            return fail(op, "is not a dense constant");
          int64_t k = dense.isSplat() ? 0 : static_cast<int64_t>(i);
          if (isa<FloatType>(dense.getElementType()))
            return (*(dense.getValues<APFloat>().begin() + k)).convertToDouble();
          return static_cast<double>((*(dense.getValues<APInt>().begin() + k)).getSExtValue());
        })
        .Default([&](Operation *other) -> FailureOr<double> {
          return fail(other, "is not pointwise in the global index, so it cannot be "
                             "initialized shard by shard yet; materialize this parameter "
                             "through ATen (tdx.materialize_module)");
        });
  }

private:
  Operation *decl;

  FailureOr<double> fail(Operation *op, StringRef why) {
    op->emitOpError() << why;
    return failure();
  }
};

} // namespace

FailureOr<std::vector<uint8_t>> mlir::tdx::evaluateInitShard(Operation *decl,
                                                             const ShardBox &box) {
  if (decl->getNumRegions() != 1 || decl->getRegion(0).empty())
    return decl->emitOpError("has no init program to evaluate (a tied name takes its "
                             "value from the one it is tied to)");
  auto yield = cast<YieldOp>(decl->getRegion(0).front().getTerminator());
  Value value = yield.getValues().front();
  auto type = cast<RankedTensorType>(value.getType());
  Type elem = type.getElementType();
  int64_t width = elem.isInteger(1) ? 1 : elem.getIntOrFloatBitWidth() / 8;
  if (!(elem.isF32() || elem.isF64() || elem.isInteger(64) || elem.isInteger(32) ||
        elem.isInteger(1)))
    return decl->emitOpError() << "has element type " << elem
                               << "; sharded init supports f32, f64, i64, i32 and i1";
  std::vector<uint8_t> bytes(static_cast<size_t>(box.numElements() * width));
  Evaluator eval(decl);
  SmallVector<int64_t> local(box.size.size(), 0), global(box.size.size());
  for (int64_t n = 0; n < box.numElements(); ++n) {
    for (size_t d = 0; d < local.size(); ++d)
      global[d] = box.offset[d] + local[d];
    FailureOr<double> v = eval.at(value, global);
    if (failed(v))
      return failure();
    uint8_t *out = bytes.data() + n * width;
    if (elem.isF32()) {
      float f = static_cast<float>(*v);
      std::memcpy(out, &f, 4);
    } else if (elem.isF64()) {
      std::memcpy(out, &*v, 8);
    } else if (elem.isInteger(64)) {
      int64_t x = static_cast<int64_t>(*v);
      std::memcpy(out, &x, 8);
    } else if (elem.isInteger(32)) {
      int32_t x = static_cast<int32_t>(*v);
      std::memcpy(out, &x, 4);
    } else {
      *out = *v != 0.0;
    }
    // Next local index, row-major.
    for (int64_t d = static_cast<int64_t>(local.size()) - 1; d >= 0; --d) {
      if (++local[d] < box.size[d])
        break;
      local[d] = 0;
    }
  }
  return bytes;
}
