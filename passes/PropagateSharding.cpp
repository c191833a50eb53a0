//===- PropagateSharding.cpp - a placement for every tensor value ---------===//
//
// Two phases per function:
//  1. Propagation. Each tensor value has, per mesh axis, a proposed placement
//     with the priority of the user annotation it came from. Sweeping the ops
//     forward and backward, each op reads the proposals of its operands and
//     results, picks the factor of its sharding rule to shard on each axis,
//     and proposes the matching placement to its values that have none yet.
//     Levels run in priority order; user annotations are fixed.
//  2. Decision. In program order, each op picks the layout it computes in
//     (cheapest under the cost model given its operands' layouts and its
//     results' proposals); its results take that layout, and operands whose
//     layout differs get a tdx.redistribute.
//
//===----------------------------------------------------------------------===//

#include "tdx/Dialect/TdxOps.h"
#include "tdx/Passes/Passes.h"
#include "tdx/Sharding/Layout.h"

#include "mlir/IR/Builders.h"
#include "llvm/ADT/MapVector.h"

#include <limits>
#include <set>

namespace mlir::tdx {
#define GEN_PASS_DEF_PROPAGATESHARDING
#include "tdx/Passes/Passes.h.inc"
} // namespace mlir::tdx

using namespace mlir;
using namespace mlir::tdx;

namespace {

std::string seconds(double s) {
  char buf[32];
  std::snprintf(buf, sizeof(buf), "%.3g s", s);
  return buf;
}

/// A candidate of linear ops: keep the operand's Partial through the op.
constexpr int64_t kPartialThrough = -2;

constexpr int kUnknownPriority = std::numeric_limits<int>::max();

/// The proposal for one value on one mesh axis.
struct AxisState {
  PlacementAttr placement; // null: no proposal yet
  int priority = kUnknownPriority;
  /// The user annotation this proposal comes from (for diagnostics).
  Operation *source = nullptr;
  /// Set by the user on this very value; never changed.
  bool fixed = false;
};
using State = SmallVector<AxisState, 4>;

/// What an op asks of one axis: shard `factor` (-1: none).
struct Candidate {
  int64_t factor;
  int priority;
  bool fixed;
  Operation *source;
  std::string origin; // "operand #0" / "result #0"
};

class FunctionPropagation {
public:
  FunctionPropagation(func::FuncOp fn, MeshOp mesh, const CostModel &cost,
                      bool explain, SymbolTableCollection &symbols)
      : fn(fn), mesh(mesh), meshShape(mesh.getShape()),
        rank(mesh.getShape().size()), cost(cost), explain(explain),
        symbols(symbols) {}

  LogicalResult run();

private:
  func::FuncOp fn;
  MeshOp mesh;
  ArrayRef<int64_t> meshShape;
  int64_t rank;
  const CostModel &cost;
  bool explain;
  SymbolTableCollection &symbols;

  SmallVector<Operation *> ops;
  DenseMap<Value, Value> leader; // param_ref results of one parameter share a state
  DenseMap<StringAttr, Value> firstRef; // the state's first param_ref, by owner name
  DenseMap<Value, State> states;
  /// Per op, the layout each tensor operand must have.
  DenseMap<Operation *, SmallVector<Layout>> required;

  Value key(Value v) const {
    auto it = leader.find(v);
    return it == leader.end() ? v : it->second;
  }
  State &state(Value v) {
    State &s = states[key(v)];
    if (s.empty())
      s.resize(rank);
    return s;
  }
  static bool isTensor(Value v) { return isa<RankedTensorType>(v.getType()); }
  static RankedTensorType tensorType(Value v) {
    return cast<RankedTensorType>(v.getType());
  }
  Layout layout(Value v) {
    Layout l;
    for (AxisState &a : state(v))
      l.push_back(a.placement ? a.placement
                              : PlacementAttr::replicate(fn.getContext()));
    return l;
  }

  LogicalResult seed();
  LogicalResult propagateLevel(int level);
  FailureOr<bool> propagateOp(Operation *op, int level);
  void decide();
  void decideOp(Operation *op);
  void rewrite();

