//===- TdxNNOps.cpp - matmul, norms, embedding, losses --------------------===//

#include "tdx/IR/TdxOps.h"

#include "mlir/Dialect/Traits.h"
#include "mlir/IR/PatternMatch.h"

using namespace mlir;
using namespace mlir::tdx;

/// Formats a shape as `[2x3x4]` for diagnostics.
static std::string shapeStr(ArrayRef<int64_t> shape) {
  std::string s;
  llvm::raw_string_ostream os(s);
  os << "[";
  llvm::interleave(
      shape, os,
      [&](int64_t d) {
        if (ShapedType::isDynamic(d))
          os << "?";
        else
          os << d;
      },
      "x");
  os << "]";
  return s;
}

static bool dimsCompatible(int64_t a, int64_t b) {
  return ShapedType::isDynamic(a) || ShapedType::isDynamic(b) || a == b;
}

//===----------------------------------------------------------------------===//
// MatmulOp
//===----------------------------------------------------------------------===//

LogicalResult MatmulOp::inferReturnTypes(MLIRContext *, std::optional<Location> loc,
                                         Adaptor adaptor, SmallVectorImpl<Type> &inferred) {
  ValueRange operands = adaptor.getOperands();
  auto a = cast<RankedTensorType>(operands[0].getType());
  auto b = cast<RankedTensorType>(operands[1].getType());
  if (a.getElementType() != b.getElementType())
    return emitOptionalError(loc, "'", getOperationName(), "' op operands have element types ",
                             a.getElementType(), " and ", b.getElementType(),
                             "; insert a 'tdx.cast' so both have one dtype");
  if (a.getRank() == 0 || b.getRank() == 0)
    return emitOptionalError(loc, "'", getOperationName(),
                             "' op needs operands of rank >= 1 (torch.matmul); "
                             "use 'tdx.mul' to scale by a 0-D tensor");
  // Promote 1-D operands to matrices as torch.matmul does.
  SmallVector<int64_t> sa(a.getShape()), sb(b.getShape());
  bool aVec = sa.size() == 1, bVec = sb.size() == 1;
  if (aVec)
    sa.insert(sa.begin(), 1);
  if (bVec)
    sb.push_back(1);
  int64_t ka = sa.back(), kb = sb[sb.size() - 2];
  if (!dimsCompatible(ka, kb))
    return emitOptionalError(
        loc, "'", getOperationName(), "' op contracting dims differ: lhs ",
        shapeStr(a.getShape()), " has ", ka, " columns but rhs ",
        shapeStr(b.getShape()), " has ", kb, " rows");
  SmallVector<int64_t> batch;
  ArrayRef<int64_t> ba(sa.data(), sa.size() - 2), bb(sb.data(), sb.size() - 2);
  if (!OpTrait::util::getBroadcastedShape(ba, bb, batch))
    return emitOptionalError(loc, "'", getOperationName(), "' op batch dims ",
                             shapeStr(ba), " and ", shapeStr(bb),
                             " do not broadcast");
  SmallVector<int64_t> shape(batch);
  if (!aVec)
    shape.push_back(sa[sa.size() - 2]);
  if (!bVec)
    shape.push_back(sb.back());
  inferred.push_back(RankedTensorType::get(shape, a.getElementType()));
  return success();
}

//===----------------------------------------------------------------------===//
// LinearOp
//===----------------------------------------------------------------------===//

