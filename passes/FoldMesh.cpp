//===- FoldMesh.cpp - folded mesh axes: each rank computes their shards --===//
//
// A `tdx.mesh` with `ranks` runs its folded axes (ranks 1) inside each
// process. Every value that a folded axis splits or leaves Partial is held as
// one SSA value per shard of the folded axes (a "chunk"), and every op that
// reads one is cloned per chunk with that chunk's shapes: the op a rank of the
// whole mesh runs, on the same operands. A redistribution over a folded axis
// becomes local: Partial chunks are summed pairwise in coordinate order
// ((c0 + c1) + (c2 + c3) ...), shards are concatenated or sliced. A
// redistribution over an axis that keeps its ranks runs once per chunk.
//
// So the program computes every value of the whole mesh's per-rank programs
// with the same ops and shapes, and sums what crosses a folded axis in one
// order. The sum of two values does not depend on their order, so a
// program gives bitwise the same results on every folding of a mesh whose
// unfolded axes have at most 2 ranks.
//
// Then the folded axes leave every placement (Replicate) and the mesh's
// shape becomes its ranks, for tdx-partition.
//
//===----------------------------------------------------------------------===//

#include "tdx/IR/LocalTypes.h"
#include "tdx/IR/TdxOps.h"
#include "tdx/Transforms/Passes.h"
#include "tdx/Sharding/Layout.h"

#include "mlir/Dialect/Func/IR/FuncOps.h"
#include "mlir/IR/AttrTypeSubElements.h"
#include "mlir/IR/Builders.h"

#include <map>

namespace mlir::tdx {
#define GEN_PASS_DEF_FOLDMESH
#include "tdx/Transforms/Passes.h.inc"
} // namespace mlir::tdx

using namespace mlir;
using namespace mlir::tdx;

namespace {

/// Notes the ops an op's `partition` method creates that would communicate
/// over an axis (a vocabulary split's mesh coordinate or all_reduce).
struct CommunicationListener : public OpBuilder::Listener {
  Operation *found = nullptr;
  void notifyOperationInserted(Operation *op, OpBuilder::InsertPoint) override {
    if (!found && (isa<MeshCoordOp>(op) || op->hasTrait<OpTrait::TdxCollective>()))
      found = op;
  }
};

class Folder {
public:
  Folder(func::FuncOp fn, MeshOp mesh, ArrayRef<int64_t> ranks)
      : fn(fn), mesh(mesh), shape(mesh.getShape()), b(fn.getContext()) {
    for (auto [axis, r] : llvm::enumerate(ranks))
      if (r != shape[axis]) {
        folded.push_back(axis);
        numChunks *= shape[axis];
      }
  }

  LogicalResult run();

private:
  func::FuncOp fn;
  MeshOp mesh;
  SmallVector<int64_t> shape;
  /// The folded axes in mesh order; chunk k's coordinates are k in mixed
  /// radix over them, the last one minor.
  SmallVector<int64_t> folded;
  int64_t numChunks = 1;
  OpBuilder b;
  /// Values held as chunks, by chunk index.
  DenseMap<Value, SmallVector<Value>> chunks;
  /// The value each chunk is a chunk of (for the ops' partition methods).
  DenseMap<Value, Value> origin;
  /// Chunks sliced from values held whole (arguments, state reads, random
  /// draws), by value and chunk.
  DenseMap<std::pair<Value, int64_t>, Value> sliced;
  /// Ops replaced by their chunks' ops, erased at the end.
  SmallVector<Operation *> replaced;

  bool isFolded(int64_t axis) const { return llvm::is_contained(folded, axis); }
  int64_t stride(int64_t axis) const {
    int64_t s = 1;
    for (int64_t a : llvm::reverse(folded)) {
      if (a == axis)
        return s;
      s *= shape[a];
    }
    return s;
  }
  int64_t coord(int64_t k, int64_t axis) const { return (k / stride(axis)) % shape[axis]; }

