//===- ExpandBatchNorm.cpp - training batch norm as per-channel sums ------===//
//
// A training step records batch norm in training mode as ATen runs it:
// `aten::native_batch_norm` (the normalized batch and its statistics) and,
// in the backward, `aten::native_batch_norm_backward`. ATen computes the
// statistics over every element of a channel it is given, so the op cannot
// run on a shard of the batch and give the global batch's numbers; left as
// it was, a data-parallel step gathers the batch. This pass writes both as
// what they are, per-channel sums and elementwise ops that have sharding
// rules:
//
//   mean   = sum(x) / n                 var = sum((x - mean)^2) / n
//   y      = (x - mean) * rsqrt(var + eps) * w + b
//   dx     = (dy - sum(dy) / n - (x - mean) * sum(dy (x - mean)) * invstd^2 / n)
//            * invstd * w
//   dw     = sum(dy (x - mean)) * invstd,   db = sum(dy)
//
// The sums accumulate in float64, as ATen's statistics do (the mean is the
// float64 mean rounded once). With the batch split, each sum is a Partial
// of per-channel values that propagation all-reduces; the variance is the
// sum of squares about the global mean (two exact passes, not
// E[x^2] - E[x]^2). The running
// statistics become explicit writes of the buffers (ATen updates them in
// place): running = (1 - momentum) running + momentum stat, the variance
// unbiased.
//
// A module with `tdx.batch_norm = {axis = "dp", statistics = ...}`
// (tdx.parallelize with data_parallel) names the mesh axis that splits the
// batch: the batch is viewed as [G, N/G, ...] for the axis' G ranks.
//  - "global": each group's mean and sum of squares about it are gathered
//    (one all_gather of [G, 2, C]) and merged exactly (Chan et al.:
//    M2 = sum M2_g + n_g sum (m_g - mean)^2); the backward's two sums are
//    all-reduced together: two collectives per batch norm, not four.
//  - "local": each group's own statistics, as DDP without SyncBatchNorm
//    (no communication for them); the running statistics follow group 0
//    (DDP broadcasts rank 0's buffers), gathered once per batch norm.
//
//===----------------------------------------------------------------------===//

#include "RaiseAtenCall.h"
#include "tdx/IR/TdxOps.h"
#include "tdx/Transforms/Passes.h"

#include "mlir/Dialect/Func/IR/FuncOps.h"
#include "mlir/IR/Builders.h"
#include "llvm/ADT/MapVector.h"

namespace mlir::tdx {
#define GEN_PASS_DEF_EXPANDBATCHNORM
#include "tdx/Transforms/Passes.h.inc"
} // namespace mlir::tdx

using namespace mlir;
using namespace mlir::tdx;

namespace {

RankedTensorType typeOf(Value v) { return cast<RankedTensorType>(v.getType()); }

/// How the module's batch norms take their statistics.
struct Mode {
  int64_t groups = 1;
  bool local = false;
  /// The mesh the batch is split on (null: none named).
  FlatSymbolRefAttr mesh;
  int64_t meshRank = 0;
};

/// A forward's statistics, shaped to broadcast against its grouped input,
/// and how it took them (its backward takes the same).
struct Statistics {
  Value mean, invstd;
  Mode mode;
};

/// The expansion's builder: it owns the OpBuilder that raise::Call (the
/// helpers tdx-raise-aten's rows build with) refers to.
struct OwnBuilder {
  explicit OwnBuilder(Operation *at) : builder(at) {}
  OpBuilder builder;
};

/// Builds the expansion of one op.
class Expander : private OwnBuilder, public raise::Call {
public:
  Expander(AtenOp op, const Mode &mode) : OwnBuilder(op), Call(op, builder), mode(mode) {}

  Mode mode;

  /// The optional tensor arguments in schema order (null where None).
  SmallVector<Value> optionals(ArrayRef<StringRef> names, size_t first) const {
    SmallVector<Value> out;
    size_t next = first;
    for (StringRef n : names)
      out.push_back(isNone(n) || next >= plain.size() ? Value() : plain[next++]);
    return out;
  }
  Value over(Value v, double n) { return binary<DivOp>(v, full(n, typeOf(v).getElementType())); }