LogicalResult LinearOp::inferReturnTypes(MLIRContext *, std::optional<Location> loc,
                                         Adaptor adaptor, SmallVectorImpl<Type> &inferred) {
  StringRef name = getOperationName();
  auto x = cast<RankedTensorType>(adaptor.getInput().getType());
  auto w = cast<RankedTensorType>(adaptor.getWeight().getType());
  if (x.getRank() < 1)
    return emitOptionalError(loc, "'", name, "' op input must have rank >= 1");
  if (w.getRank() != 1 && w.getRank() != 2)
    return emitOptionalError(loc, "'", name, "' op weight must be [out, in] or [in], got ",
                             shapeStr(w.getShape()));
  for (Value v : adaptor.getOperands().drop_front())
    if (cast<RankedTensorType>(v.getType()).getElementType() != x.getElementType())
      return emitOptionalError(loc, "'", name, "' op weight and bias must have the input's "
                               "element type ", x.getElementType(),
                               "; insert a 'tdx.cast'");
  int64_t in = x.getShape().back(), win = w.getShape().back();
  if (!dimsCompatible(in, win))
    return emitOptionalError(loc, "'", name, "' op input ", shapeStr(x.getShape()),
                             " has ", in, " features but weight ",
                             shapeStr(w.getShape()), " expects ", win);
  SmallVector<int64_t> shape(x.getShape().drop_back());
  if (w.getRank() == 2)
    shape.push_back(w.getDimSize(0));
  if (Value bias = adaptor.getBias()) {
    auto b = cast<RankedTensorType>(bias.getType());
    SmallVector<int64_t> unused;
    if (b.getRank() > static_cast<int64_t>(shape.size()) ||
        !OpTrait::util::getBroadcastedShape(shape, b.getShape(), unused) ||
        ArrayRef<int64_t>(unused) != ArrayRef<int64_t>(shape))
      return emitOptionalError(loc, "'", name, "' op bias ", shapeStr(b.getShape()),
                               " does not broadcast to the output ",
                               shapeStr(shape));
  }
  inferred.push_back(RankedTensorType::get(shape, x.getElementType()));
  return success();
}

//===----------------------------------------------------------------------===//
// Softmax
//===----------------------------------------------------------------------===//

template <typename Op>
static LogicalResult verifySoftmaxDim(Op op) {
  int64_t rank = cast<RankedTensorType>(op.getInput().getType()).getRank();
  auto dim = static_cast<int64_t>(op.getDim());
  if (!normalizeDim(dim, std::max<int64_t>(rank, 1)))
    return op.emitOpError() << "dim " << dim
                            << " is out of range for a tensor of rank " << rank
                            << "; valid dims are " << -std::max<int64_t>(rank, 1)
                            << " to " << std::max<int64_t>(rank, 1) - 1;
  return success();
}
LogicalResult SoftmaxOp::verify() { return verifySoftmaxDim(*this); }
LogicalResult LogSoftmaxOp::verify() { return verifySoftmaxDim(*this); }

//===----------------------------------------------------------------------===//
// LayerNormOp / RmsNormOp
//===----------------------------------------------------------------------===//

static LogicalResult inferNorm(std::optional<Location> loc, StringRef name,
                               ValueRange operands, ArrayRef<int64_t> normalized,
                               double eps, SmallVectorImpl<Type> &inferred) {
  auto x = cast<RankedTensorType>(operands[0].getType());
  if (normalized.empty())
    return emitOptionalError(loc, "'", name,
                             "' op normalized_shape must name at least one dim");
  if (!(eps >= 0))
    return emitOptionalError(loc, "'", name, "' op eps must be >= 0, got ", formatNumber(eps));
  int64_t n = normalized.size();
  if (x.getRank() < n)
    return emitOptionalError(loc, "'", name, "' op normalized_shape ",
                             shapeStr(normalized), " has more dims than the input ",
                             shapeStr(x.getShape()));
  ArrayRef<int64_t> trailing = x.getShape().take_back(n);
  for (auto [d, e] : llvm::zip(trailing, normalized))
    if (!dimsCompatible(d, e))
      return emitOptionalError(loc, "'", name, "' op normalized_shape ",
                               shapeStr(normalized),
                               " must equal the trailing dims of the input ",
                               shapeStr(x.getShape()));
  for (Value v : operands.drop_front()) {
    auto t = cast<RankedTensorType>(v.getType());
    if (t.getShape() != normalized || t.getElementType() != x.getElementType())
      return emitOptionalError(loc, "'", name, "' op weight and bias must be ",
                               RankedTensorType::get(normalized, x.getElementType()),
                               ", got ", t);
  }
  inferred.push_back(x);
  return success();
}

LogicalResult LayerNormOp::inferReturnTypes(MLIRContext *, std::optional<Location> loc,
                                            Adaptor adaptor, SmallVectorImpl<Type> &inferred) {
  ValueRange operands = adaptor.getOperands();
  return inferNorm(loc, getOperationName(), operands, adaptor.getNormalizedShape(),
                   adaptor.getEps().convertToDouble(), inferred);
}

