//===- AtenShardingRules.cpp - factor mappings of generic aten ops --------===//
//
// A `tdx.aten` op is replicated unless its schema has a rule here. The rows
// are the ops libtorch's autograd dispatches for the backward of ops tdx
// shards (a training step's backward is recorded as libtorch runs it): with
// a rule, the batch stays split through the backward and a weight's
// gradient comes out Partial, as the forward's matmuls do. A rule only
// maps dims to factors; the op still runs through ATen on the local
// operands, so a rule is right when ATen on a shard computes the shard (or
// the partial sum) of the global result.
//
//===----------------------------------------------------------------------===//

#include "tdx/IR/ShardingRule.h"
#include "tdx/IR/TdxOps.h"

#include "llvm/ADT/StringMap.h"

using namespace mlir;
using namespace mlir::tdx;

namespace {

RankedTensorType typeOf(Value v) { return cast<RankedTensorType>(v.getType()); }

int64_t intArg(AtenOp op, StringRef name, int64_t otherwise) {
  DictionaryAttr args = op.getArgsAttr();
  auto i = args ? args.getAs<IntegerAttr>(name) : IntegerAttr();
  return i ? i.getInt() : otherwise;
}

/// Every operand and the one result have one shape: one factor per dim,
/// `replicated` for the dims that may not be split (a softmax's dim).
std::optional<ShardingRule> sameShape(AtenOp op, ArrayRef<int64_t> replicatedDims) {
  if (op->getNumResults() != 1)
    return std::nullopt;
  RankedTensorType t = typeOf(op->getResult(0));
  ShardingRule rule;
  TensorFactors dims;
  for (int64_t d = 0; d < t.getRank(); ++d)
    dims.push_back({rule.addFactor(t.getDimSize(d), llvm::is_contained(replicatedDims, d)
                                                        ? FactorKind::Replicated
                                                        : FactorKind::Parallel)});
  for (Value v : op->getOperands()) {
    if (typeOf(v).getShape() != t.getShape())
      return std::nullopt;
    rule.operands.push_back(dims);
    rule.addedAfterReduction.push_back(false);
  }
  rule.results.push_back(dims);
  return rule;
}

/// threshold_backward(grad, self, threshold), hardswish_backward(grad,
/// self), ..., broadcasting (tdx-raise-aten turns the backward formulas it
/// knows into elementwise ops).
std::optional<ShardingRule> pointwise(AtenOp op) {
  if (op->getNumResults() != 1)
    return std::nullopt;
  int64_t rank = typeOf(op->getResult(0)).getRank();
  for (Value v : op->getOperands())
    if (typeOf(v).getRank() > rank)
      return std::nullopt;
  return ShardingRule::broadcast(op);
}

/// _softmax_backward_data(grad, output, dim, dtype) and the log form;
/// _safe_softmax(self, dim, dtype) (SDPA's math path under a mask: rows
/// that mask everything are zero): every dim but `dim` splits.
std::optional<ShardingRule> softmaxAlongDim(AtenOp op) {
  int64_t rank = typeOf(op->getResult(0)).getRank();
  int64_t dim = intArg(op, "dim", 0);
  return sameShape(op, {dim < 0 ? dim + rank : dim});
}

/// The factors of a norm's operands: `batch` over the leading dims, the
/// `normalized` trailing dims replicated; `[B..., 1...]` statistics.
struct NormFactors {
  ShardingRule rule;
  TensorFactors full, stats, weight;
};
std::optional<NormFactors> normFactors(RankedTensorType input, int64_t normalized,
                                       FactorKind batchKind) {
  if (normalized > input.getRank())
    return std::nullopt;
  NormFactors n;
  int64_t batch = input.getRank() - normalized;
  for (int64_t d = 0; d < input.getRank(); ++d) {
    bool isBatch = d < batch;
    int64_t f = n.rule.addFactor(input.getDimSize(d),
                                 isBatch ? batchKind : FactorKind::Replicated);
    n.full.push_back({f});
    n.stats.push_back(isBatch ? DimFactors{f} : DimFactors{});
    if (!isBatch)
      n.weight.push_back({f});
  }
  return n;
}

int64_t normalizedRank(AtenOp op) {
  DictionaryAttr args = op.getArgsAttr();
  auto shape = args ? args.getAs<DenseI64ArrayAttr>("normalized_shape") : DenseI64ArrayAttr();
  return shape ? static_cast<int64_t>(shape.size()) : -1;
}

/// native_layer_norm(input, normalized_shape, weight?, bias?, eps)
///   -> (out, mean, rstd)
/// _fused_rms_norm(input, normalized_shape, weight?, eps) -> (out, rstd):
/// the same factors (torch 2.x's RMSNorm on CUDA tensors, a model traced
/// with fake CUDA tensors; on the CPU torch decomposes it).
std::optional<ShardingRule> layerNorm(AtenOp op) {
  int64_t k = normalizedRank(op);
  bool rms = op.getSchema() == "aten::_fused_rms_norm";
  if (k < 0 || op->getNumResults() != (rms ? 2u : 3u))
    return std::nullopt;
  auto n = normFactors(typeOf(op->getOperand(0)), k, FactorKind::Parallel);
  if (!n)
    return std::nullopt;
  n->rule.operands.push_back(n->full);
  for (Value v : op->getOperands().drop_front()) {
    if (typeOf(v).getRank() != k)
      return std::nullopt;
    n->rule.operands.push_back(n->weight);
  }
  n->rule.addedAfterReduction.assign(op->getNumOperands(), false);
  n->rule.results = {n->full, n->stats};
  if (!rms)
    n->rule.results.push_back(n->stats);
  return n->rule;
}

/// native_layer_norm_backward(grad_out, input, normalized_shape, mean, rstd,
/// weight?, bias?, output_mask) -> (grad_input, grad_weight, grad_bias).
/// The batch dims are summed away in the weight and bias gradients: a split
/// batch leaves those Partial.
/// _fused_rms_norm_backward(grad_out, input, normalized_shape, rstd,
/// weight?, output_mask) -> (grad_input, grad_weight) likewise.
std::optional<ShardingRule> layerNormBackward(AtenOp op) {
  int64_t k = normalizedRank(op);
  bool rms = op.getSchema() == "aten::_fused_rms_norm_backward";
  unsigned stats = rms ? 1 : 2;
  if (k < 0 || op->getNumOperands() < 2 + stats || op->getNumResults() != 1 + stats)
    return std::nullopt;
  RankedTensorType input = typeOf(op->getOperand(1));
  auto n = normFactors(input, k, FactorKind::Reduction);
  if (!n || typeOf(op->getOperand(0)) != input)
    return std::nullopt;
  n->rule.operands = {n->full, n->full, n->stats};
  if (!rms)
    n->rule.operands.push_back(n->stats);
  for (Value v : op->getOperands().drop_front(2 + stats)) {
    if (typeOf(v).getRank() != k)
      return std::nullopt;
    n->rule.operands.push_back(n->weight);
  }
  n->rule.addedAfterReduction.assign(op->getNumOperands(), false);
  for (Value r : op->getResults().drop_front())
    if (typeOf(r).getRank() != k)
      return std::nullopt;
  n->rule.results = {n->full, n->weight, n->weight};
  return n->rule;
}

/// embedding_dense_backward(grad_output [S..., D], indices [S...],
/// num_weights, padding_idx, scale_grad_by_freq) -> [V, D]: rows are
/// summed over S, so a split S leaves a Partial table gradient.
std::optional<ShardingRule> embeddingBackward(AtenOp op) {
  DictionaryAttr args = op.getArgsAttr();
  auto byFreq = args ? args.getAs<BoolAttr>("scale_grad_by_freq") : BoolAttr();
  if (!byFreq || byFreq.getValue() || op->getNumOperands() != 2)
    return std::nullopt; // frequencies count over every index
  RankedTensorType grad = typeOf(op->getOperand(0)), ids = typeOf(op->getOperand(1));
  RankedTensorType out = typeOf(op->getResult(0));
  if (grad.getRank() != ids.getRank() + 1 || out.getRank() != 2)
    return std::nullopt;
  ShardingRule rule;
  TensorFactors g, i;
  for (int64_t d = 0; d < ids.getRank(); ++d) {
    int64_t f = rule.addFactor(ids.getDimSize(d), FactorKind::Reduction);
    g.push_back({f});
    i.push_back({f});
  }
  int64_t dim = rule.addFactor(out.getDimSize(1));
  g.push_back({dim});
  int64_t rows = rule.addFactor(out.getDimSize(0), FactorKind::Replicated);
  rule.operands = {g, i};
  rule.addedAfterReduction = {false, false};
  rule.results = {{{rows}, {dim}}};
  return rule;
}

/// nll_loss_backward(grad_output, self [N, C] or [C], target, weight?,
/// reduction, ignore_index, total_weight): each row's gradient needs only
/// its own target (and the global total weight, a replicated operand).
std::optional<ShardingRule> nllLossBackward(AtenOp op) {
  RankedTensorType self = typeOf(op->getOperand(1));
  if (self.getRank() != 2 || op->getNumResults() != 1)
    return std::nullopt;
  ShardingRule rule;
  int64_t n = rule.addFactor(self.getDimSize(0));
  int64_t c = rule.addFactor(self.getDimSize(1), FactorKind::Replicated);
  for (auto [i, v] : llvm::enumerate(op->getOperands())) {
    RankedTensorType t = typeOf(v);
    TensorFactors dims;
    if (i == 1)
      dims = {{n}, {c}};
    else if (i == 2 || (i == 0 && t.getRank() == 1)) // target; an unreduced grad_output
      dims = {{n}};
    else if (t.getRank() == 1) // class weights
      dims = {{c}};
    else if (t.getRank() != 0) // grad_output, total_weight: scalars
      return std::nullopt;
    rule.operands.push_back(dims);
    rule.addedAfterReduction.push_back(false);
  }
  rule.results = {{{n}, {c}}};
  return rule;
}

/// slice_backward(grad, input_sizes, dim, start, end, step): the gradient
/// of a slice, placed in zeros of the input's shape (rotary embeddings'
/// x[..., ::2]). The other dims split alike; the op is linear in grad.
std::optional<ShardingRule> sliceBackward(AtenOp op) {
  if (op->getNumOperands() != 1 || op->getNumResults() != 1)
    return std::nullopt;
  RankedTensorType g = typeOf(op->getOperand(0)), r = typeOf(op->getResult(0));
  if (g.getRank() != r.getRank())
    return std::nullopt;
  int64_t dim = intArg(op, "dim", 0);
  dim = dim < 0 ? dim + r.getRank() : dim;
  ShardingRule rule;
  TensorFactors grad, result;
  for (int64_t d = 0; d < r.getRank(); ++d) {
    if (d == dim) {
      grad.push_back({rule.addFactor(g.getDimSize(d), FactorKind::Replicated)});
      result.push_back({rule.addFactor(r.getDimSize(d), FactorKind::Replicated)});
      continue;
    }
    if (g.getDimSize(d) != r.getDimSize(d))
      return std::nullopt;
    int64_t f = rule.addFactor(r.getDimSize(d));
    grad.push_back({f});
    result.push_back({f});
  }
  rule.operands.push_back(grad);
  rule.addedAfterReduction.push_back(false);
  rule.results.push_back(result);
  rule.linear = true;
  return rule;
}

/// One factor per dim of `t`: `batch` (a factor of `rule`, or -1) on dim 0,
/// a replicated factor of its own on each other dim.
TensorFactors batchOnly(ShardingRule &rule, RankedTensorType t, int64_t batch) {
  TensorFactors dims;
  for (int64_t d = 0; d < t.getRank(); ++d)
    dims.push_back({batch >= 0 && d == 0 ? batch
                                         : rule.addFactor(t.getDimSize(d), FactorKind::Replicated)});
  return dims;
}

/// Ops over [N, C, spatial...] planes, each plane on its own: pooling
/// (max_pool2d_with_indices -> (out, indices), whose indices count within a
/// plane) and the pooling backwards (grad_output, self[, indices]) ->
/// grad_input. The batch and channel dims split; the spatial dims, whose
/// windows cross any split, stay whole.
std::optional<ShardingRule> planes(AtenOp op) {
  if (op->getNumOperands() == 0)
    return std::nullopt;
  RankedTensorType first = typeOf(op->getOperand(0));
  if (first.getRank() < 3)
    return std::nullopt;
  ShardingRule rule;
  int64_t n = rule.addFactor(first.getDimSize(0)), c = rule.addFactor(first.getDimSize(1));
  auto factors = [&](RankedTensorType t) -> std::optional<TensorFactors> {
    if (t.getRank() != first.getRank() || t.getDimSize(0) != first.getDimSize(0) ||
        t.getDimSize(1) != first.getDimSize(1))
      return std::nullopt;
    TensorFactors dims{{n}, {c}};
    for (int64_t d = 2; d < t.getRank(); ++d)
      dims.push_back({rule.addFactor(t.getDimSize(d), FactorKind::Replicated)});
    return dims;
  };
  for (Value v : op->getOperands()) {
    auto dims = factors(typeOf(v));
    if (!dims)
      return std::nullopt;
    rule.operands.push_back(*dims);
    rule.addedAfterReduction.push_back(false);
  }
  for (Value r : op->getResults()) {
    auto dims = factors(typeOf(r));
    if (!dims)
      return std::nullopt;
    rule.results.push_back(*dims);
  }
  return rule;
}

/// convolution_backward(grad_output [N, Co, ...], input [N, Ci, ...],
/// weight [Co, Ci/groups, ...], ...) -> (grad_input, grad_weight,
/// grad_bias [Co] or [0]): each sample's gradient is its own, the weight's
/// and bias's sum over the batch, so a split batch leaves them Partial. The
/// channel and spatial dims stay whole.
std::optional<ShardingRule> convolutionBackward(AtenOp op) {
  DictionaryAttr args = op.getArgsAttr();
  auto transposed = args ? args.getAs<BoolAttr>("transposed") : BoolAttr();
  if (!transposed || transposed.getValue() || op->getNumOperands() != 3 ||
      op->getNumResults() != 3)
    return std::nullopt;
  RankedTensorType dy = typeOf(op->getOperand(0)), x = typeOf(op->getOperand(1));
  // A gradient the output mask leaves out is an empty tensor.
  RankedTensorType dx = typeOf(op->getResult(0));
  bool inputGrad = dx.getNumElements() != 0;
  if (dy.getRank() < 3 || x.getRank() != dy.getRank() || dy.getDimSize(0) != x.getDimSize(0) ||
      (inputGrad && dx != x))
    return std::nullopt;
  ShardingRule rule;
  int64_t n = rule.addFactor(x.getDimSize(0), FactorKind::Reduction);
  TensorFactors input = batchOnly(rule, x, n);
  rule.operands = {batchOnly(rule, dy, n), input, batchOnly(rule, typeOf(op->getOperand(2)), -1)};
  rule.addedAfterReduction.assign(3, false);
  rule.results = {inputGrad ? input : batchOnly(rule, dx, -1),
                  batchOnly(rule, typeOf(op->getResult(1)), -1),
                  batchOnly(rule, typeOf(op->getResult(2)), -1)};
  return rule;
}

/// native_group_norm(input [N, C, ...], weight?, bias?, N, C, HxW, group,
/// eps) -> (out, mean [N, group], rstd [N, group]), and
/// native_group_norm_backward(grad_out, input, mean, rstd, weight?, N, C,
/// HxW, group, output_mask) -> (grad_input, grad_weight [C], grad_bias
/// [C]): every sample is normalized on its own, so the batch splits (its
/// count `N` becomes the local one); the weight's and bias's gradients sum
/// over it, Partial when it is split. Channels and the rest stay whole.
std::optional<ShardingRule> groupNorm(AtenOp op) {
  bool backward = op.getSchema() == "aten::native_group_norm_backward";
  if (op->getNumResults() != 3 || op->getNumOperands() < (backward ? 4u : 1u))
    return std::nullopt;
  RankedTensorType x = typeOf(op->getOperand(backward ? 1 : 0));
  if (x.getRank() < 2)
    return std::nullopt;
  ShardingRule rule;
  int64_t n = rule.addFactor(x.getDimSize(0), backward ? FactorKind::Reduction
                                                       : FactorKind::Parallel);
  auto add = [&](SmallVector<TensorFactors> &to, Value v, bool batch) {
    RankedTensorType t = typeOf(v);
    if (batch && (t.getRank() < 1 || t.getDimSize(0) != x.getDimSize(0)))
      return false;
    to.push_back(batchOnly(rule, t, batch ? n : -1));
    return true;
  };
  // Forward: input, then [C] weight and bias. Backward: grad_out, input,
  // mean, rstd ([N, group]), then the [C] weight.
  for (auto [i, v] : llvm::enumerate(op->getOperands()))
    if (!add(rule.operands, v, backward ? i < 4 : i == 0))
      return std::nullopt;
  rule.addedAfterReduction.assign(op->getNumOperands(), false);
  for (auto [i, r] : llvm::enumerate(op->getResults())) {
    // An output the mask leaves out is an empty tensor.
    bool batch = backward ? i == 0 && typeOf(r).getNumElements() != 0 : true;
    if (!add(rule.results, r, batch))
      return std::nullopt;
  }
  return rule;
}

/// _grouped_mm(self, mat2, offs?, bias?, out_dtype?), torch's grouped GEMM
/// (a Mixture of Experts' experts). The dim `offs` groups stays whole
/// (which rows belong to which group is in its values), and so does the
/// groups dim; the others split as a matmul's: 2D x 3D (the experts'
/// forward) (m, k) x (g, k, n) -> (m, n) grouped over m; 2D x 2D (the
/// weights' gradient) (m, k) x (k, n) -> (g, m, n) grouped over k; 3D x
/// 3D without offs a batched matmul. With a bias, replicated.
std::optional<ShardingRule> groupedMm(AtenOp op) {
  SmallVector<Value> plain = op.getPlainOperands();
  DictionaryAttr args = op.getArgsAttr();
  auto given = [&](StringRef name) {
    return !(args && isa_and_nonnull<UnitAttr>(args.get(name)));
  };
  bool offs = given("offs");
  if (op->getNumResults() != 1 || given("bias") || plain.size() != (offs ? 3u : 2u))
    return std::nullopt;
  RankedTensorType a = typeOf(plain[0]), b = typeOf(plain[1]), r = typeOf(op->getResult(0));
  ShardingRule rule;
  auto factor = [&](int64_t size, FactorKind kind = FactorKind::Parallel) {
    return DimFactors{rule.addFactor(size, kind)};
  };
  if (a.getRank() == 2 && b.getRank() == 3 && offs) {
    DimFactors m = factor(a.getDimSize(0), FactorKind::Replicated),
               k = factor(a.getDimSize(1), FactorKind::Reduction),
               g = factor(b.getDimSize(0), FactorKind::Replicated), n = factor(b.getDimSize(2));
    rule.operands = {{m, k}, {g, k, n}, {g}};
    rule.results = {{m, n}};
  } else if (a.getRank() == 2 && b.getRank() == 2 && offs && r.getRank() == 3) {
    DimFactors m = factor(a.getDimSize(0)), k = factor(a.getDimSize(1), FactorKind::Replicated),
               n = factor(b.getDimSize(1)), g = factor(r.getDimSize(0), FactorKind::Replicated);
    rule.operands = {{m, k}, {k, n}, {g}};
    rule.results = {{g, m, n}};
  } else if (a.getRank() == 3 && b.getRank() == 3 && !offs) {
    DimFactors g = factor(a.getDimSize(0)), m = factor(a.getDimSize(1)),
               k = factor(a.getDimSize(2), FactorKind::Reduction), n = factor(b.getDimSize(2));
    rule.operands = {{g, m, k}, {g, k, n}};
    rule.results = {{g, m, n}};
  } else {
    return std::nullopt;
  }
  rule.addedAfterReduction.assign(rule.operands.size(), false);
  return rule;
}

/// index_copy(self, dim, index, source): rows of `source` written into
/// `self` at `index` along `dim` (a generation step's key/value cache at
/// its position). `dim` and the index stay whole; every other dim splits,
/// self, source and the result alike (each rank writes its heads).
std::optional<ShardingRule> indexCopy(AtenOp op) {
  SmallVector<Value> plain = op.getPlainOperands();
  if (op->getNumResults() != 1 || plain.size() != 3)
    return std::nullopt;
  RankedTensorType self = typeOf(plain[0]), index = typeOf(plain[1]), source = typeOf(plain[2]);
  int64_t rank = self.getRank(), dim = intArg(op, "dim", -1);
  if (dim < 0)
    dim += rank;
  if (dim < 0 || dim >= rank || source.getRank() != rank || index.getRank() != 1)
    return std::nullopt;
  ShardingRule rule;
  TensorFactors selfDims, sourceDims;
  DimFactors rows{rule.addFactor(index.getDimSize(0), FactorKind::Replicated)};
  for (int64_t d = 0; d < rank; ++d) {
    if (d == dim) {
      selfDims.push_back({rule.addFactor(self.getDimSize(d), FactorKind::Replicated)});
      sourceDims.push_back(rows);
      continue;
    }
    if (self.getDimSize(d) != source.getDimSize(d))
      return std::nullopt;
    DimFactors f{rule.addFactor(self.getDimSize(d))};
    selfDims.push_back(f);
    sourceDims.push_back(f);
  }
  rule.operands = {selfDims, {rows}, sourceDims};
  rule.results = {selfDims};
  rule.addedAfterReduction.assign(3, false);
  return rule;
}

using Rule = std::optional<ShardingRule> (*)(AtenOp);
/// A schema's rule, and the argument that spells the result's shape (global
/// in the captured program, the local shape once partitioned).
struct Row {
  Row(Rule rule, const char *resultSizes = nullptr, const char *batchCount = nullptr)
      : rule(rule), resultSizes(resultSizes), batchCount(batchCount) {}
  Rule rule;
  const char *resultSizes;
  /// The int argument that counts the batch (dim 0 of the first operand).
  const char *batchCount;
};
const llvm::StringMap<Row> &rules() {
  static const llvm::StringMap<Row> table = {
      {"aten::threshold_backward", pointwise},
      {"aten::hardtanh_backward", pointwise},
      {"aten::hardswish_backward", pointwise},
      {"aten::hardsigmoid_backward", pointwise},
      {"aten::_grouped_mm", groupedMm},
      {"aten::index_copy", indexCopy},
      {"aten::_safe_softmax", softmaxAlongDim},
      {"aten::_softmax_backward_data", softmaxAlongDim},
      {"aten::_log_softmax_backward_data", softmaxAlongDim},
      {"aten::native_layer_norm", layerNorm},
      {"aten::native_layer_norm_backward", layerNormBackward},
      {"aten::_fused_rms_norm", layerNorm},
      {"aten::_fused_rms_norm_backward", layerNormBackward},
      {"aten::embedding_dense_backward", embeddingBackward},
      {"aten::nll_loss_backward", nllLossBackward},
      {"aten::slice_backward", {sliceBackward, "input_sizes"}},
      {"aten::native_group_norm", {groupNorm, nullptr, "N"}},
      {"aten::native_group_norm_backward", {groupNorm, nullptr, "N"}},
      {"aten::convolution_backward", convolutionBackward},
      {"aten::max_pool2d_with_indices", planes},
      {"aten::max_pool2d_with_indices_backward", planes},
      {"aten::avg_pool2d_backward", planes},
      {"aten::_adaptive_avg_pool2d_backward", planes},
  };
  return table;
}

} // namespace

