//===- SchedulePipeline.cpp - each pipeline rank's step, in schedule order -===//
//
// After tdx-split-stages gave every op of the step its chunk, each rank of
// the pipeline axis gets a function of its own, @train_step_pp<r>, with the
// step's signature: the ops of its chunks (chunk c runs on rank c mod the
// axis size), in the order its schedule runs them, and a tdx.send where a
// value it makes is read on another rank (right after it is made) and a
// tdx.recv where it reads one made elsewhere (right before it is first
// read). Ops that read only the batch and constants are made by each rank
// that reads them. The loss reaches every rank.
//
// The work is cut into tasks: the forward (F) or backward (B) of one chunk
// on one micro-batch (a micro-batch is what reads slice i of the stacked
// batch, trace_train_step's accumulation_steps); the rest (summing the
// micro-batches' gradients and losses, the optimizer's update) runs on
// each rank as soon as what it reads is there. Each rank's tasks come in
// its schedule's order:
//
//   gpipe             every F, then every B
//   1f1b              p - r - 1 F's, then one F and one B in turn, then B's
//   interleaved-1f1b  Megatron's: v chunks per rank, F's in rounds of p
//                     micro-batches over the chunks, 1F1B after a warm-up
//                     of 2 (p - r - 1) + (v - 1) p
//
// The tasks are timed by the cost model (a task waits for the one before
// it on its rank and the one it reads from), and every rank's ops are laid
// out in that one global order, so a recv never waits for a send that a
// rank could only make after the recv (sends never wait); each rank
// receives from a peer in the order the peer sends. The timeline is
// kept in `tdx.pipeline`'s `timeline` for the plan page.
//
//===----------------------------------------------------------------------===//

#include "PipelineStages.h"
#include "tdx/Target/Lifetimes.h"
#include "tdx/Target/StepMemory.h"
#include "tdx/Transforms/Passes.h"

#include "mlir/IR/Builders.h"
#include "mlir/IR/IRMapping.h"
#include "llvm/ADT/DenseSet.h"

#include <map>
#include <set>
#include <tuple>

namespace mlir::tdx {
#define GEN_PASS_DEF_SCHEDULEPIPELINE
#include "tdx/Transforms/Passes.h.inc"
} // namespace mlir::tdx

using namespace mlir;
using namespace mlir::tdx;