LogicalResult RmsNormOp::inferReturnTypes(MLIRContext *, std::optional<Location> loc,
                                          Adaptor adaptor, SmallVectorImpl<Type> &inferred) {
  ValueRange operands = adaptor.getOperands();
  return inferNorm(loc, getOperationName(), operands, adaptor.getNormalizedShape(),
                   adaptor.getEps().convertToDouble(), inferred);
}

//===----------------------------------------------------------------------===//
// SdpaOp / SdpaBackwardOp
//===----------------------------------------------------------------------===//

/// Checks query [B, H, S, D], key [B, Hkv, T, D], value [B, Hkv, T, E] (Hkv
/// divides H) and a mask that broadcasts to [B, H, S, T].
static LogicalResult checkAttention(std::optional<Location> loc, StringRef name, Value q,
                                    Value k, Value v, Value mask) {
  auto qt = cast<RankedTensorType>(q.getType()), kt = cast<RankedTensorType>(k.getType()),
       vt = cast<RankedTensorType>(v.getType());
  if (qt.getRank() != 4 || kt.getRank() != 4 || vt.getRank() != 4)
    return emitOptionalError(loc, "'", name,
                             "' op query, key and value must be [batch, heads, seq, dim], got ",
                             shapeStr(qt.getShape()), ", ", shapeStr(kt.getShape()), ", ",
                             shapeStr(vt.getShape()));
  if (kt.getElementType() != qt.getElementType() || vt.getElementType() != qt.getElementType())
    return emitOptionalError(loc, "'", name, "' op query, key and value must have one element type");
  auto q4 = qt.getShape(), k4 = kt.getShape(), v4 = vt.getShape();
  if (q4[0] != k4[0] || k4[0] != v4[0] || k4[1] != v4[1] || k4[2] != v4[2] || q4[3] != k4[3])
    return emitOptionalError(loc, "'", name, "' op key ", shapeStr(k4), " and value ",
                             shapeStr(v4), " do not fit query ", shapeStr(q4),
                             ": batch, heads and key length must agree, and key's dim must "
                             "be query's");
  if (k4[1] <= 0 || q4[1] % k4[1] != 0)
    return emitOptionalError(loc, "'", name, "' op key's ", k4[1],
                             " heads must divide query's ", q4[1], " (grouped-query attention)");
  if (mask) {
    auto mt = cast<RankedTensorType>(mask.getType());
    SmallVector<int64_t> full = {q4[0], q4[1], q4[2], k4[2]};
    if (mt.getRank() > 4)
      return emitOptionalError(loc, "'", name, "' op attn_mask ", shapeStr(mt.getShape()),
                               " has more than 4 dims");
    for (auto [d, m] : llvm::zip(llvm::reverse(full), llvm::reverse(mt.getShape())))
      if (m != 1 && m != d)
        return emitOptionalError(loc, "'", name, "' op attn_mask ", shapeStr(mt.getShape()),
                                 " does not broadcast to ", shapeStr(full));
  }
  return success();
}

LogicalResult SdpaOp::inferReturnTypes(MLIRContext *, std::optional<Location> loc,
                                       Adaptor adaptor, SmallVectorImpl<Type> &inferred) {
  if (failed(checkAttention(loc, getOperationName(), adaptor.getQuery(), adaptor.getKey(),
                            adaptor.getValue(), adaptor.getAttnMask())))
    return failure();
  auto q = cast<RankedTensorType>(adaptor.getQuery().getType());
  auto v = cast<RankedTensorType>(adaptor.getValue().getType());
  auto shape = q.getShape();
  inferred.push_back(RankedTensorType::get({shape[0], shape[1], shape[2], v.getShape()[3]},
                                           q.getElementType()));
  // The log-sum-exp is kept in the accumulate type, as torch's kernel keeps
  // it: f32 for bf16 and f16 queries.
  Type lse = q.getElementType();
  if (isa<BFloat16Type, Float16Type>(lse))
    lse = Float32Type::get(lse.getContext());
  inferred.push_back(RankedTensorType::get(shape.drop_back(), lse));
  return success();
}