  bool grouped() const { return mode.groups > 1; }
  /// [N, C, S...] as [G, N/G, C, S...] (itself for one group).
  Value group(Value x) {
    if (!grouped())
      return x;
    SmallVector<int64_t> shape{mode.groups};
    ArrayRef<int64_t> dims = typeOf(x).getShape();
    shape.push_back(dims[0] / mode.groups);
    shape.append(dims.begin() + 1, dims.end());
    return reshape(x, shape);
  }
  Value ungroup(Value x, RankedTensorType to) {
    return grouped() ? reshape(x, to.getShape()) : x;
  }
  /// The dim of the channels in the grouped input.
  int64_t channelDim() const { return grouped() ? 2 : 1; }
  /// Sum over every dim of `x` but the channels' (and the groups', with
  /// `perGroup`), the summed dims kept as 1.
  Value channelSum(Value x, bool perGroup) {
    x = cast(x, b.getF64Type()); // sums accumulate in float64, as ATen's
    auto t = typeOf(x);
    SmallVector<int64_t> dims, shape(t.getShape());
    for (int64_t d = 0; d < t.getRank(); ++d)
      if (d != channelDim() && !(perGroup && grouped() && d == 0)) {
        dims.push_back(d);
        shape[d] = 1;
      }
    return SumOp::create(b, loc, t.clone(shape), x, b.getDenseI64ArrayAttr(dims),
                         b.getUnitAttr());
  }
  /// A [C] tensor shaped to broadcast against the grouped input.
  Value perChannel(Value v, int64_t rank, Type e) {
    SmallVector<int64_t> shape(rank, 1);
    shape[channelDim()] = typeOf(v).getDimSize(0);
    return reshape(cast(v, e), shape);
  }
  /// `parts` (of one shape) side by side along `dim`, replicated on the
  /// batch's mesh: one collective moves them all.
  Value together(ArrayRef<Value> parts, int64_t dim) {
    auto t = typeOf(parts[0]);
    SmallVector<int64_t> shape(t.getShape());
    shape[dim] *= static_cast<int64_t>(parts.size());
    Value v = ConcatOp::create(b, loc, t.clone(shape), parts, b.getI64IntegerAttr(dim));
    if (!mode.mesh)
      return v;
    SmallVector<PlacementAttr> replicated(mode.meshRank, PlacementAttr::replicate(b.getContext()));
    return AnnotateOp::create(b, loc, v, ShardingAttr::get(b.getContext(), mode.mesh, replicated),
                              b.getI64IntegerAttr(0));
  }
  /// Part `i` of `together`'s result.
  Value part(Value all, int64_t dim, int64_t i, int64_t size) {
    auto t = typeOf(all);
    SmallVector<int64_t> shape(t.getShape());
    shape[dim] = size;
    return SliceOp::create(b, loc, t.clone(shape), all, b.getI64IntegerAttr(dim),
                           b.getI64IntegerAttr(i * size), b.getI64IntegerAttr((i + 1) * size),
                           b.getI64IntegerAttr(1));
  }
  /// A broadcast statistic as [C]: group 0's of a per-group one.
  Value flat(Value stat, int64_t channels) {
    if (typeOf(stat).getRank() && grouped() && typeOf(stat).getDimSize(0) > 1)
      stat = part(stat, 0, 0, 1);
    return reshape(stat, {channels});
  }
};

/// native_batch_norm_backward's optional tensors, after grad_out and input.
constexpr StringRef backwardOptionals[] = {"weight", "running_mean", "running_var", "save_mean",
                                           "save_invstd"};

/// Whether a forward's running statistics (if any) are the model's buffers,
/// which the expansion writes explicitly. Others (F.batch_norm on tensors
/// of the caller's, instance norm's repeated ones) are left to ATen.
bool statsAreBuffers(AtenOp op) {
  Expander e(op, Mode());
  SmallVector<Value> given = e.optionals({"weight", "bias", "running_mean", "running_var"}, 1);
  for (Value v : ArrayRef<Value>(given).drop_front(2))
    if (v && !v.getDefiningOp<ParamRefOp>())
      return false;
  return true;
}

/// Whether the op is one this pass writes out: the schema's operands on a
/// static float32 or float64 [N, C, ...] input (others stay ATen's).
bool expandable(AtenOp op) {
  bool forward = op.getSchema() == "aten::native_batch_norm";
  SmallVector<Value> plain = op.getPlainOperands();
  if (op->getNumResults() != 3 || plain.size() < (forward ? 1u : 2u))
    return false;
  auto x = dyn_cast<RankedTensorType>(plain[forward ? 0 : 1].getType());
  return x && x.getRank() >= 2 && x.hasStaticShape() &&
         (x.getElementType().isF32() || x.getElementType().isF64());
}

struct ExpandBatchNormPass : public mlir::tdx::impl::ExpandBatchNormBase<ExpandBatchNormPass> {
  using ExpandBatchNormBase::ExpandBatchNormBase;

