//===- RaiseAten.cpp - generic aten ops to first-class tdx ops ------------===//
//
// The one table from aten schemas to tdx ops. Capture emits every aten op
// as a generic `tdx.aten` with all its schema arguments (tensors as
// operands, the rest by name in `args`); each row here rewrites one schema
// (or every overload of a name) into first-class ops, or declines and the
// op stays generic. The elementwise rows come from ElementwiseOps.def.
//
//===----------------------------------------------------------------------===//

#include "tdx/Dialect/TdxOps.h"
#include "tdx/Passes/Passes.h"

#include "mlir/IR/Builders.h"
#include "llvm/ADT/StringMap.h"
#include "llvm/ADT/StringSet.h"

#include <algorithm>
#include <cmath>

namespace mlir::tdx {
#define GEN_PASS_DEF_RAISEATEN
#include "tdx/Passes/Passes.h.inc"
} // namespace mlir::tdx

using namespace mlir;
using namespace mlir::tdx;

namespace {

/// A tdx.aten op's arguments by schema name, and helpers to build with.
class Call {
public:
  Call(AtenOp op, OpBuilder &b)
      : op(op), b(b), loc(op.getLoc()), plain(op.getPlainOperands()) {
    std::tie(name, overload) = op.getSchema().split('.');
  }

  mutable AtenOp op;
  OpBuilder &b;
  Location loc;
  StringRef name, overload;
  /// Tensor operands that are not in a tensor list, in schema order.
  SmallVector<Value> plain;

  Attribute arg(StringRef n) const {
    DictionaryAttr dict = op.getArgsAttr();
    return dict ? dict.get(n) : Attribute();
  }
  bool isNone(StringRef n) const { return isa_and_nonnull<UnitAttr>(arg(n)); }
  bool absentOrNone(StringRef n) const { return !arg(n) || isNone(n); }
  std::optional<int64_t> i64(StringRef n) const {
    if (auto i = dyn_cast_or_null<IntegerAttr>(arg(n)); i && !i.getType().isIndex())
      return i.getInt();
    return std::nullopt;
  }
  std::optional<bool> boolean(StringRef n) const {
    if (auto x = dyn_cast_or_null<BoolAttr>(arg(n)))
      return x.getValue();
    return std::nullopt;
  }
  /// A Scalar argument (bool, int or float) as a double.
  std::optional<double> number(StringRef n) const {
    Attribute a = arg(n);
    if (auto x = dyn_cast_or_null<BoolAttr>(a))
      return x.getValue() ? 1.0 : 0.0;
    if (auto x = dyn_cast_or_null<IntegerAttr>(a); x && !x.getType().isIndex())
      return static_cast<double>(x.getInt());
    if (auto x = dyn_cast_or_null<FloatAttr>(a))
      return x.getValueAsDouble();
    return std::nullopt;
  }
  std::optional<ArrayRef<int64_t>> ints(StringRef n) const {
    if (auto x = dyn_cast_or_null<DenseI64ArrayAttr>(arg(n)))
      return x.asArrayRef();
    return std::nullopt;
  }
  /// The operands of tensor-list argument `n` (null for None elements).
  std::optional<SmallVector<Value>> tensors(StringRef n) const {
    auto refs = AtenOp::tensorListRefs(arg(n));
    if (!refs)
      return std::nullopt;
    SmallVector<Value> out;
    for (auto r : *refs)
      out.push_back(r ? op.getOperand(*r) : Value());
    return out;
  }

  RankedTensorType resultType(unsigned i = 0) const {
    return dyn_cast<RankedTensorType>(op->getResult(i).getType());
  }
  Type elementType() const { return resultType().getElementType(); }
  /// Every result after the first is unused (index or statistics outputs).
  bool onlyFirstResultUsed() const {
    return llvm::all_of(op->getResults().drop_front(), [](Value r) { return r.use_empty(); });
  }

