//===- Recompute.cpp - make tensors again instead of holding them ---------===//
//
// A step over its memory budget holds fewer tensors across its peak: each
// tensor made before the peak and read after it is either held, or made
// again right before its first read after the peak from tensors that are
// held (the step's arguments and state are always at hand). Which is a
// minimum cut of the ops before the peak, as functorch's min-cut
// rematerialization: holding an op's results costs their bytes, making the op
// again costs its run time priced in bytes per second (matmuls by their
// flops, collectives by latency and bytes, the rest by the bytes they move).
// The price starts high (nothing is made again) and falls tenfold until the
// step fits; each price cuts at the peak, and again at the peak that moves.
// A pipeline's ranks each fit their own step.
//
//===----------------------------------------------------------------------===//

#include "tdx/IR/TdxOps.h"
#include "tdx/Target/Lifetimes.h"
#include "tdx/Target/StepMemory.h"
#include "tdx/Transforms/Passes.h"

#include "mlir/Dialect/Func/IR/FuncOps.h"
#include "mlir/IR/Builders.h"
#include "mlir/IR/IRMapping.h"
#include "mlir/Interfaces/SideEffectInterfaces.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

namespace mlir::tdx {
#define GEN_PASS_DEF_RECOMPUTE
#include "tdx/Transforms/Passes.h.inc"
} // namespace mlir::tdx

using namespace mlir;
using namespace mlir::tdx;

namespace {

constexpr int64_t kInfinite = std::numeric_limits<int64_t>::max() / 4;

/// Whether running `op` again gives its results again, with nothing else
/// changed: pure ops, kernels, collectives (every rank runs the same
/// program, so every rank runs them again) and their waits. The tdx random
/// ops are counter-based, so they are pure.
bool canRunAgain(Operation *op) {
  if (op->getNumResults() == 0 || isa<ParamRefOp, StartOp>(op))
    return false;
  if (auto wait = dyn_cast<WaitOp>(op))
    return wait.getToken().getDefiningOp<StartOp>() != nullptr;
  if (op->hasTrait<OpTrait::TdxCollective>() || isa<FusedOp>(op))
    return true;
  if (auto aten = dyn_cast<AtenOp>(op))
    return !aten.isRandom();
  return op->getNumRegions() == 0 && isMemoryEffectFree(op);
}

/// Dinic's maximum flow, and the nodes the source reaches after it: the
/// source side of a minimum cut.
class MinCut {
public:
  explicit MinCut(int64_t nodes) : edges(nodes), level(nodes), next(nodes) {}

  void add(int64_t from, int64_t to, int64_t capacity) {
    edges[from].push_back({to, capacity, static_cast<int64_t>(edges[to].size())});
    edges[to].push_back({from, 0, static_cast<int64_t>(edges[from].size()) - 1});
  }

  std::vector<bool> sourceSide(int64_t source, int64_t sink) {
    while (levels(source, sink)) {
      std::fill(next.begin(), next.end(), 0);
      while (push(source, sink, kInfinite) > 0) {
      }
    }
    levels(source, sink);
    std::vector<bool> side(edges.size());
    for (size_t n = 0; n < edges.size(); ++n)
      side[n] = level[n] >= 0;
    return side;
  }

private:
  struct Edge {
    int64_t to, capacity, back;
  };

  bool levels(int64_t source, int64_t sink) {
    std::fill(level.begin(), level.end(), -1);
    std::vector<int64_t> queue{source};
    level[source] = 0;
    for (size_t i = 0; i < queue.size(); ++i)
      for (const Edge &e : edges[queue[i]])
        if (e.capacity > 0 && level[e.to] < 0) {
          level[e.to] = level[queue[i]] + 1;
          queue.push_back(e.to);
        }
    return level[sink] >= 0;
  }

  int64_t push(int64_t node, int64_t sink, int64_t limit) {
    if (node == sink)
      return limit;
    for (int64_t &i = next[node]; i < static_cast<int64_t>(edges[node].size()); ++i) {
      Edge &e = edges[node][i];
      if (e.capacity <= 0 || level[e.to] != level[node] + 1)
        continue;
      if (int64_t got = push(e.to, sink, std::min(limit, e.capacity)); got > 0) {
        e.capacity -= got;
        edges[e.to][e.back].capacity += got;
        return got;
      }
    }
    return 0;
  }