  void runOnOperation() override {
    ModuleOp module = getOperation();
    Mode mode;
    if (auto spec = module->getAttrOfType<DictionaryAttr>(TdxDialect::kBatchNormAttrName)) {
      StringRef axis = spec.getAs<StringAttr>("axis").getValue(); // the dialect verified it
      mode.local = spec.getAs<StringAttr>("statistics").getValue() == "local";
      for (MeshOp mesh : module.getOps<MeshOp>())
        for (auto [i, a] : llvm::enumerate(mesh.getAxes().getAsValueRange<StringAttr>()))
          if (a == axis) {
            mode.groups = mesh.getShape()[i];
            mode.mesh = FlatSymbolRefAttr::get(mesh.getSymNameAttr());
            mode.meshRank = static_cast<int64_t>(mesh.getShape().size());
          }
      if (!mode.mesh) {
        module.emitError() << "tdx-expand-batch-norm: '" << TdxDialect::kBatchNormAttrName
                           << "' names mesh axis '" << axis
                           << "', which no tdx.mesh has; declare the mesh first";
        return signalPassFailure();
      }
    }
    for (auto fn : module.getOps<func::FuncOp>())
      if (failed(expand(fn, mode)))
        return signalPassFailure();
  }

  LogicalResult expand(func::FuncOp fn, Mode mode) {
    SmallVector<AtenOp> ops;
    fn.walk([&](AtenOp op) {
      StringRef s = op.getSchema();
      if (s == "aten::native_batch_norm" || s == "aten::native_batch_norm_backward")
        ops.push_back(op);
    });
    DenseMap<Operation *, Statistics> stats;
    SmallVector<AtenOp> expanded;
    // Each running buffer's latest value (a step that runs the model twice
    // updates it twice, in order).
    llvm::MapVector<StringAttr, Value> running;
    for (AtenOp op : ops) {
      bool forward = op.getSchema() == "aten::native_batch_norm";
      if (!Expander(op, mode).boolean(forward ? "training" : "train").value_or(false))
        continue; // eval mode: tdx-raise-aten's elementwise form, or ATen
      if (!expandable(op) || (forward && !statsAreBuffers(op)))
        continue; // ATen's kernel on the whole batch
      Mode m = mode;
      if (forward) {
        int64_t n = typeOf(op.getPlainOperands()[0]).getDimSize(0);
        if (m.groups > 1 && n % m.groups) {
          if (m.local)
            return op.emitOpError()
                   << "(native_batch_norm) cannot take each rank's statistics "
                      "(batch_norm=\"local\"): a batch of "
                   << n << " does not split into " << m.groups
                   << " equal shards; use batch_norm=\"global\" or a batch that splits evenly";
          m.groups = 1; // the global sums, placed by propagation
        }
        Expander e(op, m);
        if (failed(expandForward(fn, e, stats, running)))
          return failure();
      } else {
        SmallVector<Value> given = Expander(op, mode).optionals(backwardOptionals, 2);
        Value saveMean = given[3], saveInvstd = given[4];
        Operation *forwardOp = saveInvstd ? saveInvstd.getDefiningOp() : nullptr;
        auto found = forwardOp ? stats.find(forwardOp) : stats.end();
        if (found == stats.end())
          continue; // the backward of a forward left to ATen: ATen's too
        if (!saveMean || saveMean.getDefiningOp() != forwardOp)
          return op.emitOpError() << "(native_batch_norm_backward) reads the saved statistics "
                                     "of two different native_batch_norms";
        Expander e(op, found->second.mode);
        if (failed(expandBackward(e, found->second)))
          return failure();
      }
      expanded.push_back(op);
    }
    // The backward ops read the forward's results until they are expanded.
    for (AtenOp op : llvm::reverse(expanded)) {
      if (!op->use_empty())
        return op.emitOpError() << "(" << op.getSchema()
                                << ") is read by an op that is not its backward";
      op->erase();
    }
    if (running.empty())
      return success();
    auto ret = cast<func::ReturnOp>(fn.getBody().back().getTerminator());
    OpBuilder b(ret);
    for (auto [name, value] : running)
      AssignOp::create(b, ret.getLoc(), FlatSymbolRefAttr::get(name), value);
    return success();
  }

