//===- SplitStages.cpp - a training step split into pipeline stages -------===//
//
// The layers of the model are the units a pipeline splits: a state's layer
// is its name up to its first number ("h.3.attn.c_attn.weight" -> "h.3"),
// else its module ("ln_f.weight" -> "ln_f"), in the order the forward
// first reads them. Each layer costs the seconds of the forward ops that
// read it (by the cost model, tdx::opSeconds); the layers are cut into
// `chunks` contiguous runs that minimize the most expensive run (linear
// partition by dynamic programming), every layer in exactly one.
//
// Every op of the step is then given its chunk (`tdx.stage`): a state's
// read and write are its layer's chunk; a forward op runs at the latest
// chunk of what it reads; a backward or update op runs where it moves the
// fewest bytes: what it reads that is not there yet, and its results when
// they only go into one other chunk's state (a weight's gradient goes to
// its parameter's chunk unless its inputs are larger), ties broken toward
// the chunk the gradient flows to. Ops
// that read only the batch and constants get no chunk: each stage that
// needs them makes them itself (tdx-schedule-pipeline).
//
//===----------------------------------------------------------------------===//

#include "PipelineStages.h"
#include "tdx/Target/Lifetimes.h"
#include "tdx/Target/StepMemory.h"
#include "tdx/Transforms/Passes.h"

#include "llvm/ADT/BitVector.h"
#include "llvm/ADT/DenseSet.h"
#include "llvm/ADT/StringMap.h"

#include <limits>
#include <map>
#include <set>

namespace mlir::tdx {
#define GEN_PASS_DEF_SPLITSTAGES
#include "tdx/Transforms/Passes.h.inc"
} // namespace mlir::tdx

using namespace mlir;
using namespace mlir::tdx;

namespace {

/// A state's layer: its name up to its first all-digit part, else its module.
std::string layerOf(StringRef name) {
  SmallVector<StringRef> parts;
  name.split(parts, '.');
  std::string out;
  for (StringRef part : parts) {
    out += (out.empty() ? "" : ".") + part.str();
    if (!part.empty() && llvm::all_of(part, [](char c) { return c >= '0' && c <= '9'; }))
      return out;
  }
  // A parameter of the root module ("weight") is in the root's layer ("").
  size_t dot = name.rfind('.');
  return (dot == StringRef::npos ? StringRef() : name.take_front(dot)).str();
}

/// The state an optimizer state is kept for ("optimizer.<param>.<key>").
std::optional<std::string> optimizedParameter(StringRef name) {
  if (!name.consume_front("optimizer."))
    return std::nullopt;
  size_t dot = name.rfind('.');
  if (dot == StringRef::npos)
    return std::nullopt;
  return name.take_front(dot).str();
}

/// Cuts `costs` into `k` contiguous nonempty runs minimizing the largest
/// run's sum; returns each item's run.
SmallVector<int64_t> linearPartition(ArrayRef<double> costs, int64_t k) {
  int64_t n = costs.size();
  SmallVector<double> prefix(n + 1, 0);
  for (int64_t i = 0; i < n; ++i)
    prefix[i + 1] = prefix[i] + costs[i];
  const double inf = std::numeric_limits<double>::infinity();
  // best[c][i]: the first i items in c runs; cut[c][i]: where the last run starts.
  std::vector<std::vector<double>> best(k + 1, std::vector<double>(n + 1, inf));
  std::vector<std::vector<int64_t>> cut(k + 1, std::vector<int64_t>(n + 1, 0));
  best[0][0] = 0;
  for (int64_t c = 1; c <= k; ++c)
    for (int64_t i = c; i <= n; ++i)
      for (int64_t j = c - 1; j < i; ++j) {
        double v = std::max(best[c - 1][j], prefix[i] - prefix[j]);
        // Ties keep the earliest cut: the same split every time.
        if (v < best[c][i] - 1e-15 * std::abs(best[c][i] == inf ? 0 : best[c][i])) {
          best[c][i] = v;
          cut[c][i] = j;
        }
      }
  SmallVector<int64_t> run(n);
  for (int64_t c = k, i = n; c > 0; --c) {
    int64_t j = cut[c][i];
    for (int64_t t = j; t < i; ++t)
      run[t] = c - 1;
    i = j;
  }
  return run;
}

class SplitStagesPass : public mlir::tdx::impl::SplitStagesBase<SplitStagesPass> {
public:
  void runOnOperation() override {
    ModuleOp module = getOperation();
    if (module->hasAttr(TdxDialect::kPipelineAttrName) &&
        !module->hasAttr(TdxDialect::kPartitionedAttrName)) {
      module.emitError() << getArgument()
                         << ": split stages after tdx-partition (`--tdx-spmd`): it splits the "
                            "per-rank program";
      return signalPassFailure();
    }
    FailureOr<std::optional<Pipelined>> pipelined = pipelinedStep(module, getArgument());
    if (failed(pipelined))
      return signalPassFailure();
    if (!*pipelined)
      return;
    auto &[spec, step] = **pipelined;
    if (failed(checkAxisUnused(module, step, spec)) || failed(split(module, step, spec)))
      return signalPassFailure();
  }

private:
  /// Nothing may be placed on, or communicate over, the pipeline's axis.
  LogicalResult checkAxisUnused(ModuleOp module, func::FuncOp step, PipelineSpec &spec) {
    int64_t axis = spec.mesh.getAxisIndex(spec.axis);
    auto placedOn = [&](ShardingAttr s) {
      return s && axis < static_cast<int64_t>(s.getPlacements().size()) &&
             !s.getPlacements()[axis].isReplicate();
    };
    auto refuse = [&](Operation *op, StringRef what) {
      return op->emitError() << getArgument() << ": " << what << " the pipeline's axis \""
                             << spec.axis
                             << "\"; the stages are on it, so the plan, data_parallel and zero "
                                "must name other axes";
    };
    for (Operation &op : module.getBody()->getOperations())
      if (auto state = dyn_cast<StateOpInterface>(op); state && placedOn(state.getStateSharding()))
        return refuse(&op, "this state is placed on");
    for (int64_t i = 0; i < step.getNumArguments(); ++i)
      if (placedOn(step.getArgAttrOfType<ShardingAttr>(i, TdxDialect::kShardingAttrName)))
        return refuse(step, "an input is placed on");
    WalkResult walk = step.walk([&](Operation *op) {
      if (auto axes = op->getAttrOfType<ArrayAttr>("mesh_axes"))
        for (StringRef a : axes.getAsValueRange<StringAttr>())
          if (a == spec.axis) {
            (void)refuse(op, "this collective communicates over");
            return WalkResult::interrupt();
          }
      return WalkResult::advance();
    });
    return failure(walk.wasInterrupted());
  }

