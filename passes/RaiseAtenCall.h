//===- RaiseAtenCall.h - what tdx-raise-aten's rows build with ---*- C++ -*-===//
//
// Internal to tdx-raise-aten. The pass and its one table are in
// RaiseAten.cpp; the rows it names are in RaiseAtenMath.cpp (elementwise
// ops, activations and their backward formulas, linear algebra,
// reductions) and RaiseAtenShapes.cpp (concatenation, padding, scatters,
// indexing, convolution and pooling). Each row rewrites one aten call into
// first-class tdx ops, or returns null to leave it generic.
//
//===----------------------------------------------------------------------===//

#ifndef TDX_PASSES_RAISEATENCALL_H
#define TDX_PASSES_RAISEATENCALL_H

#include "tdx/IR/TdxOps.h"

#include "mlir/IR/Builders.h"

#include <optional>

namespace mlir::tdx::raise {

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

// RaiseAtenMath.cpp
template <typename OpT> Value raiseUnary(Call &c);
template <typename OpT> Value raiseBinary(Call &c);
template <typename OpT> Value raiseAddc(Call &c);
template <typename OpT> Value raiseReduce(Call &c);
Value raiseGelu(Call &c);
Value raiseClamp(Call &c);
Value raiseReciprocal(Call &c);
Value raiseCompare(Call &c);
Value raiseWhere(Call &c);
Value raiseMaskedFill(Call &c);
Value raiseGeluBackward(Call &c);
Value raiseSiluBackward(Call &c);
Value raiseSigmoidBackward(Call &c);
Value raiseTanhBackward(Call &c);
Value raiseRsub(Call &c);
Value raiseLerp(Call &c);
Value raiseSdpa(Call &c);
Value raiseFusedRmsNorm(Call &c);
Value raiseSdpaBackward(Call &c);
Value raiseOuter(Call &c);
Value raiseTriangle(Call &c);
Value raiseBatchNorm(Call &c);
Value raiseMatmul(Call &c);
Value raiseAddmm(Call &c);
Value raiseLinear(Call &c);
Value raiseSoftmax(Call &c);
Value raiseNorm(Call &c);
Value raiseEmbedding(Call &c);

// RaiseAtenRegions.cpp
Value raiseToLocal(Call &c);
Value raiseFromLocal(Call &c);

// RaiseAtenShapes.cpp
Value raiseCat(Call &c);
Value raiseStack(Call &c);
Value raiseRoll(Call &c);
Value raiseConstantPad(Call &c);
Value raiseScatter(Call &c);
Value raiseAsStrided(Call &c);
Value raiseAsStridedScatter(Call &c);
Value raiseIndex(Call &c);
Value raiseConvolution(Call &c);
Value raiseMaxPool(Call &c);
Value raiseAvgPool(Call &c);
Value raiseAdaptiveAvgPool(Call &c);

} // namespace mlir::tdx::raise

#endif // TDX_PASSES_RAISEATENCALL_H
