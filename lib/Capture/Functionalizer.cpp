//===- Functionalizer.cpp - the values of a symbolic replay ---------------===//
//
// What Functionalizer (Functionalizer.h) builds each op with: the SSA value
// a fake tensor holds (read, define, write: a write into a view is scattered
// back into its base, and other views of the base are recomputed when next
// read), constants, casts, generic tdx.aten ops, and views.
//
//===----------------------------------------------------------------------===//

#include "CaptureInternal.h"
#include "Functionalizer.h"

#include "tdx/IR/TdxOps.h"
#include "tdx/Transforms/Passes.h"

#include "mlir/Dialect/Arith/IR/Arith.h"
#include "mlir/Dialect/Func/IR/FuncOps.h"
#include "mlir/Dialect/Linalg/IR/Linalg.h"
#include "mlir/Dialect/Tensor/IR/Tensor.h"
#include "mlir/Analysis/SliceAnalysis.h"
#include "mlir/AsmParser/AsmParser.h"
#include "mlir/IR/Builders.h"
#include "mlir/IR/BuiltinOps.h"
#include "mlir/IR/Diagnostics.h"
#include "mlir/IR/IRMapping.h"
#include "mlir/IR/Verifier.h"
#include "mlir/Parser/Parser.h"
#include "mlir/Pass/PassManager.h"
#include "mlir/Transforms/Passes.h"
#include "llvm/ADT/ScopeExit.h"
#include "llvm/ADT/SetVector.h"

#include <ATen/ATen.h>

#include <unordered_set>
#include <ATen/core/dispatch/Dispatcher.h>

using namespace mlir;
using namespace mlir::tdx;
namespace capture = ::tdx::capture;
using ::tdx::capture::CaptureError;
using ::tdx::capture::RecordedOp;

