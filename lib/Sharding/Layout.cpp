//===- Layout.cpp - local shapes, costs and redistribution plans ----------===//

#include "tdx/Sharding/Layout.h"

#include <cmath>
#include <iterator>
#include <limits>

using namespace mlir;
using namespace mlir::tdx;

Layout mlir::tdx::replicatedLayout(MLIRContext *ctx, int64_t rank) {
  return Layout(rank, PlacementAttr::replicate(ctx));
}

Layout mlir::tdx::layoutOf(ShardingAttr sharding) {
  return Layout(sharding.getPlacements().begin(), sharding.getPlacements().end());
}

ShardingAttr mlir::tdx::shardingOf(MeshOp mesh, ArrayRef<PlacementAttr> layout) {
  return ShardingAttr::get(mesh.getContext(),
                           FlatSymbolRefAttr::get(mesh.getSymNameAttr()), layout);
}

std::string mlir::tdx::layoutToString(ArrayRef<PlacementAttr> layout) {
  std::string s;
  llvm::raw_string_ostream os(s);
  os << "[";
  for (auto [i, p] : llvm::enumerate(layout)) {
    if (i)
      os << ", ";
    switch (p.getKind()) {
    case PlacementKind::Shard:
      os << "Shard(" << p.getDim() << ")";
      break;
    case PlacementKind::Replicate:
      os << "Replicate";
      break;
    case PlacementKind::Partial:
      os << "Partial(" << stringifyReduceKind(p.getReduce()) << ")";
      break;
    }
  }
  os << "]";
  return s;
}


int64_t mlir::tdx::localBytes(RankedTensorType global, ArrayRef<PlacementAttr> layout,
                              ArrayRef<int64_t> meshShape) {
  int64_t elements = 1;
  for (int64_t d = 0; d < global.getRank(); ++d) {
    int64_t size = global.getDimSize(d);
    if (ShapedType::isDynamic(size))
      return -1;
    elements *= chunkSize(size, shardGroupsOfDim(layout, meshShape, d)).max;
  }
  return elements * elementBytes(global.getElementType());
}

double mlir::tdx::collectiveSeconds(StringRef kind, int64_t bytes, int64_t groupSize,
                                    double bandwidth, double latency, double call) {
  if (groupSize <= 1)
    return 0.0;
  double n = static_cast<double>(std::max<int64_t>(bytes, 0)), g = static_cast<double>(groupSize);
  if (kind == "all_gather")
    return call + (g - 1) * latency + (g - 1) * n / bandwidth;
  if (kind == "all_reduce")
    return call + 2 * (g - 1) * latency + 2 * (g - 1) / g * n / bandwidth;
  if (kind == "send" || kind == "recv" || kind == "collective_permute")
    return call + latency + n / bandwidth;
  return call + (g - 1) * latency + (g - 1) / g * n / bandwidth; // reduce_scatter, ...
}

CostModel CostModel::uniform(int64_t rank, double bandwidth, double latency) {
  CostModel c;
  c.bandwidth.assign(rank, bandwidth);
  c.latency.assign(rank, latency);
  return c;
}

FailureOr<CostModel> CostModel::fromOptions(MeshOp mesh, ArrayRef<double> bandwidth,
                                            ArrayRef<double> latency, double flops,
                                            double secondsPerByteHeld) {
  int64_t rank = mesh.getShape().size();
  CostModel c = uniform(rank);
  auto fill = [&](ArrayRef<double> given, SmallVectorImpl<double> &out,
                  StringRef name, bool allowZero) -> LogicalResult {
    if (given.empty())
      return success();
    if (given.size() != 1 && static_cast<int64_t>(given.size()) != rank)
      return mesh.emitError() << "the '" << name << "' option has " << given.size()
                              << " values but mesh "
                              << FlatSymbolRefAttr::get(mesh.getSymNameAttr())
                              << " has " << rank << " axes; give one per axis or one for all";
    for (auto [i, v] : llvm::enumerate(out)) {
      v = given.size() == 1 ? given[0] : given[i];
      if (!(v > 0 || (allowZero && v == 0)) || !std::isfinite(v))
        return mesh.emitError() << "the '" << name << "' option must be "
                                << (allowZero ? "non-negative" : "positive") << ", got " << v;
    }
    return success();
  };
  if (failed(fill(bandwidth, c.bandwidth, "bandwidth", false)) ||
      failed(fill(latency, c.latency, "latency", true)))
    return failure();
  if (!(flops > 0))
    return mesh.emitError() << "the 'flops' option must be positive, got " << flops;
  c.flopsPerSecond = flops;
  if (!(secondsPerByteHeld >= 0) || !std::isfinite(secondsPerByteHeld))
    return mesh.emitError() << "the 'memory' option must be non-negative, got "
                            << secondsPerByteHeld;
  c.secondsPerByteHeld = secondsPerByteHeld;
  return c;
}

