//===- ShardingRules.cpp - the factor mapping of every first-class op -----===//
//
// One function per op family, in the spirit of Shardy's sharding rule
// registry. Every rule is a pure function of the op's types and attributes.
//
//===----------------------------------------------------------------------===//

#include "tdx/IR/ShardingRule.h"
#include "tdx/IR/TdxOps.h"

using namespace mlir;
using namespace mlir::tdx;

static RankedTensorType tensorType(Value v) {
  return cast<RankedTensorType>(v.getType());
}

/// Every dim of the single result is its own parallel factor (creation ops).
static ShardingRule creationRule(Operation *op) {
  ShardingRule rule;
  TensorFactors dims;
  for (int64_t size : cast<RankedTensorType>(op->getResult(0).getType()).getShape())
    dims.push_back({rule.addFactor(size)});
  rule.results.push_back(dims);
  return rule;
}

/// One factor per input dim; dims listed in `replicatedDims` may not be
/// sharded. The result has the input's dims (same-shape ops).
static ShardingRule sameShapeRule(Operation *op, ArrayRef<int64_t> replicatedDims) {
  ShardingRule rule;
  auto t = tensorType(op->getOperand(0));
  TensorFactors dims;
  for (int64_t d = 0; d < t.getRank(); ++d)
    dims.push_back({rule.addFactor(t.getDimSize(d),
                                   llvm::is_contained(replicatedDims, d)
                                       ? FactorKind::Replicated
                                       : FactorKind::Parallel)});
  rule.operands.push_back(dims);
  rule.addedAfterReduction.push_back(false);
  rule.results.push_back(dims);
  return rule;
}

// The elementwise table (tdx/Runtime/ElementwiseOps.def) and the other
// broadcasting ops.
#define TDX_UNARY(Name, fn, aten, isLinear, ...)                                      \
  ShardingRule Name##Op::getShardingRule() {                                     \
    ShardingRule rule = ShardingRule::broadcast(*this);                                  \
    rule.linear = isLinear;                                                    \
    return rule;                                                               \
  }
/// Sums of Partial(sum) operands are Partial(sum): add and sub are linear
/// in their operands together.
template <typename Op>
constexpr bool isAdditive() {
  return std::is_same_v<Op, AddOp> || std::is_same_v<Op, SubOp>;
}
#define TDX_BINARY(Name, fn, aten, ...)                                               \
  ShardingRule Name##Op::getShardingRule() {                                     \
    ShardingRule rule = ShardingRule::broadcast(*this);                          \
    rule.linear = isAdditive<Name##Op>();                                        \
    return rule;                                                               \
  }
#include "tdx/Runtime/ElementwiseOps.def"
ShardingRule CmpOp::getShardingRule() { return ShardingRule::broadcast(*this); }
ShardingRule WhereOp::getShardingRule() { return ShardingRule::broadcast(*this); }
ShardingRule GeluOp::getShardingRule() { return ShardingRule::broadcast(*this); }
/// A widening float cast (bf16 -> f32) is exact, so a sum of its results is
/// its result of the sum, computed in the wider type: mixed precision's
/// gradients are summed after the cast back to the parameter's dtype.
ShardingRule CastOp::getShardingRule() {
  ShardingRule rule = ShardingRule::broadcast(*this);
  rule.linear = floatWidening(*this) > 0;
  return rule;
}

ShardingRule EmptyOp::getShardingRule() { return creationRule(*this); }
ShardingRule FullOp::getShardingRule() { return creationRule(*this); }
ShardingRule ParamRefOp::getShardingRule() { return creationRule(*this); }
ShardingRule UniformOp::getShardingRule() { return creationRule(*this); }
ShardingRule NormalOp::getShardingRule() { return creationRule(*this); }
ShardingRule TruncNormalOp::getShardingRule() { return creationRule(*this); }
ShardingRule BernoulliOp::getShardingRule() { return creationRule(*this); }
/// A range is made whole on every rank: a split one would need each rank's
/// own start, so its one dim is a replicated factor (its readers slice it).
ShardingRule ArangeOp::getShardingRule() {
  ShardingRule rule;
  auto t = cast<RankedTensorType>(getType());
  rule.results = {{{rule.addFactor(t.getDimSize(0), FactorKind::Replicated)}}};
  return rule;
}

