//===- PartitionRules.cpp - ops with a per-rank rewrite of their own ------===//
//
// The `partition` methods of ShardingRuleOpInterface, for the ops whose
// per-rank computation is not the global one on local operands:
//   - an embedding whose table is split by rows, and a cross-entropy whose
//     classes are split, over one mesh axis: a masked local lookup and a
//     log-sum-exp whose max and sum cross the axis. Both leave a Partial sum,
//     which tdx-insert-collectives turned into one all_reduce where a
//     replicated value is needed.
//   - reshape and expand, whose size attributes spell out global sizes.
//   - the random ops, which keep their global shape to draw this rank's box.
// Every other op keeps the interface's default (nothing to rewrite).
//
//===----------------------------------------------------------------------===//

#include "tdx/IR/TdxOps.h"

using namespace mlir;
using namespace mlir::tdx;

namespace {

/// Small helpers that infer result types as the ops do.
struct Emitter {
  OpBuilder &b;
  Location loc;

  RankedTensorType scalar(Type elem) { return RankedTensorType::get({}, elem); }
  Value full(double v, RankedTensorType t) { return FullOp::create(b, loc, t, b.getF64FloatAttr(v)); }

  template <typename Op>
  Value binary(Value l, Value r) {
    SmallVector<Type> types;
    if (failed(Op::inferReturnTypes(b.getContext(), loc, ValueRange{l, r}, DictionaryAttr(),
                                    OpaqueProperties(nullptr), RegionRange(), types)))
      return {};
    return Op::create(b, loc, types[0], l, r);
  }
  Value cmp(CmpPredicate p, Value l, Value r) {
    SmallVector<Type> types;
    if (failed(CmpOp::inferReturnTypes(b.getContext(), loc, ValueRange{l, r}, DictionaryAttr(),
                                       OpaqueProperties(nullptr), RegionRange(), types)))
      return {};
    return CmpOp::create(b, loc, types[0], p, l, r);
  }
  Value where(Value c, Value l, Value r) {
    SmallVector<Type> types;
    if (failed(WhereOp::inferReturnTypes(b.getContext(), loc, ValueRange{c, l, r},
                                         DictionaryAttr(), OpaqueProperties(nullptr),
                                         RegionRange(), types)))
      return {};
    return WhereOp::create(b, loc, types[0], c, l, r);
  }
  Value reshape(Value v, ArrayRef<int64_t> shape) {
    auto t = cast<RankedTensorType>(v.getType());
    // A rank-dependent (`?`) size is the one size the reshape infers.
    SmallVector<int64_t> sizes(shape);
    for (int64_t &s : sizes)
      if (ShapedType::isDynamic(s))
        s = -1;
    return ReshapeOp::create(b, loc, RankedTensorType::get(shape, t.getElementType()), v,
                             b.getDenseI64ArrayAttr(sizes));
  }
  Value castTo(Value v, Type elem) {
    auto t = cast<RankedTensorType>(v.getType());
    if (t.getElementType() == elem)
      return v;
    return CastOp::create(b, loc, RankedTensorType::get(t.getShape(), elem), v);
  }
  template <typename Op>
  Value reduce(Value v, int64_t dim, bool keepdim) {
    auto t = cast<RankedTensorType>(v.getType());
    SmallVector<int64_t> shape;
    for (int64_t d = 0; d < t.getRank(); ++d)
      if (d != dim)
        shape.push_back(t.getDimSize(d));
      else if (keepdim)
        shape.push_back(1);
    return Op::create(b, loc, RankedTensorType::get(shape, t.getElementType()), v,
                      b.getDenseI64ArrayAttr({dim}), keepdim ? b.getUnitAttr() : UnitAttr());
  }
  Value allReduce(Value v, MeshOp mesh, int64_t axis, ReduceKind kind) {
    auto t = cast<RankedTensorType>(v.getType());
    auto op = AllReduceOp::create(b, loc, t, v, FlatSymbolRefAttr::get(mesh.getSymNameAttr()),
                                  b.getArrayAttr({mesh.getAxes()[axis]}),
                                  ReduceKindAttr::get(b.getContext(), kind));
    if (t.hasStaticShape())
      op->setAttr(::mlir::tdx::TdxDialect::kPayloadBytesAttrName,
                  b.getI64IntegerAttr(t.getNumElements() * elementBytes(t.getElementType())));
    return op;
  }
  /// This rank's coordinate on mesh axis `axis`.
  Value coord(MeshOp mesh, int64_t axis) {
    return MeshCoordOp::create(b, loc, scalar(b.getI64Type()),
                               FlatSymbolRefAttr::get(mesh.getSymNameAttr()),
                               cast<StringAttr>(mesh.getAxes()[axis]));
  }
  /// This rank's first global row: coordinate * ceil(total / k).
  Value offset(MeshOp mesh, int64_t axis, int64_t total, Type elem) {
    Value coord = this->coord(mesh, axis);
    int64_t k = mesh.getShape()[axis];
    Value chunk = full(static_cast<double>((total + k - 1) / k), scalar(b.getI64Type()));
    return castTo(binary<MulOp>(coord, chunk), elem);
  }
};

} // namespace

