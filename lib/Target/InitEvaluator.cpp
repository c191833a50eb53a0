//===- InitEvaluator.cpp - one rank's shard of a parameter's init ---------===//

#include "tdx/Target/InitEvaluator.h"
#include "tdx/StateFormat/Box.h"

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
      auto [begin, end] = ::tdx::rt::chunkRange(size, meshShape[axis], coords[axis]);
      start += begin;
      size = end - begin;
    }
    box.offset.push_back(start);
    box.size.push_back(size);
  }
  return box;
}

namespace {

using ::tdx::rt::DType;
using ::tdx::rt::InitProgram;

/// The dtype of `t` where init programs make it.
std::optional<DType> dtypeOf(Type t) {
#define TDX_DTYPE(Name, stored, bytes, aten, ctype, mlir, ir, runs)                                  \
  if ((mlir) && runs && ::tdx::rt::initProgramsMake(DType::Name))                                  \
    return DType::Name;
#include "tdx/StateFormat/DTypes.def"
  return std::nullopt;
}

class ProgramBuilder {
public:
  InitProgram program;

  /// The node of `v`, adding it (and its operands) first.
  FailureOr<int> node(Value v) {
    if (auto it = nodes.find(v); it != nodes.end())
      return it->second;
    Operation *op = v.getDefiningOp();
    if (!op)
      return emitError(v.getLoc(), "an init program reads a block argument"), failure();
    auto type = cast<RankedTensorType>(v.getType());
    std::optional<DType> dtype = dtypeOf(type.getElementType());
    if (!dtype)
      return op->emitOpError() << "makes " << type.getElementType()
                               << " elements; init programs make f32, f64, i64, i32 and i1",
             failure();
    InitProgram::Node n;
    n.dtype = *dtype;
    n.shape.assign(type.getShape().begin(), type.getShape().end());
    auto seedOf = [](IntegerAttr a) { return static_cast<uint64_t>(a.getValue().getZExtValue()); };
    // A random op partitioned in a function keeps its global shape.
    auto random = [&](auto o) -> LogicalResult {
      n.seed = seedOf(o.getSeedAttr());
      n.stream = seedOf(o.getStreamAttr());
      if (std::optional<ArrayRef<int64_t>> global = o.getGlobalShape())
        n.shape.assign(global->begin(), global->end());
      return success();
    };
    auto unary = [&](InitProgram::Kind k) -> LogicalResult {
      FailureOr<int> a = node(op->getOperand(0));
      n.kind = k;
      n.a = failed(a) ? -1 : *a;
      return a;
    };
    auto binary = [&](InitProgram::Kind k) -> LogicalResult {
      FailureOr<int> a = node(op->getOperand(0)), b = node(op->getOperand(1));
      n.kind = k;
      n.a = failed(a) ? -1 : *a;
      n.b = failed(b) ? -1 : *b;
      return success(succeeded(a) && succeeded(b));
    };
    LogicalResult built =
        llvm::TypeSwitch<Operation *, LogicalResult>(op)
            .Case([&](EmptyOp) { n.kind = InitProgram::Empty; return success(); })
            .Case([&](FullOp o) {
              n.kind = InitProgram::Full;
              n.p[0] = o.getValue().convertToDouble();
              return success();
            })
            .Case([&](ArangeOp o) {
              n.kind = InitProgram::Arange;
              n.p[0] = o.getStart().convertToDouble();
              n.p[1] = o.getStep().convertToDouble();
              return success();
            })
            .Case([&](UniformOp o) {
              n.kind = InitProgram::Uniform;
              n.p[0] = o.getLow().convertToDouble();
              n.p[1] = o.getHigh().convertToDouble();
              return random(o);
            })
            .Case([&](NormalOp o) {
              n.kind = InitProgram::Normal;
              n.p[0] = o.getMean().convertToDouble();
              n.p[1] = o.getStd().convertToDouble();
              return random(o);
            })
            .Case([&](TruncNormalOp o) {
              n.kind = InitProgram::TruncNormal;
              n.p[0] = o.getMean().convertToDouble();
              n.p[1] = o.getStd().convertToDouble();
              n.p[2] = o.getA().convertToDouble();
              n.p[3] = o.getB().convertToDouble();
              return random(o);
            })
            .Case([&](BernoulliOp o) {
              n.kind = InitProgram::Bernoulli;
              n.p[0] = o.getP().convertToDouble();
              return random(o);
            })
            .Case([&](arith::ConstantOp o) -> LogicalResult {
              auto dense = dyn_cast<DenseElementsAttr>(o.getValue());
              if (!dense)
                return o.emitOpError("is not a dense constant");
              n.kind = InitProgram::Constant;
              if (isa<FloatType>(dense.getElementType()))
                for (const APFloat &x : dense.isSplat()
                                            ? SmallVector<APFloat>{dense.getSplatValue<APFloat>()}
                                            : SmallVector<APFloat>(dense.getValues<APFloat>()))
                  n.values.push_back(x.convertToDouble());
              else
                for (const APInt &x : dense.isSplat()
                                          ? SmallVector<APInt>{dense.getSplatValue<APInt>()}
                                          : SmallVector<APInt>(dense.getValues<APInt>()))
                  n.values.push_back(static_cast<double>(
                      dense.getElementType().isInteger(1) ? x.getZExtValue() : x.getSExtValue()));
              return success();
            })
            .Case([&](CastOp) { return unary(InitProgram::Cast); })
            .Case([&](CmpOp o) {
              n.p[0] = static_cast<double>(o.getPredicate());
              return binary(InitProgram::Cmp);
            })
            .Case([&](WhereOp o) -> LogicalResult {
              FailureOr<int> c = node(o->getOperand(2));
              if (failed(binary(InitProgram::Where)) || failed(c))
                return failure();
              n.c = *c;
              return success();
            })
            .Case([&](ReshapeOp) { return unary(InitProgram::Reshape); })
            .Case([&](ExpandOp) { return unary(InitProgram::Expand); })
#define TDX_UNARY(Name, fn, aten, linear, ...) .Case([&](Name##Op) { return unary(InitProgram::Name); })
#define TDX_BINARY(Name, fn, aten, ...) .Case([&](Name##Op) { return binary(InitProgram::Name); })
#include "tdx/Runtime/ElementwiseOps.def"
            .Default([&](Operation *other) {
              return other->emitOpError()
                     << "is not pointwise in the global index, so it cannot be initialized "
                        "shard by shard yet; pass the weights with --params (or materialize "
                        "this parameter through ATen with tdx.materialize_module)";
            });
    if (failed(built))
      return failure();
    if (llvm::any_of(n.shape, ShapedType::isDynamic) || n.shape.size() > 8)
      return op->emitOpError("init programs need static shapes of rank <= 8"), failure();
    program.nodes.push_back(std::move(n));
    return nodes[v] = static_cast<int>(program.nodes.size()) - 1;
  }

private:
  DenseMap<Value, int> nodes;
};

} // namespace