/// The value's dims, each its own factor; propagation requires the state's
/// layout of it (PropagateSharding.cpp).
ShardingRule AssignOp::getShardingRule() {
  ShardingRule rule;
  TensorFactors dims;
  for (int64_t size : tensorType(getValue()).getShape())
    dims.push_back({rule.addFactor(size)});
  rule.operands.push_back(dims);
  rule.addedAfterReduction.push_back(false);
  return rule;
}

//===----------------------------------------------------------------------===//
// Contractions
//===----------------------------------------------------------------------===//

ShardingRule MatmulOp::getShardingRule() {
  ShardingRule rule;
  auto a = tensorType(getLhs()), b = tensorType(getRhs());
  auto r = cast<RankedTensorType>(getType());
  bool aVec = a.getRank() == 1, bVec = b.getRank() == 1;
  int64_t batchRank = r.getRank() - (aVec ? 0 : 1) - (bVec ? 0 : 1);
  TensorFactors resultDims;
  for (int64_t d = 0; d < batchRank; ++d)
    resultDims.push_back({rule.addFactor(r.getDimSize(d))});
  int64_t i = aVec ? -1 : rule.addFactor(a.getDimSize(a.getRank() - 2));
  int64_t j = bVec ? -1 : rule.addFactor(b.getDimSize(b.getRank() - 1));
  int64_t k = rule.addFactor(a.getShape().back(), FactorKind::Reduction);
  auto batchOf = [&](RankedTensorType t, int64_t numBatch) {
    TensorFactors dims;
    for (int64_t d = 0; d < numBatch; ++d) {
      int64_t rd = d + batchRank - numBatch;
      if (t.getDimSize(d) == 1 && r.getDimSize(rd) != 1)
        dims.push_back({});
      else
        dims.push_back(resultDims[rd]);
    }
    return dims;
  };
  TensorFactors aDims = aVec ? TensorFactors{} : batchOf(a, a.getRank() - 2);
  if (!aVec)
    aDims.push_back({i});
  aDims.push_back({k});
  TensorFactors bDims = bVec ? TensorFactors{} : batchOf(b, b.getRank() - 2);
  bDims.push_back({k});
  if (!bVec)
    bDims.push_back({j});
  if (!aVec)
    resultDims.push_back({i});
  if (!bVec)
    resultDims.push_back({j});
  rule.operands = {aDims, bDims};
  rule.addedAfterReduction = {false, false};
  rule.results = {resultDims};
  return rule;
}

ShardingRule LinearOp::getShardingRule() {
  ShardingRule rule;
  auto x = tensorType(getInput()), w = tensorType(getWeight());
  auto r = cast<RankedTensorType>(getType());
  TensorFactors xDims, resultDims;
  for (int64_t d = 0; d + 1 < x.getRank(); ++d) {
    xDims.push_back({rule.addFactor(x.getDimSize(d))});
    resultDims.push_back(xDims.back());
  }
  int64_t o = w.getRank() == 2 ? rule.addFactor(w.getDimSize(0)) : -1;
  int64_t k = rule.addFactor(x.getShape().back(), FactorKind::Reduction);
  xDims.push_back({k});
  TensorFactors wDims;
  if (o >= 0) {
    wDims.push_back({o});
    resultDims.push_back({o});
  }
  wDims.push_back({k});
  rule.operands = {xDims, wDims};
  rule.addedAfterReduction = {false, false};
  if (Value bias = getBias()) {
    rule.operands.push_back(ShardingRule::broadcastFactors(tensorType(bias), r, resultDims));
    rule.addedAfterReduction.push_back(true);
  }
  rule.results = {resultDims};
  return rule;
}

//===----------------------------------------------------------------------===//
// Convolution and pooling
//===----------------------------------------------------------------------===//