StringRef mlir::tdx::stringifyStepKind(StepKind kind) {
  // In StepKind's order.
  static constexpr const char *kNames[] = {"all_gather",  "all_reduce", "reduce_scatter",
                                           "all_to_all",  "local_chunk", "local_zero",
                                           "local_noop"};
  static_assert(std::size(kNames) == static_cast<size_t>(StepKind::LocalNoop) + 1,
                "a StepKind without a name");
  return kNames[static_cast<size_t>(kind)];
}

SmallVector<AxisStep> mlir::tdx::axisSteps(PlacementAttr from, PlacementAttr to) {
  MLIRContext *ctx = from.getContext();
  PlacementAttr rep = PlacementAttr::replicate(ctx);
  auto fromReplicate = [&](PlacementAttr t) -> AxisStep {
    if (t.isShard())
      return {rep, t, StepKind::LocalChunk};
    return {rep, t,
            t.getReduce() == ReduceKind::Sum ? StepKind::LocalZero : StepKind::LocalNoop};
  };
  if (from == to)
    return {};
  if (from.isReplicate())
    return {fromReplicate(to)};
  if (from.isShard()) {
    if (to.isReplicate())
      return {{from, to, StepKind::AllGather}};
    if (to.isShard())
      return {{from, to, StepKind::AllToAll}};
    return {{from, rep, StepKind::AllGather}, fromReplicate(to)};
  }
  // from is Partial.
  if (to.isReplicate())
    return {{from, to, StepKind::AllReduce}};
  if (to.isShard() && from.getReduce() != ReduceKind::Avg)
    return {{from, to, StepKind::ReduceScatter}};
  return {{from, rep, StepKind::AllReduce}, fromReplicate(to)};
}

namespace {

bool innermostForDim(ArrayRef<PlacementAttr> layout, int64_t axis, int64_t dim) {
  for (int64_t m = axis + 1; m < static_cast<int64_t>(layout.size()); ++m)
    if (layout[m].isShard() && layout[m].getDim() == dim)
      return false;
  return true;
}

/// Whether applying `t` on `axis` keeps the nesting of shards valid.
bool validStep(ArrayRef<PlacementAttr> layout, int64_t axis, const AxisStep &t) {
  if (t.from.isShard() && !innermostForDim(layout, axis, t.from.getDim()))
    return false;
  if (t.to.isShard() && !innermostForDim(layout, axis, t.to.getDim()))
    return false;
  return true;
}

double stepSeconds(StepKind kind, int64_t bytesIn, int64_t bytesOut, int64_t k, double bw,
                   double lat, double call, double memBw) {
  switch (kind) {
  case StepKind::AllGather:
  case StepKind::AllReduce:
  case StepKind::ReduceScatter:
  case StepKind::AllToAll:
    return collectiveSeconds(stringifyStepKind(kind), bytesIn, k, bw, lat, call);
  case StepKind::LocalChunk:
    return k <= 1 ? 0.0 : static_cast<double>(bytesOut) / memBw;
  case StepKind::LocalZero:
    return k <= 1 ? 0.0 : static_cast<double>(bytesIn) / memBw;
  case StepKind::LocalNoop:
    return 0.0;
  }
  return 0.0;
}

struct Planner {
  RankedTensorType global;
  ArrayRef<int64_t> meshShape;
  const CostModel &cost;
  SmallVector<SmallVector<AxisStep>> pending; // per axis, remaining steps
  SmallVector<RedistributionStep> current, best;
  double bestSeconds = std::numeric_limits<double>::infinity();

