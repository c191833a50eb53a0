//===- Partition.cpp - global program to per-rank program -----------------===//

#include "tdx/IR/ManualRegions.h"
#include "tdx/IR/TdxOps.h"
#include "tdx/Transforms/Passes.h"
#include "tdx/Sharding/Layout.h"

#include "mlir/IR/Builders.h"

namespace mlir::tdx {
#define GEN_PASS_DEF_PARTITION
#include "tdx/Transforms/Passes.h.inc"
} // namespace mlir::tdx

using namespace mlir;
using namespace mlir::tdx;

namespace {

class FunctionPartitioner {
public:
  FunctionPartitioner(func::FuncOp fn, MeshOp mesh)
      : fn(fn), mesh(mesh), meshShape(mesh.getShape()), b(fn.getContext()) {}

  LogicalResult run();

private:
  func::FuncOp fn;
  MeshOp mesh;
  ArrayRef<int64_t> meshShape;
  OpBuilder b;
  SymbolTableCollection symbols;
  /// The global result types of the op being partitioned.
  SmallVector<RankedTensorType> globalResults;
  /// The global type of every value retyped so far.
  DenseMap<Value, RankedTensorType> globalTypes;

  FlatSymbolRefAttr meshRef() {
    return FlatSymbolRefAttr::get(mesh.getSymNameAttr());
  }
  ArrayAttr axisNames(int64_t axis) {
    return b.getArrayAttr({mesh.getAxes()[axis]});
  }
  LogicalResult lowerRedistribute(RedistributeOp op);
  LogicalResult retype(Operation *op);
  /// The layout a value has: its producer's `tdx.shardings`, its
  /// argument's `tdx.sharding`, or replicated.
  Layout layoutOfValue(Value v);
  int64_t globalDimSize(Value v, int64_t dim);
  friend class Context;
};

/// What an op's `partition` method sees of the partitioner.
class Context final : public PartitionContext {
public:
  explicit Context(FunctionPartitioner &p) : p(p) {}
  OpBuilder &builder() override { return p.b; }
  Operation *mesh() override { return p.mesh; }
  ArrayRef<int64_t> meshShape() override { return p.meshShape; }
  SmallVector<PlacementAttr> layoutOf(Value v) override { return p.layoutOfValue(v); }
  int64_t globalDimSize(Value v, int64_t dim) override { return p.globalDimSize(v, dim); }
  RankedTensorType globalResultType(unsigned i) override { return p.globalResults[i]; }
  void replaced(Value from, Value to) override {
    // Erased values leave the map: their storage may be reused.
    if (auto it = p.globalTypes.find(from); it != p.globalTypes.end()) {
      RankedTensorType global = it->second;
      p.globalTypes.erase(it);
      p.globalTypes[to] = global;
    }
  }

private:
  FunctionPartitioner &p;
};

Layout FunctionPartitioner::layoutOfValue(Value v) {
  ShardingAttr sharding = valueSharding(v);
  return sharding ? layoutOf(sharding) : replicatedLayout(fn.getContext(), meshShape.size());
}

int64_t FunctionPartitioner::globalDimSize(Value v, int64_t dim) {
  if (auto it = globalTypes.find(v); it != globalTypes.end() && it->second)
    return it->second.getDimSize(dim);
  // A parameter's declaration keeps its global type.
  if (auto ref = dyn_cast_or_null<ParamRefOp>(v.getDefiningOp()))
    if (StateOpInterface state = ref.getStateOwner(nullptr))
      return state.getStateType().getDimSize(dim);
  // Otherwise from the local size, when the split is even.
  int64_t size = cast<RankedTensorType>(v.getType()).getDimSize(dim);
  if (ShapedType::isDynamic(size))
    return size;
  for (auto [axis, p] : llvm::enumerate(layoutOfValue(v)))
    if (p.isShard() && p.getDim() == dim)
      size *= meshShape[axis];
  return size;
}

LogicalResult FunctionPartitioner::lowerRedistribute(RedistributeOp op) {
  auto global = cast<RankedTensorType>(op.getType());
  Layout from = layoutOf(op.getSource()), to = layoutOf(op.getTarget());
  SmallVector<int64_t> changed;
  for (size_t axis = 0; axis < from.size(); ++axis)
    if (from[axis] != to[axis])
      changed.push_back(axis);
  Value input = op.getInput();
  if (changed.empty()) {
    op.getResult().replaceAllUsesWith(input);
    op.erase();
    return success();
  }
  if (changed.size() > 1)
    return op.emitOpError()
           << "changes " << changed.size()
           << " mesh axes at once; run tdx-insert-collectives first so that "
              "every redistribute is one collective";
  int64_t axis = changed.front();
  PlacementAttr src = from[axis], dst = to[axis];
  auto outType = localType(global, to, meshShape);
  auto inType = cast<RankedTensorType>(input.getType());
  int64_t payload = localBytes(global, from, meshShape);
  b.setInsertionPoint(op);
  Location loc = op.getLoc();
  Value result;
  Operation *collective = nullptr;
  auto coord = [&]() {
    return MeshCoordOp::create(b, loc, RankedTensorType::get({}, b.getI64Type()),
                               meshRef(), cast<StringAttr>(mesh.getAxes()[axis]))
        .getResult();
  };
  // One elementary step of the one planner (tdx-insert-collectives split
  // every redistribution into them).
  SmallVector<AxisStep> steps = axisSteps(src, dst);
  if (steps.size() != 1)
    return op.emitOpError() << "has no single-collective lowering from "
                            << layoutToString(from) << " to " << layoutToString(to)
                            << "; run tdx-insert-collectives first";
  switch (steps.front().kind) {
  case StepKind::AllGather:
    collective = AllGatherOp::create(b, loc, outType, input, meshRef(), axisNames(axis),
                                     b.getI64IntegerAttr(src.getDim()));
    break;
  case StepKind::AllReduce:
    collective = AllReduceOp::create(b, loc, outType, input, meshRef(), axisNames(axis),
                                     ReduceKindAttr::get(b.getContext(), src.getReduce()));
    break;
  case StepKind::ReduceScatter:
    collective = ReduceScatterOp::create(
        b, loc, outType, input, meshRef(), axisNames(axis),
        ReduceKindAttr::get(b.getContext(), src.getReduce()),
        b.getI64IntegerAttr(dst.getDim()));
    break;
  case StepKind::AllToAll:
    collective = AllToAllOp::create(b, loc, outType, input, meshRef(), axisNames(axis),
                                    b.getI64IntegerAttr(dst.getDim()),
                                    b.getI64IntegerAttr(src.getDim()));
    break;
  case StepKind::LocalChunk: {
    // Folds where `input` is an all_gather of this rank's piece (ZeRO-3's
    // update reads the parameter its forward gathers).
    Value index = coord();
    result = b.createOrFold<ChunkOp>(loc, outType, input, index,
                                     b.getI64IntegerAttr(meshShape[axis]),
                                     b.getI64IntegerAttr(dst.getDim()));
    if (index.use_empty())
      index.getDefiningOp()->erase();
    break;
  }
  case StepKind::LocalNoop:
    // max, min or avg of equal values is the value itself.
    result = input;
    break;
  case StepKind::LocalZero: {
    // Coordinate 0 keeps the value, the others hold zeros: their sum is it.
    auto i64 = RankedTensorType::get({}, b.getI64Type());
    auto i1 = RankedTensorType::get({}, b.getI1Type());
    Value zero = FullOp::create(b, loc, i64, b.getF64FloatAttr(0.0));
    Value isFirst = CmpOp::create(b, loc, i1, CmpPredicate::eq, coord(), zero);
    Value zeros = FullOp::create(
        b, loc, RankedTensorType::get({}, inType.getElementType()), b.getF64FloatAttr(0.0));
    result = WhereOp::create(b, loc, inType, isFirst, input, zeros);
    break;
  }
  }
  if (collective) {
    collective->setAttr(::mlir::tdx::TdxDialect::kPayloadBytesAttrName, b.getI64IntegerAttr(payload));
    result = collective->getResult(0);
  }
  if (Operation *def = result.getDefiningOp(); def && def != input.getDefiningOp())
    def->setAttr(::mlir::tdx::TdxDialect::kShardingsAttrName, b.getArrayAttr({op.getTarget()}));
  op.getResult().replaceAllUsesWith(result);
  globalTypes[result] = global;
  op.erase();
  // A gather only this chunk read (folded away) has no reader left.
  if (auto gather = input.getDefiningOp<AllGatherOp>(); gather && gather->use_empty()) {
    globalTypes.erase(gather.getResult());
    gather->erase();
  }
  return success();
}

LogicalResult FunctionPartitioner::retype(Operation *op) {
  if (op->getNumResults() == 0)
    return success();
  globalResults.clear();
  for (Value result : op->getResults()) {
    globalResults.push_back(dyn_cast<RankedTensorType>(result.getType()));
    globalTypes[result] = globalResults.back();
  }
  auto shardings = op->getAttrOfType<ArrayAttr>(::mlir::tdx::TdxDialect::kShardingsAttrName);
  if (!shardings || shardings.size() != op->getNumResults())
    return op->emitOpError() << "has no placement for its results ('tdx.shardings'); "
                                "run tdx-propagate-sharding before tdx-partition";
  for (auto [result, attr] : llvm::zip(op->getResults(), shardings)) {
    auto sharding = dyn_cast<ShardingAttr>(attr);
    auto global = dyn_cast<RankedTensorType>(result.getType());
    if (!sharding || !global)
      return op->emitOpError("has a malformed 'tdx.shardings' attribute");
    if (failed(sharding.verifyFor(op, global, symbols, "result placement")))
      return failure();
    if (sharding.getMesh().getAttr() != mesh.getSymNameAttr())
      return op->emitOpError() << "is placed on mesh " << sharding.getMesh()
                               << " but its function on @" << mesh.getSymName();
    result.setType(localType(global, sharding.getPlacements(), meshShape));
  }
  return success();
}

LogicalResult FunctionPartitioner::run() {
  // The global signature stays on the function for whoever feeds the per-rank
  // program global tensors (the model binaries' driver).
  for (auto [i, t] : llvm::enumerate(fn.getFunctionType().getInputs()))
    fn.setArgAttr(i, ::mlir::tdx::TdxDialect::kGlobalTypeAttrName, TypeAttr::get(t));
  for (auto [i, t] : llvm::enumerate(fn.getFunctionType().getResults()))
    fn.setResultAttr(i, ::mlir::tdx::TdxDialect::kGlobalTypeAttrName, TypeAttr::get(t));
  for (BlockArgument arg : fn.getArguments()) {
    auto global = dyn_cast<RankedTensorType>(arg.getType());
    auto sharding = fn.getArgAttrOfType<ShardingAttr>(arg.getArgNumber(), ::mlir::tdx::TdxDialect::kShardingAttrName);
    if (!global || !sharding)
      continue;
    if (failed(sharding.verifyFor(fn, global, symbols,
                                  "placement of argument #" + std::to_string(arg.getArgNumber()))))
      return failure();
    if (sharding.getMesh().getAttr() != mesh.getSymNameAttr())
      return fn.emitError() << "argument #" << arg.getArgNumber() << " is placed on mesh "
                            << sharding.getMesh() << " but the function on @"
                            << mesh.getSymName();
    globalTypes[arg] = global;
    arg.setType(localType(global, sharding.getPlacements(), meshShape));
  }
  Context context(*this);
  SmallVector<Operation *> ops;
  fn.walk([&](Operation *op) {
    if (op != fn.getOperation())
      ops.push_back(op);
  });
  for (Operation *op : ops) {
    if (auto r = dyn_cast<RedistributeOp>(op)) {
      if (failed(lowerRedistribute(r)))
        return failure();
      continue;
    }
    if (isa<AnnotateOp>(op))
      return op->emitOpError("is still here; run tdx-propagate-sharding before "
                             "tdx-partition");
    if (failed(retype(op)))
      return failure();
    if (auto iface = dyn_cast<ShardingRuleOpInterface>(op))
      if (failed(iface.partition(context)))
        return failure();
  }
  // A manual region is each rank's code already: its entries and exits are
  // the identity on the local pieces, its collectives the dialect's.
  SmallVector<Operation *> edges, calls;
  fn.walk([&](Operation *op) {
    if (isa<ToLocalOp, FromLocalOp>(op))
      edges.push_back(op);
    else if (isUserCollective(op))
      calls.push_back(op);
  });
  for (Operation *op : edges) {
    Value in = op->getOperand(0), out = op->getResult(0);
    if (in.getType() != out.getType())
      return op->emitOpError() << "reads a local " << in.getType() << " but gives "
                               << out.getType() << "; its placement and its operand's differ";
    out.replaceAllUsesWith(in);
    op->erase();
  }
  for (Operation *op : calls)
    if (failed(raiseUserCollective(cast<AtenOp>(op), mesh)))
      return failure();
  auto ret = cast<func::ReturnOp>(fn.getBody().back().getTerminator());
  fn.setType(FunctionType::get(fn.getContext(), fn.getBody().getArgumentTypes(),
                               ret.getOperandTypes()));
  return success();
}

struct PartitionPass : public mlir::tdx::impl::PartitionBase<PartitionPass> {
  void runOnOperation() override {
    ModuleOp module = getOperation();
    if (module->hasAttr(::mlir::tdx::TdxDialect::kPartitionedAttrName)) {
      module.emitError("tdx-partition: the module is already partitioned (its types "
                       "are per-rank); partition the global program once");
      return signalPassFailure();
    }
    for (auto fn : module.getOps<func::FuncOp>()) {
      if (fn.isExternal())
        continue;
      // The mesh: the one the function's placements name.
      ShardingAttr any = firstPlacement(fn);
      if (!any)
        continue;
      MeshOp mesh = lookupMesh(fn, any.getMesh());
      if (!mesh) {
        fn.emitError() << "is placed on mesh " << any.getMesh()
                       << ", which is not a 'tdx.mesh' in scope";
        return signalPassFailure();
      }
      if (failed(FunctionPartitioner(fn, mesh).run()))
        return signalPassFailure();
    }
    module->setAttr(::mlir::tdx::TdxDialect::kPartitionedAttrName, UnitAttr::get(module.getContext()));
  }
};

} // namespace