static FailureOr<Value> vocabParallelEmbedding(OpBuilder &b, EmbeddingOp op, MeshOp mesh,
                                               int64_t axis, int64_t vocab) {
  b.setInsertionPoint(op);
  Emitter e{b, op.getLoc()};
  Value ids = op.getIndices();
  auto idsType = cast<RankedTensorType>(ids.getType());
  Type idElem = idsType.getElementType();
  int64_t k = mesh.getShape()[axis];
  int64_t chunk = (vocab + k - 1) / k;
  Value start = e.offset(mesh, axis, vocab, idElem);
  Value local = e.binary<SubOp>(ids, start);
  Value zero = e.full(0, e.scalar(idElem));
  // This rank holds rows [start, min(start + chunk, vocab)).
  Value end = e.binary<MinimumOp>(e.binary<AddOp>(start, e.full(chunk, e.scalar(idElem))),
                                  e.full(vocab, e.scalar(idElem)));
  Value rows = e.binary<SubOp>(end, start);
  Value owned = e.where(e.cmp(CmpPredicate::ge, local, zero), e.cmp(CmpPredicate::lt, local, rows),
                        e.full(0, e.scalar(b.getI1Type())));
  Value safe = e.where(owned, local, zero);
  auto resultType = cast<RankedTensorType>(op.getType());
  // A split with an empty shard (torch.chunk of 2 rows over 3 ranks): a
  // zero row after every local table gives the masked lookups a row to read.
  Value table = op.getWeight();
  if ((k - 1) * chunk >= vocab) {
    auto t = cast<RankedTensorType>(table.getType());
    SmallVector<int64_t> row(t.getShape());
    row[0] = 1;
    if (!RankedTensorType::get(row, t.getElementType()).hasStaticShape())
      return op.emitOpError("cannot look up rows of a table split unevenly on two dims");
    Value zeros = e.full(0, RankedTensorType::get(row, t.getElementType()));
    SmallVector<int64_t> padded(t.getShape());
    if (!ShapedType::isDynamic(padded[0]))
      ++padded[0];
    table = ConcatOp::create(b, op.getLoc(), RankedTensorType::get(padded, t.getElementType()),
                             ValueRange{table, zeros}, b.getI64IntegerAttr(0));
  }
  // padding_idx only shapes gradients; the local table has other row numbers.
  Value rowsOut = EmbeddingOp::create(b, op.getLoc(), resultType, table, safe, IntegerAttr());
  SmallVector<int64_t> maskShape(idsType.getShape());
  maskShape.push_back(1);
  Value mask = e.reshape(owned, maskShape);
  Value out = e.where(mask, rowsOut, e.full(0, e.scalar(resultType.getElementType())));
  if (!out)
    return op.emitOpError("cannot build its vocabulary-parallel form");
  return out;
}