  LogicalResult expandForward(func::FuncOp fn, Expander &e,
                              DenseMap<Operation *, Statistics> &stats,
                              llvm::MapVector<StringAttr, Value> &running) {
    AtenOp op = e.op;
    Value x = op.getPlainOperands()[0];
    auto t = typeOf(x);
    Type f = t.getElementType();
    SmallVector<Value> given = e.optionals({"weight", "bias", "running_mean", "running_var"}, 1);
    std::optional<double> eps = e.number("eps"), momentum = e.number("momentum");
    if (!eps || !momentum)
      return op.emitOpError() << "(native_batch_norm) has no constant eps and momentum";
    for (Value stat : {given[2], given[3]}) {
      auto ref = stat ? stat.getDefiningOp<ParamRefOp>() : ParamRefOp();
      if (ref && llvm::any_of(fn.getOps<AssignOp>(),
                              [&](AssignOp a) { return a.getName() == ref.getName(); }))
        return op.emitOpError() << "(native_batch_norm) updates " << ref.getName()
                                << ", which the step also writes otherwise";
    }
    int64_t channels = t.getDimSize(1);
    double total = static_cast<double>(t.getNumElements() / channels);
    double each = total / static_cast<double>(e.mode.groups);
    Value xg = e.group(x);
    int64_t rank = typeOf(xg).getRank();
    Type wide = e.b.getF64Type();
    // Each group's mean and sum of squares about it (the only ones without
    // groups), in float64 as ATen's statistics: the mean is then the
    // float64 mean rounded once, so which side of it an element lies on
    // (what a following ReLU keeps) is exact.
    Value groupMean = e.over(e.channelSum(xg, true), each);
    Value groupCentered = e.binary<SubOp>(e.cast(xg, wide), groupMean);
    Value groupSquares = e.channelSum(e.binary<MulOp>(groupCentered, groupCentered), true);
    Value mean = groupMean, squares = groupSquares;
    double n = e.mode.local ? each : total;
    if (e.grouped() && !e.mode.local) {
      // The groups' statistics merged exactly, on every rank.
      Value all = e.together({groupMean, groupSquares}, 1);
      Value means = e.part(all, 1, 0, 1), sums = e.part(all, 1, 1, 1);
      auto overGroups = [&](Value v) {
        auto vt = typeOf(v);
        SmallVector<int64_t> shape(vt.getShape());
        shape[0] = 1;
        return Value(SumOp::create(e.b, e.loc, vt.clone(shape), v, e.b.getDenseI64ArrayAttr({0}),
                                   e.b.getUnitAttr()));
      };
      mean = e.over(overGroups(means), static_cast<double>(e.mode.groups));
      Value apart = e.binary<SubOp>(means, mean);
      squares = e.binary<AddOp>(
          overGroups(sums),
          e.binary<MulOp>(overGroups(e.binary<MulOp>(apart, apart)), e.full(each, wide)));
    }
    Value var = e.over(squares, n);
    Value invstd = e.cast(RsqrtOp::create(e.b, e.loc, e.binary<AddOp>(var, e.full(*eps, wide))), f);
    Value narrowMean = e.cast(mean, f);
    Value centered = e.binary<SubOp>(xg, narrowMean);
    Value scale = given[0] ? e.binary<MulOp>(invstd, e.perChannel(given[0], rank, f)) : invstd;
    Value y = e.binary<MulOp>(centered, scale);
    if (given[1])
      y = e.binary<AddOp>(y, e.perChannel(given[1], rank, f));
    op->getResult(0).replaceAllUsesWith(e.ungroup(y, t));
    stats[op] = {narrowMean, invstd, e.mode};
    for (unsigned i : {1u, 2u}) {
      Value r = op->getResult(i);
      for (OpOperand &use : llvm::make_early_inc_range(r.getUses())) {
        auto user = dyn_cast<AtenOp>(use.getOwner());
        if (!user || user.getSchema() != "aten::native_batch_norm_backward")
          use.set(e.flat(i == 1 ? narrowMean : invstd, channels));
      }
    }
    // The running statistics, as ATen's update (the variance unbiased):
    // group 0's under local statistics, gathered in one collective.
    if (!given[2] && !given[3])
      return success();
    Value unbiased = e.over(squares, n > 1 ? n - 1 : 0.0);
    Value runMean = mean, runVar = unbiased;
    if (e.grouped() && e.mode.local) {
      Value all = e.together({mean, unbiased}, 1);
      runMean = e.part(e.part(all, 1, 0, 1), 0, 0, 1);
      runVar = e.part(e.part(all, 1, 1, 1), 0, 0, 1);
    }
    auto update = [&](Value state, Value stat) {
      StringAttr name = state.getDefiningOp<ParamRefOp>().getNameAttr().getAttr();
      Value now = running.count(name) ? running[name] : state;
      Type s = typeOf(now).getElementType();
      Value kept = e.binary<MulOp>(now, e.full(1.0 - *momentum, s));
      Value moved = e.binary<MulOp>(e.cast(e.reshape(stat, {channels}), s), e.full(*momentum, s));
      running[name] = e.binary<AddOp>(moved, kept);
    };
    if (given[2])
      update(given[2], runMean);
    if (given[3])
      update(given[3], runVar);
    return success();
  }