  bool canShard(const ShardingRule &rule, const TensorFactors &dims, int64_t dim,
                int64_t axis) const {
    if (dims[dim].size() <= 1)
      return true;
    // A dim made of several factors is sharded through its major factor:
    // torch.chunk of the dim equals chunking the factor only when it divides.
    return rule.factorSizes[dims[dim].front()] % meshShape[axis] == 0;
  }
  /// Whether sharding factor `f` over `axis` can be expressed in every
  /// operand and result that has it: there it must be a dim's major factor,
  /// and divide evenly when that dim is made of several factors. Otherwise
  /// the local computation would not match the local types.
  bool expressible(const ShardingRule &rule, int64_t f, int64_t axis) const {
    if (f < 0)
      return true;
    if (rule.factorKinds[f] == FactorKind::Replicated)
      return false;
    auto check = [&](const TensorFactors &dims) {
      for (const DimFactors &fs : dims) {
        auto it = llvm::find(fs, f);
        if (it == fs.end())
          continue;
        if (it != fs.begin())
          return false;
        if (fs.size() > 1 && rule.factorSizes[f] % meshShape[axis] != 0)
          return false;
      }
      return true;
    };
    // A max or min over an uneven split leaves a rank with no elements, and
    // those reductions have no identity to give it.
    if (rule.factorKinds[f] == FactorKind::Reduction &&
        (rule.reduction == ReduceKind::Max || rule.reduction == ReduceKind::Min) &&
        rule.factorSizes[f] % meshShape[axis] != 0)
      return false;
    return llvm::all_of(rule.operands, check) && llvm::all_of(rule.results, check);
  }
  PlacementAttr placementFor(const ShardingRule &rule, const TensorFactors &dims,
                             int64_t f, int64_t axis, bool partialWithout);
  PlacementAttr requiredOperand(const ShardingRule &rule, size_t i, int64_t f,
                                int64_t axis);
  PlacementAttr producedResult(const ShardingRule &rule, size_t j, int64_t f,
                               int64_t axis);
  double candidateCost(Operation *op, const ShardingRule &rule, int64_t axis,
                       int64_t f);
  double changeCost(Value v, ArrayRef<PlacementAttr> from, int64_t axis,
                    PlacementAttr to);
  std::string describe(const ShardingRule &rule, Operation *op, int64_t f);
};

/// The placement on `axis` of a tensor with factors `dims` when the op
/// shards factor `f` there. Without `f` the tensor is replicated, or Partial
/// when `f` is a reduction factor and `partialWithout` (results; operands
/// added after the reduction).
PlacementAttr FunctionPropagation::placementFor(const ShardingRule &rule,
                                                const TensorFactors &dims, int64_t f,
                                                int64_t axis, bool partialWithout) {
  MLIRContext *ctx = fn.getContext();
  if (f == kPartialThrough)
    return PlacementAttr::partial(ctx, ReduceKind::Sum);
  if (f < 0)
    return PlacementAttr::replicate(ctx);
  int64_t d = ShardingRule::dimOfFactor(dims, f);
  if (d >= 0 && canShard(rule, dims, d, axis))
    return PlacementAttr::shard(ctx, d);
  if (rule.factorKinds[f] == FactorKind::Reduction && partialWithout)
    return PlacementAttr::partial(ctx, rule.reduction);
  return PlacementAttr::replicate(ctx);
}

PlacementAttr FunctionPropagation::requiredOperand(const ShardingRule &rule, size_t i,
                                                   int64_t f, int64_t axis) {
  return placementFor(rule, rule.operands[i], f, axis, rule.addedAfterReduction[i]);
}

PlacementAttr FunctionPropagation::producedResult(const ShardingRule &rule, size_t j,
                                                  int64_t f, int64_t axis) {
  return placementFor(rule, rule.results[j], f, axis, /*partialWithout=*/true);
}

double FunctionPropagation::changeCost(Value v, ArrayRef<PlacementAttr> from,
                                       int64_t axis, PlacementAttr to) {
  if (from[axis] == to)
    return 0.0;
  Layout target(from.begin(), from.end());
  target[axis] = to;
  return planSeconds(
      planRedistribution(tensorType(v), from, target, meshShape, cost));
}

double FunctionPropagation::candidateCost(Operation *op, const ShardingRule &rule,
                                          int64_t axis, int64_t f) {
  double seconds = 0.0;
  for (auto [i, operand] : llvm::enumerate(op->getOperands())) {
    if (!isTensor(operand) || i >= rule.operands.size())
      continue;
    AxisState &s = state(operand)[axis];
    if (!s.placement)
      continue;
    seconds += changeCost(operand, layout(operand), axis,
                          requiredOperand(rule, i, f, axis));
  }
  for (auto [j, result] : llvm::enumerate(op->getResults())) {
    if (!isTensor(result) || j >= rule.results.size())
      continue;
    AxisState &s = state(result)[axis];
    if (!s.placement)
      continue;
    Layout produced = layout(result);
    produced[axis] = producedResult(rule, j, f, axis);
    seconds += changeCost(result, produced, axis, s.placement);
  }
  // Memory: what each rank holds of the results computed this way (a
  // replicated or Partial result is held whole by every rank).
  for (auto [j, result] : llvm::enumerate(op->getResults())) {
    if (!isTensor(result) || j >= rule.results.size())
      continue;
    Layout held = layout(result);
    held[axis] = producedResult(rule, j, f, axis);
    seconds += cost.secondsPerByteHeld *
               static_cast<double>(localBytes(tensorType(result), held, meshShape));
  }
  double flops = 2.0;
  for (int64_t size : rule.factorSizes)
    flops *= static_cast<double>(std::max<int64_t>(size, 1));
  if (f >= 0 && rule.factorKinds[f] != FactorKind::Replicated)
    flops /= static_cast<double>(meshShape[axis]);
  return seconds + flops / cost.flopsPerSecond;
}

std::string FunctionPropagation::describe(const ShardingRule &rule, Operation *op,
                                          int64_t f) {
  if (f == kPartialThrough)
    return "Partial(sum) kept through the op";
  if (f < 0)
    return "no factor (replicated)";
  std::string s;
  llvm::raw_string_ostream os(s);
  os << "factor #" << f << " (size " << rule.factorSizes[f] << ", "
     << (rule.factorKinds[f] == FactorKind::Reduction ? "reduction" : "parallel")
     << ")";
  return s;
}

//===----------------------------------------------------------------------===//
// Seeds
//===----------------------------------------------------------------------===//

LogicalResult FunctionPropagation::seed() {
  fn.walk([&](Operation *op) {
    if (op != fn.getOperation())
      ops.push_back(op);
  });
  // All references to one parameter (or to the names tied to it) share one
  // state: a parameter has one layout.
  for (Operation *op : ops) {
    auto ref = dyn_cast<ParamRefOp>(op);
    if (!ref)
      continue;
    // A tied name is the state it shares.
    Operation *target = lookupStateOwner(op, ref.getNameAttr(), &symbols);
    StringAttr owner = target ? SymbolTable::getSymbolName(target) : ref.getNameAttr().getAttr();
    ShardingAttr sharding = stateSharding(target);
    auto [it, inserted] = firstRef.try_emplace(owner, ref.getResult());
    if (!inserted)
      leader[ref.getResult()] = it->second;
    if (sharding) {
      if (sharding.getMesh().getAttr() != mesh.getSymNameAttr() ||
          static_cast<int64_t>(sharding.getPlacements().size()) != rank)
        return op->emitError() << "reads " << ref.getNameAttr() << ", placed on mesh "
                               << sharding.getMesh() << ", but the function uses mesh @"
                               << mesh.getSymName() << "; one function is placed on one mesh";
      State &s = state(ref.getResult());
      for (auto [axis, p] : llvm::enumerate(sharding.getPlacements()))
        s[axis] = {p, 0, target, true};
    }
  }
  for (BlockArgument arg : fn.getArguments()) {
    auto sharding = fn.getArgAttrOfType<ShardingAttr>(arg.getArgNumber(), ::mlir::tdx::TdxDialect::kShardingAttrName);
    if (!sharding || !isTensor(arg))
      continue;
    if (sharding.getMesh().getAttr() != mesh.getSymNameAttr() ||
        static_cast<int64_t>(sharding.getPlacements().size()) != rank)
      return fn.emitError() << "argument #" << arg.getArgNumber()
                            << " is placed on mesh " << sharding.getMesh()
                            << " but the function uses mesh @" << mesh.getSymName()
                            << "; one function is placed on one mesh";
    if (failed(sharding.verifyFor(fn, arg.getType(), symbols, "argument sharding")))
      return failure();
    // A preference (data parallelism's batch split) starts propagation at
    // its level but is not fixed: preferences that disagree are settled by
    // cost.
    auto preference = fn.getArgAttrOfType<IntegerAttr>(
        arg.getArgNumber(), ::mlir::tdx::TdxDialect::kShardingPriorityAttrName);
    State &s = state(arg);
    for (auto [axis, p] : llvm::enumerate(sharding.getPlacements()))
      s[axis] = preference ? AxisState{p, static_cast<int>(preference.getInt()), fn, false}
                           : AxisState{p, 0, fn, true};
  }
  for (Operation *op : ops)
    if (auto annotate = dyn_cast<AnnotateOp>(op)) {
      State &s = state(annotate.getResult());
      int priority = static_cast<int>(annotate.getPriority());
      for (auto [axis, p] : llvm::enumerate(annotate.getSharding().getPlacements()))
        s[axis] = {p, priority, op, true};
    } else if (auto redistribute = dyn_cast<RedistributeOp>(op)) {
      State &s = state(redistribute.getResult());
      for (auto [axis, p] : llvm::enumerate(redistribute.getTarget().getPlacements()))
        s[axis] = {p, 0, op, true};
    }
  return success();
}

//===----------------------------------------------------------------------===//
// Phase 1: propagation
//===----------------------------------------------------------------------===//

FailureOr<bool> FunctionPropagation::propagateOp(Operation *op, int level) {
  // A written state keeps the layout it is read with (decideOp).
  if (isa<func::ReturnOp, RedistributeOp, AssignOp>(op))
    return false;
  ShardingRule rule;
  if (auto annotate = dyn_cast<AnnotateOp>(op)) {
    // Identity: the annotated value and the annotation share every factor.
    auto t = tensorType(annotate.getInput());
    TensorFactors dims;
    for (int64_t size : t.getShape())
      dims.push_back({rule.addFactor(size)});
    rule.operands = {dims};
    rule.addedAfterReduction = {false};
    rule.results = {dims};
  } else {
    rule = getShardingRuleOrReplicated(op);
  }
  bool changed = false;
  for (int64_t axis = 0; axis < rank; ++axis) {
    SmallVector<Candidate> candidates;
    auto consider = [&](Value v, const TensorFactors &dims, bool isResult,
                        size_t index) {
      AxisState &s = state(v)[axis];
      if (!s.placement || s.priority > level)
        return;
      int64_t f = -1;
      if (s.placement.isShard()) {
        int64_t d = s.placement.getDim();
        f = ShardingRule::majorFactor(dims, d);
        if (f < 0 || !expressible(rule, f, axis))
          return;
      } else if (s.placement.isPartial() && isResult) {
        auto it = llvm::find(rule.factorKinds, FactorKind::Reduction);
        if (it == rule.factorKinds.end())
          return;
        f = it - rule.factorKinds.begin();
        if (!expressible(rule, f, axis))
          return;
      } else {
        return;
      }
      candidates.push_back({f, s.priority, s.fixed, s.source,
                            (isResult ? "result #" : "operand #") +
                                std::to_string(index)});
    };
    for (auto [i, v] : llvm::enumerate(op->getOperands()))
      if (isTensor(v) && i < rule.operands.size())
        consider(v, rule.operands[i], false, i);
    for (auto [j, v] : llvm::enumerate(op->getResults()))
      if (isTensor(v) && j < rule.results.size())
        consider(v, rule.results[j], true, j);
    if (candidates.empty())
      continue;

    int best = kUnknownPriority;
    for (Candidate &c : candidates)
      best = std::min(best, c.priority);
    llvm::erase_if(candidates, [&](Candidate &c) { return c.priority != best; });
    // Two user annotations on this op's own values that disagree at the
    // same priority: the user must settle it.
    const Candidate *fixedA = nullptr, *fixedB = nullptr;
    for (Candidate &c : candidates)
      if (c.fixed) {
        if (!fixedA)
          fixedA = &c;
        else if (c.factor != fixedA->factor && !fixedB)
          fixedB = &c;
      }
    if (fixedB) {
      InFlightDiagnostic diag = op->emitError()
          << "conflicting user shardings on mesh axis \""
          << cast<StringAttr>(mesh.getAxes()[axis]).getValue() << "\": "
          << fixedA->origin << " and " << fixedB->origin
          << " ask this op to shard different dims over it, both at priority "
          << best << "; give one annotation a larger 'priority' number (lower "
                     "priority) or make them agree";
      diag.attachNote(fixedA->source->getLoc()) << "the sharding of " << fixedA->origin;
      diag.attachNote(fixedB->source->getLoc()) << "the sharding of " << fixedB->origin;
      return failure();
    }
    int64_t chosen = candidates.front().factor;
    std::string explanation;
    bool contested = llvm::any_of(
        candidates, [&](Candidate &c) { return c.factor != chosen; });
    if (fixedA) {
      chosen = fixedA->factor;
    } else if (contested) {
      double bestCost = std::numeric_limits<double>::infinity();
      SmallVector<std::pair<int64_t, double>> costs;
      for (Candidate &c : candidates) {
        if (llvm::any_of(costs, [&](auto &p) { return p.first == c.factor; }))
          continue;
        double s = candidateCost(op, rule, axis, c.factor);
        costs.push_back({c.factor, s});
        if (s < bestCost) {
          bestCost = s;
          chosen = c.factor;
        }
      }
      if (explain) {
        llvm::raw_string_ostream os(explanation);
        os << "tdx-propagate-sharding: on mesh axis \""
           << cast<StringAttr>(mesh.getAxes()[axis]).getValue() << "\" chose "
           << describe(rule, op, chosen) << " by cost among";
        for (auto [f, s] : costs)
          os << " " << describe(rule, op, f) << " = " << seconds(s) << ";";
      }
    }
    auto apply = [&](Value v, const TensorFactors &dims, bool isResult) {
      AxisState &s = state(v)[axis];
      if (s.fixed || s.placement)
        return;
      int64_t d = ShardingRule::dimOfFactor(dims, chosen);
      PlacementAttr p;
      if (d >= 0 && canShard(rule, dims, d, axis))
        p = PlacementAttr::shard(fn.getContext(), d);
      else if (isResult && rule.factorKinds[chosen] == FactorKind::Reduction)
        p = PlacementAttr::partial(fn.getContext(), rule.reduction);
      else
        return;
      const Candidate &from = *llvm::find_if(
          candidates, [&](Candidate &c) { return c.factor == chosen; });
      s = {p, best, from.source, false};
      changed = true;
    };
    bool before = changed;
    changed = false;
    for (auto [i, v] : llvm::enumerate(op->getOperands()))
      if (isTensor(v) && i < rule.operands.size())
        apply(v, rule.operands[i], false);
    for (auto [j, v] : llvm::enumerate(op->getResults()))
      if (isTensor(v) && j < rule.results.size())
        apply(v, rule.results[j], true);
    // Explain a contested choice once: when it placed something.
    if (changed && !explanation.empty())
      mlir::emitRemark(op->getLoc()) << explanation;
    changed |= before;
  }
  return changed;
}

LogicalResult FunctionPropagation::propagateLevel(int level) {
  // Sweep forward then backward until a fixed point. Each sweep only adds
  // proposals, so this ends after at most (values x axes) changes.
  for (bool changed = true; changed;) {
    changed = false;
    for (Operation *op : ops) {
      FailureOr<bool> c = propagateOp(op, level);
      if (failed(c))
        return failure();
      changed |= *c;
    }
    for (Operation *op : llvm::reverse(ops)) {
      FailureOr<bool> c = propagateOp(op, level);
      if (failed(c))
        return failure();
      changed |= *c;
    }
  }
  return success();
}

//===----------------------------------------------------------------------===//
// Phase 2: decision
//===----------------------------------------------------------------------===//

void FunctionPropagation::decideOp(Operation *op) {
  MLIRContext *ctx = fn.getContext();
  SmallVector<Layout> &req = required[op];
  if (auto annotate = dyn_cast<AnnotateOp>(op)) {
    req = {layoutOf(annotate.getSharding())};
    return;
  }
  if (auto redistribute = dyn_cast<RedistributeOp>(op)) {
    req = {layoutOf(redistribute.getSource())};
    return;
  }
  if (auto assign = dyn_cast<AssignOp>(op)) {
    // The state's layout: that of its reads, else its declaration's.
    Operation *owner = lookupStateOwner(op, assign.getNameAttr(), &symbols);
    ShardingAttr declared = stateSharding(owner);
    auto ref = owner ? firstRef.find(SymbolTable::getSymbolName(owner)) : firstRef.end();
    req = {ref != firstRef.end() ? layout(ref->second)
           : declared            ? layoutOf(declared)
                                 : replicatedLayout(ctx, rank)};
    return;
  }
  if (isa<func::ReturnOp>(op)) {
    for (auto [i, v] : llvm::enumerate(op->getOperands())) {
      Layout l = isTensor(v) ? layout(v) : Layout();
      // A result leaves the program Shard, Replicate or Partial(sum): the
      // runtimes assemble a result's boxes by copying or adding them. A
      // Partial(max|min|avg) is reduced by its own collective first.
      for (PlacementAttr &p : l)
        if (p.isPartial() && p.getReduce() != ReduceKind::Sum)
          p = PlacementAttr::replicate(ctx);
      if (auto sharding = fn.getResultAttrOfType<ShardingAttr>(i, ::mlir::tdx::TdxDialect::kShardingAttrName))
        l = layoutOf(sharding);
      req.push_back(l);
    }
    return;
  }
  ShardingRule rule = getShardingRuleOrReplicated(op);
  SmallVector<int64_t> chosen(rank, -1);
  for (int64_t axis = 0; axis < rank; ++axis) {
    SmallVector<int64_t> candidates = {-1};
    auto add = [&](int64_t f) {
      if (f >= 0 && expressible(rule, f, axis) && !llvm::is_contained(candidates, f))
        candidates.push_back(f);
    };
    for (auto [i, v] : llvm::enumerate(op->getOperands())) {
      if (!isTensor(v) || i >= rule.operands.size())
        continue;
      PlacementAttr p = state(v)[axis].placement;
      if (p && p.isShard()) {
        int64_t f = ShardingRule::majorFactor(rule.operands[i], p.getDim());
        if (f >= 0 && canShard(rule, rule.operands[i], p.getDim(), axis))
          add(f);
      }
    }
    for (auto [j, v] : llvm::enumerate(op->getResults())) {
      if (!isTensor(v) || j >= rule.results.size())
        continue;
      PlacementAttr p = state(v)[axis].placement;
      if (p && p.isShard()) {
        int64_t f = ShardingRule::majorFactor(rule.results[j], p.getDim());
        if (f >= 0 && canShard(rule, rule.results[j], p.getDim(), axis))
          add(f);
      } else if (p && p.isPartial()) {
        auto it = llvm::find(rule.factorKinds, FactorKind::Reduction);
        if (it != rule.factorKinds.end())
          add(it - rule.factorKinds.begin());
      }
    }
    // A linear op may keep Partial(sum) operands Partial (the backward's
    // sums of partial gradients reduce once).
    if (rule.linear && llvm::any_of(op->getOperands(), [&](Value v) {
          PlacementAttr p = isTensor(v) ? state(v)[axis].placement : PlacementAttr();
          return p && p.isPartial() && p.getReduce() == ReduceKind::Sum;
        }))
      candidates.push_back(kPartialThrough);
    double bestCost = std::numeric_limits<double>::infinity();
    SmallVector<double> costs;
    for (int64_t f : candidates) {
      double s = candidateCost(op, rule, axis, f);
      costs.push_back(s);
      // At equal cost a Partial is kept: reducing later costs the same
      // here, and a sum of partials further on then reduces once.
      if (s < bestCost || (f == kPartialThrough && s <= bestCost)) {
        bestCost = s;
        chosen[axis] = f;
      }
    }
    // Explain choices that were not forced: several candidates that cost
    // differently.
    if (explain && candidates.size() > 2) {
      InFlightDiagnostic remark = mlir::emitRemark(op->getLoc())
          << "tdx-propagate-sharding: computes with "
          << describe(rule, op, chosen[axis]) << " sharded on mesh axis \""
          << cast<StringAttr>(mesh.getAxes()[axis]).getValue() << "\"; candidates:";
      for (auto [f, s] : llvm::zip(candidates, costs))
        remark << " " << describe(rule, op, f) << " = " << seconds(s)
               << ";";
    }
  }
  for (auto [i, v] : llvm::enumerate(op->getOperands())) {
    if (!isTensor(v) || i >= rule.operands.size()) {
      req.push_back({});
      continue;
    }
    Layout l;
    for (int64_t axis = 0; axis < rank; ++axis)
      l.push_back(requiredOperand(rule, i, chosen[axis], axis));
    req.push_back(l);
  }
  for (auto [j, v] : llvm::enumerate(op->getResults())) {
    if (!isTensor(v) || j >= rule.results.size())
      continue;
    State &s = state(v);
    for (int64_t axis = 0; axis < rank; ++axis)
      s[axis].placement = producedResult(rule, j, chosen[axis], axis);
  }
  (void)ctx;
}

void FunctionPropagation::decide() {
  // Whatever propagation left open is replicated.
  for (auto &[v, s] : states)
    for (AxisState &a : s)
      if (!a.placement)
        a.placement = PlacementAttr::replicate(fn.getContext());
  for (BlockArgument arg : fn.getArguments())
    if (isTensor(arg))
      for (AxisState &a : state(arg))
        if (!a.placement)
          a.placement = PlacementAttr::replicate(fn.getContext());
  for (Operation *op : ops)
    decideOp(op);
}

void FunctionPropagation::rewrite() {
  MLIRContext *ctx = fn.getContext();
  OpBuilder b(ctx);
  // One redistribute per (value, layout), placed right after the value's
  // definition so that every user is dominated.
  DenseMap<std::pair<Value, Attribute>, Value> redistributed;
  auto valueIn = [&](Value v, ArrayRef<PlacementAttr> want) -> Value {
    Layout have = layout(v);
    if (ArrayRef<PlacementAttr>(have) == want)
      return v;
    ShardingAttr to = shardingOf(mesh, want);
    auto [it, inserted] = redistributed.try_emplace({v, to}, Value());
    if (!inserted)
      return it->second;
    if (auto arg = dyn_cast<BlockArgument>(v))
      b.setInsertionPointToStart(arg.getOwner());
    else
      b.setInsertionPointAfter(v.getDefiningOp());
    auto r = RedistributeOp::create(b, v.getLoc(), v, shardingOf(mesh, have), to);
    r->setAttr(::mlir::tdx::TdxDialect::kShardingsAttrName, b.getArrayAttr({to}));
    it->second = r.getResult();
    return r.getResult();
  };

  for (Operation *op : ops) {
    auto it = required.find(op);
    if (it != required.end())
      for (auto [i, want] : llvm::enumerate(it->second))
        if (!want.empty())
          op->setOperand(i, valueIn(op->getOperand(i), want));
    if (op->getNumResults() && llvm::all_of(op->getResults(), isTensor)) {
      SmallVector<Attribute> shardings;
      for (Value r : op->getResults())
        shardings.push_back(shardingOf(mesh, layout(r)));
      op->setAttr(::mlir::tdx::TdxDialect::kShardingsAttrName, b.getArrayAttr(shardings));
    }
  }
  for (BlockArgument arg : fn.getArguments()) {
    if (isTensor(arg))
      fn.setArgAttr(arg.getArgNumber(), ::mlir::tdx::TdxDialect::kShardingAttrName, shardingOf(mesh, layout(arg)));
    // A preference has become the argument's placement.
    fn.removeArgAttr(arg.getArgNumber(), ::mlir::tdx::TdxDialect::kShardingPriorityAttrName);
  }
  for (Operation *op : ops)
    if (auto ref = dyn_cast<ParamRefOp>(op)) {
      Operation *owner = lookupStateOwner(op, ref.getNameAttr(), &symbols);
      if (owner && !stateSharding(owner))
        setStateSharding(owner, shardingOf(mesh, layout(ref.getResult())));
    }
  // Annotations have done their work: their operand now has their layout.
  for (Operation *op : ops)
    if (auto annotate = dyn_cast<AnnotateOp>(op)) {
      annotate.getResult().replaceAllUsesWith(annotate.getInput());
      annotate.erase();
    }
}

LogicalResult FunctionPropagation::run() {
  if (failed(seed()))
    return failure();
  // One propagation per priority that occurs, highest (0) first.
  std::set<int> levels = {0};
  for (Operation *op : ops)
    if (auto annotate = dyn_cast<AnnotateOp>(op))
      levels.insert(static_cast<int>(annotate.getPriority()));
  for (unsigned i = 0; i < fn.getNumArguments(); ++i)
    if (auto p = fn.getArgAttrOfType<IntegerAttr>(
            i, ::mlir::tdx::TdxDialect::kShardingPriorityAttrName))
      levels.insert(static_cast<int>(p.getInt()));
  for (int level : levels)
    if (failed(propagateLevel(level)))
      return failure();
  decide();
  rewrite();
  return success();
}

/// The mesh a function is placed on: the one its annotations, argument
/// shardings and parameters name. Null when it names none.
FailureOr<MeshOp> meshOfFunction(func::FuncOp fn, SymbolTableCollection &symbols) {
  SmallVector<std::pair<FlatSymbolRefAttr, Location>> uses;
  fn.walk([&](Operation *op) {
    if (auto a = dyn_cast<AnnotateOp>(op))
      uses.push_back({a.getSharding().getMesh(), op->getLoc()});
    else if (auto r = dyn_cast<RedistributeOp>(op))
      uses.push_back({r.getSource().getMesh(), op->getLoc()});
    else if (auto ref = dyn_cast<ParamRefOp>(op)) {
      // A tied name is placed where the value it shares is.
      Operation *owner = lookupStateOwner(op, ref.getNameAttr(), &symbols);
      if (ShardingAttr sharding = stateSharding(owner))
        uses.push_back({sharding.getMesh(), owner->getLoc()});
    }
  });
  for (unsigned i = 0; i < fn.getNumArguments(); ++i)
    if (auto s = fn.getArgAttrOfType<ShardingAttr>(i, ::mlir::tdx::TdxDialect::kShardingAttrName))
      uses.push_back({s.getMesh(), fn.getLoc()});
  if (uses.empty())
    return MeshOp();
  for (auto &[name, loc] : uses)
    if (name != uses.front().first) {
      InFlightDiagnostic diag = fn.emitError()
          << "uses two meshes, " << uses.front().first << " and " << name
          << "; tdx places one function on one mesh";
      diag.attachNote(uses.front().second) << "mesh " << uses.front().first << " here";
      diag.attachNote(loc) << "mesh " << name << " here";
      return failure();
    }
  MeshOp mesh = lookupMesh(fn, uses.front().first);
  if (!mesh)
    return fn.emitError() << "refers to mesh " << uses.front().first
                          << ", which is not a 'tdx.mesh' in scope";
  return mesh;
}

struct PropagateShardingPass
    : public mlir::tdx::impl::PropagateShardingBase<PropagateShardingPass> {
  using PropagateShardingBase::PropagateShardingBase;

  void runOnOperation() override {
    if (getOperation()->hasAttr(::mlir::tdx::TdxDialect::kPartitionedAttrName)) {
      getOperation().emitError("tdx-propagate-sharding runs on the global view, "
                               "but this module is already partitioned");
      return signalPassFailure();
    }
    SymbolTableCollection symbols;
    for (auto fn : llvm::make_early_inc_range(getOperation().getOps<func::FuncOp>())) {
      if (fn.isExternal())
        continue;
      FailureOr<MeshOp> mesh = meshOfFunction(fn, symbols);
      if (failed(mesh))
        return signalPassFailure();
      if (!*mesh)
        continue;
      FailureOr<CostModel> cost =
          CostModel::fromOptions(*mesh, bandwidth, latency, flops, memory);
      if (failed(cost))
        return signalPassFailure();
      FunctionPropagation propagation(fn, *mesh, *cost, explain, symbols);
      if (failed(propagation.run()))
        return signalPassFailure();
    }
  }
};

} // namespace
