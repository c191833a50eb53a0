//===- Layout.h - per-axis placements, local shapes, redistribution -*- C++ -*-===//
//
// A Layout is one placement per mesh axis (what a ShardingAttr holds). This
// header gives the local (per-rank) shape of a global tensor under a layout,
// the alpha-beta cost model of the collectives, and the planner that turns a
// layout change into the cheapest sequence of single-axis steps. The sharding
// passes (propagation, collective insertion, partitioning, the report) share
// it, so they agree on shapes, bytes and costs.
//
//===----------------------------------------------------------------------===//

#ifndef TDX_SHARDING_LAYOUT_H
#define TDX_SHARDING_LAYOUT_H

#include "tdx/IR/LocalTypes.h"
#include "tdx/IR/TdxOps.h"

namespace mlir::tdx {

using Layout = llvm::SmallVector<PlacementAttr, 4>;

/// The fully replicated layout on a mesh of `rank` axes.
Layout replicatedLayout(MLIRContext *ctx, int64_t rank);
/// The layout of a sharding attribute, and back.
Layout layoutOf(ShardingAttr sharding);
ShardingAttr shardingOf(MeshOp mesh, ArrayRef<PlacementAttr> layout);
/// Prints `[Shard(0), Replicate]`.
std::string layoutToString(ArrayRef<PlacementAttr> layout);

/// The largest number of bytes any rank holds of `global` under `layout`.
int64_t localBytes(RankedTensorType global, ArrayRef<PlacementAttr> layout,
                   ArrayRef<int64_t> meshShape);

/// The cost model's defaults: bytes/s and seconds per step of a collective
/// on a mesh axis, and the seconds one call of a collective costs whatever
/// its size and group (making and finishing it: on this machine's MPI, the
/// collectives of a CPU training step take 30-40 us each, bytes aside;
/// bench/training's profile).
constexpr double kLinkBandwidth = 1e10, kLinkLatency = 1e-5, kCollectiveCallSeconds = 2.5e-5;

/// Seconds of one collective by the alpha-beta model plus its call: `bytes`
/// a rank passes in, a group of `groupSize` ranks. `kind` is the op's name:
/// all_gather ((g-1) steps, (g-1) n bytes), all_reduce (2 (g-1) steps,
/// 2 (g-1)/g n), reduce_scatter, all_to_all and broadcast ((g-1) steps,
/// (g-1)/g n), send and recv (one step, n). Free on a group of one.
double collectiveSeconds(llvm::StringRef kind, int64_t bytes, int64_t groupSize,
                         double bandwidth = kLinkBandwidth, double latency = kLinkLatency,
                         double call = kCollectiveCallSeconds);

/// Bandwidth (bytes/s) and latency (s) of each mesh axis, plus the compute
/// rate used to weigh sharded against replicated compute.
struct CostModel {
  llvm::SmallVector<double, 4> bandwidth;
  llvm::SmallVector<double, 4> latency;
  /// Seconds per call of a collective (collectiveSeconds).
  double callSeconds = kCollectiveCallSeconds;
  double flopsPerSecond = 1e11;
  /// Bytes/s of a local copy (slicing, zeroing).
  double memoryBandwidth = 1e10;
  /// Seconds charged per byte a rank holds of an op's results (and of what
  /// redistributing its operands adds to what it held): the memory
  /// term of propagation, so that replicating a large result is never free
  /// (default: writing it at memoryBandwidth; 0 leaves memory out).
  double secondsPerByteHeld = 1e-10;

  static CostModel uniform(int64_t rank, double bandwidth = kLinkBandwidth,
                           double latency = kLinkLatency);
  /// From pass options: one value per mesh axis, or one for all axes, or
  /// none for the defaults. Reports a wrong count or a non-positive value
  /// at `mesh`.
  static FailureOr<CostModel> fromOptions(MeshOp mesh, ArrayRef<double> bandwidth,
                                          ArrayRef<double> latency, double flops,
                                          double secondsPerByteHeld = 1e-10);
};

enum class StepKind {
  AllGather,     // Shard(d) -> Replicate
  AllReduce,     // Partial -> Replicate
  ReduceScatter, // Partial -> Shard(d)
  AllToAll,      // Shard(i) -> Shard(j)
  LocalChunk,    // Replicate -> Shard(d): keep this rank's chunk
  LocalZero,     // Replicate -> Partial(sum): keep the value on coordinate 0
  LocalNoop,     // Replicate -> Partial(avg|max|min): the value already is one
};
llvm::StringRef stringifyStepKind(StepKind kind);

/// One elementary step on one mesh axis: placement `from` becomes `to`.
struct AxisStep {
  PlacementAttr from, to;
  StepKind kind;
};
/// The elementary steps that take one mesh axis from `from` to `to`, in
/// order (none when they are equal): Shard(d) -> Partial(sum) is an
/// all_gather and a local zero, Partial(avg) -> Shard(d) an all_reduce and a
/// local chunk. The planner orders them across axes; tdx-partition lowers
/// each to its collective and tdx-fold-mesh computes each locally.
llvm::SmallVector<AxisStep> axisSteps(PlacementAttr from, PlacementAttr to);

/// One step of a redistribution: placement `from` becomes `to` on `axis`.
struct RedistributionStep {
  int64_t axis;
  PlacementAttr from, to;
  StepKind kind;
  /// Bytes of the local input of the step (largest rank).
  int64_t bytes;
  double seconds;
};

/// The cheapest valid sequence of single-axis steps from `source` to
/// `target` for a tensor of type `global`. Shards of one dim over several
/// axes are nested in mesh-axis order (as in DTensor), so steps on an inner
/// axis come first when gathering and last when splitting.
llvm::SmallVector<RedistributionStep>
planRedistribution(RankedTensorType global, ArrayRef<PlacementAttr> source,
                   ArrayRef<PlacementAttr> target, ArrayRef<int64_t> meshShape,
                   const CostModel &cost);

/// Total seconds of a plan.
double planSeconds(ArrayRef<RedistributionStep> plan);

/// The mesh a sharding attribute names, looked up from `from`.
MeshOp lookupMesh(Operation *from, FlatSymbolRefAttr name);

/// The first placement of `fn` (its arguments', then its ops' results' in
/// order), which names the mesh the function is placed on; null when the
/// function places nothing.
ShardingAttr firstPlacement(func::FuncOp fn);

} // namespace mlir::tdx

#endif // TDX_SHARDING_LAYOUT_H
