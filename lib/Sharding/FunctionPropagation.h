//===- FunctionPropagation.h - propagation's state of one function -*- C++ -*-===//
//
// What lib/Sharding's propagation (Propagation.cpp: seeding and the
// per-priority sweeps) and decision (Decision.cpp: the cost of each
// candidate factor, the layout each op computes in, the rewrite) share:
// the proposals per value and mesh axis. Internal to lib/Sharding; the API
// is tdx/Sharding/Propagation.h.
//
//===----------------------------------------------------------------------===//

#ifndef TDX_LIB_SHARDING_FUNCTIONPROPAGATION_H
#define TDX_LIB_SHARDING_FUNCTIONPROPAGATION_H

#include "tdx/IR/ManualRegions.h"
#include "tdx/IR/TdxOps.h"
#include "tdx/Sharding/Layout.h"

#include "mlir/IR/Builders.h"

#include <limits>
#include <string>

namespace mlir::tdx::detail {
inline std::string seconds(double s) {
  char buf[32];
  std::snprintf(buf, sizeof(buf), "%.3g s", s);
  return buf;
}

/// A candidate of linear ops: keep the operand's Partial through the op.
inline constexpr int64_t kPartialThrough = -2;

inline constexpr int kUnknownPriority = std::numeric_limits<int>::max();

/// The proposal for one value on one mesh axis.
struct AxisState {
  PlacementAttr placement; // null: no proposal yet
  int priority = kUnknownPriority;
  /// The user annotation this proposal comes from (for diagnostics).
  Operation *source = nullptr;
  /// Set by the user on this very value; never changed.
  bool fixed = false;
};
using State = SmallVector<AxisState, 4>;

/// What an op asks of one axis: shard `factor` (-1: none).
struct Candidate {
  int64_t factor;
  int priority;
  bool fixed;
  Operation *source;
  std::string origin; // "operand #0" / "result #0"
};

class FunctionPropagation {
public:
  FunctionPropagation(func::FuncOp fn, MeshOp mesh, const CostModel &cost,
                      bool explain, SymbolTableCollection &symbols)
      : fn(fn), mesh(mesh), meshShape(mesh.getShape()),
        rank(mesh.getShape().size()), cost(cost), explain(explain),
        symbols(symbols) {}

  LogicalResult run();

private:
  func::FuncOp fn;
  MeshOp mesh;
  ArrayRef<int64_t> meshShape;
  int64_t rank;
  const CostModel &cost;
  bool explain;
  SymbolTableCollection &symbols;

  SmallVector<Operation *> ops;
  DenseMap<Value, Value> leader; // param_ref results of one parameter share a state
  DenseMap<StringAttr, Value> firstRef; // the state's first param_ref, by owner name
  DenseMap<Value, State> states;
  /// The ops of the function's manual regions (tdx/IR/ManualRegions.h):
  /// each rank's own code, Replicate throughout, never partitioned.
  DenseSet<Operation *> manual;
  /// Per op, the layout each tensor operand must have.
  DenseMap<Operation *, SmallVector<Layout>> required;

  Value key(Value v) const {
    auto it = leader.find(v);
    return it == leader.end() ? v : it->second;
  }
  State &state(Value v) {
    State &s = states[key(v)];
    if (s.empty())
      s.resize(rank);
    return s;
  }
  static bool isTensor(Value v) { return isa<RankedTensorType>(v.getType()); }
  static RankedTensorType tensorType(Value v) {
    return cast<RankedTensorType>(v.getType());
  }
  Layout layout(Value v) {
    Layout l;
    for (AxisState &a : state(v))
      l.push_back(a.placement ? a.placement
                              : PlacementAttr::replicate(fn.getContext()));
    return l;
  }

  LogicalResult seed();
  LogicalResult propagateLevel(int level);
  FailureOr<bool> propagateOp(Operation *op, int level);
  void decide();
  void decideOp(Operation *op);
  void rewrite();

  bool canShard(const ShardingRule &rule, const TensorFactors &dims, int64_t dim,
                int64_t axis) const {
    if (dims[dim].size() <= 1)
      return true;
    // A dim made of several factors is sharded through its major factor:
    // torch.chunk of the dim equals chunking the factor only when it divides.
    return rule.factorSizes[dims[dim].front()] % meshShape[axis] == 0;
  }
  /// Whether sharding factor `f` over `axis` can be expressed in every
  /// operand and result that has it: there it must be a dim's major factor,
  /// and divide evenly when that dim is made of several factors. Otherwise
  /// the local computation would not match the local types.
  bool expressible(const ShardingRule &rule, int64_t f, int64_t axis) const {
    if (f < 0)
      return true;
    if (rule.factorKinds[f] == FactorKind::Replicated)
      return false;
    auto check = [&](const TensorFactors &dims) {
      for (const DimFactors &fs : dims) {
        auto it = llvm::find(fs, f);
        if (it == fs.end())
          continue;
        if (it != fs.begin())
          return false;
        if (fs.size() > 1 && rule.factorSizes[f] % meshShape[axis] != 0)
          return false;
      }
      return true;
    };
    // A max or min over an uneven split leaves a rank with no elements, and
    // those reductions have no identity to give it.
    if (rule.factorKinds[f] == FactorKind::Reduction &&
        (rule.reduction == ReduceKind::Max || rule.reduction == ReduceKind::Min) &&
        rule.factorSizes[f] % meshShape[axis] != 0)
      return false;
    return llvm::all_of(rule.operands, check) && llvm::all_of(rule.results, check);
  }
  PlacementAttr placementFor(const ShardingRule &rule, const TensorFactors &dims,
                             int64_t f, int64_t axis, bool partialWithout);
  PlacementAttr requiredOperand(const ShardingRule &rule, size_t i, int64_t f,
                                int64_t axis);
  PlacementAttr producedResult(const ShardingRule &rule, size_t j, int64_t f,
                               int64_t axis);
  double candidateCost(Operation *op, const ShardingRule &rule, int64_t axis,
                       int64_t f);
  double changeCost(Value v, ArrayRef<PlacementAttr> from, int64_t axis,
                    PlacementAttr to);
  std::string describe(const ShardingRule &rule, Operation *op, int64_t f);
};

} // namespace mlir::tdx::detail

#endif // TDX_LIB_SHARDING_FUNCTIONPROPAGATION_H