static FailureOr<Value> vocabParallelCrossEntropy(OpBuilder &b, CrossEntropyOp op, MeshOp mesh,
                                                  int64_t axis, int64_t classes) {
  b.setInsertionPoint(op);
  Emitter e{b, op.getLoc()};
  Value x = op.getInput(), t = op.getTarget();
  auto xt = cast<RankedTensorType>(x.getType());
  auto tt = cast<RankedTensorType>(t.getType());
  int64_t cd = xt.getRank() == 1 ? 0 : 1;
  int64_t localClasses = xt.getDimSize(cd);
  if (ShapedType::isDynamic(localClasses) || !isa<IntegerType>(tt.getElementType()))
    return op.emitOpError() << "vocabulary-parallel cross_entropy needs class-index targets "
                               "and classes that split evenly over mesh axis \""
                            << cast<StringAttr>(mesh.getAxes()[axis]).getValue() << "\"";
  Type f = xt.getElementType();
  // log-sum-exp over all classes: the max and the sum cross the axis.
  Value mx = e.allReduce(e.reduce<MaxOp>(x, cd, true), mesh, axis, ReduceKind::Max);
  Value se = e.allReduce(e.reduce<SumOp>(ExpOp::create(b, op.getLoc(), e.binary<SubOp>(x, mx)),
                                         cd, true),
                         mesh, axis, ReduceKind::Sum);
  Value lse = e.binary<AddOp>(LogOp::create(b, op.getLoc(), se), mx);
  SmallVector<int64_t> lossShape(xt.getShape());
  lossShape.erase(lossShape.begin() + cd);
  lse = e.reshape(lse, lossShape);
  // The target's logit, on the rank that holds it (zero elsewhere).
  Type idElem = tt.getElementType();
  Value local = e.binary<SubOp>(t, e.offset(mesh, axis, classes, idElem));
  SmallVector<int64_t> keep(tt.getShape());
  keep.insert(keep.begin() + cd, 1);
  SmallVector<int64_t> classShape(xt.getRank(), 1);
  classShape[cd] = localClasses;
  Value ids = ArangeOp::create(b, op.getLoc(), RankedTensorType::get({localClasses}, idElem),
                               b.getF64FloatAttr(0), b.getF64FloatAttr(localClasses),
                               b.getF64FloatAttr(1));
  Value hit = e.cmp(CmpPredicate::eq, e.reshape(local, keep), e.reshape(ids, classShape));
  Value picked = e.reduce<SumOp>(e.where(hit, x, e.full(0, e.scalar(f))), cd, false);
  // Partial sum: coordinate 0 adds the log-sum-exp once.
  Value coord = e.coord(mesh, axis);
  Value first = e.cmp(CmpPredicate::eq, coord, e.full(0, e.scalar(b.getI64Type())));
  Value loss = e.binary<SubOp>(e.where(first, lse, e.full(0, e.scalar(f))), picked);
  Value valid = e.cmp(CmpPredicate::ne, t,
                      e.full(static_cast<double>(static_cast<int64_t>(op.getIgnoreIndex())), e.scalar(idElem)));
  loss = e.where(valid, loss, e.full(0, e.scalar(f)));
  auto all = [&](Value v) {
    auto vt = cast<RankedTensorType>(v.getType());
    SmallVector<int64_t> dims;
    for (int64_t d = 0; d < vt.getRank(); ++d)
      dims.push_back(d);
    return SumOp::create(b, op.getLoc(), RankedTensorType::get({}, vt.getElementType()), v,
                         b.getDenseI64ArrayAttr(dims), UnitAttr())
        .getResult();
  };
  switch (op.getReduction()) {
  case LossReduction::none:
    return loss;
  case LossReduction::sum:
    return all(loss);
  case LossReduction::mean:
    return e.binary<DivOp>(all(loss), all(e.castTo(valid, f)));
  }
  return failure();
}

/// The one mesh axis that splits dim `dim` of `split`, -1 when none; an
/// error when several do (`what` names the dim in it).
static FailureOr<int64_t> splittingAxis(Operation *op, PartitionContext &ctx, Value split,
                                        int64_t dim, StringRef what) {
  SmallVector<int64_t> axes;
  for (auto [axis, p] : llvm::enumerate(ctx.layoutOf(split)))
    if (p.isShard() && p.getDim() == dim)
      axes.push_back(axis);
  if (axes.size() > 1)
    return op->emitOpError() << "splits " << what << " over several mesh axes; split it over one";
  return axes.empty() ? -1 : axes.front();
}

/// Replaces `op` by `replacement`, which takes over its placement.
static LogicalResult replaceWith(Operation *op, PartitionContext &ctx,
                                 FailureOr<Value> replacement) {
  if (failed(replacement))
    return failure();
  if (Operation *def = replacement->getDefiningOp())
    if (auto shardings = op->getAttr(TdxDialect::kShardingsAttrName))
      def->setAttr(TdxDialect::kShardingsAttrName, shardings);
  ctx.replaced(op->getResult(0), *replacement);
  op->getResult(0).replaceAllUsesWith(*replacement);
  op->erase();
  return success();
}

/// Vocabulary-parallel form of `op` when dim `dim` of `split` is sharded.
template <typename Op, typename Lower>
static LogicalResult partitionVocabSplit(Op op, PartitionContext &ctx, Value split, int64_t dim,
                                         Lower lower) {
  FailureOr<int64_t> axis = splittingAxis(op, ctx, split, dim, "its vocabulary");
  if (failed(axis))
    return failure();
  if (*axis < 0)
    return success();
  int64_t global = ctx.globalDimSize(split, dim);
  if (ShapedType::isDynamic(global))
    return op.emitOpError("cannot tell the global vocabulary size of its split operand");
  return replaceWith(op, ctx, lower(ctx.builder(), op, cast<MeshOp>(ctx.mesh()), *axis, global));
}

LogicalResult EmbeddingOp::partition(PartitionContext &ctx) {
  return partitionVocabSplit(*this, ctx, getWeight(), 0, vocabParallelEmbedding);
}

LogicalResult CrossEntropyOp::partition(PartitionContext &ctx) {
  int64_t dim = getInput().getType().getRank() == 1 ? 0 : 1;
  return partitionVocabSplit(*this, ctx, getInput(), dim, vocabParallelCrossEntropy);
}