ShardingRule ConvOp::getShardingRule() {
  ShardingRule rule;
  auto x = tensorType(getInput()), w = tensorType(getWeight());
  auto r = cast<RankedTensorType>(getType());
  int64_t groups = getGroups(), c = x.getDimSize(1), o = w.getDimSize(0);
  int64_t n = rule.addFactor(x.getDimSize(0));
  int64_t oc, ic = -1;
  bool depthwise = groups > 1 && groups == c && groups == o;
  if (groups == 1) {
    oc = rule.addFactor(o);
    ic = rule.addFactor(c, FactorKind::Reduction);
  } else if (depthwise) {
    oc = rule.addFactor(o); // one channel in, one out: elementwise in C
  } else {
    oc = rule.addFactor(o, FactorKind::Replicated);
    ic = rule.addFactor(c, FactorKind::Replicated);
  }
  TensorFactors xDims = {{n}, {depthwise ? oc : ic}}, wDims = {{oc}, {}}, rDims = {{n}, {oc}};
  if (!depthwise)
    wDims[1] = {groups == 1 ? ic : rule.addFactor(w.getDimSize(1), FactorKind::Replicated)};
  for (int64_t d = 2; d < x.getRank(); ++d) {
    xDims.push_back({rule.addFactor(x.getDimSize(d), FactorKind::Replicated)});
    wDims.push_back({rule.addFactor(w.getDimSize(d), FactorKind::Replicated)});
    rDims.push_back({rule.addFactor(r.getDimSize(d), FactorKind::Replicated)});
  }
  rule.operands = {xDims, wDims};
  rule.addedAfterReduction = {false, false};
  if (getBias()) {
    rule.operands.push_back({{oc}});
    rule.addedAfterReduction.push_back(true);
  }
  rule.results = {rDims};
  return rule;
}

/// Pooling: batch and channels are parallel, the window dims replicated.
static ShardingRule poolRule(Operation *op) {
  ShardingRule rule;
  auto x = tensorType(op->getOperand(0));
  auto r = cast<RankedTensorType>(op->getResult(0).getType());
  TensorFactors xDims, rDims;
  for (int64_t d = 0; d < 2; ++d) {
    xDims.push_back({rule.addFactor(x.getDimSize(d))});
    rDims.push_back(xDims.back());
  }
  for (int64_t d = 2; d < x.getRank(); ++d) {
    xDims.push_back({rule.addFactor(x.getDimSize(d), FactorKind::Replicated)});
    rDims.push_back({rule.addFactor(r.getDimSize(d), FactorKind::Replicated)});
  }
  rule.operands = {xDims};
  rule.addedAfterReduction = {false};
  rule.results = {rDims};
  return rule;
}
ShardingRule MaxPoolOp::getShardingRule() { return poolRule(*this); }
ShardingRule AvgPoolOp::getShardingRule() { return poolRule(*this); }

//===----------------------------------------------------------------------===//
// Reductions and normalizations
//===----------------------------------------------------------------------===//

/// Reduced dims are reduction factors of kind `kind` (or replicated factors
/// when `shardable` is false: a mean over uneven shards is not the mean of
/// the shard means).
template <typename ReduceOp>
static ShardingRule reduceRule(ReduceOp op, bool shardable, ReduceKind kind) {
  ShardingRule rule;
  rule.reduction = kind;
  auto t = tensorType(op.getInput());
  std::optional<ArrayRef<int64_t>> dims = op.getDims();
  TensorFactors inDims, outDims;
  for (int64_t d = 0; d < t.getRank(); ++d) {
    bool reduced = !dims || dims->empty() ||
                   llvm::any_of(*dims, [&](int64_t x) {
                     return normalizeDim(x, t.getRank()) == d;
                   });
    if (!reduced) {
      inDims.push_back({rule.addFactor(t.getDimSize(d))});
      outDims.push_back(inDims.back());
      continue;
    }
    inDims.push_back({rule.addFactor(t.getDimSize(d), shardable
                                                          ? FactorKind::Reduction
                                                          : FactorKind::Replicated)});
    if (op.getKeepdim())
      outDims.push_back({});
  }
  rule.operands = {inDims};
  rule.addedAfterReduction = {false};
  rule.results = {outDims};
  return rule;
}

ShardingRule SumOp::getShardingRule() {
  return reduceRule(*this, /*shardable=*/true, ReduceKind::Sum);
}
ShardingRule MaxOp::getShardingRule() {
  return reduceRule(*this, /*shardable=*/true, ReduceKind::Max);
}
ShardingRule MeanOp::getShardingRule() {
  return reduceRule(*this, /*shardable=*/false, ReduceKind::Avg);
}

template <typename SoftmaxOp>
static ShardingRule softmaxRule(SoftmaxOp op) {
  int64_t rank = tensorType(op.getInput()).getRank();
  std::optional<int64_t> dim =
      normalizeDim(static_cast<int64_t>(op.getDim()), std::max<int64_t>(rank, 1));
  return sameShapeRule(op, rank ? ArrayRef<int64_t>{*dim} : ArrayRef<int64_t>{});
}
ShardingRule SoftmaxOp::getShardingRule() { return softmaxRule(*this); }
ShardingRule LogSoftmaxOp::getShardingRule() { return softmaxRule(*this); }