  std::vector<std::vector<Edge>> edges;
  std::vector<int64_t> level, next;
};

/// Cuts once at the peak of `block` at `price` (bytes per second of
/// running again): makes again, after the peak, what the cut says not to
/// hold across it. Returns whether anything is made again.
bool cutAtPeak(Block &block, double price) {
  Lifetimes lifetimes(block);
  Operation *peak = lifetimes.peakOp();
  if (!peak)
    return false;
  DenseMap<Operation *, int64_t> position;
  SmallVector<Operation *> ops;
  for (Operation &op : block) {
    position[&op] = static_cast<int64_t>(ops.size());
    ops.push_back(&op);
  }
  int64_t at = position[peak];
  auto after = [&](Operation *user) {
    Operation *op = block.findAncestorOpInBlock(*user);
    auto it = op ? position.find(op) : position.end();
    return it != position.end() && it->second > at;
  };
  // What the step holds anyway: its results and state writes, and what the
  // peak's own op reads.
  SmallVector<Value> atPeak = readsOf(peak);
  DenseSet<Value> held(atPeak.begin(), atPeak.end());
  for (Operation &op : block)
    if (isa<AssignOp, func::ReturnOp>(op))
      held.insert(op.operand_begin(), op.operand_end());

  // The ops before the peak that a read after it needs, back to the
  // arguments and state.
  DenseMap<Operation *, int64_t> node;
  SmallVector<Operation *> nodes, sinks, work;
  auto visit = [&](Operation *op) {
    if (!op || op->getBlock() != &block || isa<ParamRefOp, StartOp>(op) || node.count(op) ||
        position[op] >= at)
      return;
    node[op] = static_cast<int64_t>(nodes.size());
    nodes.push_back(op);
    work.push_back(op);
  };
  for (int64_t i = 0; i < at; ++i)
    for (Value r : ops[i]->getResults())
      if (llvm::any_of(r.getUsers(), after) && !held.contains(r)) {
        visit(ops[i]);
        if (node.count(ops[i]) && (sinks.empty() || sinks.back() != ops[i]))
          sinks.push_back(ops[i]);
      }
  if (sinks.empty())
    return false;
  while (!work.empty()) {
    Operation *op = work.pop_back_val();
    if (canRunAgain(op))
      for (Value v : readsOf(op))
        visit(v.getDefiningOp());
  }

  // Node n: 2n is its op made, 2n+1 its results there; holding costs the
  // edge between, running again the edge from the source.
  int64_t source = 2 * nodes.size(), sink = source + 1;
  MinCut cut(sink + 1);
  for (auto [n, op] : llvm::enumerate(nodes)) {
    int64_t bytes = 0;
    for (Value r : op->getResults())
      if (!held.contains(r))
        bytes += tensorBytes(r);
    // A view holds its base: held, the base is.
    cut.add(2 * n, 2 * n + 1, isView(op) ? kInfinite : bytes);
    if (!canRunAgain(op)) {
      cut.add(source, 2 * n, kInfinite);
      continue;
    }
    // Running it again also holds its results again for a while: half
    // their bytes, so a cut does not make a whole prefix of the step again
    // to save the few bytes at its start.
    double cost = std::max(1.0, std::ceil(price * opSeconds(op) + bytes / 2.0));
    cut.add(source, 2 * n, cost >= static_cast<double>(kInfinite) ? kInfinite
                                                                   : static_cast<int64_t>(cost));
    for (Value v : readsOf(op))
      if (auto it = node.find(v.getDefiningOp()); it != node.end())
        cut.add(2 * it->second + 1, 2 * n, kInfinite);
  }
  for (Operation *op : sinks)
    cut.add(2 * node[op] + 1, sink, kInfinite);
  std::vector<bool> side = cut.sourceSide(source, sink);

  // The ops to run again: a sink not held, and what it needs not held.
  DenseSet<Operation *> again;
  SmallVector<Operation *> need;
  for (Operation *op : sinks)
    if (!side[2 * node[op]])
      need.push_back(op);
  while (!need.empty()) {
    Operation *op = need.pop_back_val();
    if (!again.insert(op).second)
      continue;
    for (Value v : readsOf(op))
      if (auto it = node.find(v.getDefiningOp()); it != node.end() && !side[2 * it->second])
        need.push_back(v.getDefiningOp());
  }
  if (again.empty())
    return false;
  SmallVector<Operation *> order(again.begin(), again.end());
  llvm::sort(order, [&](Operation *a, Operation *b) { return position[a] < position[b]; });

  // Each runs again right before the first op after the peak that reads it
  // or reads what is made again from it.
  DenseMap<Operation *, int64_t> place;
  for (Operation *op : llvm::reverse(order)) {
    auto it = place.find(op); // set by what is made again from it
    int64_t first = it != place.end() ? it->second : static_cast<int64_t>(ops.size());
    for (Value r : op->getResults())
      for (Operation *user : r.getUsers())
        if (after(user))
          first = std::min(first, position[block.findAncestorOpInBlock(*user)]);
    place[op] = first;
    for (Value v : readsOf(op))
      if (Operation *def = v.getDefiningOp(); def && again.contains(def)) {
        auto [slot, fresh] = place.try_emplace(def, first);
        slot->second = std::min(slot->second, first);
      }
  }
  IRMapping map;
  UnitAttr mark = UnitAttr::get(block.getParentOp()->getContext());
  for (Operation *op : order) {
    OpBuilder b(ops[place[op]]);
    if (auto wait = dyn_cast<WaitOp>(op))
      b.clone(*wait.getToken().getDefiningOp(), map)->setAttr(TdxDialect::kRecomputedAttrName,
                                                              mark);
    b.clone(*op, map)->setAttr(TdxDialect::kRecomputedAttrName, mark);
  }
  for (Operation *op : order)
    for (Value r : op->getResults())
      r.replaceUsesWithIf(map.lookup(r), [&](OpOperand &use) { return after(use.getOwner()); });
  return true;
}

struct RecomputePass : public mlir::tdx::impl::RecomputeBase<RecomputePass> {
  using RecomputeBase::RecomputeBase;