namespace {

/// Moves each recv of `fn` before the earlier recvs from its peer that have
/// a later tag, so a rank receives from each peer in the order the peer
/// sends (tags are given in send order). NCCL matches a pair's messages
/// in order, not by tag; MPI is indifferent. A recv reads nothing, and a
/// recv moved earlier still follows its send in the global order.
void receiveInSendOrder(func::FuncOp fn) {
  std::map<int64_t, SmallVector<RecvOp>> fromPeer;
  fn.walk([&](RecvOp recv) {
    SmallVector<RecvOp> &seen = fromPeer[recv.getPeer()];
    auto later = llvm::find_if(seen, [&](RecvOp o) { return o.getTag() > recv.getTag(); });
    if (later != seen.end())
      recv->moveBefore(*later);
    seen.insert(later, recv);
  });
}

/// A task's part of a chunk's work on a micro-batch: its forward, its
/// backward (with the zero-bubble schedule, the gradients of its inputs
/// only), and its weights' gradients (zero bubble's W).
enum Phase : int64_t { Forward = 0, Backward = 1, Weights = 2 };

struct Task {
  int64_t phase, chunk, microbatch;
  bool operator<(const Task &o) const {
    return std::tie(phase, chunk, microbatch) < std::tie(o.phase, o.chunk, o.microbatch);
  }
};

/// Rank `r`'s tasks in the order its schedule runs them.
SmallVector<Task> scheduleOf(PipelineSpec &spec, int64_t r) {
  int64_t p = spec.ranks, m = spec.microbatches, v = spec.stagesPerRank;
  SmallVector<Task> out;
  if (spec.schedule == "zb-h1") {
    // Zero bubble (ZB-H1): 1F1B's order of F and B, each rank's weight
    // gradients (W) p - r - 1 micro-batches behind its B's, the rest of
    // them after its last B, where 1F1B idles.
    int64_t warmup = std::min(p - r - 1, m), lag = p - r - 1, w = 0;
    for (int64_t i = 0; i < warmup; ++i)
      out.push_back({Forward, r, i});
    for (int64_t i = 0; i < m - warmup; ++i) {
      out.push_back({Forward, r, warmup + i});
      out.push_back({Backward, r, i});
      if (i >= lag)
        out.push_back({Weights, r, w++});
    }
    for (int64_t i = m - warmup; i < m; ++i) {
      out.push_back({Backward, r, i});
      if (i >= lag)
        out.push_back({Weights, r, w++});
    }
    while (w < m)
      out.push_back({Weights, r, w++});
    return out;
  }
  if (spec.schedule == "gpipe") {
    for (int64_t i = 0; i < m; ++i)
      out.push_back({Forward, r, i});
    for (int64_t i = 0; i < m; ++i)
      out.push_back({Backward, r, i});
    return out;
  }
  int64_t total = m * v;
  auto forward = [&](int64_t i) -> Task {
    if (v == 1)
      return {Forward, r, i};
    int64_t k = (i / p) % v, mb = (i / (p * v)) * p + i % p;
    return {Forward, k * p + r, mb};
  };
  auto backward = [&](int64_t i) -> Task {
    if (v == 1)
      return {Backward, r, i};
    int64_t k = v - 1 - (i / p) % v, mb = (i / (p * v)) * p + i % p;
    return {Backward, k * p + r, mb};
  };
  int64_t warmup = v == 1 ? p - r - 1 : 2 * (p - r - 1) + (v - 1) * p;
  warmup = std::min(warmup, total);
  for (int64_t i = 0; i < warmup; ++i)
    out.push_back(forward(i));
  for (int64_t i = 0; i < total - warmup; ++i) {
    out.push_back(forward(warmup + i));
    out.push_back(backward(i));
  }
  for (int64_t i = total - warmup; i < total; ++i)
    out.push_back(backward(i));
  return out;
}

class SchedulePipelinePass : public mlir::tdx::impl::SchedulePipelineBase<SchedulePipelinePass> {
public:
  void runOnOperation() override {
    ModuleOp module = getOperation();
    FailureOr<std::optional<Pipelined>> pipelined = pipelinedStep(module, getArgument());
    if (failed(pipelined))
      return signalPassFailure();
    if (*pipelined && failed(schedule(module, (*pipelined)->step, (*pipelined)->spec)))
      return signalPassFailure();
  }

private:
  /// Each op's micro-batch: the slice of the stacked batch it reads, -1
  /// none, -2 several.
  DenseMap<Operation *, int64_t> microbatches(Block &body, PipelineSpec &spec) {
    DenseMap<Operation *, int64_t> mb;
    bool stacked = spec.microbatches > 1;
    for (Operation &op : body) {
      int64_t m = -1;
      if (auto slice = dyn_cast<SliceOp>(op);
          stacked && slice && isa<BlockArgument>(slice.getInput()) && slice.getDim() == 0 &&
          slice.getEnd() == slice.getStart() + 1) {
        m = slice.getStart();
      } else {
        for (Value v : op.getOperands()) {
          Operation *def = v.getDefiningOp();
          int64_t o = def ? mb.lookup(def) : -1;
          if (o == -1 || o == m)
            continue;
          m = m == -1 ? o : -2;
        }
      }
      // One micro-batch: every staged op is its.
      mb[&op] = stacked ? m : (stageOf(&op) ? 0 : -1);
    }
    return mb;
  }

