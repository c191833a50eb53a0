//===- RaiseAtenMath.cpp - tdx-raise-aten's rows: math ---------------------===//
//
// Elementwise ops (the rows of ElementwiseOps.def), activations and their
// backward formulas, linear algebra and reductions (RaiseAtenCall.h).
//
//===----------------------------------------------------------------------===//

#include "RaiseAtenCall.h"

#include "llvm/ADT/StringMap.h"
#include "llvm/ADT/StringSet.h"

#include <algorithm>
#include <cmath>

using namespace mlir;
using namespace mlir::tdx;

namespace mlir::tdx::raise {

//===----------------------------------------------------------------------===//
// Elementwise (the rows of ElementwiseOps.def)
//===----------------------------------------------------------------------===//

template <typename OpT> Value raiseUnary(Call &c) {
  if (c.plain.size() != 1 || c.op->getNumResults() != 1 || !c.overload.empty())
    return {};
  Value x = c.cast(c.plain[0], c.elementType());
  auto r = OpT::create(c.b, c.loc, x);
  if (r.getType() != c.resultType())
    return {};
  return r;
}

/// The two inputs of a binary aten op, Scalars as f64 scalars of the result
/// element type and tensors cast to it (type promotion made explicit).
std::optional<std::pair<Value, Value>> binaryInputs(Call &c) {
  Type e = c.elementType();
  auto scalar = [&](StringRef n) -> Value {
    std::optional<double> v = c.number(n);
    return v ? c.full(*v, e) : Value();
  };
  Value lhs, rhs;
  if (c.plain.size() == 2) {
    lhs = c.plain[0];
    rhs = c.plain[1];
  } else if (c.plain.size() == 1 && c.name == "aten::pow" && c.overload == "Scalar") {
    lhs = scalar("self");
    rhs = c.plain[0];
  } else if (c.plain.size() == 1) {
    lhs = c.plain[0];
    rhs = c.arg("other") ? scalar("other") : scalar("exponent");
  }
  if (!lhs || !rhs)
    return std::nullopt;
  return std::make_pair(c.cast(lhs, e), c.cast(rhs, e));
}

template <typename OpT> Value raiseBinary(Call &c) {
  static const llvm::StringSet<> overloads = {"", "Tensor", "Scalar", "Tensor_Tensor",
                                               "Tensor_Scalar"};
  if (!overloads.contains(c.overload) || c.op->getNumResults() != 1)
    return {};
  // Integer true division and powers promote differently: keep them generic.
  if ((std::is_same_v<OpT, DivOp> || std::is_same_v<OpT, PowOp>) &&
      !isa<FloatType>(c.elementType()))
    return {};
  if (!c.absentOrNone("rounding_mode"))
    return {};
  auto inputs = binaryInputs(c);
  if (!inputs)
    return {};
  auto [lhs, rhs] = *inputs;
  // add/sub with alpha: rhs * alpha.
  if (Attribute alpha = c.arg("alpha")) {
    std::optional<double> a = c.number("alpha");
    if (!a)
      return {};
    if (*a != 1.0)
      rhs = c.binary<MulOp>(rhs, c.full(*a, c.elementType()));
  }
  Value r = rhs ? c.binary<OpT>(lhs, rhs) : Value();
  return r && r.getType() == c.resultType() ? r : Value();
}

//===----------------------------------------------------------------------===//
// Activations and decompositions
//===----------------------------------------------------------------------===//

Value raiseGelu(Call &c) {
  if (c.plain.size() != 1 || !isa<FloatType>(c.elementType()))
    return {};
  auto approx = dyn_cast_or_null<StringAttr>(c.arg("approximate"));
  if (approx && approx.getValue() != "none" && approx.getValue() != "tanh")
    return {};
  return GeluOp::create(c.b, c.loc, c.cast(c.plain[0], c.elementType()),
                        approx && approx.getValue() == "tanh" ? GeluApproximation::tanh
                                                              : GeluApproximation::none);
}

/// clamp(x, min, max) = minimum(maximum(x, min), max), either bound optional;
/// hardtanh(x, min_val, max_val) and clamp_min / clamp_max likewise.
Value raiseClamp(Call &c) {
  if (c.plain.size() != 1 || c.resultType() != c.plain[0].getType())
    return {};
  StringRef lo = c.arg("min_val") ? "min_val" : "min", hi = c.arg("max_val") ? "max_val" : "max";
  if ((c.arg(lo) && !c.isNone(lo) && !c.number(lo)) ||
      (c.arg(hi) && !c.isNone(hi) && !c.number(hi)))
    return {}; // tensor bounds: clamp.Tensor
  Value x = c.plain[0];
  if (std::optional<double> v = c.number(lo))
    x = c.binary<MaximumOp>(x, c.full(*v, c.elementType()));
  if (std::optional<double> v = c.number(hi))
    x = c.binary<MinimumOp>(x, c.full(*v, c.elementType()));
  return x;
}

Value raiseReciprocal(Call &c) {
  if (c.plain.size() != 1 || !isa<FloatType>(c.elementType()))
    return {};
  return c.binary<DivOp>(c.full(1.0, c.elementType()), c.cast(c.plain[0], c.elementType()));
}

/// eq / ne / lt / le / gt / ge on tensors or a tensor and a Scalar, in the
/// promoted type (floats win, then the wider type).
Value raiseCompare(Call &c) {
  static const llvm::StringMap<CmpPredicate> predicates = {
      {"aten::eq", CmpPredicate::eq}, {"aten::ne", CmpPredicate::ne},
      {"aten::lt", CmpPredicate::lt}, {"aten::le", CmpPredicate::le},
      {"aten::gt", CmpPredicate::gt}, {"aten::ge", CmpPredicate::ge}};
  if ((c.overload != "Tensor" && c.overload != "Scalar") || c.plain.empty() ||
      !c.resultType().getElementType().isInteger(1))
    return {};
  auto elementOf = [](Value v) { return cast<RankedTensorType>(v.getType()).getElementType(); };
  Value lhs = c.plain[0], rhs;
  Type e = elementOf(lhs);
  if (c.plain.size() == 2) {
    Type f = elementOf(c.plain[1]);
    if (e != f) {
      bool eFloat = isa<FloatType>(e), fFloat = isa<FloatType>(f);
      if (eFloat != fFloat)
        e = eFloat ? e : f;
      else
        e = e.getIntOrFloatBitWidth() >= f.getIntOrFloatBitWidth() ? e : f;
    }
    rhs = c.cast(c.plain[1], e);
  } else {
    std::optional<double> v = c.number("other");
    if (!v)
      return {};
    if (!isa<FloatType>(e) && *v != static_cast<double>(static_cast<int64_t>(*v)))
      e = c.b.getF32Type();
    rhs = c.full(*v, e);
  }
  return CmpOp::create(c.b, c.loc, c.resultType(), predicates.lookup(c.name), c.cast(lhs, e), rhs);
}

/// where(condition, self, other), either value a tensor or a Scalar.
Value raiseWhere(Call &c) {
  static const llvm::StringSet<> overloads = {"self", "ScalarSelf", "ScalarOther", "Scalar"};
  if (!overloads.contains(c.overload) || c.plain.empty())
    return {};
  Type e = c.elementType();
  size_t next = 1;
  auto value = [&](StringRef n) -> Value {
    if (std::optional<double> v = c.number(n))
      return c.full(*v, e);
    return next < c.plain.size() ? c.cast(c.plain[next++], e) : Value();
  };
  Value lhs = value("self"), rhs = value("other");
  if (!lhs || !rhs || next != c.plain.size())
    return {};
  SmallVector<Type> t;
  if (failed(WhereOp::inferReturnTypes(c.b.getContext(), c.loc, ValueRange{c.plain[0], lhs, rhs},
                                       DictionaryAttr(), OpaqueProperties(nullptr),
                                       RegionRange(), t)) ||
      t[0] != c.resultType())
    return {};
  return WhereOp::create(c.b, c.loc, c.resultType(), c.plain[0], lhs, rhs);
}

/// masked_fill(x, mask, value) = where(mask, value, x).
Value raiseMaskedFill(Call &c) {
  if (c.overload != "Scalar" || c.plain.size() != 2 || c.plain[0].getType() != c.resultType())
    return {};
  std::optional<double> v = c.number("value");
  if (!v)
    return {};
  return WhereOp::create(c.b, c.loc, c.resultType(), c.plain[1], c.full(*v, c.elementType()),
                         c.plain[0]);
}

//===----------------------------------------------------------------------===//
// Backward and optimizer formulas: ATen's CPU kernels' own arithmetic, in
// their order, as elementwise tdx ops (one fused kernel on every backend)
//===----------------------------------------------------------------------===//

/// The two tensors of a (grad, x) backward op in the result type.
std::optional<std::pair<Value, Value>> gradAndInput(Call &c) {
  if (c.plain.size() != 2 || !isa<FloatType>(c.elementType()) ||
      c.plain[0].getType() != c.resultType() || c.plain[1].getType() != c.resultType())
    return std::nullopt;
  return std::make_pair(c.plain[0], c.plain[1]);
}

/// gelu_backward(grad, x, approximate): dy * (cdf + x * pdf), or the tanh
/// form's dy * (0.5 (1 + t) + 0.5 x (1 - t^2) beta (1 + 3 kappa x^2)).
Value raiseGeluBackward(Call &c) {
  auto in = gradAndInput(c);
  auto approx = dyn_cast_or_null<StringAttr>(c.arg("approximate"));
  if (!in || (approx && approx.getValue() != "none" && approx.getValue() != "tanh"))
    return {};
  auto [dy, x] = *in;
  Type e = c.elementType();
  auto k = [&](double v) { return c.full(v, e); };
  if (approx && approx.getValue() == "tanh") {
    const double beta = M_SQRT2 * M_2_SQRTPI * 0.5, kappa = 0.044715;
    Value xSq = c.binary<MulOp>(x, x);
    Value xCube = c.binary<MulOp>(xSq, x);
    Value inner = c.binary<MulOp>(k(beta), c.binary<AddOp>(x, c.binary<MulOp>(k(kappa), xCube)));
    Value t = TanhOp::create(c.b, c.loc, inner);
    Value left = c.binary<MulOp>(k(0.5), x);
    Value right = c.binary<AddOp>(k(1.0), t);
    Value leftDerivative = c.binary<MulOp>(k(0.5), right);
    Value tanhDerivative = c.binary<SubOp>(k(1.0), c.binary<MulOp>(t, t));
    Value innerDerivative =
        c.binary<MulOp>(k(beta), c.binary<AddOp>(k(1.0), c.binary<MulOp>(k(3.0 * kappa), xSq)));
    Value rightDerivative =
        c.binary<MulOp>(c.binary<MulOp>(left, tanhDerivative), innerDerivative);
    return c.binary<MulOp>(dy, c.binary<AddOp>(leftDerivative, rightDerivative));
  }
  const double alpha = M_SQRT1_2, beta = M_2_SQRTPI * M_SQRT1_2 * 0.5;
  Value cdf = c.binary<MulOp>(
      k(0.5), c.binary<AddOp>(k(1.0), ErfOp::create(c.b, c.loc, c.binary<MulOp>(x, k(alpha)))));
  Value pdf = c.binary<MulOp>(
      k(beta), ExpOp::create(c.b, c.loc, c.binary<MulOp>(c.binary<MulOp>(x, x), k(-0.5))));
  return c.binary<MulOp>(dy, c.binary<AddOp>(cdf, c.binary<MulOp>(x, pdf)));
}

/// silu_backward(grad, x): dy * s * (1 + x * (1 - s)), s = sigmoid(x).
Value raiseSiluBackward(Call &c) {
  auto in = gradAndInput(c);
  if (!in)
    return {};
  auto [dy, x] = *in;
  Value one = c.full(1.0, c.elementType());
  Value s = SigmoidOp::create(c.b, c.loc, x);
  Value factor = c.binary<AddOp>(one, c.binary<MulOp>(x, c.binary<SubOp>(one, s)));
  return c.binary<MulOp>(c.binary<MulOp>(dy, s), factor);
}

/// sigmoid_backward(grad, y) = dy * (1 - y) * y; tanh_backward(grad, y) =
/// dy * (1 - y * y).
Value raiseSigmoidBackward(Call &c) {
  auto in = gradAndInput(c);
  if (!in)
    return {};
  auto [dy, y] = *in;
  Value one = c.full(1.0, c.elementType());
  return c.binary<MulOp>(c.binary<MulOp>(dy, c.binary<SubOp>(one, y)), y);
}
Value raiseTanhBackward(Call &c) {
  auto in = gradAndInput(c);
  if (!in)
    return {};
  auto [dy, y] = *in;
  Value one = c.full(1.0, c.elementType());
  return c.binary<MulOp>(dy, c.binary<SubOp>(one, c.binary<MulOp>(y, y)));
}

/// addcmul(self, t1, t2, value) = self + value * t1 * t2 and addcdiv's
/// self + value * t1 / t2 (an optimizer's update).
template <typename OpT> Value raiseAddc(Call &c) {
  std::optional<double> value = c.number("value");
  if (c.plain.size() != 3 || !value || !isa<FloatType>(c.elementType()))
    return {};
  Type e = c.elementType();
  Value t1 = c.cast(c.plain[1], e);
  if (*value != 1.0)
    t1 = c.binary<MulOp>(c.full(*value, e), t1);
  Value term = c.binary<OpT>(t1, c.cast(c.plain[2], e));
  Value r = term ? c.binary<AddOp>(c.cast(c.plain[0], e), term) : Value();
  return r && r.getType() == c.resultType() ? r : Value();
}

/// rsub(self, other, alpha) = other - alpha * self.
Value raiseRsub(Call &c) {
  auto inputs = binaryInputs(c);
  std::optional<double> alpha = c.number("alpha");
  if (!inputs || (c.arg("alpha") && !alpha))
    return {};
  auto [self, other] = *inputs;
  if (alpha && *alpha != 1.0)
    self = c.binary<MulOp>(c.full(*alpha, c.elementType()), self);
  Value r = c.binary<SubOp>(other, self);
  return r && r.getType() == c.resultType() ? r : Value();
}

/// lerp(self, end, weight) with a number weight, as ATen computes it: self +
/// weight * (end - self) for |weight| < 0.5, else end - (end - self) * (1 -
/// weight) (torch.optim's Adam and AdamW move their first moment with it).
Value raiseLerp(Call &c) {
  std::optional<double> weight = c.number("weight");
  if (c.plain.size() != 2 || !weight || !isa<FloatType>(c.elementType()))
    return {};
  Type e = c.elementType();
  Value self = c.cast(c.plain[0], e), end = c.cast(c.plain[1], e);
  Value diff = c.binary<SubOp>(end, self);
  Value r = std::abs(*weight) < 0.5
                ? c.binary<AddOp>(self, c.binary<MulOp>(c.full(*weight, e), diff))
                : c.binary<SubOp>(end, c.binary<MulOp>(diff, c.full(1.0 - *weight, e)));
  return r && r.getType() == c.resultType() ? r : Value();
}

/// torch's fused attention on the CPU (what F.scaled_dot_product_attention
/// runs there) and its backward, without dropout: tdx.sdpa and
/// tdx.sdpa_backward, every result.
namespace {
struct AttentionArgs {
  bool causal;
  Value mask; // the tensor after the `fixed` ones, or null
  FloatAttr scale;
};
/// The arguments both share, or nothing where the op stays generic.
std::optional<AttentionArgs> attentionArgs(Call &c, size_t fixed) {
  std::optional<double> dropout = c.number("dropout_p");
  std::optional<bool> causal = c.boolean("is_causal");
  if (!dropout || *dropout != 0.0 || !causal || c.plain.size() != fixed + !c.isNone("attn_mask"))
    return std::nullopt;
  std::optional<double> scale = c.number("scale");
  return AttentionArgs{*causal, c.plain.size() > fixed ? c.plain[fixed] : Value(),
                       scale ? c.b.getF64FloatAttr(*scale) : FloatAttr()};
}
} // namespace

Value raiseSdpa(Call &c) {
  std::optional<AttentionArgs> a = attentionArgs(c, 3);
  if (!a)
    return {};
  return SdpaOp::create(c.b, c.loc, c.plain[0], c.plain[1], c.plain[2], a->mask, a->causal,
                        a->scale)
      .getOutput();
}

Value raiseSdpaBackward(Call &c) {
  std::optional<AttentionArgs> a = attentionArgs(c, 6);
  if (!a)
    return {};
  return SdpaBackwardOp::create(c.b, c.loc, c.plain[0], c.plain[1], c.plain[2], c.plain[3],
                                c.plain[4], c.plain[5], a->mask, a->causal, a->scale)
      .getGradQuery();
}

/// _fused_rms_norm(input, normalized_shape, weight?, eps?) whose rstd no
/// backward reads (inference): tdx.rms_norm. eps None is torch's default,
/// the input dtype's machine epsilon.
Value raiseFusedRmsNorm(Call &c) {
  std::optional<ArrayRef<int64_t>> shape = c.ints("normalized_shape");
  if (!shape || c.plain.empty() || c.plain.size() != 1 + !c.isNone("weight"))
    return {};
  Type e = c.elementType();
  std::optional<double> eps = c.number("eps");
  if (!eps && c.isNone("eps")) {
    if (e.isF32())
      eps = 1.1920928955078125e-07;
    else if (e.isF64())
      eps = 2.220446049250313e-16;
    else if (e.isBF16())
      eps = 0.0078125;
    else if (e.isF16())
      eps = 0.0009765625;
  }
  if (!eps)
    return {};
  Value weight = c.plain.size() > 1 ? c.plain[1] : Value();
  return RmsNormOp::create(c.b, c.loc, c.plain[0], weight, c.b.getDenseI64ArrayAttr(*shape),
                           c.b.getF64FloatAttr(*eps));
}

/// outer(x, y) = x[:, None] * y[None, :].
Value raiseOuter(Call &c) {
  RankedTensorType t = c.resultType();
  if (c.plain.size() != 2 || t.getRank() != 2)
    return {};
  Value x = c.cast(c.plain[0], t.getElementType()), y = c.cast(c.plain[1], t.getElementType());
  return MulOp::create(c.b, c.loc, t, c.reshape(x, {t.getDimSize(0), 1}),
                       c.reshape(y, {1, t.getDimSize(1)}));
}

/// triu / tril keep x where col - row >= diagonal (<= for tril), else 0.
Value raiseTriangle(Call &c) {
  RankedTensorType t = c.resultType();
  if (c.plain.size() != 1 || t.getRank() < 2 || !t.hasStaticShape() ||
      c.plain[0].getType() != t)
    return {};
  int64_t diagonal = c.i64("diagonal").value_or(0);
  int64_t rows = t.getDimSize(t.getRank() - 2), cols = t.getDimSize(t.getRank() - 1);
  Type i64 = c.b.getI64Type();
  auto index = [&](int64_t count, ArrayRef<int64_t> shape) {
    Value r = ArangeOp::create(c.b, c.loc, RankedTensorType::get({count}, i64),
                               c.b.getF64FloatAttr(0), c.b.getF64FloatAttr(count),
                               c.b.getF64FloatAttr(1));
    return c.reshape(r, shape);
  };
  Value diff = c.binary<SubOp>(index(cols, {1, cols}), index(rows, {rows, 1}));
  Value keep = CmpOp::create(c.b, c.loc, RankedTensorType::get({rows, cols}, c.b.getI1Type()),
                             c.name == "aten::triu" ? CmpPredicate::ge : CmpPredicate::le, diff,
                             c.full(static_cast<double>(diagonal), i64));
  return WhereOp::create(c.b, c.loc, t, keep, c.plain[0], c.full(0.0, t.getElementType()));
}

/// Eval-mode batch norm, ATen's way: alpha = weight / sqrt(var + eps),
/// beta = bias - mean * alpha, y = x * alpha + beta (per channel, dim 1).
Value raiseBatchNorm(Call &c) {
  // input, then the optional weight, bias, running_mean, running_var.
  StringRef names[] = {"weight", "bias", "running_mean", "running_var"};
  if (c.boolean("training").value_or(true) || !c.onlyFirstResultUsed() || c.plain.empty())
    return {};
  Value x = c.plain[0];
  auto t = cast<RankedTensorType>(x.getType());
  if (t.getRank() < 2 || t != c.resultType() || !isa<FloatType>(t.getElementType()))
    return {};
  Value given[4];
  size_t next = 1;
  for (int i = 0; i < 4; ++i)
    given[i] = c.isNone(names[i]) ? Value() : (next < c.plain.size() ? c.plain[next++] : Value());
  if (next != c.plain.size() || !given[2] || !given[3])
    return {};
  std::optional<double> eps = c.number("eps");
  if (!eps)
    return {};
  Type e = t.getElementType();
  Value invstd = RsqrtOp::create(c.b, c.loc, c.binary<AddOp>(c.cast(given[3], e), c.full(*eps, e)));
  Value alpha = given[0] ? c.binary<MulOp>(invstd, c.cast(given[0], e)) : invstd;
  Value shifted = c.binary<MulOp>(c.cast(given[2], e), alpha);
  Value beta = given[1] ? c.binary<SubOp>(c.cast(given[1], e), shifted)
                        : c.binary<SubOp>(c.full(0.0, e), shifted);
  SmallVector<int64_t> perChannel(t.getRank() - 1, 1);
  perChannel[0] = t.getDimSize(1);
  return c.binary<AddOp>(c.binary<MulOp>(x, c.reshape(alpha, perChannel)),
                         c.reshape(beta, perChannel));
}

//===----------------------------------------------------------------------===//
// Contractions, reductions, normalizations, embedding
//===----------------------------------------------------------------------===//

Value raiseMatmul(Call &c) {
  // tdx.matmul multiplies matrices (batched); torch.matmul's vector cases
  // stay generic.
  auto rank = [&](int i) { return cast<RankedTensorType>(c.plain[i].getType()).getRank(); };
  if (c.plain.size() != 2 || rank(0) < 2 || rank(1) < 2)
    return {};
  return MatmulOp::create(c.b, c.loc, c.resultType(), c.plain[0], c.plain[1]);
}

/// addmm / baddbmm (self, m1, m2, beta=1, alpha=1) = m1 @ m2 + self.
Value raiseAddmm(Call &c) {
  if (c.plain.size() != 3 || c.number("beta").value_or(1.0) != 1.0 ||
      c.number("alpha").value_or(1.0) != 1.0)
    return {};
  Value mm = MatmulOp::create(c.b, c.loc, c.resultType(), c.plain[1], c.plain[2]);
  Value r = c.binary<AddOp>(mm, c.cast(c.plain[0], c.elementType()));
  return r && r.getType() == c.resultType() ? r : Value();
}

Value raiseLinear(Call &c) {
  if (c.plain.size() < 2 || c.plain.size() > 3)
    return {};
  return LinearOp::create(c.b, c.loc, c.resultType(), c.plain[0], c.plain[1],
                          c.plain.size() == 3 ? c.plain[2] : Value());
}

Value raiseSoftmax(Call &c) {
  std::optional<int64_t> dim = c.i64("dim");
  if (c.plain.size() != 1 || !dim || c.plain[0].getType() != c.resultType() ||
      !(c.absentOrNone("dtype")))
    return {};
  if (c.name.contains("log"))
    return LogSoftmaxOp::create(c.b, c.loc, c.plain[0], c.b.getI64IntegerAttr(*dim));
  return SoftmaxOp::create(c.b, c.loc, c.plain[0], c.b.getI64IntegerAttr(*dim));
}

/// OpT of `x` over the call's `dim` (all dims when it is absent or empty)
/// and `keepdim`, typed as the call's result; null for another `dim`.
template <typename OpT> Value reduceAsCalled(Call &c, Value x) {
  std::optional<ArrayRef<int64_t>> dims = c.ints("dim");
  if (c.arg("dim") && !dims && !c.isNone("dim"))
    return {};
  bool keep = c.boolean("keepdim").value_or(false);
  return OpT::create(c.b, c.loc, c.resultType(), x,
                     dims && !dims->empty() ? c.b.getDenseI64ArrayAttr(*dims) : DenseI64ArrayAttr(),
                     keep ? c.b.getUnitAttr() : UnitAttr());
}

/// sum / mean / amax over `dim`.
template <typename OpT> Value raiseReduce(Call &c) {
  if (c.plain.size() != 1 || !c.absentOrNone("dtype") ||
      cast<RankedTensorType>(c.plain[0].getType()).getElementType() != c.elementType())
    return {};
  return reduceAsCalled<OpT>(c, c.plain[0]);
}

/// The 2-norm (norm with p = 2, linalg_vector_norm with ord = 2) as
/// sqrt(sum(x * x)): a sum shards (a split dim leaves a Partial sum), so a
/// gradient-clipping norm of split gradients reduces scalars, not tensors.
Value raiseNorm(Call &c) {
  if (c.plain.size() != 1 || !c.absentOrNone("dtype") || !isa<FloatType>(c.elementType()) ||
      cast<RankedTensorType>(c.plain[0].getType()).getElementType() != c.elementType())
    return {};
  std::optional<double> p = c.arg("p") ? c.number("p") : c.arg("ord") ? c.number("ord") : 2.0;
  if (c.arg("p") && c.isNone("p"))
    p = 2.0;
  if (!p || *p != 2.0)
    return {};
  Value x = c.plain[0];
  Value squares = c.binary<MulOp>(x, x);
  Value sum = squares ? reduceAsCalled<SumOp>(c, squares) : Value();
  return sum ? SqrtOp::create(c.b, c.loc, sum) : Value();
}

Value raiseEmbedding(Call &c) {
  if (c.plain.size() != 2 || c.boolean("sparse").value_or(false))
    return {};
  int64_t pad = c.i64("padding_idx").value_or(-1);
  return EmbeddingOp::create(c.b, c.loc, c.resultType(), c.plain[0], c.plain[1],
                             pad >= 0 ? c.b.getI64IntegerAttr(pad) : IntegerAttr());
}

// The rows the table names by instance.
#define TDX_UNARY(Name, fn, aten, linear, ...) template Value raiseUnary<Name##Op>(Call &);
#define TDX_BINARY(Name, fn, aten, ...) template Value raiseBinary<Name##Op>(Call &);
#include "tdx/Runtime/ElementwiseOps.def"
template Value raiseAddc<MulOp>(Call &);
template Value raiseAddc<DivOp>(Call &);
template Value raiseReduce<SumOp>(Call &);
template Value raiseReduce<MeanOp>(Call &);
template Value raiseReduce<MaxOp>(Call &);

} // namespace mlir::tdx::raise