  void runOnOperation() override {
    ModuleOp module = getOperation();
    if (budget < 0) {
      module.emitError() << "tdx-recompute: budget must be a byte count >= 0 (0: the module's "
                         << TdxDialect::kMemoryBudgetAttrName << "), got " << static_cast<int64_t>(budget);
      return signalPassFailure();
    }
    int64_t limit = budget;
    if (limit == 0)
      if (auto attr = module->getAttrOfType<IntegerAttr>(TdxDialect::kMemoryBudgetAttrName))
        limit = attr.getInt();
    if (limit <= 0)
      return markAllAnalysesPreserved();
    // Each pipeline rank's step holds its own stages: each fits on its own.
    for (func::FuncOp fn : stepFunctions(module))
      if (fn.getBody().hasOneBlock())
        fit(module, fn, limit);
  }

  /// Runs ops of `fn` again until its peak fits `limit` with what state and
  /// batch hold, or leaves the smallest peak it found.
  void fit(ModuleOp module, func::FuncOp fn, int64_t limit) {
    // The step's own tensors may take what state and batch leave.
    int64_t target = limit - stepMemory(module, fn).fixed();
    int64_t best = Lifetimes(fn.getBody().front()).peakBytes();
    if (best <= target)
      return;
    func::FuncOp chosen;
    for (double price = 1e12; price >= 1e5 && best > target; price /= 10) {
      // In the module, so that its collectives find their mesh (opSeconds).
      func::FuncOp work = fn.clone();
      module.getBody()->getOperations().insert(fn->getIterator(), work);
      Block &block = work.getBody().front();
      int64_t peak = Lifetimes(block).peakBytes();
      for (int round = 0; round < 4 && peak > target && cutAtPeak(block, price); ++round)
        peak = Lifetimes(block).peakBytes();
      if (peak < best) {
        best = peak;
        if (chosen)
          chosen.erase();
        chosen = work;
      } else {
        work.erase();
      }
    }
    if (!chosen)
      return;
    // Over budget still, tdx-memory-report refuses it with this smallest peak.
    fn.getBody().takeBody(chosen.getBody());
    chosen.erase();
  }
};

} // namespace