/// The normalized trailing dims are replicated; weight and bias map to them.
static ShardingRule normRule(Operation *op, int64_t numNormalized) {
  auto t = cast<RankedTensorType>(op->getOperand(0).getType());
  SmallVector<int64_t> replicated;
  for (int64_t d = t.getRank() - numNormalized; d < t.getRank(); ++d)
    replicated.push_back(d);
  ShardingRule rule = sameShapeRule(op, replicated);
  TensorFactors trailing(rule.operands[0].end() - numNormalized,
                         rule.operands[0].end());
  for (size_t i = 1; i < op->getNumOperands(); ++i) {
    rule.operands.push_back(trailing);
    rule.addedAfterReduction.push_back(false);
  }
  return rule;
}
ShardingRule LayerNormOp::getShardingRule() {
  return normRule(*this, getNormalizedShape().size());
}
ShardingRule RmsNormOp::getShardingRule() {
  return normRule(*this, getNormalizedShape().size());
}

/// Attention over [batch, heads, seq, dim]: batch and heads split (each
/// (batch, head) pair is an attention of its own); query's heads are kv
/// heads times the group (grouped-query attention), so splitting the kv
/// heads splits both. Sequence and head dims stay whole: the kernel is
/// fused, and a causal mask is laid out on the whole sequence.
struct AttentionFactors {
  int64_t b, kvHeads, group, s, t, d, e;
  TensorFactors q, k, v, lse, mask;
};
static AttentionFactors attentionFactors(ShardingRule &rule, Value q, Value k, Value v,
                                         Value mask) {
  auto qs = tensorType(q).getShape(), ks = tensorType(k).getShape(),
       vs = tensorType(v).getShape();
  AttentionFactors f;
  f.b = rule.addFactor(qs[0]);
  f.kvHeads = rule.addFactor(ks[1]);
  f.group = rule.addFactor(qs[1] / ks[1]);
  f.s = rule.addFactor(qs[2], FactorKind::Replicated);
  f.t = rule.addFactor(ks[2], FactorKind::Replicated);
  f.d = rule.addFactor(qs[3], FactorKind::Replicated);
  f.e = rule.addFactor(vs[3], FactorKind::Replicated);
  TensorFactors heads = ks[1] == qs[1] ? TensorFactors{{f.kvHeads}}
                                       : TensorFactors{{f.kvHeads, f.group}};
  f.q = {{f.b}, heads[0], {f.s}, {f.d}};
  f.k = {{f.b}, {f.kvHeads}, {f.t}, {f.d}};
  f.v = {{f.b}, {f.kvHeads}, {f.t}, {f.e}};
  f.lse = {{f.b}, heads[0], {f.s}};
  if (mask) {
    // Broadcast dims (size 1) have no factor; the others are the scores'.
    TensorFactors scores = {{f.b}, heads[0], {f.s}, {f.t}};
    auto ms = tensorType(mask).getShape();
    for (auto [i, size] : llvm::enumerate(ms))
      f.mask.push_back(size == 1 ? SmallVector<int64_t>{}
                                 : scores[scores.size() - ms.size() + i]);
  }
  return f;
}

ShardingRule SdpaOp::getShardingRule() {
  ShardingRule rule;
  AttentionFactors f = attentionFactors(rule, getQuery(), getKey(), getValue(), getAttnMask());
  rule.operands = {f.q, f.k, f.v};
  if (getAttnMask())
    rule.operands.push_back(f.mask);
  rule.addedAfterReduction.assign(rule.operands.size(), false);
  rule.results = {{f.q[0], f.q[1], f.q[2], {f.e}}, f.lse};
  return rule;
}

ShardingRule SdpaBackwardOp::getShardingRule() {
  ShardingRule rule;
  AttentionFactors f = attentionFactors(rule, getQuery(), getKey(), getValue(), getAttnMask());
  TensorFactors out = {f.q[0], f.q[1], f.q[2], {f.e}};
  rule.operands = {out, f.q, f.k, f.v, out, f.lse};
  if (getAttnMask())
    rule.operands.push_back(f.mask);
  rule.addedAfterReduction.assign(rule.operands.size(), false);
  rule.results = {f.q, f.k, f.v};
  return rule;
}