ShardingRule AtenOp::getShardingRule() {
  auto row = rules().find(getSchema());
  if (row != rules().end())
    if (std::optional<ShardingRule> rule = row->second.rule(*this))
      return *rule;
  return ShardingRule::replicated(*this);
}

LogicalResult AtenOp::partition(PartitionContext &) {
  auto row = rules().find(getSchema());
  if (row == rules().end())
    return success();
  if (const char *count = row->second.batchCount) {
    int64_t local = cast<RankedTensorType>(getOperand(0).getType()).getDimSize(0);
    if (ShapedType::isDynamic(local))
      return emitOpError() << "(" << getSchema() << ") is split unevenly, so its '" << count
                           << "' differs between ranks; split the batch evenly";
    NamedAttrList args(getArgsAttr());
    args.set(count, IntegerAttr::get(IntegerType::get(getContext(), 64), local));
    setArgsAttr(args.getDictionary(getContext()));
  }
  if (!row->second.resultSizes)
    return success();
  auto local = cast<RankedTensorType>(getResult(0).getType());
  if (!local.hasStaticShape())
    return emitOpError() << "(" << getSchema() << ") is split unevenly, so its '"
                         << row->second.resultSizes
                         << "' differs between ranks; split the value it makes evenly";
  NamedAttrList args(getArgsAttr());
  args.set(row->second.resultSizes, DenseI64ArrayAttr::get(getContext(), local.getShape()));
  setArgsAttr(args.getDictionary(getContext()));
  return success();
}