/// The local sizes of an op whose attribute spells out its result sizes:
/// the (retyped) result's, with `-1` for the one rank-dependent dim and for
/// dims that `old` keeps with `-1`.
static FailureOr<SmallVector<int64_t>> localSizes(Operation *op, ArrayRef<int64_t> old) {
  auto local = cast<RankedTensorType>(op->getResult(0).getType());
  SmallVector<int64_t> sizes;
  int64_t dynamic = 0;
  for (auto [i, d] : llvm::enumerate(local.getShape())) {
    bool keep = old.size() == local.getShape().size() && old[i] == -1;
    if (ShapedType::isDynamic(d))
      ++dynamic;
    sizes.push_back(ShapedType::isDynamic(d) || keep ? -1 : d);
  }
  if (dynamic > 1)
    return op->emitOpError() << "would need " << dynamic
                             << " rank-dependent sizes after partitioning; shard "
                                "at most one dim of it unevenly";
  return sizes;
}

LogicalResult ReshapeOp::partition(PartitionContext &) {
  FailureOr<SmallVector<int64_t>> sizes = localSizes(*this, {});
  if (failed(sizes))
    return failure();
  setShape(*sizes);
  return success();
}

LogicalResult ExpandOp::partition(PartitionContext &ctx) {
  FailureOr<SmallVector<int64_t>> sizes = localSizes(*this, getSizes());
  if (failed(sizes))
    return failure();
  // `-1` keeps the input's size; a rank-dependent dim that the input does
  // not have (a new leading dim) or broadcasts from 1 has no such size:
  // expand that dim to its global size, then take this rank's chunk.
  int64_t lead = static_cast<int64_t>(sizes->size()) - getInput().getType().getRank();
  std::optional<int64_t> broadcast;
  for (auto [d, size] : llvm::enumerate(*sizes))
    if (size == -1 && ShapedType::isDynamic(getType().getDimSize(d)) &&
        (static_cast<int64_t>(d) < lead || getInput().getType().getDimSize(d - lead) == 1))
      broadcast = d;
  if (!broadcast) {
    setSizes(*sizes);
    return success();
  }
  int64_t dim = *broadcast;
  FailureOr<int64_t> axis =
      splittingAxis(*this, ctx, getResult(), dim,
                    "dim " + std::to_string(dim) + ", which it broadcasts unevenly,");
  if (failed(axis))
    return failure();
  if (*axis < 0)
    return emitOpError() << "has a rank-dependent size in dim " << dim
                         << " that no mesh axis shards (a tdx bug)";
  (*sizes)[dim] = ctx.globalResultType(0).getDimSize(dim);
  Emitter e{ctx.builder(), getLoc()};
  e.b.setInsertionPoint(*this);
  Value full = ExpandOp::create(e.b, getLoc(), getInput(), *sizes);
  Value chunk = ChunkOp::create(e.b, getLoc(), getType(), full,
                                e.coord(cast<MeshOp>(ctx.mesh()), *axis),
                                e.b.getI64IntegerAttr(ctx.meshShape()[*axis]),
                                e.b.getI64IntegerAttr(dim));
  return replaceWith(*this, ctx, chunk);
}

/// A random op draws its box of the global tensor: the global shape stays.
template <typename Op>
static LogicalResult keepGlobalShape(Op op, PartitionContext &ctx) {
  RankedTensorType global = ctx.globalResultType(0);
  if (global != op.getType())
    op.setGlobalShape(global.getShape());
  return success();
}

/// A filled tensor split unevenly has a rank-dependent size (`?`): it
/// keeps its global shape, from which each rank makes its box.
template <typename Op> static LogicalResult keepGlobalShapeWhereDynamic(Op op, PartitionContext &ctx) {
  if (!op.getType().hasStaticShape())
    op.setGlobalShape(ctx.globalResultType(0).getShape());
  return success();
}

LogicalResult FullOp::partition(PartitionContext &ctx) {
  return keepGlobalShapeWhereDynamic(*this, ctx);
}
LogicalResult EmptyOp::partition(PartitionContext &ctx) {
  return keepGlobalShapeWhereDynamic(*this, ctx);
}
LogicalResult UniformOp::partition(PartitionContext &ctx) { return keepGlobalShape(*this, ctx); }
LogicalResult NormalOp::partition(PartitionContext &ctx) { return keepGlobalShape(*this, ctx); }
LogicalResult TruncNormalOp::partition(PartitionContext &ctx) {
  return keepGlobalShape(*this, ctx);
}
LogicalResult BernoulliOp::partition(PartitionContext &ctx) { return keepGlobalShape(*this, ctx); }
