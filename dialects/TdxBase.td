//===- TdxBase.td - tdx dialect definition and enums -------*- tablegen -*-===//
//
// The tdx dialect records PyTorch programs (parameters, their init programs and
// the forward pass) with logical (global) tensor shapes, and carries the
// placements that the sharding passes propagate over a device mesh.
//
//===----------------------------------------------------------------------===//

#ifndef TDX_DIALECT_TDXBASE_TD
#define TDX_DIALECT_TDXBASE_TD

include "mlir/IR/OpBase.td"
include "mlir/IR/AttrTypeBase.td"
include "mlir/IR/EnumAttr.td"

def Tdx_Dialect : Dialect {
  let name = "tdx";
  let cppNamespace = "::mlir::tdx";
  let summary = "Distributed PyTorch programs: parameters, init, forward, placements";
  let description = [{
    The `tdx` dialect holds a PyTorch model as a compiler sees it: every
    parameter and buffer with its fully-qualified name, global shape, dtype and
    functionalized init program; the forward function over value-semantic
    tensors; device meshes; and DTensor-style placements (`Shard(dim)`,
    `Replicate`, `Partial(sum|avg|max|min)`) on values.

    Tensor types are builtin `tensor<...>` types. Before partitioning a type
    is the logical (global) shape; after partitioning it is the local shard
    of one rank. See `docs/ir.md` for a worked example.
  }];
  let useDefaultAttributePrinterParser = 1;
  let useDefaultTypePrinterParser = 1;
  let dependentDialects = ["::mlir::func::FuncDialect"];
  // The discardable attributes below are checked wherever they appear.
  let hasOperationAttrVerify = 1;
  let hasRegionArgAttrVerify = 1;
  let hasRegionResultAttrVerify = 1;
  let extraClassDeclaration = [{
    /// The discardable attributes of the dialect, by the one spelling every
    /// pass, the emitter and the Python package use.
    /// Per-result placements of an op (an array of #tdx.sharding).
    static constexpr ::llvm::StringLiteral kShardingsAttrName = "tdx.shardings";
    /// The placement of a function argument or result (#tdx.sharding).
    static constexpr ::llvm::StringLiteral kShardingAttrName = "tdx.sharding";
    /// With an argument's `tdx.sharding`: a preference at this priority
    /// level (i64 >= 0), not a fixed placement; tdx-propagate-sharding
    /// settles disagreeing preferences by cost and then drops it.
    static constexpr ::llvm::StringLiteral kShardingPriorityAttrName =
        "tdx.sharding_priority";
    /// The global type of a partitioned function's argument or result.
    static constexpr ::llvm::StringLiteral kGlobalTypeAttrName = "tdx.global_type";
    /// A module whose types are per-rank (unit).
    static constexpr ::llvm::StringLiteral kPartitionedAttrName = "tdx.partitioned";
    /// On the module: the element type every collective that sums runs in
    /// when its value is a narrower float (a TypeAttr: mixed precision's
    /// reduce_dtype, honored by tdx-widen-reductions).
    static constexpr ::llvm::StringLiteral kReduceTypeAttrName = "tdx.reduce_type";
    /// On the module: the mesh axis that splits training-mode batch norm's
    /// batch and whose statistics it takes, `{axis = "dp", statistics =
    /// "global" | "local"}` (tdx.parallelize's data_parallel and
    /// batch_norm, honored by tdx-expand-batch-norm).
    static constexpr ::llvm::StringLiteral kBatchNormAttrName = "tdx.batch_norm";
    /// On the module: the bytes a rank may hold at the step's peak (i64 > 0;
    /// tdx.parallelize's memory_budget, checked by tdx-memory-report).
    static constexpr ::llvm::StringLiteral kMemoryBudgetAttrName = "tdx.memory_budget";
    /// The payload a collective moves per rank (i64 bytes).
    static constexpr ::llvm::StringLiteral kPayloadBytesAttrName = "tdx.payload_bytes";
    /// The memory plan (tdx-plan-memory): where in the step's arena each
    /// result of an op lives (array<i64>, one byte offset per result, -1
    /// for a tensor the plan leaves to the allocator).
    static constexpr ::llvm::StringLiteral kArenaAttrName = "tdx.arena";
    /// On a planned function: its arena's bytes, and the most bytes of its
    /// own tensors alive at once (i64 each).
    static constexpr ::llvm::StringLiteral kArenaBytesAttrName = "tdx.arena_bytes";
    static constexpr ::llvm::StringLiteral kStepBytesAttrName = "tdx.step_bytes";
    /// On an op tdx-recompute made: a copy of an op before the step's peak,
    /// run again after it so its result is not held across (unit).
    static constexpr ::llvm::StringLiteral kRecomputedAttrName = "tdx.recomputed";
    /// The part of the step an op is emitted in (tdx-split-parts): i64 >= 0,
    /// never less than the part of the op before it.
    static constexpr ::llvm::StringLiteral kPartAttrName = "tdx.part";
    /// On the module: the pipeline tdx.parallelize's `pipeline=` asks for, a
    /// dictionary {axis, microbatches, schedule, stages_per_rank} that
    /// tdx-split-stages adds `stages` (each chunk's layers) and
    /// `chunk_seconds` to, and tdx-schedule-pipeline `functions` (each
    /// pipeline rank's step) and `timeline` (its schedule by the cost model).
    static constexpr ::llvm::StringLiteral kPipelineAttrName = "tdx.pipeline";
    /// The pipeline chunk an op of the step, or a state symbol, belongs to
    /// (i64 >= 0; tdx-split-stages).
    static constexpr ::llvm::StringLiteral kStageAttrName = "tdx.stage";
  }];
}