LogicalResult SdpaBackwardOp::inferReturnTypes(MLIRContext *, std::optional<Location> loc,
                                               Adaptor adaptor,
                                               SmallVectorImpl<Type> &inferred) {
  if (failed(checkAttention(loc, getOperationName(), adaptor.getQuery(), adaptor.getKey(),
                            adaptor.getValue(), adaptor.getAttnMask())))
    return failure();
  if (adaptor.getGrad().getType() != adaptor.getOutput().getType())
    return emitOptionalError(loc, "'", getOperationName(), "' op grad ",
                             adaptor.getGrad().getType(), " must be the output's type ",
                             adaptor.getOutput().getType());
  inferred.push_back(adaptor.getQuery().getType());
  inferred.push_back(adaptor.getKey().getType());
  inferred.push_back(adaptor.getValue().getType());
  return success();
}

//===----------------------------------------------------------------------===//
// EmbeddingOp
//===----------------------------------------------------------------------===//

LogicalResult EmbeddingOp::inferReturnTypes(MLIRContext *, std::optional<Location> loc,
                                            Adaptor adaptor, SmallVectorImpl<Type> &inferred) {
  ValueRange operands = adaptor.getOperands();
  auto w = cast<RankedTensorType>(operands[0].getType());
  auto idx = cast<RankedTensorType>(operands[1].getType());
  if (w.getRank() != 2)
    return emitOptionalError(loc, "'", getOperationName(),
                             "' op weight must be [num_embeddings, dim], got ",
                             shapeStr(w.getShape()));
  if (std::optional<uint64_t> pad = adaptor.getPaddingIdx()) {
    int64_t p = static_cast<int64_t>(*pad), v = w.getDimSize(0);
    if (!ShapedType::isDynamic(v) && (p < -v || p >= v))
      return emitOptionalError(loc, "'", getOperationName(), "' op padding_idx ", p,
                               " is out of range for ", v, " embeddings");
  }
  SmallVector<int64_t> shape(idx.getShape());
  shape.push_back(w.getDimSize(1));
  inferred.push_back(RankedTensorType::get(shape, w.getElementType()));
  return success();
}

//===----------------------------------------------------------------------===//
// CrossEntropyOp
//===----------------------------------------------------------------------===//

LogicalResult CrossEntropyOp::inferReturnTypes(MLIRContext *, std::optional<Location> loc,
                                               Adaptor adaptor, SmallVectorImpl<Type> &inferred) {
  StringRef name = getOperationName();
  auto x = cast<RankedTensorType>(adaptor.getInput().getType());
  auto t = cast<RankedTensorType>(adaptor.getTarget().getType());
  if (x.getRank() < 1)
    return emitOptionalError(loc, "'", name, "' op input must be [C] or [N, C, d...]");
  // Per-element loss shape: input without its class dim.
  SmallVector<int64_t> lossShape(x.getShape());
  lossShape.erase(lossShape.begin() + (x.getRank() == 1 ? 0 : 1));
  if (isa<FloatType>(t.getElementType())) {
    if (t != x)
      return emitOptionalError(loc, "'", name, "' op probability targets must have the "
                               "input's type ", x, ", got ", t);
  } else if (isa<IntegerType>(t.getElementType())) {
    if (t.getRank() != static_cast<int64_t>(lossShape.size()) ||
        llvm::any_of(llvm::zip(t.getShape(), lossShape), [](auto p) {
          return !dimsCompatible(std::get<0>(p), std::get<1>(p));
        }))
      return emitOptionalError(loc, "'", name, "' op class-index target ",
                               shapeStr(t.getShape()), " must be ",
                               shapeStr(lossShape), " for input ",
                               shapeStr(x.getShape()));
  } else {
    return emitOptionalError(loc, "'", name,
                             "' op target must hold integer class indices or "
                             "float probabilities");
  }
  if (adaptor.getReduction() != LossReduction::none)
    lossShape.clear();
  inferred.push_back(RankedTensorType::get(lossShape, x.getElementType()));
  return success();
}

