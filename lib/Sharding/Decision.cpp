//===- Decision.cpp - the layout each op computes in -----------------------===//
//
// Phase 2 of propagation (FunctionPropagation.h): in program order, each op
// picks the layout it computes in, the cheapest under the cost model given
// its operands' layouts and its results' proposals; its results take that
// layout, and operands whose layout differs get a tdx.redistribute. Also the
// cost of a candidate factor, which phase 1 uses to settle contested
// proposals.
//
//===----------------------------------------------------------------------===//

#include "FunctionPropagation.h"

using namespace mlir;
using namespace mlir::tdx;
using namespace mlir::tdx::detail;

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
  // What the redistribution makes a rank hold beyond the tensor it starts
  // from (a gather's growth) is held like a result: a gather that saves a
  // small result pays for the large operand it makes.
  RankedTensorType type = tensorType(v);
  int64_t growth = localBytes(type, target, meshShape) - localBytes(type, from, meshShape);
  return planSeconds(planRedistribution(type, from, target, meshShape, cost)) +
         cost.secondsPerByteHeld * static_cast<double>(std::max<int64_t>(growth, 0));
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
  // A manual region: its input in the layout it reads, its ops on each
  // rank's own values, its output in the layout the user gave.
  if (auto enter = dyn_cast<ToLocalOp>(op)) {
    req = {layoutOf(enter.getSharding())};
    for (AxisState &a : state(enter.getResult()))
      a.placement = PlacementAttr::replicate(ctx);
    return;
  }
  if (auto leave = dyn_cast<FromLocalOp>(op)) {
    req = {replicatedLayout(ctx, rank)};
    State &s = state(leave.getResult());
    for (auto [axis, p] : llvm::enumerate(leave.getSharding().getPlacements()))
      s[axis].placement = p;
    return;
  }
  if (auto assign = dyn_cast<AssignOp>(op)) {
    // The state's layout: that of its reads, else its declaration's.
    StateOpInterface owner = assign.getStateOwner(&symbols);
    ShardingAttr declared = owner ? owner.getStateSharding() : ShardingAttr();
    auto ref = owner ? firstRef.find(assign.getStateName()) : firstRef.end();
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
  ShardingRule rule =
      manual.contains(op) ? ShardingRule::replicated(op) : getShardingRuleOrReplicated(op);
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
      StateOpInterface owner = ref.getStateOwner(&symbols);
      if (owner && !owner.getStateSharding())
        owner.setStateSharding(shardingOf(mesh, layout(ref.getResult())));
    }
  // Annotations have done their work: their operand now has their layout.
  for (Operation *op : ops)
    if (auto annotate = dyn_cast<AnnotateOp>(op)) {
      annotate.getResult().replaceAllUsesWith(annotate.getInput());
      annotate.erase();
    }
}