  void search(Layout &layout, double seconds) {
    if (seconds >= bestSeconds)
      return;
    bool done = true;
    for (int64_t axis = 0; axis < static_cast<int64_t>(pending.size()); ++axis) {
      if (pending[axis].empty())
        continue;
      done = false;
      AxisStep t = pending[axis].front();
      if (!validStep(layout, axis, t))
        continue;
      int64_t bytesIn = localBytes(global, layout, meshShape);
      layout[axis] = t.to;
      int64_t bytesOut = localBytes(global, layout, meshShape);
      double s = stepSeconds(t.kind, bytesIn, bytesOut, meshShape[axis],
                             cost.bandwidth[axis], cost.latency[axis], cost.callSeconds,
                             cost.memoryBandwidth);
      pending[axis].erase(pending[axis].begin());
      current.push_back({axis, t.from, t.to, t.kind, bytesIn, s});
      search(layout, seconds + s);
      current.pop_back();
      pending[axis].insert(pending[axis].begin(), t);
      layout[axis] = t.from;
    }
    if (done && seconds < bestSeconds) {
      bestSeconds = seconds;
      best = current;
    }
  }
};

} // namespace

SmallVector<RedistributionStep>
mlir::tdx::planRedistribution(RankedTensorType global, ArrayRef<PlacementAttr> source,
                              ArrayRef<PlacementAttr> target,
                              ArrayRef<int64_t> meshShape, const CostModel &cost) {
  Planner planner{global, meshShape, cost, {}, {}, {}};
  int64_t rank = source.size();
  planner.pending.resize(rank);
  PlacementAttr rep = PlacementAttr::replicate(global.getContext());
  for (int64_t axis = 0; axis < rank; ++axis) {
    PlacementAttr from = source[axis], to = target[axis];
    // A shard that stays on this axis still moves when an outer axis starts
    // or stops sharding the same dim: its chunks are cut from another piece.
    bool nestingChanges = false;
    if (from == to && from.isShard())
      for (int64_t outer = 0; outer < axis; ++outer) {
        bool before = source[outer].isShard() && source[outer].getDim() == from.getDim();
        bool after = target[outer].isShard() && target[outer].getDim() == from.getDim();
        nestingChanges |= before != after;
      }
    if (nestingChanges)
      planner.pending[axis] = {{from, rep, StepKind::AllGather},
                               {rep, to, StepKind::LocalChunk}};
    else
      planner.pending[axis] = axisSteps(from, to);
  }
  Layout layout(source.begin(), source.end());
  planner.search(layout, 0.0);
  if (!std::isinf(planner.bestSeconds))
    return planner.best;
  // No interleaving keeps the nesting valid: gather everything (inner axes
  // first), then split (outer axes first). Always valid.
  for (int64_t axis = 0; axis < rank; ++axis) {
    planner.pending[axis].clear();
    for (const AxisStep &t : axisSteps(source[axis], rep))
      planner.pending[axis].push_back(t);
  }
  Layout work(source.begin(), source.end());
  SmallVector<RedistributionStep> plan;
  // Takes transition `t` on `axis`, priced on the layout it starts from.
  auto take = [&](int64_t axis, const AxisStep &t) {
    int64_t bytesIn = localBytes(global, work, meshShape);
    work[axis] = t.to;
    plan.push_back({axis, t.from, t.to, t.kind, bytesIn,
                    stepSeconds(t.kind, bytesIn, localBytes(global, work, meshShape),
                                meshShape[axis], cost.bandwidth[axis], cost.latency[axis],
                                cost.callSeconds, cost.memoryBandwidth)});
  };
  for (int64_t axis = rank - 1; axis >= 0; --axis)
    for (const AxisStep &t : planner.pending[axis])
      take(axis, t);
  for (int64_t axis = 0; axis < rank; ++axis)
    for (const AxisStep &t : axisSteps(rep, target[axis]))
      take(axis, t);
  return plan;
}

double mlir::tdx::planSeconds(ArrayRef<RedistributionStep> plan) {
  double s = 0;
  for (const RedistributionStep &step : plan)
    s += step.seconds;
  return s;
}

MeshOp mlir::tdx::lookupMesh(Operation *from, FlatSymbolRefAttr name) {
  return SymbolTable::lookupNearestSymbolFrom<MeshOp>(from, name);
}

ShardingAttr mlir::tdx::firstPlacement(func::FuncOp fn) {
  for (unsigned i = 0; i < fn.getNumArguments(); ++i)
    if (auto s = fn.getArgAttrOfType<ShardingAttr>(i, TdxDialect::kShardingAttrName))
      return s;
  ShardingAttr first;
  fn.walk([&](Operation *op) {
    if (auto list = op->getAttrOfType<ArrayAttr>(TdxDialect::kShardingsAttrName))
      for (Attribute a : list)
        if ((first = dyn_cast<ShardingAttr>(a)))
          return WalkResult::interrupt();
    return WalkResult::advance();
  });
  return first;
}