LogicalResult CrossEntropyOp::verify() {
  double ls = getLabelSmoothing().convertToDouble();
  if (!(ls >= 0.0 && ls <= 1.0))
    return emitOpError() << "label_smoothing " << formatNumber(ls) << " must be in [0, 1]";
  return success();
}


//===----------------------------------------------------------------------===//
// MatmulOp canonicalization
//===----------------------------------------------------------------------===//

namespace {
/// reshape [L..., m, k] -> [prod(L), m, k] and [L..., k, n] -> [prod(L), k, n],
/// matmul, reshape [prod(L), m, n] -> [L..., m, n]: one matmul over L.
struct FoldBatchReshapes : public OpRewritePattern<MatmulOp> {
  using OpRewritePattern::OpRewritePattern;

  LogicalResult matchAndRewrite(MatmulOp op, PatternRewriter &rewriter) const override {
    auto lhs = op.getLhs().getDefiningOp<ReshapeOp>();
    auto rhs = op.getRhs().getDefiningOp<ReshapeOp>();
    if (!lhs || !rhs || !op->hasOneUse())
      return failure();
    auto out = dyn_cast<ReshapeOp>(*op->getUsers().begin());
    if (!out)
      return failure();
    auto x = cast<RankedTensorType>(lhs.getInput().getType());
    auto y = cast<RankedTensorType>(rhs.getInput().getType());
    auto a = cast<RankedTensorType>(op.getLhs().getType());
    auto b = cast<RankedTensorType>(op.getRhs().getType());
    auto r = cast<RankedTensorType>(out.getType());
    if (a.getRank() != 3 || b.getRank() != 3 || x.getRank() < 3 ||
        x.getRank() != y.getRank() || r.getRank() != x.getRank() ||
        !x.hasStaticShape() || !y.hasStaticShape() || !r.hasStaticShape())
      return failure();
    int64_t rank = x.getRank();
    ArrayRef<int64_t> lead = x.getShape().drop_back(2);
    if (lead != y.getShape().drop_back(2) || lead != r.getShape().drop_back(2))
      return failure();
    int64_t batch = 1;
    for (int64_t d : lead)
      batch *= d;
    // The reshapes only merge the leading dims.
    if (a.getShape() != ArrayRef<int64_t>{batch, x.getDimSize(rank - 2), x.getDimSize(rank - 1)} ||
        b.getShape() != ArrayRef<int64_t>{batch, y.getDimSize(rank - 2), y.getDimSize(rank - 1)} ||
        r.getDimSize(rank - 2) != x.getDimSize(rank - 2) ||
        r.getDimSize(rank - 1) != y.getDimSize(rank - 1))
      return failure();
    rewriter.replaceOpWithNewOp<MatmulOp>(out, r, lhs.getInput(), rhs.getInput());
    return success();
  }
};

/// transpose(reshape(x [L..., m, k] -> [prod(L), m, k]), 1, 2): the same
/// reshape of x with its last two dims swapped. The backward of a batched
/// matmul transposes the operands it saved merged; with the transpose above
/// the merge, FoldBatchReshapes sees the backward's matmuls too, and heads
/// stay sharded through the whole training step.
struct SwapTransposeAboveMerge : public OpRewritePattern<TransposeOp> {
  using OpRewritePattern::OpRewritePattern;