FailureOr<InitProgram> mlir::tdx::buildInitProgram(Operation *decl) {
  if (decl->getNumRegions() != 1 || decl->getRegion(0).empty())
    return decl->emitOpError("has no init program to evaluate (a tied name takes its "
                             "value from the one it is tied to)");
  auto yield = cast<YieldOp>(decl->getRegion(0).front().getTerminator());
  ProgramBuilder b;
  // Operands are added before their users: the result is the last node.
  if (failed(b.node(yield.getValues().front())))
    return failure();
  return std::move(b.program);
}

FailureOr<InitProgram> mlir::tdx::buildValueProgram(Value value) {
  ProgramBuilder b;
  if (failed(b.node(value)))
    return failure();
  return std::move(b.program);
}

FailureOr<std::vector<uint8_t>> mlir::tdx::evaluateInitShard(Operation *decl,
                                                             const ShardBox &box) {
  FailureOr<InitProgram> program = buildInitProgram(decl);
  if (failed(program))
    return failure();
  int64_t item = ::tdx::rt::dtypeSize(program->result().dtype);
  std::vector<uint8_t> bytes(static_cast<size_t>(box.numElements() * item));
  program->fillBox(std::vector<int64_t>(box.offset.begin(), box.offset.end()),
                   std::vector<int64_t>(box.size.begin(), box.size.end()), bytes.data());
  return bytes;
}
