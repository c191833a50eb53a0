//===- Lifetimes.cpp - where the step's tensors live and die --------------===//

#include "tdx/Target/Lifetimes.h"
#include "tdx/Sharding/Layout.h"

#include "mlir/Dialect/Func/IR/FuncOps.h"

#include <algorithm>
#include <map>
#include <vector>

using namespace mlir;
using namespace mlir::tdx;

bool mlir::tdx::isView(Operation *op) {
  return isa<ReshapeOp, TransposeOp, PermuteOp, SliceOp, ExpandOp>(op);
}

int64_t mlir::tdx::tensorBytes(Value v) {
  auto t = dyn_cast<RankedTensorType>(v.getType());
  return t && t.hasStaticShape() ? t.getNumElements() * elementBytes(t.getElementType()) : 0;
}

SmallVector<Value> mlir::tdx::allocatedTensors(Operation *op) {
  if (auto start = dyn_cast<StartOp>(op))
    return {start.getCollective()->getResult(0)};
  return SmallVector<Value>(op->getResults());
}

Lifetimes::Lifetimes(Block &block) {
  DenseSet<Value> kept(block.getArguments().begin(), block.getArguments().end());
  DenseMap<Value, Operation *> last;
  SmallVector<Value> made;
  std::map<std::string, SmallVector<AssignOp>> assigns;
  std::map<std::string, SmallVector<ParamRefOp>> refs;
  for (Operation &op : block) {
    if (auto a = dyn_cast<AssignOp>(op))
      assigns[a.getStateName().str()].push_back(a);
    if (isa<AssignOp, func::ReturnOp>(op)) {
      kept.insert(op.operand_begin(), op.operand_end());
      continue;
    }
    if (auto r = dyn_cast<ParamRefOp>(op))
      refs[r.getStateName().str()].push_back(r);
    // A started collective reads its input at the start; its result, made
    // there, is the value its wait gives.
    SmallVector<Value> reads(op.getOperands()), results(op.getResults());
    if (auto start = dyn_cast<StartOp>(op)) {
      reads.assign(start.getCollective()->operand_begin(), start.getCollective()->operand_end());
      results.clear();
      if (WaitOp wait = start.getWait())
        results.push_back(wait.getResult());
    } else if (isa<WaitOp>(op)) {
      results.clear();
    }
    position[&op] = static_cast<int64_t>(points.size());
    points.push_back(&op);
    for (Value v : reads)
      last[v] = &op;
    resultsAt[&op].assign(results.begin(), results.end());
    for (Value v : results) {
      last[v] = &op; // a result nobody reads ends where it is made
      madeAt[v] = position[&op];
      made.push_back(v);
    }
  }
  // A started reduce_scatter's or all_gather's input is read until its
  // wait; a collective whose result nothing reads is waited for before the
  // return, and its input and result live to the end.
  for (Operation *op : points)
    if (auto start = dyn_cast<StartOp>(op)) {
      WaitOp wait = start.getWait();
      if (!wait)
        continue;
      Value input = start.getCollective()->getOperand(0);
      if (wait.getResult().use_empty()) {
        unread.insert(wait.getResult());
        if (isa<ReduceScatterOp, AllGatherOp>(start.getCollective()))
          kept.insert(input);
      } else if (isa<ReduceScatterOp, AllGatherOp>(start.getCollective()) &&
                 position.lookup(wait) > position.lookup(last[input])) {
        last[input] = wait;
      }
    }
  for (Value v : made)
    if (!kept.contains(v) && !unread.contains(v))
      ending[last[v]].push_back(v);
  plan(made, kept, last, assigns, refs);
}