  LogicalResult expandBackward(Expander &e, const Statistics &s) {
    AtenOp op = e.op;
    Value dy = e.plain[0], x = e.plain[1];
    auto t = typeOf(x);
    Type f = t.getElementType();
    SmallVector<Value> given = e.optionals(backwardOptionals, 2);
    int64_t channels = t.getDimSize(1);
    double n = static_cast<double>(t.getNumElements() / channels);
    if (e.mode.local)
      n /= static_cast<double>(e.mode.groups);
    Value xg = e.group(x), dyg = e.group(e.cast(dy, f));
    int64_t rank = typeOf(xg).getRank();
    Value centered = e.binary<SubOp>(xg, s.mean);
    // The two sums: per group under local statistics, else over the batch
    // (all-reduced together).
    Value sumDy = e.channelSum(dyg, e.mode.local);
    Value dot = e.channelSum(e.binary<MulOp>(dyg, centered), e.mode.local);
    if (!e.mode.local && e.mode.mesh) {
      Value all = e.together({sumDy, dot}, 0);
      int64_t size = typeOf(sumDy).getDimSize(0);
      sumDy = e.part(all, 0, 0, size);
      dot = e.part(all, 0, 1, size);
    }
    // The per-channel coefficients in float64, then the step's type.
    Value invstd = e.cast(s.invstd, typeOf(dot).getElementType());
    if (!op->getResult(0).use_empty()) {
      Value k = e.cast(e.over(e.binary<MulOp>(dot, e.binary<MulOp>(invstd, invstd)), n), f);
      Value g = e.binary<SubOp>(e.binary<SubOp>(dyg, e.cast(e.over(sumDy, n), f)),
                                e.binary<MulOp>(centered, k));
      Value scale =
          given[0] ? e.binary<MulOp>(s.invstd, e.perChannel(given[0], rank, f)) : s.invstd;
      Value dx = e.ungroup(e.binary<MulOp>(g, scale), t);
      op->getResult(0).replaceAllUsesWith(e.cast(dx, typeOf(op->getResult(0)).getElementType()));
    }
    // A [C] gradient: the sum over the groups of per-group values.
    auto perParameter = [&](Value v) {
      auto vt = typeOf(v);
      if (vt.getNumElements() == channels)
        return e.reshape(v, {channels});
      // Each group's in the step's type first: the sum over the groups
      // is the gradients' all-reduce, as DDP's.
      SmallVector<int64_t> dims;
      for (int64_t d = 0; d < vt.getRank(); ++d)
        if (d != e.channelDim())
          dims.push_back(d);
      return Value(SumOp::create(e.b, e.loc, RankedTensorType::get({channels}, f), e.cast(v, f),
                                 e.b.getDenseI64ArrayAttr(dims), UnitAttr()));
    };
    auto weightLike = [&](unsigned i, Value v) {
      Value r = op->getResult(i);
      if (!r.use_empty())
        r.replaceAllUsesWith(e.cast(perParameter(v), typeOf(r).getElementType()));
    };
    weightLike(1, e.binary<MulOp>(dot, invstd));
    weightLike(2, sumDy);
    return success();
  }
};

} // namespace