//===----------------------------------------------------------------------===//
// Enums
//===----------------------------------------------------------------------===//

def Tdx_ReduceKind : I32EnumAttr<"ReduceKind",
    "how Partial values combine (torch.distributed ReduceOp)", [
  I32EnumAttrCase<"Sum", 0, "sum">,
  I32EnumAttrCase<"Avg", 1, "avg">,
  I32EnumAttrCase<"Max", 2, "max">,
  I32EnumAttrCase<"Min", 3, "min">
]> {
  let cppNamespace = "::mlir::tdx";
}

def Tdx_PlacementKind : I32EnumAttr<"PlacementKind",
    "kind of a placement on one mesh axis", [
  I32EnumAttrCase<"Shard", 0, "Shard">,
  I32EnumAttrCase<"Replicate", 1, "Replicate">,
  I32EnumAttrCase<"Partial", 2, "Partial">
]> {
  let genSpecializedAttr = 0;
  let cppNamespace = "::mlir::tdx";
}

def Tdx_CmpPredicate : I32EnumAttr<"CmpPredicate",
    "comparison predicate (aten eq/ne/lt/le/gt/ge)", [
  I32EnumAttrCase<"eq", 0>, I32EnumAttrCase<"ne", 1>,
  I32EnumAttrCase<"lt", 2>, I32EnumAttrCase<"le", 3>,
  I32EnumAttrCase<"gt", 4>, I32EnumAttrCase<"ge", 5>
]> {
  let cppNamespace = "::mlir::tdx";
}

def Tdx_GeluApproximation : I32EnumAttr<"GeluApproximation",
    "torch.nn.functional.gelu approximate=", [
  I32EnumAttrCase<"none", 0>, I32EnumAttrCase<"tanh", 1>
]> {
  let cppNamespace = "::mlir::tdx";
}

def Tdx_LossReduction : I32EnumAttr<"LossReduction",
    "loss reduction (torch reduction=)", [
  I32EnumAttrCase<"none", 0>, I32EnumAttrCase<"mean", 1>,
  I32EnumAttrCase<"sum", 2>
]> {
  let cppNamespace = "::mlir::tdx";
}

#endif // TDX_DIALECT_TDXBASE_TD