void Lifetimes::plan(ArrayRef<Value> made, const DenseSet<Value> &kept,
                     DenseMap<Value, Operation *> &last,
                     std::map<std::string, SmallVector<AssignOp>> &assigns,
                     std::map<std::string, SmallVector<ParamRefOp>> &refs) {
  int64_t end = static_cast<int64_t>(points.size());
  // The tensor whose storage each value uses (null: not the step's, or a
  // state's), and where that storage is last needed.
  DenseMap<Value, Value> root;
  DenseMap<Value, int64_t> until;
  DenseMap<Value, std::string> stateOf; // param_ref results and views of them
  std::map<std::string, int64_t> lastStateRead;
  for (Value v : made) {
    Operation *def = v.getDefiningOp();
    if (auto r = dyn_cast<ParamRefOp>(def))
      stateOf[v] = r.getStateName().str();
    else if (isView(def) && stateOf.count(def->getOperand(0)))
      stateOf[v] = stateOf[def->getOperand(0)];
    if (auto it = stateOf.find(v); it != stateOf.end())
      lastStateRead[it->second] = std::max(lastStateRead[it->second], position.lookup(last[v]));
    Value r = stateOf.count(v) ? Value() : isView(def) ? root.lookup(def->getOperand(0)) : v;
    root[v] = r;
    if (r)
      until[r] = std::max(until.lookup(r), kept.contains(v) ? end : position.lookup(last[v]));
  }
  std::vector<int64_t> grow(end + 1, 0), shrink(end + 1, 0);
  for (Value v : made)
    if (root.lookup(v) == v) {
      grow[madeAt.lookup(v)] += tensorBytes(v);
      shrink[until.lookup(v)] += tensorBytes(v);
    }
  for (auto &[key, ops] : assigns) {
    Value value = ops.front().getValue();
    Operation *maker = value.getDefiningOp();
    if (ops.size() != 1 || !maker || isa<WaitOp>(maker) || !madeAt.count(value)) {
      for (AssignOp a : ops)
        atReturn.push_back(a);
      continue;
    }
    int64_t at = madeAt.lookup(value);
    for (ParamRefOp r : refs[key])
      at = std::max(at, position.lookup(r));
    writes[points[at]].push_back(ops.front());
    // The old tensor (of the state's type, the value's) goes with its
    // last handle.
    shrink[std::max(at, lastStateRead.count(key) ? lastStateRead[key] : at)] += tensorBytes(value);
  }
  int64_t live = 0;
  for (int64_t i = 0; i <= end; ++i) {
    live += grow[i];
    curve.push_back(live);
    if (live > peak)
      peak = live, peakAt = i;
    live -= shrink[i];
  }
  for (Value v : made)
    if (root.lookup(v) == v && tensorBytes(v) > 0 && madeAt.lookup(v) <= peakAt &&
        until.lookup(v) >= peakAt)
      peakLive.push_back({v, tensorBytes(v)});
  assignOffsets(made, kept, last, root, until);
}

struct Lifetimes::Planned {
  Value value;
  int64_t bytes, from, to, offset = 0;
};

void Lifetimes::assignOffsets(ArrayRef<Value> made, const DenseSet<Value> &kept,
                              DenseMap<Value, Operation *> &last,
                              const DenseMap<Value, Value> &root,
                              const DenseMap<Value, int64_t> &until) {
  int64_t end = static_cast<int64_t>(points.size());
  std::vector<Planned> planned;
  for (Value v : made) {
    int64_t bytes = (tensorBytes(v) + 63) / 64 * 64;
    if (root.lookup(v) != v || bytes == 0 || until.lookup(v) >= end || kept.contains(v) ||
        unread.contains(v))
      continue;
    planned.push_back({v, bytes, madeAt.lookup(v), until.lookup(v)});
  }
  std::vector<size_t> order(planned.size());
  for (size_t i = 0; i < order.size(); ++i)
    order[i] = i;
  std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) {
    return planned[a].bytes != planned[b].bytes ? planned[a].bytes > planned[b].bytes
                                                : planned[a].from < planned[b].from;
  });
  std::vector<const Planned *> done, overlapping;
  for (size_t i : order) {
    Planned &t = planned[i];
    overlapping.clear();
    for (const Planned *o : done)
      if (o->from <= t.to && t.from <= o->to)
        overlapping.push_back(o);
    llvm::sort(overlapping, [](const Planned *a, const Planned *b) { return a->offset < b->offset; });
    for (const Planned *o : overlapping) {
      if (t.offset + t.bytes <= o->offset)
        break;
      t.offset = std::max(t.offset, o->offset + o->bytes);
    }
    arena = std::max(arena, t.offset + t.bytes);
    done.push_back(&t);
  }
  DenseMap<Value, int64_t> offsetOf;
  for (const Planned &t : planned)
    offsetOf[t.value] = t.offset;
  // Every result, so the runtime matches allocations to results in
  // order: one the plan leaves out has offset -1.
  for (Operation *op : points) {
    SmallVector<int64_t> here;
    bool any = false;
    for (Value v : resultsAt.lookup(op)) {
      auto it = offsetOf.find(v);
      any |= it != offsetOf.end();
      here.push_back(it != offsetOf.end() ? it->second : -1);
    }
    if (any)
      offsets[op] = std::move(here);
  }
}