ShardingRule EmbeddingOp::getShardingRule() {
  ShardingRule rule;
  auto w = tensorType(getWeight()), idx = tensorType(getIndices());
  // Vocabulary-parallel: with the table's rows split, each rank looks up
  // the ids it owns (zeros elsewhere), so the result is a Partial sum.
  int64_t v = rule.addFactor(w.getDimSize(0), FactorKind::Reduction);
  TensorFactors idxDims;
  for (int64_t size : idx.getShape())
    idxDims.push_back({rule.addFactor(size)});
  int64_t d = rule.addFactor(w.getDimSize(1));
  TensorFactors resultDims = idxDims;
  resultDims.push_back({d});
  rule.operands = {{{v}, {d}}, idxDims};
  rule.addedAfterReduction = {false, false};
  rule.results = {resultDims};
  return rule;
}

ShardingRule CrossEntropyOp::getShardingRule() {
  ShardingRule rule;
  auto x = tensorType(getInput()), t = tensorType(getTarget());
  int64_t classDim = x.getRank() == 1 ? 0 : 1;
  // The batch (and extra) dims: parallel without reduction, a sum when the
  // loss is summed, replicated for a mean (ignored targets make the mean of
  // shard means wrong).
  FactorKind batchKind = getReduction() == LossReduction::none
                             ? FactorKind::Parallel
                         : getReduction() == LossReduction::sum
                             ? FactorKind::Reduction
                             : FactorKind::Replicated;
  // Vocabulary-parallel: with the classes split, the loss is a Partial sum
  // (the partitioner reduces the max and the sum of exponentials across
  // ranks inside). Only plain class-index targets: smoothing and
  // probability targets keep the classes whole.
  bool classesShardable = isa<IntegerType>(t.getElementType()) &&
                          getLabelSmoothing().convertToDouble() == 0.0;
  TensorFactors xDims, lossDims;
  for (int64_t d = 0; d < x.getRank(); ++d) {
    if (d == classDim) {
      xDims.push_back({rule.addFactor(x.getDimSize(d), classesShardable
                                                           ? FactorKind::Reduction
                                                           : FactorKind::Replicated)});
      continue;
    }
    xDims.push_back({rule.addFactor(x.getDimSize(d), batchKind)});
    lossDims.push_back(xDims.back());
  }
  rule.operands = {xDims, t.getRank() == x.getRank() ? xDims : lossDims};
  rule.addedAfterReduction = {false, false};
  rule.results = {getReduction() == LossReduction::none ? lossDims
                                                        : TensorFactors{}};
  return rule;
}

//===----------------------------------------------------------------------===//
// Shape ops
//===----------------------------------------------------------------------===//

ShardingRule ReshapeOp::getShardingRule() {
  auto in = tensorType(getInput());
  auto out = cast<RankedTensorType>(getType());
  if (!in.hasStaticShape() || !out.hasStaticShape() || in.getNumElements() == 0 ||
      out.getNumElements() == 0)
    return ShardingRule::replicated(*this);
  ShardingRule rule;
  TensorFactors inDims(in.getRank()), outDims(out.getRank());
  ArrayRef<int64_t> a = in.getShape(), b = out.getShape();
  size_t i = 0, j = 0;
  // Walk both shapes, grouping dims whose products agree. A split (one input
  // dim, several output dims) or a merge (the reverse) is expressed with one
  // factor per finer dim; the coarse dim lists them major to minor. Groups
  // that are neither stay replicated. Dims of size 1 have no factor.
  while (i < a.size() || j < b.size()) {
    if (i < a.size() && a[i] == 1) {
      ++i;
      continue;
    }
    if (j < b.size() && b[j] == 1) {
      ++j;
      continue;
    }
    if (i >= a.size() || j >= b.size())
      break;
    size_t i0 = i, j0 = j;
    int64_t pa = a[i++], pb = b[j++];
    while (pa != pb) {
      if (pa < pb && i < a.size())
        pa *= a[i++];
      else if (pb < pa && j < b.size())
        pb *= b[j++];
      else
        return ShardingRule::replicated(*this); // products never meet
    }
    size_t na = i - i0, nb = j - j0;
    if (na == 1 && nb == 1) {
      int64_t f = rule.addFactor(a[i0]);
      inDims[i0] = {f};
      outDims[j0] = {f};
    } else if (na == 1) {
      for (size_t d = j0; d < j; ++d) {
        int64_t f = rule.addFactor(b[d]);
        outDims[d] = {f};
        inDims[i0].push_back(f);
      }
    } else if (nb == 1) {
      for (size_t d = i0; d < i; ++d) {
        int64_t f = rule.addFactor(a[d]);
        inDims[d] = {f};
        outDims[j0].push_back(f);
      }
    } else {
      for (size_t d = i0; d < i; ++d)
        inDims[d] = {rule.addFactor(a[d], FactorKind::Replicated)};
      for (size_t d = j0; d < j; ++d)
        outDims[d] = {rule.addFactor(b[d], FactorKind::Replicated)};
    }
  }
  rule.operands = {inDims};
  rule.addedAfterReduction = {false};
  rule.results = {outDims};
  rule.linear = true;
  return rule;
}

