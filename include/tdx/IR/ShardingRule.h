//===- ShardingRule.h - factor mappings of tdx ops ---------------*- C++ -*-===//
//
// A sharding rule says how the dims of an op's tensor operands and results
// are tied together by factors, as in Shardy: sharding a factor over a mesh
// axis shards every dim that maps to it.
//
//===----------------------------------------------------------------------===//

#ifndef TDX_DIALECT_SHARDINGRULE_H
#define TDX_DIALECT_SHARDINGRULE_H

#include "mlir/IR/Builders.h"
#include "mlir/IR/BuiltinTypes.h"
#include "mlir/IR/Operation.h"
#include "tdx/IR/TdxDialect.h"
#include "llvm/ADT/SmallVector.h"

namespace mlir::tdx {

enum class FactorKind {
  /// Sharding it shards the operands and results that have it.
  Parallel,
  /// Only operands have it; sharding it leaves the results Partial.
  Reduction,
  /// Must not be sharded (a softmax dim, a normalized dim, a sliced dim).
  Replicated,
};

/// The factors of one tensor dim, major to minor. Empty: the dim has no
/// factor (a broadcast dim of size 1), so it is never sharded.
using DimFactors = llvm::SmallVector<int64_t, 2>;
using TensorFactors = llvm::SmallVector<DimFactors, 4>;

struct ShardingRule {
  llvm::SmallVector<int64_t> factorSizes;
  llvm::SmallVector<FactorKind> factorKinds;
  /// How results combine when a reduction factor is sharded.
  ReduceKind reduction = ReduceKind::Sum;
  /// One entry per operand and result; non-tensor ones have no dims.
  llvm::SmallVector<TensorFactors> operands;
  llvm::SmallVector<TensorFactors> results;
  /// Operands that are added to the reduced value (a linear's bias): when a
  /// reduction factor is sharded they must be Partial too, not Replicate.
  llvm::SmallVector<bool> addedAfterReduction;
  /// The op is linear in its tensor operands together (a reshape,
  /// transpose, slice, negation, ...; add and sub): Partial(sum) operands
  /// can stay Partial(sum) through it (a Replicate one becomes Partial for
  /// free: coordinate 0 keeps it).
  bool linear = false;

  int64_t addFactor(int64_t size, FactorKind kind = FactorKind::Parallel) {
    factorSizes.push_back(size);
    factorKinds.push_back(kind);
    return factorSizes.size() - 1;
  }
  int64_t numFactors() const { return factorSizes.size(); }

  /// The factor that a Shard on `dim` of `factors` shards: the dim's major
  /// factor, or -1 when the dim has none.
  static int64_t majorFactor(const TensorFactors &factors, int64_t dim) {
    if (dim < 0 || dim >= static_cast<int64_t>(factors.size()) ||
        factors[dim].empty())
      return -1;
    return factors[dim].front();
  }
  /// The dim of `factors` whose major factor is `factor`, or -1.
  static int64_t dimOfFactor(const TensorFactors &factors, int64_t factor);

  /// A rule that keeps every operand and result replicated: every dim gets
  /// its own replicated factor (generic aten ops, unknown ops).
  static ShardingRule replicated(Operation *op);
  /// Elementwise with numpy broadcasting: one factor per dim of the single
  /// result; an operand dim of size 1 that is broadcast has no factor.
  static ShardingRule broadcast(Operation *op);
  /// The factors of `operand` broadcast (numpy-style) to `result`, whose
  /// dims have `resultDims`: a size-1 dim that grows has no factor.
  static TensorFactors broadcastFactors(RankedTensorType operand, RankedTensorType result,
                                        const TensorFactors &resultDims);

  /// Prints the rule Shardy-style, for example
  /// `([i, k], [k, j]) -> ([i, j]) {i=8, j=4, k=16} reduction={k}`.
  void print(llvm::raw_ostream &os) const;
};

/// The rule of `op`: its ShardingRuleOpInterface rule, or `replicated` for an
/// op without one.
ShardingRule getShardingRuleOrReplicated(Operation *op);

/// What `ShardingRuleOpInterface::partition` sees of the function being
/// partitioned (tdx-partition implements it): the builder, the mesh, and the
/// global facts that retyping to per-rank types has erased.
class PartitionContext {
public:
  virtual ~PartitionContext() = default;
  virtual OpBuilder &builder() = 0;
  /// The `tdx.mesh` op the function is placed on.
  virtual Operation *mesh() = 0;
  virtual ArrayRef<int64_t> meshShape() = 0;
  /// The layout of `v` (one placement per mesh axis): its producer's
  /// `tdx.shardings`, its argument's `tdx.sharding`, or replicated.
  virtual SmallVector<PlacementAttr> layoutOf(Value v) = 0;
  /// The global size of dim `dim` of `v`, or ShapedType::kDynamic when it
  /// cannot be told (an uneven split of a computed value).
  virtual int64_t globalDimSize(Value v, int64_t dim) = 0;
  /// The global type of result `i` of the op being partitioned.
  virtual RankedTensorType globalResultType(unsigned i) = 0;
  /// `from`, a result of an op about to be erased, is replaced by `to`.
  virtual void replaced(Value from, Value to) = 0;
};

} // namespace mlir::tdx

namespace mlir::tdx::detail {
/// The tdx.parameter or tdx.buffer that holds the value `name` names, seen
/// from `from`: its declaration, or the one a tied name shares; null when
/// `name` is no state (StateAccessOpInterface::getStateOwner).
Operation *lookupStateOwner(Operation *from, FlatSymbolRefAttr name,
                            SymbolTableCollection *symbols);
} // namespace mlir::tdx::detail

#include "tdx/IR/TdxInterfaces.h.inc"

#endif // TDX_DIALECT_SHARDINGRULE_H