  Layout layout(Value v) {
    ShardingAttr s = valueSharding(v);
    if (!s)
      if (auto r = v.getDefiningOp<RedistributeOp>())
        s = r.getTarget();
    return s ? layoutOf(s) : replicatedLayout(b.getContext(), shape.size());
  }
  bool touchesFolded(const Layout &l) const {
    return llvm::any_of(folded, [&](int64_t a) { return !l[a].isReplicate(); });
  }
  Layout onlyFolded(Layout l) const {
    for (auto [axis, p] : llvm::enumerate(l))
      if (!isFolded(axis))
        p = PlacementAttr::replicate(b.getContext());
    return l;
  }
  Layout strip(Layout l) const {
    for (int64_t a : folded)
      l[a] = PlacementAttr::replicate(b.getContext());
    return l;
  }
  ArrayAttr strippedShardings(const Layout &l) {
    return b.getArrayAttr({shardingOf(mesh, strip(l))});
  }
  std::string axisName(int64_t axis) {
    return cast<StringAttr>(mesh.getAxes()[axis]).getValue().str();
  }

  LogicalResult checkLayout(Operation *at, const Layout &l);
  FailureOr<RankedTensorType> chunkType(Operation *at, Type global, const Layout &l);
  /// Checks that `user` can read chunks of `v` (held whole: an argument, a
  /// state read, a random draw): its folded splits are even.
  LogicalResult checkWhole(Operation *user, Value v);
  Value chunkOf(Value v, int64_t k);
  FailureOr<Value> whole(Value v, Operation *user);
  Value slice(Value v, int64_t dim, int64_t part, int64_t parts, const Layout &l);
  Value concat(ArrayRef<Value> parts, int64_t dim, const Layout &l);
  FailureOr<Value> combine(Operation *at, ArrayRef<Value> parts, ReduceKind kind,
                           const Layout &l);
  LogicalResult foldRedistribute(RedistributeOp op);
  LogicalResult cloneOp(Operation *op);
  LogicalResult join(Operation *op);
  friend class FoldContext;
};

/// What a chunk's op sees in its `partition` method: the folded axes only.
class FoldContext final : public PartitionContext {
public:
  FoldContext(Folder &f, Operation *original) : f(f), original(original) {}
  OpBuilder &builder() override { return f.b; }
  Operation *mesh() override { return f.mesh; }
  ArrayRef<int64_t> meshShape() override { return f.shape; }
  SmallVector<PlacementAttr> layoutOf(Value v) override {
    auto it = f.origin.find(v);
    return f.onlyFolded(f.layout(it == f.origin.end() ? v : it->second));
  }
  int64_t globalDimSize(Value v, int64_t dim) override {
    auto it = f.origin.find(v);
    return cast<RankedTensorType>((it == f.origin.end() ? v : it->second).getType())
        .getDimSize(dim);
  }
  RankedTensorType globalResultType(unsigned i) override {
    return cast<RankedTensorType>(original->getResult(i).getType());
  }
  // Sizes come from `origin`, which keeps the whole values: nothing to move.
  void replaced(Value, Value) override {}

private:
  Folder &f;
  Operation *original;
};

LogicalResult Folder::checkLayout(Operation *at, const Layout &l) {
  for (int64_t a : folded) {
    if (!l[a].isShard())
      continue;
    for (auto [other, p] : llvm::enumerate(l))
      if (static_cast<int64_t>(other) != a && p.isShard() && p.getDim() == l[a].getDim())
        return at->emitOpError() << "splits dim " << l[a].getDim() << " over folded mesh axis \""
                                 << axisName(a) << "\" and over \"" << axisName(other)
                                 << "\"; a folded axis must be the only one that splits a dim "
                                    "(fold \""
                                 << axisName(other) << "\" too, or place the dim on one axis)";
  }
  for (int64_t a : folded)
    if (l[a].isPartial() && l[a].getReduce() == ReduceKind::Avg)
      return at->emitOpError() << "is Partial(avg) over folded mesh axis \"" << axisName(a)
                               << "\"; only sum, max and min are folded";
  return success();
}

FailureOr<RankedTensorType> Folder::chunkType(Operation *at, Type global, const Layout &l) {
  auto t = cast<RankedTensorType>(global);
  Layout own = onlyFolded(l);
  for (int64_t d = 0; d < t.getRank(); ++d) {
    SmallVector<int64_t> groups = shardGroupsOfDim(own, shape, d);
    if (groups.empty())
      continue;
    int64_t parts = 1;
    for (int64_t g : groups)
      parts *= g;
    if (ShapedType::isDynamic(t.getDimSize(d)) || t.getDimSize(d) % parts != 0)
      return at->emitOpError() << "splits dim " << d << " of size " << t.getDimSize(d)
                               << " into " << parts
                               << " shards over folded mesh axes; a folded axis needs an even "
                                  "split (change the batch or the plan, or do not fold)";
  }
  return localType(t, own, shape);
}

Value Folder::slice(Value v, int64_t dim, int64_t part, int64_t parts, const Layout &l) {
  auto t = cast<RankedTensorType>(v.getType());
  SmallVector<int64_t> sizes(t.getShape());
  int64_t size = sizes[dim] / parts;
  sizes[dim] = size;
  auto s = SliceOp::create(b, v.getLoc(), RankedTensorType::get(sizes, t.getElementType()), v,
                           b.getI64IntegerAttr(dim), b.getI64IntegerAttr(part * size),
                           b.getI64IntegerAttr((part + 1) * size), b.getI64IntegerAttr(1));
  s->setAttr(TdxDialect::kShardingsAttrName, strippedShardings(l));
  return s;
}

Value Folder::concat(ArrayRef<Value> parts, int64_t dim, const Layout &l) {
  auto t = cast<RankedTensorType>(parts.front().getType());
  SmallVector<int64_t> sizes(t.getShape());
  sizes[dim] *= parts.size();
  auto c = ConcatOp::create(b, parts.front().getLoc(),
                            RankedTensorType::get(sizes, t.getElementType()), parts,
                            b.getI64IntegerAttr(dim));
  c->setAttr(TdxDialect::kShardingsAttrName, strippedShardings(l));
  return c;
}

FailureOr<Value> Folder::combine(Operation *at, ArrayRef<Value> parts, ReduceKind kind,
                                 const Layout &l) {
  SmallVector<Value> level(parts);
  while (level.size() > 1) {
    SmallVector<Value> next;
    for (size_t i = 0; i + 1 < level.size(); i += 2) {
      Value x = level[i], y = level[i + 1];
      Operation *sum;
      switch (kind) {
      case ReduceKind::Sum:
        sum = AddOp::create(b, at->getLoc(), x.getType(), x, y);
        break;
      case ReduceKind::Max:
        sum = MaximumOp::create(b, at->getLoc(), x.getType(), x, y);
        break;
      case ReduceKind::Min:
        sum = MinimumOp::create(b, at->getLoc(), x.getType(), x, y);
        break;
      default:
        return at->emitOpError("reduces with avg over a folded mesh axis; only sum, max and "
                               "min are folded");
      }
      sum->setAttr(TdxDialect::kShardingsAttrName, strippedShardings(l));
      next.push_back(sum->getResult(0));
    }
    if (level.size() % 2)
      next.push_back(level.back());
    level = std::move(next);
  }
  return level.front();
}

LogicalResult Folder::checkWhole(Operation *user, Value v) {
  if (chunks.count(v))
    return success();
  Layout l = layout(v);
  if (!touchesFolded(l))
    return success();
  if (failed(checkLayout(user, l)))
    return failure();
  return chunkType(user, v.getType(), l);
}

Value Folder::chunkOf(Value v, int64_t k) {
  if (auto it = chunks.find(v); it != chunks.end())
    return it->second[k];
  Layout l = layout(v);
  if (!touchesFolded(l))
    return v;
  // A value held whole: its chunk is a slice, the same for every coordinate
  // of an axis that does not split it.
  int64_t key = 0;
  for (int64_t a : folded)
    if (l[a].isShard())
      key += coord(k, a) * stride(a);
  Value &s = sliced[{v, key}];
  if (s)
    return s;
  OpBuilder::InsertionGuard guard(b);
  b.setInsertionPointAfterValue(v);
  Value t = v;
  for (int64_t a : folded)
    if (l[a].isShard())
      t = slice(t, l[a].getDim(), coord(k, a), shape[a], l);
  origin[t] = v;
  return s = t;
}

FailureOr<Value> Folder::whole(Value v, Operation *user) {
  auto it = chunks.find(v);
  if (it == chunks.end())
    return v;
  Layout l = layout(v);
  SmallVector<Value> level(it->second);
  for (int64_t a : llvm::reverse(folded)) {
    if (l[a].isPartial())
      return user->emitOpError() << "reads a value that is Partial over folded mesh axis \""
                                 << axisName(a) << "\"; it must be reduced before";
    SmallVector<Value> next;
    for (size_t i = 0; i < level.size(); i += shape[a]) {
      ArrayRef<Value> group(level.data() + i, shape[a]);
      next.push_back(l[a].isShard() ? concat(group, l[a].getDim(), l) : group.front());
    }
    level = std::move(next);
  }
  return level.front();
}

LogicalResult Folder::join(Operation *op) {
  b.setInsertionPoint(op);
  for (OpOperand &use : op->getOpOperands()) {
    if (!chunks.count(use.get()))
      continue;
    FailureOr<Value> w = whole(use.get(), op);
    if (failed(w))
      return failure();
    use.set(*w);
  }
  return success();
}

LogicalResult Folder::foldRedistribute(RedistributeOp op) {
  Layout src = layoutOf(op.getSource()), dst = layoutOf(op.getTarget());
  if (failed(checkLayout(op, src)) || failed(checkLayout(op, dst)))
    return failure();
  SmallVector<int64_t> changed;
  for (size_t axis = 0; axis < src.size(); ++axis)
    if (src[axis] != dst[axis])
      changed.push_back(axis);
  if (changed.size() > 1)
    return op.emitOpError() << "changes " << changed.size()
                            << " mesh axes at once; run tdx-insert-collectives first";
  Value input = op.getInput();
  if (failed(checkWhole(op, input)) || failed(chunkType(op, op.getType(), dst)))
    return failure();
  b.setInsertionPoint(op);
  SmallVector<Value> out(numChunks);
  if (changed.empty() || !isFolded(changed.front())) {
    if (!chunks.count(input) && !touchesFolded(src))
      return success();
    // Once per chunk, over the axes that keep their ranks.
    DenseMap<Value, Value> done;
    for (int64_t k = 0; k < numChunks; ++k) {
      Value in = chunkOf(input, k);
      Value &r = done[in];
      if (!r) {
        auto clone = RedistributeOp::create(b, op.getLoc(), in, shardingOf(mesh, strip(src)),
                                            shardingOf(mesh, strip(dst)));
        clone->setAttr(TdxDialect::kShardingsAttrName, strippedShardings(dst));
        r = clone;
        origin[r] = op.getResult();
      }
      out[k] = r;
    }
  } else {
    int64_t a = changed.front();
    PlacementAttr from = src[a], to = dst[a];
    int64_t n = shape[a], step = stride(a);
    std::map<std::vector<void *>, SmallVector<Value>> done;
    for (int64_t k = 0; k < numChunks; ++k) {
      if (coord(k, a) != 0)
        continue;
      SmallVector<Value> group;
      std::vector<void *> key;
      for (int64_t j = 0; j < n; ++j) {
        group.push_back(chunkOf(input, k + j * step));
        key.push_back(group.back().getAsOpaquePointer());
      }
      SmallVector<Value> &res = done[key];
      if (res.empty()) {
        // The planner's elementary steps, each computed locally over the
        // group's n coordinates of the folded axis.
        res = group;
        Layout cur(src.begin(), src.end());
        for (const AxisStep &s : axisSteps(from, to)) {
          cur[a] = s.to;
          switch (s.kind) {
          case StepKind::AllReduce:
          case StepKind::ReduceScatter: {
            FailureOr<Value> sum = combine(op, res, s.from.getReduce(), cur);
            if (failed(sum))
              return failure();
            for (int64_t j = 0; j < n; ++j)
              res[j] = s.to.isShard() ? slice(*sum, s.to.getDim(), j, n, cur) : *sum;
            break;
          }
          case StepKind::AllGather:
          case StepKind::AllToAll: {
            Value all = concat(res, s.from.getDim(), cur);
            for (int64_t j = 0; j < n; ++j)
              res[j] = s.to.isShard() ? slice(all, s.to.getDim(), j, n, cur) : all;
            break;
          }
          case StepKind::LocalChunk:
            for (int64_t j = 0; j < n; ++j)
              res[j] = slice(res[j], s.to.getDim(), j, n, cur);
            break;
          case StepKind::LocalZero:
            // Coordinate 0 keeps the value; the others hold zeros.
            for (int64_t j = 1; j < n; ++j) {
              auto zero = FullOp::create(b, op.getLoc(), res[j].getType(), b.getF64FloatAttr(0));
              zero->setAttr(TdxDialect::kShardingsAttrName, strippedShardings(cur));
              res[j] = zero;
            }
            break;
          case StepKind::LocalNoop: // max, min: every coordinate's value is one
            break;
          }
        }
      }
      for (int64_t j = 0; j < n; ++j)
        out[k + j * step] = res[j];
    }
    for (Value v : out)
      origin.try_emplace(v, op.getResult());
  }
  chunks[op.getResult()] = std::move(out);
  replaced.push_back(op);
  return success();
}

LogicalResult Folder::cloneOp(Operation *op) {
  bool touched = false;
  for (Value v : op->getOperands())
    touched |= chunks.count(v) || touchesFolded(layout(v));
  if (!touched)
    return success();
  auto iface = dyn_cast<ShardingRuleOpInterface>(op);
  if (!iface || op->getNumResults() == 0 || op->getNumRegions() != 0)
    return join(op);
  for (Value v : op->getOperands())
    if (failed(checkWhole(op, v)))
      return failure();
  auto shardings = op->getAttrOfType<ArrayAttr>(TdxDialect::kShardingsAttrName);
  if (!shardings || shardings.size() != op->getNumResults())
    return op->emitOpError("has no placement for its results ('tdx.shardings'); run "
                           "tdx-propagate-sharding before tdx-fold-mesh");
  SmallVector<Layout> layouts;
  SmallVector<RankedTensorType> types;
  for (auto [result, attr] : llvm::zip(op->getResults(), shardings)) {
    auto sharding = dyn_cast<ShardingAttr>(attr);
    if (!sharding || !isa<RankedTensorType>(result.getType()))
      return op->emitOpError("has a malformed 'tdx.shardings' attribute");
    layouts.push_back(layoutOf(sharding));
    if (failed(checkLayout(op, layouts.back())))
      return failure();
    FailureOr<RankedTensorType> t = chunkType(op, result.getType(), layouts.back());
    if (failed(t))
      return failure();
    types.push_back(*t);
  }
  SmallVector<Attribute> stripped;
  for (const Layout &l : layouts)
    stripped.push_back(shardingOf(mesh, strip(l)));
  std::map<std::vector<void *>, Operation *> done;
  SmallVector<SmallVector<Value>> out(op->getNumResults(), SmallVector<Value>(numChunks));
  for (int64_t k = 0; k < numChunks; ++k) {
    SmallVector<Value> operands;
    std::vector<void *> key;
    for (Value v : op->getOperands()) {
      operands.push_back(chunkOf(v, k));
      key.push_back(operands.back().getAsOpaquePointer());
    }
    Operation *&clone = done[key];
    if (!clone) {
      b.setInsertionPoint(op);
      clone = b.clone(*op);
      clone->setOperands(operands);
      for (auto [r, t] : llvm::zip(clone->getResults(), types))
        r.setType(t);
      clone->setAttr(TdxDialect::kShardingsAttrName, b.getArrayAttr(stripped));
      CommunicationListener listener;
      b.setListener(&listener);
      FoldContext ctx(*this, op);
      b.setInsertionPoint(clone);
      LogicalResult partitioned = cast<ShardingRuleOpInterface>(clone).partition(ctx);
      b.setListener(nullptr);
      if (failed(partitioned))
        return failure();
      if (listener.found)
        return op->emitOpError()
               << "communicates inside the op over a folded mesh axis (its per-rank form "
                  "makes '"
               << listener.found->getName()
               << "'), which tdx-fold-mesh cannot run; give that axis its ranks, or place "
                  "the op's split dim on an axis that is not folded";
      for (Value r : clone->getResults())
        origin[r] = op->getResult(cast<OpResult>(r).getResultNumber());
    }
    for (unsigned i = 0; i < op->getNumResults(); ++i)
      out[i][k] = clone->getResult(i);
  }
  for (unsigned i = 0; i < op->getNumResults(); ++i)
    chunks[op->getResult(i)] = std::move(out[i]);
  replaced.push_back(op);
  return success();
}

LogicalResult Folder::run() {
  if (folded.empty())
    return success();
  // Every placement of the function is on this mesh (its layouts index its axes).
  auto other = [&](Attribute a) {
    auto s = dyn_cast_or_null<ShardingAttr>(a);
    return s && s.getMesh().getAttr() != mesh.getSymNameAttr() ? s : ShardingAttr();
  };
  ShardingAttr stranger;
  Operation *where = fn;
  for (unsigned i = 0; i < fn.getNumArguments() && !stranger; ++i)
    stranger = other(fn.getArgAttr(i, TdxDialect::kShardingAttrName));
  fn.walk([&](Operation *op) {
    if (stranger)
      return;
    if (auto list = op->getAttrOfType<ArrayAttr>(TdxDialect::kShardingsAttrName))
      for (Attribute a : list)
        if ((stranger = other(a)))
          where = op;
    if (auto r = dyn_cast<RedistributeOp>(op); r && !stranger)
      if ((stranger = other(r.getSource())))
        where = op;
  });
  if (stranger)
    return where->emitOpError() << "is placed on mesh " << stranger.getMesh()
                                << " while its function is folded on @" << mesh.getSymName()
                                << "; a folded program runs on one mesh";
  for (BlockArgument arg : fn.getArguments())
    if (failed(checkLayout(fn, layout(arg))))
      return failure();
  for (Operation &op : llvm::make_early_inc_range(fn.getBody().front())) {
    LogicalResult r = isa<RedistributeOp>(op) ? foldRedistribute(cast<RedistributeOp>(op))
                                              : cloneOp(&op);
    if (failed(r))
      return failure();
  }
  for (Operation *op : llvm::reverse(replaced)) {
    op->dropAllUses();
    op->erase();
  }
  return success();
}

struct FoldMeshPass : public mlir::tdx::impl::FoldMeshBase<FoldMeshPass> {
  void runOnOperation() override {
    ModuleOp module = getOperation();
    for (MeshOp mesh : llvm::make_early_inc_range(module.getOps<MeshOp>())) {
      std::optional<ArrayRef<int64_t>> ranks = mesh.getRanks();
      if (!ranks)
        continue;
      if (module->hasAttr(TdxDialect::kPartitionedAttrName)) {
        mesh.emitOpError("has folded axes but the module is already partitioned; run "
                         "tdx-fold-mesh before tdx-partition");
        return signalPassFailure();
      }
      SmallVector<int64_t> real(*ranks);
      for (auto fn : module.getOps<func::FuncOp>()) {
        ShardingAttr placed = fn.isExternal() ? ShardingAttr() : firstPlacement(fn);
        if (!placed || placed.getMesh().getAttr() != mesh.getSymNameAttr())
          continue;
        if (!fn.getBody().hasOneBlock()) {
          fn.emitOpError("has more than one block; tdx-fold-mesh folds a straight-line body");
          return signalPassFailure();
        }
        if (failed(Folder(fn, mesh, real).run()))
          return signalPassFailure();
      }
      // The folded axes leave every placement on this mesh; the mesh runs on
      // its ranks.
      SmallVector<int64_t> shape(mesh.getShape());
      auto name = mesh.getSymNameAttr();
      MLIRContext *ctx = module.getContext();
      AttrTypeReplacer replacer;
      replacer.addReplacement([&](ShardingAttr s) -> std::optional<Attribute> {
        if (s.getMesh().getAttr() != name)
          return std::nullopt;
        SmallVector<PlacementAttr> placements(s.getPlacements());
        for (auto [axis, p] : llvm::enumerate(placements))
          if (real[axis] != shape[axis])
            p = PlacementAttr::replicate(ctx);
        return ShardingAttr::get(ctx, s.getMesh(), placements);
      });
      replacer.recursivelyReplaceElementsIn(module, /*replaceAttrs=*/true,
                                            /*replaceLocs=*/false, /*replaceTypes=*/false);
      mesh.setShape(real);
      mesh.removeRanksAttr();
    }
  }
};

} // namespace