ShardingRule TransposeOp::getShardingRule() {
  ShardingRule rule = sameShapeRule(*this, {});
  int64_t rank = tensorType(getInput()).getRank();
  std::swap(rule.results[0][*normalizeDim(static_cast<int64_t>(getDim0()), rank)],
            rule.results[0][*normalizeDim(static_cast<int64_t>(getDim1()), rank)]);
  rule.linear = true;
  return rule;
}

ShardingRule PermuteOp::getShardingRule() {
  ShardingRule rule = sameShapeRule(*this, {});
  int64_t rank = tensorType(getInput()).getRank();
  TensorFactors permuted;
  for (int64_t p : getPermutation())
    permuted.push_back(rule.operands[0][*normalizeDim(p, rank)]);
  rule.results[0] = permuted;
  rule.linear = true;
  return rule;
}

ShardingRule SliceOp::getShardingRule() {
  auto in = tensorType(getInput());
  int64_t dim = *normalizeDim(static_cast<int64_t>(getDim()), in.getRank());
  int64_t n = in.getDimSize(dim);
  bool whole = !ShapedType::isDynamic(n) && static_cast<int64_t>(getStart()) == 0 &&
               static_cast<int64_t>(getEnd()) >= n && static_cast<int64_t>(getStep()) == 1;
  ShardingRule rule = sameShapeRule(*this, whole ? ArrayRef<int64_t>{}
                                                 : ArrayRef<int64_t>{dim});
  // The sliced dim changes size: give the result its own factor there.
  if (!whole) {
    int64_t f = rule.addFactor(cast<RankedTensorType>(getType()).getDimSize(dim),
                               FactorKind::Replicated);
    rule.results[0][dim] = {f};
  }
  rule.linear = true;
  return rule;
}

ShardingRule ConcatOp::getShardingRule() {
  ShardingRule rule;
  auto r = cast<RankedTensorType>(getType());
  int64_t dim = *normalizeDim(static_cast<int64_t>(getDim()), r.getRank());
  TensorFactors shared;
  for (int64_t d = 0; d < r.getRank(); ++d)
    shared.push_back(d == dim ? DimFactors{} : DimFactors{rule.addFactor(r.getDimSize(d))});
  for (Value v : getInputs()) {
    TensorFactors dims = shared;
    dims[dim] = {rule.addFactor(tensorType(v).getDimSize(dim), FactorKind::Replicated)};
    rule.operands.push_back(dims);
    rule.addedAfterReduction.push_back(false);
  }
  TensorFactors resultDims = shared;
  resultDims[dim] = {rule.addFactor(r.getDimSize(dim), FactorKind::Replicated)};
  rule.results = {resultDims};
  // Concatenated partial sums are the partial sum of the concatenation.
  rule.linear = true;
  return rule;
}

ShardingRule ExpandOp::getShardingRule() {
  ShardingRule rule;
  auto in = tensorType(getInput());
  auto r = cast<RankedTensorType>(getType());
  TensorFactors inDims, outDims;
  int64_t lead = r.getRank() - in.getRank();
  for (int64_t d = 0; d < r.getRank(); ++d)
    outDims.push_back({rule.addFactor(r.getDimSize(d))});
  for (int64_t d = 0; d < in.getRank(); ++d) {
    if (in.getDimSize(d) == 1 && r.getDimSize(d + lead) != 1)
      inDims.push_back({});
    else
      inDims.push_back(outDims[d + lead]);
  }
  rule.operands = {inDims};
  rule.addedAfterReduction = {false};
  rule.results = {outDims};
  rule.linear = true;
  return rule;
}
