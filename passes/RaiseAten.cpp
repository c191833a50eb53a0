//===- RaiseAten.cpp - generic aten ops to first-class tdx ops ------------===//
//
// The one table from aten schemas to tdx ops. Capture emits every aten op
// as a generic `tdx.aten` with all its schema arguments (tensors as
// operands, the rest by name in `args`); each row here rewrites one schema
// (or every overload of a name) into first-class ops, or declines and the
// op stays generic. The elementwise rows come from ElementwiseOps.def.
//
//===----------------------------------------------------------------------===//

#include "RaiseAtenCall.h"
#include "tdx/IR/TdxOps.h"
#include "tdx/Transforms/Passes.h"

#include "mlir/IR/Builders.h"
#include "mlir/IR/Verifier.h"
#include "llvm/ADT/DenseSet.h"
#include "llvm/ADT/StringMap.h"

namespace mlir::tdx {
#define GEN_PASS_DEF_RAISEATEN
#include "tdx/Transforms/Passes.h.inc"
} // namespace mlir::tdx

using namespace mlir;
using namespace mlir::tdx;
using namespace mlir::tdx::raise;

namespace {

//===----------------------------------------------------------------------===//
// The table
//===----------------------------------------------------------------------===//

/// Schema name (every overload) or full schema -> how to raise it.
const llvm::StringMap<RaiseFn> &table() {
  static const llvm::StringMap<RaiseFn> rows = [] {
    llvm::StringMap<RaiseFn> t;
#define TDX_UNARY(Name, fn, aten, linear, ...) t[aten] = &raiseUnary<Name##Op>;
#define TDX_BINARY(Name, fn, aten, ...) t[aten] = &raiseBinary<Name##Op>;
#include "tdx/Runtime/ElementwiseOps.def"
    t["tdx::to_local"] = &raiseToLocal;
    t["tdx::from_local"] = &raiseFromLocal;
    t["aten::gelu"] = &raiseGelu;
    t["aten::clamp"] = &raiseClamp;
    t["aten::gelu_backward"] = &raiseGeluBackward;
    t["aten::silu_backward"] = &raiseSiluBackward;
    t["aten::sigmoid_backward"] = &raiseSigmoidBackward;
    t["aten::tanh_backward"] = &raiseTanhBackward;
    t["aten::addcmul"] = &raiseAddc<MulOp>;
    t["aten::addcdiv"] = &raiseAddc<DivOp>;
    t["aten::rsub"] = &raiseRsub;
    t["aten::lerp.Scalar"] = &raiseLerp;
    t["aten::_scaled_dot_product_flash_attention_for_cpu"] = &raiseSdpa;
    t["aten::_fused_rms_norm"] = &raiseFusedRmsNorm;
    t["aten::_scaled_dot_product_flash_attention_for_cpu_backward"] = &raiseSdpaBackward;
    t["aten::clamp_min"] = &raiseClamp;
    t["aten::clamp_max"] = &raiseClamp;
    t["aten::hardtanh"] = &raiseClamp;
    t["aten::reciprocal"] = &raiseReciprocal;
    t["aten::masked_fill"] = &raiseMaskedFill;
    for (const char *cmp : {"aten::eq", "aten::ne", "aten::lt", "aten::le", "aten::gt", "aten::ge"})
      t[cmp] = &raiseCompare;
    t["aten::where"] = &raiseWhere;
    t["aten::outer"] = &raiseOuter;
    t["aten::ger"] = &raiseOuter;
    t["aten::triu"] = &raiseTriangle;
    t["aten::tril"] = &raiseTriangle;
    t["aten::native_batch_norm"] = &raiseBatchNorm;
    t["aten::mm"] = &raiseMatmul;
    t["aten::bmm"] = &raiseMatmul;
    t["aten::matmul"] = &raiseMatmul;
    t["aten::addmm"] = &raiseAddmm;
    t["aten::baddbmm"] = &raiseAddmm;
    t["aten::linear"] = &raiseLinear;
    t["aten::_softmax"] = &raiseSoftmax;
    t["aten::softmax"] = &raiseSoftmax;
    t["aten::_log_softmax"] = &raiseSoftmax;
    t["aten::log_softmax"] = &raiseSoftmax;
    t["aten::sum"] = &raiseReduce<SumOp>;
    t["aten::mean"] = &raiseReduce<MeanOp>;
    t["aten::amax"] = &raiseReduce<MaxOp>;
    t["aten::norm"] = &raiseNorm;
    t["aten::linalg_vector_norm"] = &raiseNorm;
    t["aten::embedding"] = &raiseEmbedding;
    t["aten::cat"] = &raiseCat;
    t["aten::stack"] = &raiseStack;
    t["aten::roll"] = &raiseRoll;
    t["aten::constant_pad_nd"] = &raiseConstantPad;
    t["aten::slice_scatter"] = &raiseScatter;
    t["aten::select_scatter"] = &raiseScatter;
    t["aten::index"] = &raiseIndex;
    t["aten::as_strided"] = &raiseAsStrided;
    t["aten::as_strided_scatter"] = &raiseAsStridedScatter;
    t["aten::convolution"] = &raiseConvolution;
    t["aten::max_pool2d_with_indices"] = &raiseMaxPool;
    t["aten::max_pool2d"] = &raiseMaxPool;
    t["aten::avg_pool2d"] = &raiseAvgPool;
    t["aten::adaptive_avg_pool2d"] = &raiseAdaptiveAvgPool;
    t["aten::_adaptive_avg_pool2d"] = &raiseAdaptiveAvgPool;
    return t;
  }();
  return rows;
}

/// A 0-D tdx.full's value, or nothing.
std::optional<double> fullValue(Value v) {
  auto full = v.getDefiningOp<FullOp>();
  if (!full || cast<RankedTensorType>(full.getType()).getRank() != 0)
    return std::nullopt;
  return full.getValue().convertToDouble();
}

/// torch 2.x decomposes F.rms_norm / nn.RMSNorm on the CPU into
/// x * rsqrt(mean(x ** 2, last dims, keepdim) + eps) (* weight): where no
/// other op reads the pieces (a forward; a training step's backward reads
/// them), the chain is one tdx.rms_norm.
void raiseRmsNorms(ModuleOp module) {
  SmallVector<MulOp> candidates;
  module.walk([&](MulOp mul) { candidates.push_back(mul); });
  llvm::DenseSet<Operation *> erased;
  for (MulOp mul : candidates) {
    if (erased.contains(mul))
      continue;
    auto type = cast<RankedTensorType>(mul.getType());
    if (!type.getElementType().isF32())
      continue;
    // x * rsqrt(...) in either order.
    Value x, r;
    for (int i = 0; i < 2; ++i)
      if (mul->getOperand(1 - i).getDefiningOp<RsqrtOp>()) {
        x = mul->getOperand(i);
        r = mul->getOperand(1 - i);
      }
    if (!r || x.getType() != type || !r.hasOneUse())
      continue;
    auto add = r.getDefiningOp<RsqrtOp>()->getOperand(0).getDefiningOp<AddOp>();
    if (!add || !add->getResult(0).hasOneUse())
      continue;
    std::optional<double> eps = fullValue(add->getOperand(1));
    auto mean = add->getOperand(0).getDefiningOp<MeanOp>();
    if (!eps || !mean || !mean.getKeepdim() || !mean->getResult(0).hasOneUse())
      continue;
    auto pow = mean->getOperand(0).getDefiningOp<PowOp>();
    if (!pow || pow->getOperand(0) != x || fullValue(pow->getOperand(1)) != 2.0 ||
        !pow->getResult(0).hasOneUse())
      continue;
    // The mean is over the last k dims.
    std::optional<ArrayRef<int64_t>> dims = mean.getDims();
    int64_t rank = type.getRank();
    if (!dims || dims->empty())
      continue;
    SmallVector<int64_t> wrapped;
    for (int64_t d : *dims)
      wrapped.push_back(d < 0 ? d + rank : d);
    llvm::sort(wrapped);
    int64_t k = wrapped.size();
    bool trailing = true;
    for (int64_t i = 0; i < k; ++i)
      trailing &= wrapped[i] == rank - k + i;
    if (!trailing)
      continue;
    SmallVector<int64_t> normalized(type.getShape().take_back(k));
    // An elementwise weight of the normalized shape after it.
    Operation *last = mul;
    Value weight;
    if (mul->hasOneUse())
      if (auto scaled = dyn_cast<MulOp>(*mul->getUsers().begin()))
        for (int i = 0; i < 2; ++i)
          if (scaled->getOperand(i) == mul.getResult()) {
            Value w = scaled->getOperand(1 - i);
            auto wt = cast<RankedTensorType>(w.getType());
            if (wt.getShape() == ArrayRef<int64_t>(normalized) && wt.getElementType().isF32() &&
                scaled.getType() == type) {
              weight = w;
              last = scaled;
            }
            break;
          }
    OpBuilder b(last);
    auto norm = RmsNormOp::create(b, last->getLoc(), x, weight,
                                  b.getDenseI64ArrayAttr(normalized), b.getF64FloatAttr(*eps));
    last->getResult(0).replaceAllUsesWith(norm.getResult());
    // The chain, from its end.
    Operation *chain[] = {last, last == mul ? nullptr : mul.getOperation(),
                          r.getDefiningOp(), add, mean, pow};
    for (Operation *op : chain)
      if (op && op->use_empty()) {
        erased.insert(op);
        op->erase();
      }
  }
}

struct RaiseAtenPass : public mlir::tdx::impl::RaiseAtenBase<RaiseAtenPass> {
  using RaiseAtenBase::RaiseAtenBase;
  void runOnOperation() override {
    SmallVector<AtenOp> ops;
    getOperation()->walk([&](AtenOp op) { ops.push_back(op); });
    for (AtenOp op : ops) {
      StringRef schema = op.getSchema();
      auto row = table().find(schema);
      if (row == table().end())
        row = table().find(schema.split('.').first);
      Value raised;
      bool allResults = false;
      // What a row builds before it declines is erased again.
      struct Created : OpBuilder::Listener {
        SmallVector<Operation *> ops;
        void notifyOperationInserted(Operation *op, OpBuilder::InsertPoint) override {
          ops.push_back(op);
        }
      } created;
      // Complex tensors have no first-class ops (no kernels): ATen runs them.
      auto complex = [](Type t) {
        auto ranked = dyn_cast<RankedTensorType>(t);
        return ranked && isa<ComplexType>(ranked.getElementType());
      };
      bool anyComplex = llvm::any_of(op->getOperandTypes(), complex) ||
                        llvm::any_of(op->getResultTypes(), complex);
      if (row != table().end() && op->getNumResults() >= 1 && !anyComplex &&
          isa<RankedTensorType>(op->getResult(0).getType())) {
        OpBuilder b(op, &created);
        Call call(op, b);
        raised = row->second(call);
        // A row may raise every result at once: it returns the first result
        // of an op with as many results (tdx.sdpa and its backward).
        allResults = raised && raised.getDefiningOp() &&
                          raised == raised.getDefiningOp()->getResult(0) &&
                          raised.getDefiningOp()->getNumResults() == op->getNumResults() &&
                          op->getNumResults() > 1;
        if (raised && (allResults ? raised.getDefiningOp()->getResultTypes() != op->getResultTypes()
                                  : raised.getType() != op->getResult(0).getType())) {
          raised.getDefiningOp()->emitOpError()
              << "raised from " << schema << " has result types "
              << (allResults ? TypeRange(raised.getDefiningOp()->getResultTypes())
                             : TypeRange(raised.getType()))
              << " instead of "
              << (allResults ? TypeRange(op->getResultTypes())
                             : TypeRange(op->getResult(0).getType()))
              << " (a tdx bug)";
          return signalPassFailure();
        }
        if (raised && !allResults &&
            !llvm::all_of(op->getResults().drop_front(), [](Value r) { return r.use_empty(); }))
          raised = {};
        // A row's ops must verify (an element type the op does not take,
        // such as ui8 arithmetic): otherwise the op stays generic.
        std::string invalid;
        if (raised) {
          ScopedDiagnosticHandler quiet(op->getContext(), [&](Diagnostic &d) {
            invalid = d.str();
            return success();
          });
          if (llvm::any_of(created.ops, [](Operation *made) {
                return failed(verify(made, /*verifyRecursively=*/false));
              }))
            raised = {};
        }
        if (!raised && !invalid.empty() && report)
          op.emitRemark() << schema << " stays generic: " << invalid;
      }
      if (!raised) {
        for (Operation *made : llvm::reverse(created.ops))
          made->erase();
        if (report)
          op.emitRemark() << schema << " stays generic (runs through ATen on the CPU backend)";
        continue;
      }
      if (allResults)
        op->replaceAllUsesWith(raised.getDefiningOp()->getResults());
      else
        op->getResult(0).replaceAllUsesWith(raised);
      op->erase();
    }
    raiseRmsNorms(getOperation());
  }
};

} // namespace