  LogicalResult matchAndRewrite(TransposeOp op, PatternRewriter &rewriter) const override {
    auto merge = op.getInput().getDefiningOp<ReshapeOp>();
    auto t = cast<RankedTensorType>(op.getType());
    if (!merge || t.getRank() != 3)
      return failure();
    int64_t d0 = op.getDim0() < 0 ? op.getDim0() + 3 : op.getDim0();
    int64_t d1 = op.getDim1() < 0 ? op.getDim1() + 3 : op.getDim1();
    if (std::min(d0, d1) != 1 || std::max(d0, d1) != 2)
      return failure();
    auto x = cast<RankedTensorType>(merge.getInput().getType());
    auto m = cast<RankedTensorType>(merge.getType());
    int64_t rank = x.getRank();
    if (rank < 3 || !x.hasStaticShape() || !m.hasStaticShape() ||
        m.getDimSize(1) != x.getDimSize(rank - 2) || m.getDimSize(2) != x.getDimSize(rank - 1))
      return failure();
    SmallVector<int64_t> swapped(x.getShape());
    std::swap(swapped[rank - 2], swapped[rank - 1]);
    auto xt = RankedTensorType::get(swapped, x.getElementType());
    Value inner = TransposeOp::create(rewriter, op.getLoc(), xt, merge.getInput(),
                                      rewriter.getI64IntegerAttr(rank - 2),
                                      rewriter.getI64IntegerAttr(rank - 1));
    rewriter.replaceOpWithNewOp<ReshapeOp>(op, t, inner, rewriter.getDenseI64ArrayAttr(t.getShape()));
    return success();
  }
};

/// add(matmul(x, transpose(W)), b) with W [n, k] and b [n]: linear(x, W, b),
/// as torch's addmm decomposition recorded it. One op (addmm on CPU, one
/// cuBLAS call plus the bias on CUDA) instead of a matmul and a pass.
struct FoldLinear : public OpRewritePattern<AddOp> {
  using OpRewritePattern::OpRewritePattern;

  LogicalResult matchAndRewrite(AddOp op, PatternRewriter &rewriter) const override {
    for (int side = 0; side < 2; ++side) {
      auto mm = op->getOperand(side).getDefiningOp<MatmulOp>();
      Value bias = op->getOperand(1 - side);
      if (!mm || !mm->hasOneUse())
        continue;
      auto t = mm.getRhs().getDefiningOp<TransposeOp>();
      if (!t)
        continue;
      Value w = t.getInput();
      auto wt = cast<RankedTensorType>(w.getType());
      auto xt = cast<RankedTensorType>(mm.getLhs().getType());
      auto bt = cast<RankedTensorType>(bias.getType());
      auto rt = cast<RankedTensorType>(op.getType());
      int64_t d0 = t.getDim0() < 0 ? t.getDim0() + 2 : t.getDim0();
      int64_t d1 = t.getDim1() < 0 ? t.getDim1() + 2 : t.getDim1();
      if (wt.getRank() != 2 || xt.getRank() != 2 || bt.getRank() != 1 || d0 == d1 ||
          bt.getDimSize(0) != wt.getDimSize(0) || rt != mm.getType() ||
          bt.getElementType() != rt.getElementType())
        continue;
      rewriter.replaceOpWithNewOp<LinearOp>(op, rt, mm.getLhs(), w, bias);
      return success();
    }
    return failure();
  }
};

/// reshape(linear(reshape(x [L..., k] -> [m, k]), W, b) -> [m, n]) back to
/// [L..., n]: linear(x, W, b), which takes any leading dims.
struct FoldLinearReshapes : public OpRewritePattern<ReshapeOp> {
  using OpRewritePattern::OpRewritePattern;

  LogicalResult matchAndRewrite(ReshapeOp out, PatternRewriter &rewriter) const override {
    auto lin = out.getInput().getDefiningOp<LinearOp>();
    if (!lin || !lin->hasOneUse())
      return failure();
    auto in = lin.getInput().getDefiningOp<ReshapeOp>();
    if (!in)
      return failure();
    auto x = cast<RankedTensorType>(in.getInput().getType());
    auto flat = cast<RankedTensorType>(lin.getInput().getType());
    auto r = cast<RankedTensorType>(out.getType());
    auto l = cast<RankedTensorType>(lin.getType());
    if (flat.getRank() != 2 || x.getRank() < 2 || r.getRank() != x.getRank() ||
        !x.hasStaticShape() || !r.hasStaticShape() ||
        x.getShape().drop_back() != r.getShape().drop_back() ||
        x.getShape().back() != flat.getDimSize(1) || r.getShape().back() != l.getDimSize(1))
      return failure();
    Value bias = lin.getBias();
    rewriter.replaceOpWithNewOp<LinearOp>(out, r, in.getInput(), lin.getWeight(), bias);
    return success();
  }
};
} // namespace

void MatmulOp::getCanonicalizationPatterns(RewritePatternSet &results, MLIRContext *context) {
  results.add<FoldBatchReshapes, SwapTransposeAboveMerge, FoldLinear, FoldLinearReshapes>(
      context);
}