namespace tdx::capture::detail {

Type elementType(Builder &b, at::ScalarType t) {
  const char *ir = nullptr;
  switch (t) {
#define TDX_DTYPE(Name, stored, bytes, aten, ctype, mlir, irName, runs)                    \
  case at::aten:                                                                           \
    ir = irName;                                                                           \
    break;
#include "tdx/StateFormat/DTypes.def"
  default:
    throw CaptureError(std::string("tdx: dtype ") + c10::toString(t) +
                       " has no tdx element type yet; use a real or integer dtype");
  }
  return mlir::parseType(ir, b.getContext());
}

RankedTensorType tensorType(Builder &b, const at::Tensor &t) {
  return RankedTensorType::get(t.sizes().vec(), elementType(b, t.scalar_type()));
}

std::string fullName(const RecordedOp &op) {
  return op.name + (op.overload.empty() ? "" : "." + op.overload);
}

/// A non-tensor argument of an aten op as an attribute (see tdx.aten):
/// None is `unit`, lists keep their element kind, Scalars their kind.
/// Throws, naming the op and the argument, for a kind tdx cannot keep.
Attribute toAttribute(Builder &b, const c10::IValue &v, const std::string &op,
                      const std::string &arg) {
  if (v.isNone() || v.isGenerator())
    return b.getUnitAttr(); // a Generator is the default one in the binary
  if (v.isBool())
    return b.getBoolAttr(v.toBool());
  if (v.isInt())
    return b.getI64IntegerAttr(v.toInt());
  if (v.isDouble())
    return b.getF64FloatAttr(v.toDouble());
  if (v.isString())
    return b.getStringAttr(v.toStringRef());
  if (v.isDevice())
    return b.getStringAttr(v.toDevice().str());
  if (v.isIntList())
    return b.getDenseI64ArrayAttr(v.toIntVector());
  if (v.isDoubleList()) {
    SmallVector<Attribute> xs;
    for (double d : v.toDoubleVector())
      xs.push_back(b.getF64FloatAttr(d));
    return b.getArrayAttr(xs);
  }
  if (v.isBoolList()) {
    SmallVector<Attribute> xs;
    for (bool x : v.toBoolList())
      xs.push_back(b.getBoolAttr(x));
    return b.getArrayAttr(xs);
  }
  if (v.isScalar()) {
    c10::Scalar s = v.toScalar();
    if (s.isBoolean())
      return b.getBoolAttr(s.toBool());
    if (s.isIntegral(false))
      return b.getI64IntegerAttr(s.toLong());
    if (s.isFloatingPoint())
      return b.getF64FloatAttr(s.toDouble());
  }
  throw CaptureError("tdx: " + op + ": argument '" + arg + "' is a " + v.tagKind() +
                     ", which a generic tdx.aten op cannot keep; express this part of the "
                     "model with other ops");
}


Value Functionalizer::read(const at::Tensor &t) {
  if (!capture::isFake(t))
    return constant(t, tensorType(b, t)); // a real tensor: Python scalars, constants
  c10::TensorImpl *impl = t.unsafeGetTensorImpl();
  auto storage = t.storage().unsafeGetStorageImpl();
  if (!cur.count(impl) && !views.count(impl) && resolver)
    if (Value v = resolver(t))
      define(t, v);
  if (!cur.count(impl) && !views.count(impl)) {
    // A shallow copy the recording never saw (Python and autograd make
    // them): a view of whatever made its storage.
    auto owner = owners.find(storage);
    if (owner != owners.end() && owner->second.unsafeGetTensorImpl() != impl)
      views[impl] = View{owner->second, nullptr, t.sizes().vec(), t.strides().vec(),
                         t.storage_offset()};
  }
  auto view = views.find(impl);
  if (view != views.end() && (!cur.count(impl) || seen[impl] != version[storage])) {
    if (++depth > 10000)
      throw CaptureError("tdx: " + current +
                         " reads a tensor whose views lead back to itself; this is a "
                         "tdx bug, please report it with the module");
    View v = view->second;
    Value base = read(v.base);
    --depth;
    cur[impl] = applyView(base, v, t);
    seen[impl] = version[storage];
  }
  auto it = cur.find(impl);
  if (it == cur.end())
    throw CaptureError("tdx: " + current +
                       " uses a tensor that the recording did not make (it was "
                       "created outside deferred_init)");
  return it->second;
}

bool Functionalizer::auxiliaryResultsRead(const RecordedOp &op, size_t from) const {
  for (size_t i = from; i < op.results.size(); ++i)
    if (op.results[i].isTensor() && read_.count(op.results[i].toTensor().unsafeGetTensorImpl()))
      return true;
  return false;
}

void Functionalizer::define(const at::Tensor &t, Value v) {
  c10::TensorImpl *impl = t.unsafeGetTensorImpl();
  owners.emplace(t.storage().unsafeGetStorageImpl(), t);
  cur[impl] = v;
  seen[impl] = version[t.storage().unsafeGetStorageImpl()];
}

void Functionalizer::write(const at::Tensor &t, Value v) {
  c10::TensorImpl *impl = t.unsafeGetTensorImpl();
  auto view = views.find(impl);
  if (view != views.end()) {
    View copy = view->second;
    Value newBase = scatter(read(copy.base), v, copy, t);
    write(copy.base, newBase);
  } else {
    ++version[t.storage().unsafeGetStorageImpl()];
  }
  define(t, v);
}

Value Functionalizer::constant(const at::Tensor &real, RankedTensorType type) {
  capture::RealMode realMode;
  if (real.is_complex())
    throw CaptureError("tdx: " + current +
                       " uses a complex tensor made outside the recording (a constant); tdx "
                       "programs hold complex tensors that ops make, not complex constants: "
                       "build it with torch.complex(real, imag) inside the model");
  bool isFloat = isa<FloatType>(type.getElementType());
  at::Tensor data =
      real.detach().contiguous().to(isFloat ? at::kDouble : at::kLong).flatten();
  SmallVector<Attribute> values;
  for (int64_t i = 0; i < data.numel(); ++i) {
    if (isFloat)
      values.push_back(b.getFloatAttr(type.getElementType(), data[i].item<double>()));
    else
      values.push_back(b.getIntegerAttr(type.getElementType(), data[i].item<int64_t>()));
  }
  return arith::ConstantOp::create(b, loc, DenseElementsAttr::get(type, values));
}

Value Functionalizer::full(double value, RankedTensorType type) {
  return FullOp::create(b, loc, type, b.getF64FloatAttr(value));
}

Value Functionalizer::fit(Value v, RankedTensorType type) {
  auto vt = cast<RankedTensorType>(v.getType());
  if (vt.getElementType() != type.getElementType())
    v = CastOp::create(b, loc, RankedTensorType::get(vt.getShape(), type.getElementType()), v);
  if (cast<RankedTensorType>(v.getType()).getShape() != type.getShape())
    v = ExpandOp::create(b, loc, type, v, b.getDenseI64ArrayAttr(type.getShape()));
  return v;
}

Value Functionalizer::generic(StringRef schema, const RecordedOp &op, ArrayRef<Type> results) {
  SmallVector<Value> operands;
  SmallVector<NamedAttribute> args;
  const c10::FunctionSchema &fs = schemaOf(op);
  for (size_t i = 0; i < op.arguments.size() && i < fs.arguments().size(); ++i) {
    const c10::IValue &v = op.arguments[i];
    const std::string &argName = fs.arguments()[i].name();
    if (v.isTensor() && v.toTensor().defined()) {
      operands.push_back(read(v.toTensor()));
      continue;
    }
    if (v.isTensor()) { // an undefined optional tensor: None
      args.push_back(b.getNamedAttr(argName, b.getUnitAttr()));
      continue;
    }
    if (v.isTensorList() || (v.isList() && isTensorListType(fs.arguments()[i].type()))) {
      SmallVector<Attribute> refs;
      for (const c10::IValue &e : v.toListRef()) {
        if (e.isNone() || (e.isTensor() && !e.toTensor().defined())) {
          refs.push_back(b.getUnitAttr());
          continue;
        }
        refs.push_back(b.getIndexAttr(static_cast<int64_t>(operands.size())));
        operands.push_back(read(e.toTensor()));
      }
      args.push_back(b.getNamedAttr(argName, b.getArrayAttr(refs)));
      continue;
    }
    args.push_back(b.getNamedAttr(argName, toAttribute(b, v, schema.str(), argName)));
  }
  auto op2 = AtenOp::create(b, loc, results, b.getStringAttr(schema), operands,
                            args.empty() ? DictionaryAttr() : b.getDictionaryAttr(args));
  return op2->getNumResults() ? op2->getResult(0) : Value();
}

bool Functionalizer::isTensorListType(const c10::TypePtr &t) {
  if (t->kind() != c10::TypeKind::ListType)
    return false;
  c10::TypePtr e = t->castRaw<c10::ListType>()->getElementType();
  if (e->kind() == c10::TypeKind::OptionalType)
    e = e->castRaw<c10::OptionalType>()->getElementType();
  return e->kind() == c10::TypeKind::TensorType;
}

Value Functionalizer::applyView(Value base, const View &view, const at::Tensor &result) {
  RankedTensorType type = tensorType(b, result);
  if (!view.op && view.sliceDim >= 0) {
    auto baseType = cast<RankedTensorType>(base.getType());
    SmallVector<int64_t> shape(baseType.getShape());
    shape[view.sliceDim] = view.sliceEnd - view.sliceStart;
    Value s = SliceOp::create(b, loc, RankedTensorType::get(shape, baseType.getElementType()),
                              base, b.getI64IntegerAttr(view.sliceDim),
                              b.getI64IntegerAttr(view.sliceStart),
                              b.getI64IntegerAttr(view.sliceEnd), b.getI64IntegerAttr(1));
    if (view.squeeze)
      s = ReshapeOp::create(b, loc, type, s, b.getDenseI64ArrayAttr(type.getShape()));
    return s;
  }
  if (!view.op) {
    // The same elements only where the alias lays out the storage as its
    // base does: a square matrix's transpose has the base's type too.
    const at::Tensor &of = view.base;
    bool same = base.getType() == type && of.sizes() == c10::IntArrayRef(view.sizes) &&
                of.strides() == c10::IntArrayRef(view.strides) &&
                of.storage_offset() == view.offset;
    return same ? base : reshapeOrStrided(base, view, type);
  }
  const RecordedOp &op = *view.op;
  const std::string &n = op.name;
  const auto &a = op.arguments;
  auto baseType = cast<RankedTensorType>(base.getType());
  if (n == "aten::detach" || n == "aten::alias" || n == "aten::lift_fresh" ||
      n == "aten::view_as")
    return base;
  if (n == "aten::slice")
    return SliceOp::create(b, loc, type, base, b.getI64IntegerAttr(a[1].toInt()),
                           b.getI64IntegerAttr(a[2].isNone() ? 0 : a[2].toInt()),
                           b.getI64IntegerAttr(a[3].isNone() ? INT64_MAX : a[3].toInt()),
                           b.getI64IntegerAttr(a[4].toInt()));
  if (n == "aten::select") {
    int64_t dim = a[1].toInt(), index = a[2].toInt();
    int64_t size = baseType.getDimSize(*normalizeDim(dim, baseType.getRank()));
    if (index < 0)
      index += size;
    SmallVector<int64_t> kept(baseType.getShape());
    kept[*normalizeDim(dim, baseType.getRank())] = 1;
    Value s = SliceOp::create(b, loc, RankedTensorType::get(kept, baseType.getElementType()),
                              base, b.getI64IntegerAttr(dim), b.getI64IntegerAttr(index),
                              b.getI64IntegerAttr(index + 1), b.getI64IntegerAttr(1));
    return ReshapeOp::create(b, loc, type, s, b.getDenseI64ArrayAttr(type.getShape()));
  }
  if (n == "aten::t" || n == "aten::transpose") {
    int64_t d0 = n == "aten::t" ? 0 : a[1].toInt(), d1 = n == "aten::t" ? -1 : a[2].toInt();
    if (baseType.getRank() < 2)
      return base;
    return TransposeOp::create(b, loc, type, base, b.getI64IntegerAttr(d0),
                               b.getI64IntegerAttr(d1));
  }
  if (n == "aten::permute")
    return PermuteOp::create(b, loc, type, base, b.getDenseI64ArrayAttr(a[1].toIntVector()));
  if (n == "aten::view" || n == "aten::reshape" || n == "aten::_reshape_alias" ||
      n == "aten::unsqueeze" || n == "aten::squeeze" || n == "aten::flatten" ||
      n == "aten::unflatten" || n == "aten::_unsafe_view")
    return ReshapeOp::create(b, loc, type, base, b.getDenseI64ArrayAttr(type.getShape()));
  if (n == "aten::expand")
    return ExpandOp::create(b, loc, type, base, b.getDenseI64ArrayAttr(type.getShape()));
  // Any other view (diagonal, unfold, as_strided, ...): by schema name.
  SmallVector<NamedAttribute> args;
  const c10::FunctionSchema &fs = schemaOf(op);
  for (size_t i = 1; i < a.size() && i < fs.arguments().size(); ++i)
    args.push_back(b.getNamedAttr(fs.arguments()[i].name(),
                                  toAttribute(b, a[i], fullName(op), fs.arguments()[i].name())));
  return AtenOp::create(b, loc, TypeRange{type}, b.getStringAttr(fullName(op)),
                        ValueRange{base}, args.empty() ? DictionaryAttr() : b.getDictionaryAttr(args))
      ->getResult(0);
}

/// The arguments of as_strided and as_strided_scatter.
static DictionaryAttr stridedArgs(OpBuilder &b, ArrayRef<int64_t> sizes,
                                  ArrayRef<int64_t> strides, int64_t offset) {
  return b.getDictionaryAttr({b.getNamedAttr("size", b.getDenseI64ArrayAttr(sizes)),
                              b.getNamedAttr("stride", b.getDenseI64ArrayAttr(strides)),
                              b.getNamedAttr("storage_offset", b.getI64IntegerAttr(offset))});
}

/// `aten::as_strided` of `base` (the elements of its storage, row-major).
Value asStrided(OpBuilder &b, Location loc, Value base, RankedTensorType type,
                ArrayRef<int64_t> sizes, ArrayRef<int64_t> strides, int64_t offset) {
  return AtenOp::create(b, loc, TypeRange{type}, b.getStringAttr("aten::as_strided"),
                        ValueRange{base}, stridedArgs(b, sizes, strides, offset))
      ->getResult(0);
}

Value Functionalizer::reshapeOrStrided(Value base, const View &view, RankedTensorType type) {
  // An alias with other sizes/strides: as_strided of the base.
  return asStrided(b, loc, base, type, view.sizes, view.strides, view.offset);
}

Value Functionalizer::scatter(Value base, Value value, const View &view, const at::Tensor &result) {
  auto baseType = cast<RankedTensorType>(base.getType());
  if (!view.op && view.sliceDim >= 0) {
    if (view.squeeze) {
      SmallVector<int64_t> shape(baseType.getShape());
      shape[view.sliceDim] = 1;
      value = ReshapeOp::create(b, loc, RankedTensorType::get(shape, baseType.getElementType()),
                                value, b.getDenseI64ArrayAttr(shape));
    }
    SmallVector<NamedAttribute> args = {
        b.getNamedAttr("dim", b.getI64IntegerAttr(view.sliceDim)),
        b.getNamedAttr("start", b.getI64IntegerAttr(view.sliceStart)),
        b.getNamedAttr("end", b.getI64IntegerAttr(view.sliceEnd)),
        b.getNamedAttr("step", b.getI64IntegerAttr(1))};
    return AtenOp::create(b, loc, TypeRange{baseType}, b.getStringAttr("aten::slice_scatter"),
                          ValueRange{base, value}, b.getDictionaryAttr(args))
        ->getResult(0);
  }
  if (!view.op) {
    if (value.getType() == baseType)
      return value;
    return AtenOp::create(b, loc, TypeRange{baseType}, b.getStringAttr("aten::as_strided_scatter"),
                          ValueRange{base, value},
                          stridedArgs(b, view.sizes, view.strides, view.offset))
        ->getResult(0);
  }
  const RecordedOp &op = *view.op;
  const std::string &n = op.name;
  const auto &a = op.arguments;
  if (n == "aten::detach" || n == "aten::alias" || n == "aten::lift_fresh" ||
      n == "aten::view_as")
    return value;
  if (n == "aten::view" || n == "aten::reshape" || n == "aten::_reshape_alias" ||
      n == "aten::unsqueeze" || n == "aten::squeeze" || n == "aten::flatten" ||
      n == "aten::unflatten" || n == "aten::_unsafe_view")
    return ReshapeOp::create(b, loc, baseType, value, b.getDenseI64ArrayAttr(baseType.getShape()));
  // An expand that repeats no element (it only adds or keeps dims of size
  // one: Hugging Face's arange(n).expand((1, -1)) buffers) is a reshape.
  if ((n == "aten::expand" || n == "aten::expand_as") &&
      cast<RankedTensorType>(value.getType()).getNumElements() == baseType.getNumElements())
    return ReshapeOp::create(b, loc, baseType, value, b.getDenseI64ArrayAttr(baseType.getShape()));
  if (n == "aten::t" || n == "aten::transpose") {
    if (baseType.getRank() < 2)
      return value;
    int64_t d0 = n == "aten::t" ? 0 : a[1].toInt(), d1 = n == "aten::t" ? -1 : a[2].toInt();
    return TransposeOp::create(b, loc, baseType, value, b.getI64IntegerAttr(d0),
                               b.getI64IntegerAttr(d1));
  }
  if (n == "aten::permute") {
    std::vector<int64_t> perm = a[1].toIntVector();
    SmallVector<int64_t> inverse(perm.size());
    for (size_t i = 0; i < perm.size(); ++i)
      inverse[*normalizeDim(perm[i], perm.size())] = i;
    return PermuteOp::create(b, loc, baseType, value, b.getDenseI64ArrayAttr(inverse));
  }
  std::string scatterName;
  if (n == "aten::slice")
    scatterName = "aten::slice_scatter";
  else if (n == "aten::select")
    scatterName = "aten::select_scatter";
  else if (n == "aten::diagonal")
    scatterName = "aten::diagonal_scatter";
  else if (n == "aten::as_strided")
    scatterName = "aten::as_strided_scatter";
  else
    throw CaptureError("tdx: a write through a view made by " + fullName(op) +
                       " cannot be functionalized yet; write through slice, "
                       "select, diagonal, transpose, permute or a reshape");
  SmallVector<NamedAttribute> args;
  const c10::FunctionSchema &fs = schemaOf(op);
  for (size_t i = 1; i < a.size() && i < fs.arguments().size(); ++i)
    args.push_back(b.getNamedAttr(fs.arguments()[i].name(),
                                  toAttribute(b, a[i], fullName(op), fs.arguments()[i].name())));
  return AtenOp::create(b, loc, TypeRange{baseType}, b.getStringAttr(scatterName),
                        ValueRange{base, value},
                        args.empty() ? DictionaryAttr() : b.getDictionaryAttr(args))
      ->getResult(0);
}

} // namespace tdx::capture::detail