  LogicalResult schedule(ModuleOp module, func::FuncOp step, PipelineSpec &spec) {
    MLIRContext *ctx = &getContext();
    Block &body = step.getBody().front();
    for (Operation &op : body)
      if (auto chunk = stageOf(&op); chunk && *chunk >= spec.chunks())
        return op.emitError() << getArgument() << ": chunk " << *chunk << " of "
                              << spec.chunks() << "; run tdx-split-stages first";
    if (llvm::none_of(body, [](Operation &op) { return stageOf(&op).has_value(); }))
      return step.emitError() << getArgument()
                              << ": no op of the step has a stage; run tdx-split-stages first";
    int64_t p = spec.ranks;
    llvm::SetVector<Operation *> forward = forwardOf(step);
    DenseMap<Operation *, int64_t> mb = microbatches(body, spec);

    // Zero bubble splits a micro-batch's backward: B is what reads a
    // parameter (an input's gradient, g W^T; a norm's backward) and what
    // those need; the rest, the weights' gradients (x^T g, a bias's sum, an
    // embedding's scatter), is W.
    DenseSet<Operation *> weights;
    if (spec.schedule == "zb-h1") {
      DenseSet<Operation *> inputs;
      for (Operation &op : llvm::reverse(body)) {
        if (forward.contains(&op) || mb.lookup(&op) < 0 || !stageOf(&op) ||
            isa<ParamRefOp>(op))
          continue;
        // What does not depend on the batch is a parameter or made from one.
        bool readsParameter = llvm::any_of(op.getOperands(), [&](Value v) {
          Operation *def = v.getDefiningOp();
          return def && stageOf(def) && mb.lookup(def) == -1;
        });
        if (readsParameter || llvm::any_of(op.getUsers(), [&](Operation *user) {
              return inputs.contains(user);
            }))
          inputs.insert(&op);
        else
          weights.insert(&op);
      }
    }
    // The tasks and their ops; what is in no task runs when it can.
    std::map<Task, SmallVector<Operation *>> opsOf;
    std::map<Task, double> seconds;
    for (Operation &op : body) {
      std::optional<int64_t> chunk = stageOf(&op);
      int64_t m = mb.lookup(&op);
      if (!chunk || m < 0 || isa<ParamRefOp>(op))
        continue;
      Task t{forward.contains(&op) ? Forward : weights.contains(&op) ? Weights : Backward,
             *chunk, m};
      opsOf[t].push_back(&op);
      seconds[t] += opSeconds(&op);
    }

    // The schedule, timed: a task starts when its rank is free and what it
    // reads is done.
    SmallVector<SmallVector<Task>> order;
    for (int64_t r = 0; r < p; ++r)
      order.push_back(scheduleOf(spec, r));
    std::map<Task, double> finish;
    std::vector<std::tuple<double, int64_t, int64_t, Task, double>> timed; // start, rank, i
    SmallVector<size_t> next(p, 0);
    SmallVector<double> freeAt(p, 0);
    int64_t last = spec.chunks() - 1;
    for (size_t all = 0; all < static_cast<size_t>(p);) {
      bool moved = false;
      all = 0;
      for (int64_t r = 0; r < p; ++r) {
        if (next[r] == order[r].size()) {
          ++all;
          continue;
        }
        Task t = order[r][next[r]];
        SmallVector<Task> needs;
        if (t.phase == Forward && t.chunk > 0)
          needs.push_back({Forward, t.chunk - 1, t.microbatch});
        if (t.phase == Weights)
          needs.push_back({Backward, t.chunk, t.microbatch});
        if (t.phase == Backward) {
          needs.push_back({Forward, t.chunk, t.microbatch});
          if (t.chunk < last)
            needs.push_back({Backward, t.chunk + 1, t.microbatch});
        }
        double start = freeAt[r];
        bool ready = true;
        for (const Task &n : needs) {
          auto it = finish.find(n);
          if (it == finish.end()) {
            ready = false;
            break;
          }
          start = std::max(start, it->second);
        }
        if (!ready)
          continue;
        // A task's seconds, at least a tick so empty tasks keep their order.
        double d = std::max(seconds[t], 1e-9);
        finish[t] = freeAt[r] = start + d;
        timed.push_back({start, r, static_cast<int64_t>(next[r]), t, d});
        ++next[r];
        moved = true;
      }
      if (!moved && all < static_cast<size_t>(p))
        return step.emitError() << getArgument() << ": the " << spec.schedule
                                << " schedule waits on itself (a bug in tdx's schedule)";
    }
    llvm::sort(timed, [](auto &a, auto &b) {
      return std::make_tuple(std::get<0>(a), std::get<1>(a), std::get<2>(a)) <
             std::make_tuple(std::get<0>(b), std::get<1>(b), std::get<2>(b));
    });

    // Who reads each staged value.
    auto rankOf = [&](Operation *op) { return *stageOf(op) % p; };
    DenseMap<Value, std::set<int64_t>> readers;
    for (Operation &op : body)
      for (Value v : op.getOperands()) {
        Operation *def = v.getDefiningOp();
        if (!def || !stageOf(def))
          continue;
        if (isa<func::ReturnOp>(op))
          for (int64_t r = 0; r < p; ++r)
            readers[v].insert(r);
        else if (stageOf(&op))
          readers[v].insert(rankOf(&op));
      }

    // One function per rank.
    OpBuilder b(ctx);
    b.setInsertionPoint(step);
    SmallVector<func::FuncOp> fns;
    SmallVector<IRMapping> maps(p);
    SmallVector<OpBuilder> at;
    for (int64_t r = 0; r < p; ++r) {
      auto fn = cast<func::FuncOp>(b.cloneWithoutRegions(*step.getOperation()));
      fn.setSymName((step.getSymName() + "_pp" + std::to_string(r)).str());
      Block *block = fn.addEntryBlock();
      for (auto [from, to] : llvm::zip(body.getArguments(), block->getArguments()))
        maps[r].map(from, to);
      fns.push_back(fn);
      at.push_back(OpBuilder::atBlockEnd(block));
    }
    auto meshRef = FlatSymbolRefAttr::get(spec.mesh.getSymNameAttr());
    auto axes = b.getStrArrayAttr({spec.axis});
    int64_t tags = 0;
    DenseMap<std::pair<Value, int64_t>, int64_t> tagOf; // (value, reader) -> tag
    DenseSet<Operation *> emitted;
    // Emits `op` on its rank, after what it reads; sends its results.
    std::function<Value(Value, int64_t)> ensure;
    std::function<void(Operation *)> emit = [&](Operation *op) {
      if (!emitted.insert(op).second)
        return;
      int64_t r = rankOf(op);
      for (Value v : op->getOperands())
        ensure(v, r);
      Operation *copy = at[r].clone(*op, maps[r]);
      (void)copy;
      for (Value v : op->getResults())
        for (int64_t reader : readers.lookup(v)) {
          if (reader == r)
            continue;
          int64_t tag = tags++;
          tagOf[{v, reader}] = tag;
          SendOp::create(at[r], op->getLoc(), maps[r].lookup(v), meshRef, axes,
                         b.getI64IntegerAttr(reader), b.getI64IntegerAttr(tag));
        }
    };
    // `v` on rank `r`: made there, received, or (read only from the batch
    // and constants) made there for itself.
    ensure = [&](Value v, int64_t r) -> Value {
      if (Value have = maps[r].lookupOrNull(v))
        return have;
      Operation *def = v.getDefiningOp();
      if (!stageOf(def)) {
        for (Value o : def->getOperands())
          ensure(o, r);
        at[r].clone(*def, maps[r]);
        return maps[r].lookup(v);
      }
      emit(def);
      if (Value have = maps[r].lookupOrNull(v))
        return have;
      auto recv = RecvOp::create(at[r], def->getLoc(), v.getType(), meshRef, axes,
                                 b.getI64IntegerAttr(rankOf(def)),
                                 b.getI64IntegerAttr(tagOf.lookup({v, r})));
      maps[r].map(v, recv.getResult());
      return recv.getResult();
    };
    // The rest of each rank's ops, in program order: emitted once all they
    // read is made on their rank.
    SmallVector<SmallVector<Operation *>> rest(p);
    for (Operation &op : body)
      if (stageOf(&op) && !isa<ParamRefOp>(op) && mb.lookup(&op) < 0)
        rest[rankOf(&op)].push_back(&op);
    SmallVector<size_t> restFrom(p, 0);
    auto runRest = [&](int64_t r) {
      for (size_t i = restFrom[r]; i < rest[r].size(); ++i) {
        Operation *op = rest[r][i];
        if (emitted.contains(op))
          continue;
        bool local = llvm::all_of(op->getOperands(), [&](Value v) {
          Operation *def = v.getDefiningOp();
          return !def || !stageOf(def) ||
                 (rankOf(def) == r && (isa<ParamRefOp>(def) || emitted.contains(def)));
        });
        if (local)
          emit(op);
      }
      while (restFrom[r] < rest[r].size() && emitted.contains(rest[r][restFrom[r]]))
        ++restFrom[r];
    };
    SmallVector<Attribute> timeline;
    for (auto &[start, r, i, task, d] : timed) {
      for (Operation *op : opsOf[task])
        emit(op);
      runRest(r);
      timeline.push_back(DenseF64ArrayAttr::get(
          ctx, {static_cast<double>(r), static_cast<double>(task.phase),
                static_cast<double>(task.chunk), static_cast<double>(task.microbatch), start,
                start + d}));
    }
    for (Operation &op : body)
      if (stageOf(&op) && !isa<ParamRefOp>(op))
        emit(&op);
    Operation *ret = body.getTerminator();
    for (int64_t r = 0; r < p; ++r) {
      SmallVector<Value> results;
      for (Value v : ret->getOperands())
        results.push_back(ensure(v, r));
      func::ReturnOp::create(at[r], ret->getLoc(), results);
    }

    for (func::FuncOp fn : fns)
      receiveInSendOrder(fn);

    SmallVector<Attribute> names;
    for (func::FuncOp fn : fns)
      names.push_back(FlatSymbolRefAttr::get(fn.getSymNameAttr()));
    step.erase();
    NamedAttrList entries(module->getAttrOfType<DictionaryAttr>(TdxDialect::kPipelineAttrName));
    entries.set("functions", ArrayAttr::get(ctx, names));
    entries.set("timeline", ArrayAttr::get(ctx, timeline));
    module->setAttr(TdxDialect::kPipelineAttrName, entries.getDictionary(ctx));
    return success();
  }
};

} // namespace