  Value full(double v, Type element) {
    return FullOp::create(b, loc, RankedTensorType::get({}, element), b.getF64FloatAttr(v));
  }
  /// `v` with element type `element` (a tdx.cast when it differs).
  Value cast(Value v, Type element) {
    auto t = llvm::cast<RankedTensorType>(v.getType());
    if (t.getElementType() == element)
      return v;
    return CastOp::create(b, loc, RankedTensorType::get(t.getShape(), element), v);
  }
  Value reshape(Value v, ArrayRef<int64_t> shape) {
    auto t = llvm::cast<RankedTensorType>(v.getType());
    return ReshapeOp::create(b, loc, RankedTensorType::get(shape, t.getElementType()), v,
                             b.getDenseI64ArrayAttr(shape));
  }
  /// A binary op whose result type is inferred from `lhs` and `rhs`.
  template <typename OpT> Value binary(Value lhs, Value rhs) {
    SmallVector<Type> t;
    if (failed(OpT::inferReturnTypes(b.getContext(), loc, ValueRange{lhs, rhs}, DictionaryAttr(),
                                     OpaqueProperties(nullptr), RegionRange(), t)))
      return {};
    return OpT::create(b, loc, t[0], lhs, rhs);
  }
};

using RaiseFn = Value (*)(Call &);

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
  if (c.plain.size() != 2)
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

//===----------------------------------------------------------------------===//
// Shapes
//===----------------------------------------------------------------------===//

Value raiseCat(Call &c) {
  std::optional<SmallVector<Value>> xs = c.tensors("tensors");
  std::optional<int64_t> dim = c.i64("dim");
  if (!xs || !dim || xs->empty() || llvm::is_contained(*xs, Value()))
    return {};
  return ConcatOp::create(c.b, c.loc, c.resultType(), *xs, c.b.getI64IntegerAttr(*dim));
}

/// stack = concat of the inputs with a new dim of size 1.
Value raiseStack(Call &c) {
  std::optional<SmallVector<Value>> xs = c.tensors("tensors");
  RankedTensorType t = c.resultType();
  std::optional<int64_t> d = c.i64("dim");
  if (!xs || !d || xs->empty() || llvm::is_contained(*xs, Value()))
    return {};
  int64_t dim = *normalizeDim(*d, t.getRank());
  SmallVector<Value> inputs;
  for (Value x : *xs) {
    SmallVector<int64_t> shape(cast<RankedTensorType>(x.getType()).getShape());
    shape.insert(shape.begin() + dim, 1);
    inputs.push_back(c.reshape(x, shape));
  }
  return ConcatOp::create(c.b, c.loc, t, inputs, c.b.getI64IntegerAttr(dim));
}

/// x[start:end] along `dim` (a slice op; null when empty).
static Value slab(Call &c, Value x, int64_t dim, int64_t start, int64_t end) {
  auto t = cast<RankedTensorType>(x.getType());
  if (end <= start)
    return {};
  if (start == 0 && end == t.getDimSize(dim))
    return x;
  SmallVector<int64_t> shape(t.getShape());
  shape[dim] = end - start;
  return SliceOp::create(c.b, c.loc, RankedTensorType::get(shape, t.getElementType()), x,
                         c.b.getI64IntegerAttr(dim), c.b.getI64IntegerAttr(start),
                         c.b.getI64IntegerAttr(end), c.b.getI64IntegerAttr(1));
}

/// The pieces (nulls skipped) concatenated along `dim`.
static Value join(Call &c, ArrayRef<Value> pieces, int64_t dim) {
  SmallVector<Value> xs;
  for (Value v : pieces)
    if (v)
      xs.push_back(v);
  if (xs.size() == 1)
    return xs[0];
  auto t = cast<RankedTensorType>(xs[0].getType());
  SmallVector<int64_t> shape(t.getShape());
  shape[dim] = 0;
  for (Value v : xs)
    shape[dim] += cast<RankedTensorType>(v.getType()).getDimSize(dim);
  return ConcatOp::create(c.b, c.loc, RankedTensorType::get(shape, t.getElementType()), xs,
                          c.b.getI64IntegerAttr(dim));
}

/// roll(x, shifts, dims) = per dim, concat(x[n - s:], x[:n - s]).
Value raiseRoll(Call &c) {
  auto shifts = c.ints("shifts"), dims = c.ints("dims");
  RankedTensorType t = c.resultType();
  if (c.plain.size() != 1 || !shifts || !dims || dims->empty() ||
      shifts->size() != dims->size() || !t.hasStaticShape())
    return {};
  Value x = c.plain[0];
  for (auto [shift, d] : llvm::zip(*shifts, *dims)) {
    std::optional<int64_t> dim = normalizeDim(d, t.getRank());
    if (!dim)
      return {};
    int64_t n = t.getDimSize(*dim);
    if (n == 0)
      continue;
    int64_t s = ((shift % n) + n) % n;
    if (s)
      x = join(c, {slab(c, x, *dim, n - s, n), slab(c, x, *dim, 0, n - s)}, *dim);
  }
  return x;
}

/// constant_pad_nd(x, pad, value): pad pairs from the last dim backwards;
/// blocks of `value` are concatenated on, negative pads slice.
Value raiseConstantPad(Call &c) {
  auto pad = c.ints("pad");
  std::optional<double> value = c.number("value");
  if (c.plain.size() != 1 || !pad || pad->size() % 2 || !value ||
      !cast<RankedTensorType>(c.plain[0].getType()).hasStaticShape())
    return {};
  Value x = c.plain[0];
  int64_t rank = c.resultType().getRank();
  for (size_t i = 0; i < pad->size() / 2; ++i) {
    int64_t dim = rank - 1 - static_cast<int64_t>(i), lo = (*pad)[2 * i], hi = (*pad)[2 * i + 1];
    if (dim < 0)
      return {};
    auto t = cast<RankedTensorType>(x.getType());
    int64_t n = t.getDimSize(dim);
    x = slab(c, x, dim, lo < 0 ? -lo : 0, hi < 0 ? n + hi : n);
    if (!x)
      return {};
    auto block = [&](int64_t size) -> Value {
      if (size <= 0)
        return {};
      SmallVector<int64_t> shape(cast<RankedTensorType>(x.getType()).getShape());
      shape[dim] = size;
      return FullOp::create(c.b, c.loc, RankedTensorType::get(shape, t.getElementType()),
                            c.b.getF64FloatAttr(*value));
    };
    x = join(c, {block(lo), x, block(hi)}, dim);
  }
  return x;
}

/// slice_scatter(base, src, dim, start, end, step=1) and
/// select_scatter(base, src, dim, index): base with src written in,
/// as concat(base[:start], src, base[end:]).
Value raiseScatter(Call &c) {
  RankedTensorType t = c.resultType();
  std::optional<int64_t> d = c.i64("dim");
  if (c.plain.size() != 2 || !d || c.plain[0].getType() != t || !t.hasStaticShape())
    return {};
  std::optional<int64_t> dim = normalizeDim(*d, t.getRank());
  if (!dim)
    return {};
  int64_t n = t.getDimSize(*dim), start, end;
  Value src = c.cast(c.plain[1], t.getElementType());
  if (c.name == "aten::select_scatter") {
    std::optional<int64_t> index = c.i64("index");
    if (!index)
      return {};
    start = *index < 0 ? *index + n : *index;
    end = start + 1;
    SmallVector<int64_t> shape(t.getShape());
    shape[*dim] = 1;
    src = c.reshape(src, shape);
  } else {
    if (c.i64("step").value_or(1) != 1)
      return {};
    auto bound = [&](StringRef name, int64_t otherwise) {
      int64_t v = c.isNone(name) || !c.i64(name) ? otherwise : *c.i64(name);
      v = v < 0 ? v + n : v;
      return std::clamp<int64_t>(v, 0, n);
    };
    start = bound("start", 0);
    end = std::max(start, bound("end", n));
  }
  if (cast<RankedTensorType>(src.getType()).getDimSize(*dim) != end - start)
    return {};
  return join(c, {slab(c, c.plain[0], *dim, 0, start), src, slab(c, c.plain[0], *dim, end, n)},
              *dim);
}

/// as_strided(x, size, stride, 0) that reads x in row-major order (every dim
/// longer than 1 has its contiguous stride) is a reshape of x.
Value raiseAsStrided(Call &c) {
  auto size = c.ints("size"), stride = c.ints("stride");
  RankedTensorType t = c.resultType();
  auto x = c.plain.size() == 1 ? dyn_cast<RankedTensorType>(c.plain[0].getType()) : nullptr;
  if (!x || !size || !stride || size->size() != stride->size() ||
      c.i64("storage_offset").value_or(0) != 0 || !x.hasStaticShape() ||
      x.getNumElements() != t.getNumElements() || x.getElementType() != t.getElementType())
    return {};
  int64_t expected = 1;
  for (int64_t d = static_cast<int64_t>(size->size()) - 1; d >= 0; --d) {
    if ((*size)[d] != 1 && (*stride)[d] != expected)
      return {};
    expected *= (*size)[d];
  }
  return x == t ? c.plain[0] : c.reshape(c.plain[0], t.getShape());
}

/// x[idx] (index.Tensor with one integer index tensor, on dim 0): rows of
/// x flattened to 2-D, gathered as an embedding lookup.
Value raiseIndex(Call &c) {
  std::optional<SmallVector<Value>> idx = c.tensors("indices");
  if (c.overload != "Tensor" || !idx || idx->size() != 1 || !(*idx)[0] || c.plain.size() != 1)
    return {};
  auto x = cast<RankedTensorType>(c.plain[0].getType());
  auto it = cast<RankedTensorType>((*idx)[0].getType());
  if (x.getRank() < 1 || !x.hasStaticShape() || !it.getElementType().isInteger(64))
    return {};
  int64_t rest = 1;
  for (int64_t d : x.getShape().drop_front())
    rest *= d;
  Value table = c.reshape(c.plain[0], {x.getDimSize(0), rest});
  // Indexing counts negative indices from the end; a lookup does not.
  Value ids = (*idx)[0];
  Value negative = CmpOp::create(c.b, c.loc, RankedTensorType::get(it.getShape(), c.b.getI1Type()),
                                 CmpPredicate::lt, ids, c.full(0, it.getElementType()));
  ids = WhereOp::create(c.b, c.loc, it, negative,
                        c.binary<AddOp>(ids, c.full(x.getDimSize(0), it.getElementType())), ids);
  SmallVector<int64_t> shape(it.getShape());
  shape.push_back(rest);
  Value rows = EmbeddingOp::create(c.b, c.loc, RankedTensorType::get(shape, x.getElementType()),
                                   table, ids, IntegerAttr());
  return c.reshape(rows, c.resultType().getShape());
}

//===----------------------------------------------------------------------===//
// Convolution and pooling
//===----------------------------------------------------------------------===//

Value raiseConvolution(Call &c) {
  auto stride = c.ints("stride"), padding = c.ints("padding"), dilation = c.ints("dilation");
  std::optional<int64_t> groups = c.i64("groups");
  if (c.boolean("transposed").value_or(true) || !stride || !padding || !dilation || !groups ||
      c.plain.size() < 2 || c.plain.size() > 3)
    return {};
  auto x = cast<RankedTensorType>(c.plain[0].getType());
  if (x.getRank() != 3 && x.getRank() != 4)
    return {};
  Value bias = c.plain.size() == 3 ? c.plain[2] : Value();
  auto op = ConvOp::create(c.b, c.loc, c.resultType(), c.plain[0], c.plain[1], bias,
                           c.b.getDenseI64ArrayAttr(*stride), c.b.getDenseI64ArrayAttr(*padding),
                           c.b.getDenseI64ArrayAttr(*dilation), c.b.getI64IntegerAttr(*groups));
  return op;
}

/// The pooling window's attributes (stride [] means the kernel).
template <typename PoolOp> Value raisePool(Call &c, bool isMax) {
  auto kernel = c.ints("kernel_size"), stride = c.ints("stride"), padding = c.ints("padding");
  if (c.plain.size() != 1 || !kernel || !stride || !padding || !c.onlyFirstResultUsed() ||
      !c.absentOrNone("divisor_override"))
    return {};
  auto two = [](ArrayRef<int64_t> xs) {
    return xs.size() == 1 ? SmallVector<int64_t>{xs[0], xs[0]} : SmallVector<int64_t>(xs);
  };
  SmallVector<int64_t> k = two(*kernel), s = stride->empty() ? k : two(*stride), p = two(*padding);
  SmallVector<int64_t> d = isMax && c.ints("dilation") ? two(*c.ints("dilation"))
                                                       : SmallVector<int64_t>{1, 1};
  bool ceil = c.boolean("ceil_mode").value_or(false);
  bool countPad = !isMax && c.boolean("count_include_pad").value_or(true);
  return PoolOp::create(c.b, c.loc, c.resultType(), c.plain[0], c.b.getDenseI64ArrayAttr(k),
                        c.b.getDenseI64ArrayAttr(s), c.b.getDenseI64ArrayAttr(p),
                        c.b.getDenseI64ArrayAttr(d), ceil ? c.b.getUnitAttr() : UnitAttr(),
                        countPad ? c.b.getUnitAttr() : UnitAttr());
}
Value raiseMaxPool(Call &c) { return raisePool<MaxPoolOp>(c, true); }
Value raiseAvgPool(Call &c) { return raisePool<AvgPoolOp>(c, false); }

/// adaptive_avg_pool2d to 1x1 is a mean over the spatial dims.
Value raiseAdaptiveAvgPool(Call &c) {
  auto size = c.ints("output_size");
  if (c.plain.size() != 1 || !size || llvm::any_of(*size, [](int64_t s) { return s != 1; }))
    return {};
  return MeanOp::create(c.b, c.loc, c.resultType(), c.plain[0], c.b.getDenseI64ArrayAttr({-2, -1}),
                        c.b.getUnitAttr());
}

//===----------------------------------------------------------------------===//
// The table
//===----------------------------------------------------------------------===//

/// Schema name (every overload) or full schema -> how to raise it.
const llvm::StringMap<RaiseFn> &table() {
  static const llvm::StringMap<RaiseFn> rows = [] {
    llvm::StringMap<RaiseFn> t;
#define TDX_UNARY(Name, fn, aten, linear) t[aten] = &raiseUnary<Name##Op>;
#define TDX_BINARY(Name, fn, aten) t[aten] = &raiseBinary<Name##Op>;
#include "tdx/Runtime/ElementwiseOps.def"
    t["aten::gelu"] = &raiseGelu;
    t["aten::clamp"] = &raiseClamp;
    t["aten::gelu_backward"] = &raiseGeluBackward;
    t["aten::silu_backward"] = &raiseSiluBackward;
    t["aten::sigmoid_backward"] = &raiseSigmoidBackward;
    t["aten::tanh_backward"] = &raiseTanhBackward;
    t["aten::addcmul"] = &raiseAddc<MulOp>;
    t["aten::addcdiv"] = &raiseAddc<DivOp>;
    t["aten::rsub"] = &raiseRsub;
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
      // What a row builds before it declines is erased again.
      struct Created : OpBuilder::Listener {
        SmallVector<Operation *> ops;
        void notifyOperationInserted(Operation *op, OpBuilder::InsertPoint) override {
          ops.push_back(op);
        }
      } created;
      if (row != table().end() && op->getNumResults() >= 1 &&
          isa<RankedTensorType>(op->getResult(0).getType())) {
        OpBuilder b(op, &created);
        Call call(op, b);
        raised = row->second(call);
        if (raised && raised.getType() != op->getResult(0).getType()) {
          raised.getDefiningOp()->emitOpError()
              << "raised from " << schema << " has type " << raised.getType()
              << " instead of " << op->getResult(0).getType() << " (a tdx bug)";
          return signalPassFailure();
        }
        if (raised && !llvm::all_of(op->getResults().drop_front(),
                                    [](Value r) { return r.use_empty(); }))
          raised = {};
      }
      if (!raised) {
        for (Operation *made : llvm::reverse(created.ops))
          made->erase();
        if (report)
          op.emitRemark() << schema << " stays generic (runs through ATen on the CPU backend)";
        continue;
      }
      op->getResult(0).replaceAllUsesWith(raised);
      op->erase();
    }
  }
};

} // namespace
