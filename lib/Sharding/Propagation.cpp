//===- Propagation.cpp - a placement for every tensor value ---------------===//
//
// Two phases per function:
//  1. Propagation. Each tensor value has, per mesh axis, a proposed placement
//     with the priority of the user annotation it came from. Sweeping the ops
//     forward and backward, each op reads the proposals of its operands and
//     results, picks the factor of its sharding rule to shard on each axis,
//     and proposes the matching placement to its values that have none yet.
//     Levels run in priority order; user annotations are fixed.
//  2. Decision (Decision.cpp). In program order, each op picks the layout it computes in
//     (cheapest under the cost model given its operands' layouts and its
//     results' proposals); its results take that layout, and operands whose
//     layout differs get a tdx.redistribute.
//
//===----------------------------------------------------------------------===//

#include "FunctionPropagation.h"
#include "tdx/Sharding/Propagation.h"

#include <set>

using namespace mlir;
using namespace mlir::tdx;
using namespace mlir::tdx::detail;

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
    StateOpInterface target = ref.getStateOwner(&symbols);
    StringAttr owner = ref.getStateName();
    ShardingAttr sharding = target ? target.getStateSharding() : ShardingAttr();
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
  // A manual region's values are each rank's own (Replicate, fixed); its
  // outputs have the placements the user gave; its inputs are proposed the
  // placements it reads them in.
  manual = manualRegionOps(fn);
  MLIRContext *ctx = fn.getContext();
  for (Operation *op : ops) {
    if (manual.contains(op) || isa<ToLocalOp>(op))
      for (Value r : op->getResults())
        if (isTensor(r))
          for (AxisState &a : state(r))
            a = {PlacementAttr::replicate(ctx), 0, op, true};
    if (auto leave = dyn_cast<FromLocalOp>(op)) {
      State &s = state(leave.getResult());
      for (auto [axis, p] : llvm::enumerate(leave.getSharding().getPlacements()))
        s[axis] = {p, 0, op, true};
    }
    if (auto enter = dyn_cast<ToLocalOp>(op)) {
      State &s = state(enter.getInput());
      for (auto [axis, p] : llvm::enumerate(enter.getSharding().getPlacements()))
        if (!s[axis].placement)
          s[axis] = {p, 0, op, false};
    }
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
  if (isa<func::ReturnOp, RedistributeOp, AssignOp, ToLocalOp, FromLocalOp>(op) ||
      manual.contains(op))
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

LogicalResult mlir::tdx::propagateShardings(func::FuncOp fn, MeshOp mesh, const CostModel &cost,
                                            bool explain, SymbolTableCollection &symbols) {
  return FunctionPropagation(fn, mesh, cost, explain, symbols).run();
}

/// The mesh a function is placed on: the one its annotations, argument
/// shardings and parameters name. Null when it names none.
FailureOr<MeshOp> mlir::tdx::meshOfFunction(func::FuncOp fn, SymbolTableCollection &symbols) {
  SmallVector<std::pair<FlatSymbolRefAttr, Location>> uses;
  fn.walk([&](Operation *op) {
    if (auto a = dyn_cast<AnnotateOp>(op))
      uses.push_back({a.getSharding().getMesh(), op->getLoc()});
    else if (auto r = dyn_cast<RedistributeOp>(op))
      uses.push_back({r.getSource().getMesh(), op->getLoc()});
    else if (auto enter = dyn_cast<ToLocalOp>(op))
      uses.push_back({enter.getSharding().getMesh(), op->getLoc()});
    else if (auto leave = dyn_cast<FromLocalOp>(op))
      uses.push_back({leave.getSharding().getMesh(), op->getLoc()});
    else if (auto ref = dyn_cast<ParamRefOp>(op)) {
      // A tied name is placed where the value it shares is.
      if (StateOpInterface owner = ref.getStateOwner(&symbols))
        if (ShardingAttr sharding = owner.getStateSharding())
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