  LogicalResult split(ModuleOp module, func::FuncOp step, PipelineSpec &spec) {
    SymbolTableCollection symbols;
    Block &body = step.getBody().front();
    llvm::SetVector<Operation *> forward = forwardOf(step);
    auto ownerName = [&](Operation *op) -> std::string {
      auto access = cast<StateAccessOpInterface>(op);
      StateOpInterface owner = access.getStateOwner(&symbols);
      return owner ? SymbolTable::getSymbolName(owner).str()
                   : access.getStateRef().getValue().str();
    };

    // The layers, in the order the forward reads them, and their costs.
    SmallVector<std::string> layers;
    llvm::StringMap<int64_t> layerIndex;
    DenseMap<Operation *, int64_t> layerOfOp;
    SmallVector<double> costs;
    for (Operation &op : body) {
      if (!forward.contains(&op))
        continue;
      int64_t layer = -1;
      for (Value v : op.getOperands()) {
        Operation *def = v.getDefiningOp();
        if (!def)
          continue;
        if (isa<ParamRefOp>(def)) {
          std::string name = layerOf(ownerName(def));
          auto [it, added] = layerIndex.try_emplace(name, layers.size());
          if (added) {
            layers.push_back(name);
            costs.push_back(0);
          }
          layer = std::max(layer, it->second);
        } else if (auto it = layerOfOp.find(def); it != layerOfOp.end()) {
          layer = std::max(layer, it->second);
        }
      }
      if (layer < 0 || isa<ParamRefOp>(op))
        continue;
      layerOfOp[&op] = layer;
      costs[layer] += opSeconds(&op);
    }
    int64_t chunks = spec.chunks();
    if (static_cast<int64_t>(layers.size()) < chunks)
      return step.emitError() << getArgument() << ": the step's forward reads " << layers.size()
                              << " layer(s) of parameters, too few for " << chunks
                              << " pipeline stages (" << spec.ranks << " ranks on \""
                              << spec.axis << "\" x stages_per_rank " << spec.stagesPerRank
                              << "); use fewer stages";
    SmallVector<int64_t> runOfLayer = linearPartition(costs, chunks);

    // Each state's chunk: its layer's, an optimizer state its parameter's.
    llvm::StringMap<int64_t> chunkOfState;
    for (Operation &op : module.getBody()->getOperations()) {
      auto state = dyn_cast<StateOpInterface>(op);
      if (!state || state.getTiedState())
        continue;
      StringRef name = SymbolTable::getSymbolName(&op).getValue();
      std::string layer = layerOf(name);
      if (std::optional<std::string> param = optimizedParameter(name))
        layer = layerOf(*param);
      auto it = layerIndex.find(layer);
      if (it == layerIndex.end())
        continue;
      chunkOfState[name] = runOfLayer[it->second];
      op.setAttr(TdxDialect::kStageAttrName,
                 IntegerAttr::get(IntegerType::get(&getContext(), 64), runOfLayer[it->second]));
    }

    // The chunks whose state each op's results go into (a weight's gradient:
    // its parameter's, through the optimizer's update), from the writes back.
    DenseMap<Operation *, llvm::BitVector> into;
    for (Operation &op : llvm::reverse(body)) {
      llvm::BitVector chunks(spec.chunks());
      if (isa<AssignOp>(op)) {
        if (auto it = chunkOfState.find(ownerName(&op)); it != chunkOfState.end())
          chunks.set(it->second);
      } else {
        for (Operation *user : op.getUsers())
          if (auto it = into.find(user); it != into.end())
            chunks |= it->second;
      }
      if (chunks.any())
        into[&op] = std::move(chunks);
    }
    auto soleDestination = [&](Operation *op) -> std::optional<int64_t> {
      auto it = into.find(op);
      if (it == into.end() || it->second.count() != 1)
        return std::nullopt;
      return it->second.find_first();
    };

    // Each op's chunk, in program order.
    DenseMap<Value, int64_t> chunkOf;          // where a value is made
    DenseMap<Value, std::set<int64_t>> heldAt; // and where it is read
    auto i64 = IntegerType::get(&getContext(), 64);
    auto place = [&](Operation *op, int64_t chunk) {
      op->setAttr(TdxDialect::kStageAttrName, IntegerAttr::get(i64, chunk));
      for (Value r : op->getResults()) {
        chunkOf[r] = chunk;
        heldAt[r].insert(chunk);
      }
      for (Value v : op->getOperands())
        if (chunkOf.count(v))
          heldAt[v].insert(chunk);
    };
    for (Operation &op : body) {
      if (isa<func::ReturnOp>(op))
        continue;
      if (isa<ParamRefOp, AssignOp>(op)) {
        auto it = chunkOfState.find(ownerName(&op));
        if (it != chunkOfState.end()) {
          place(&op, it->second);
          continue;
        }
        if (isa<AssignOp>(op))
          return op.emitError() << getArgument() << ": the step writes state '"
                                << ownerName(&op)
                                << "', which no layer of the forward reads, so no pipeline "
                                   "stage holds it";
        continue; // read by every stage that needs it
      }
      SmallVector<Value> staged;
      for (Value v : op.getOperands())
        if (chunkOf.count(v))
          staged.push_back(v);
      if (staged.empty())
        continue; // the batch and constants only: every stage makes it itself
      if (forward.contains(&op)) {
        int64_t chunk = 0;
        for (Value v : staged)
          chunk = std::max(chunk, chunkOf[v]);
        place(&op, chunk);
        continue;
      }
      // Where it moves the fewest bytes: the operands not held there yet,
      // and its results, when they go into the state of one other chunk
      // only (a weight's gradient: made where its parameter lives unless
      // what it reads is larger). Ties toward where the gradient flows
      // (the earliest chunk a backward operand comes from, not before the
      // latest forward value it reads).
      int64_t latestForward = -1, earliestBackward = std::numeric_limits<int64_t>::max();
      std::set<int64_t> candidates;
      for (Value v : staged) {
        candidates.insert(heldAt[v].begin(), heldAt[v].end());
        Operation *def = v.getDefiningOp();
        if (def && forward.contains(def))
          latestForward = std::max(latestForward, chunkOf[v]);
        else
          earliestBackward = std::min(earliestBackward, chunkOf[v]);
      }
      std::optional<int64_t> into = soleDestination(&op);
      if (into)
        candidates.insert(*into);
      int64_t prefer = earliestBackward == std::numeric_limits<int64_t>::max()
                           ? latestForward
                           : std::max(latestForward, earliestBackward);
      int64_t chunk = -1, least = std::numeric_limits<int64_t>::max();
      for (int64_t c : candidates) {
        int64_t moved = 0;
        for (Value v : staged)
          if (!heldAt[v].count(c))
            moved += tensorBytes(v);
        if (into && *into != c)
          for (Value r : op.getResults())
            moved += tensorBytes(r);
        if (moved < least || (moved == least && std::abs(c - prefer) < std::abs(chunk - prefer)))
          chunk = c, least = moved;
      }
      place(&op, chunk);
    }

    // What the split is, for tdx-schedule-pipeline, the plan page and tests.
    MLIRContext *ctx = &getContext();
    SmallVector<SmallVector<Attribute>> names(chunks);
    SmallVector<double> seconds(chunks, 0);
    for (auto [i, layer] : llvm::enumerate(layers)) {
      names[runOfLayer[i]].push_back(StringAttr::get(ctx, layer));
      seconds[runOfLayer[i]] += costs[i];
    }
    SmallVector<Attribute> stages;
    for (auto &n : names)
      stages.push_back(ArrayAttr::get(ctx, n));
    NamedAttrList entries(module->getAttrOfType<DictionaryAttr>(TdxDialect::kPipelineAttrName));
    entries.set("stages", ArrayAttr::get(ctx, stages));
    entries.set("chunk_seconds", DenseF64ArrayAttr::get(ctx, seconds));
    entries.set("layer_seconds", DenseF64ArrayAttr::get(ctx, costs));
    module->setAttr(TdxDialect::kPipelineAttrName, entries.getDictionary(ctx));
    return success();
  }
};

} // namespace
