//===- EmitIR.cpp - a recording as tdx IR, functionalized -----------------===//
//
// Replays a recording symbolically: every fake tensor gets an SSA value,
// in-place ops and writes through views become new values (a write into a
// view is scattered back into its base, and other views of the base are
// recomputed when next read), and each parameter's init program is the
// backward slice of its final value.
//
//===----------------------------------------------------------------------===//

#include "CaptureInternal.h"

#include "tdx/Dialect/TdxOps.h"
#include "tdx/Passes/Passes.h"

#include "mlir/Dialect/Arith/IR/Arith.h"
#include "mlir/Dialect/Func/IR/FuncOps.h"
#include "mlir/Dialect/Linalg/IR/Linalg.h"
#include "mlir/Dialect/Tensor/IR/Tensor.h"
#include "mlir/Analysis/SliceAnalysis.h"
#include "mlir/IR/Builders.h"
#include "mlir/IR/BuiltinOps.h"
#include "mlir/IR/Diagnostics.h"
#include "mlir/IR/IRMapping.h"
#include "mlir/IR/Verifier.h"
#include "mlir/Parser/Parser.h"
#include "mlir/Pass/PassManager.h"
#include "mlir/Transforms/Passes.h"
#include "llvm/ADT/SetVector.h"

#include <ATen/ATen.h>

#include <unordered_set>
#include <ATen/core/dispatch/Dispatcher.h>

using namespace mlir;
using namespace mlir::tdx;
namespace capture = ::tdx::capture;
using ::tdx::capture::CaptureError;
using ::tdx::capture::RecordedOp;

namespace {

Type elementType(Builder &b, at::ScalarType t) {
  switch (t) {
  case at::kFloat:
    return b.getF32Type();
  case at::kDouble:
    return b.getF64Type();
  case at::kHalf:
    return b.getF16Type();
  case at::kBFloat16:
    return b.getBF16Type();
  case at::kLong:
    return b.getI64Type();
  case at::kInt:
    return b.getI32Type();
  case at::kShort:
    return b.getI16Type();
  case at::kChar:
  case at::kByte:
    return b.getI8Type();
  case at::kBool:
    return b.getI1Type();
  default:
    throw CaptureError(std::string("tdx: dtype ") + c10::toString(t) +
                       " has no tdx element type yet; use a real or integer dtype");
  }
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

class Functionalizer {
public:
  Functionalizer(OpBuilder &b, Location loc, int64_t seed) : b(b), loc(loc), seed(seed) {}

  void run(const std::vector<RecordedOp> &ops) {
    // What later ops read: a fused form that drops an op's auxiliary results
    // (a loss's total weight, a norm's mean and rstd) is taken only when
    // nothing reads them (a backward does).
    for (const RecordedOp &op : ops)
      for (const c10::IValue &a : op.arguments) {
        if (a.isTensor())
          read_.insert(a.toTensor().unsafeGetTensorImpl());
        else if (a.isList())
          for (const c10::IValue &e : a.toListRef())
            if (e.isTensor())
              read_.insert(e.toTensor().unsafeGetTensorImpl());
      }
    for (const RecordedOp &op : ops) {
      current = fullName(op);
      handle(op);
    }
    current = "the module";
  }

  void bindInput(const at::Tensor &t, Value v) { define(t, v); }

  Value read(const at::Tensor &t) {
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

private:
  struct View {
    at::Tensor base;
    const RecordedOp *op; // null: identity (alias, detach), or a slice below
    std::vector<int64_t> sizes, strides;
    int64_t offset = 0;
    // One piece of split/unbind/chunk: [sliceStart, sliceEnd) of sliceDim,
    // with the dim dropped when `squeeze`.
    int64_t sliceDim = -1, sliceStart = 0, sliceEnd = 0;
    bool squeeze = false;
  };

public:
  /// Called for a fake tensor that no op made (a parameter in the forward).
  std::function<Value(const at::Tensor &)> resolver;

private:

  OpBuilder &b;
  Location loc;
  int64_t seed;
  std::string current = "the module";
  int depth = 0;
  int64_t stream = 0;
  std::unordered_map<c10::TensorImpl *, Value> cur;
  std::unordered_map<c10::TensorImpl *, int64_t> seen;
  std::unordered_map<c10::TensorImpl *, View> views;
  std::unordered_map<c10::StorageImpl *, int64_t> version;

  std::unordered_map<c10::StorageImpl *, at::Tensor> owners;
  std::unordered_set<const c10::TensorImpl *> read_;

  /// Whether a later op reads result `i` or beyond of `op`.
  bool auxiliaryResultsRead(const RecordedOp &op, size_t from) const {
    for (size_t i = from; i < op.results.size(); ++i)
      if (op.results[i].isTensor() && read_.count(op.results[i].toTensor().unsafeGetTensorImpl()))
        return true;
    return false;
  }

  void define(const at::Tensor &t, Value v) {
    c10::TensorImpl *impl = t.unsafeGetTensorImpl();
    owners.emplace(t.storage().unsafeGetStorageImpl(), t);
    cur[impl] = v;
    seen[impl] = version[t.storage().unsafeGetStorageImpl()];
  }

  void write(const at::Tensor &t, Value v) {
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

  /// The data of a real tensor as a constant of `type`.
  Value constant(const at::Tensor &real, RankedTensorType type) {
    capture::RealMode realMode;
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

  Value full(double value, RankedTensorType type) {
    return FullOp::create(b, loc, type, b.getF64FloatAttr(value));
  }

  /// `v` converted to the type of `t` (dtype cast, then broadcast).
  Value fit(Value v, RankedTensorType type) {
    auto vt = cast<RankedTensorType>(v.getType());
    if (vt.getElementType() != type.getElementType())
      v = CastOp::create(b, loc, RankedTensorType::get(vt.getShape(), type.getElementType()), v);
    if (cast<RankedTensorType>(v.getType()).getShape() != type.getShape())
      v = ExpandOp::create(b, loc, type, v, b.getDenseI64ArrayAttr(type.getShape()));
    return v;
  }

  /// A generic tdx.aten op: every schema argument is kept. Tensors are
  /// operands in schema order; a Tensor[] / Tensor?[] argument is an array
  /// of operand numbers (`index` integers) and `unit` for a None element;
  /// everything else is an attribute (toAttribute).
  Value generic(StringRef schema, const RecordedOp &op, ArrayRef<Type> results) {
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

  static bool isTensorListType(const c10::TypePtr &t) {
    if (t->kind() != c10::TypeKind::ListType)
      return false;
    c10::TypePtr e = t->castRaw<c10::ListType>()->getElementType();
    if (e->kind() == c10::TypeKind::OptionalType)
      e = e->castRaw<c10::OptionalType>()->getElementType();
    return e->kind() == c10::TypeKind::TensorType;
  }

  static const c10::FunctionSchema &schemaOf(const RecordedOp &op) {
    return c10::Dispatcher::singleton()
        .findSchemaOrThrow(op.name.c_str(), op.overload.c_str())
        .schema();
  }

  Value applyView(Value base, const View &view, const at::Tensor &result) {
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
    if (!view.op)
      return base.getType() == type ? base : reshapeOrStrided(base, view, type);
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

  Value reshapeOrStrided(Value base, const View &view, RankedTensorType type) {
    // An alias with other sizes/strides: as_strided of the base.
    SmallVector<NamedAttribute> args = {
        b.getNamedAttr("size", b.getDenseI64ArrayAttr(view.sizes)),
        b.getNamedAttr("stride", b.getDenseI64ArrayAttr(view.strides)),
        b.getNamedAttr("storage_offset", b.getI64IntegerAttr(view.offset))};
    return AtenOp::create(b, loc, TypeRange{type}, b.getStringAttr("aten::as_strided"),
                          ValueRange{base}, b.getDictionaryAttr(args))
        ->getResult(0);
  }

  /// The base after writing `value` into the view `view` of it.
  Value scatter(Value base, Value value, const View &view, const at::Tensor &result) {
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
      SmallVector<NamedAttribute> args = {
          b.getNamedAttr("size", b.getDenseI64ArrayAttr(view.sizes)),
          b.getNamedAttr("stride", b.getDenseI64ArrayAttr(view.strides)),
          b.getNamedAttr("storage_offset", b.getI64IntegerAttr(view.offset))};
      return AtenOp::create(b, loc, TypeRange{baseType}, b.getStringAttr("aten::as_strided_scatter"),
                            ValueRange{base, value}, b.getDictionaryAttr(args))
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

  /// The functional value of an op on tensors, or null when unknown.
  Value functional(const RecordedOp &op, const at::Tensor &out) {
    const std::string &n = op.name;
    const auto &a = op.arguments;
    RankedTensorType type = tensorType(b, out);
    auto key = [&]() {
      return std::make_pair(b.getI64IntegerAttr(seed), b.getI64IntegerAttr(stream++));
    };
    if (n == "aten::empty" || n == "aten::empty_like" || n == "aten::empty_strided" ||
        n == "aten::new_empty")
      return EmptyOp::create(b, loc, type);
    if (n == "aten::zeros" || n == "aten::zeros_like" || n == "aten::zero_" ||
        n == "aten::new_zeros")
      return full(0.0, type);
    if (n == "aten::ones" || n == "aten::ones_like" || n == "aten::new_ones")
      return full(1.0, type);
    if (n == "aten::fill_" && a[1].isScalar())
      return full(a[1].toScalar().toDouble(), type);
    if (n == "aten::fill_" && a[1].isTensor())
      return fit(read(a[1].toTensor()), type);
    if ((n == "aten::full" || n == "aten::new_full") && a[1].isScalar())
      return full(a[1].toScalar().toDouble(), type);
    if (n == "aten::full_like")
      return full(a[1].toScalar().toDouble(), type);
    if (n == "aten::uniform_") {
      auto [s, k] = key();
      return UniformOp::create(b, loc, type, b.getF64FloatAttr(a[1].toDouble()),
                               b.getF64FloatAttr(a[2].toDouble()), s, k,
                               DenseI64ArrayAttr());
    }
    if (n == "aten::normal_") {
      auto [s, k] = key();
      return NormalOp::create(b, loc, type, b.getF64FloatAttr(a[1].toDouble()),
                              b.getF64FloatAttr(a[2].toDouble()), s, k,
                               DenseI64ArrayAttr());
    }
    if (n == "aten::rand" || n == "aten::rand_like") {
      auto [s, k] = key();
      return UniformOp::create(b, loc, type, b.getF64FloatAttr(0.0), b.getF64FloatAttr(1.0), s, k,
                               DenseI64ArrayAttr());
    }
    // Training-mode dropout's mask (torch.empty_like(x).bernoulli_(1 - p)).
    if ((n == "aten::bernoulli_" && op.overload == "float") ||
        (n == "aten::bernoulli" && op.overload == "p")) {
      auto [s, k] = key();
      return BernoulliOp::create(b, loc, type, b.getF64FloatAttr(a[1].toDouble()), s, k,
                               DenseI64ArrayAttr());
    }
    if (n == "aten::randn" || n == "aten::randn_like") {
      auto [s, k] = key();
      return NormalOp::create(b, loc, type, b.getF64FloatAttr(0.0), b.getF64FloatAttr(1.0), s, k,
                               DenseI64ArrayAttr());
    }
    if (n == "aten::arange" && type.getRank() == 1) {
      double start = 0, end, step = 1;
      if (op.overload.empty()) {
        end = a[0].toScalar().toDouble();
      } else {
        start = a[0].toScalar().toDouble();
        end = a[1].toScalar().toDouble();
        if (op.overload == "start_step")
          step = a[2].toScalar().toDouble();
      }
      return ArangeOp::create(b, loc, type, b.getF64FloatAttr(start), b.getF64FloatAttr(end),
                              b.getF64FloatAttr(step));
    }
    if (n == "aten::copy_")
      return fit(read(a[1].toTensor()), type);
    if (n == "aten::clone" || n == "aten::contiguous")
      return read(a[0].toTensor());
    if ((n == "aten::to" || n == "aten::_to_copy") && a[0].isTensor())
      return fit(read(a[0].toTensor()), type);
    if (n == "aten::_unsafe_view" || n == "aten::reshape" || n == "aten::view") {
      Value x = read(a[0].toTensor());
      if (cast<RankedTensorType>(x.getType()).getElementType() == type.getElementType())
        return ReshapeOp::create(b, loc, type, x, b.getDenseI64ArrayAttr(type.getShape()));
    }
    // Everything else is a generic tdx.aten op, raised to first-class ops
    // by tdx-raise-aten (passes/RaiseAten.cpp) when capture ends.
    return {};
  }

  void handle(const RecordedOp &op) {
    if (op.name == "tdx::constant") {
      const at::Tensor &fake = op.results[0].toTensor();
      define(fake, constant(op.arguments[0].toTensor(), tensorType(b, fake)));
      return;
    }
    if (op.name == "tdx::alias" || op.name == "tdx::set_data") {
      bool isAlias = op.name == "tdx::alias";
      const at::Tensor &base = op.arguments[isAlias ? 0 : 1].toTensor();
      const at::Tensor &t = isAlias ? op.results[0].toTensor() : op.arguments[0].toTensor();
      if (base.unsafeGetTensorImpl() == t.unsafeGetTensorImpl())
        return;
      View v{base, nullptr, t.sizes().vec(), t.strides().vec(), t.storage_offset()};
      if (isAlias) {
        v.sizes = op.arguments[1].toIntVector();
        v.strides = op.arguments[2].toIntVector();
        v.offset = op.arguments[3].toInt();
      }
      views[t.unsafeGetTensorImpl()] = v;
      cur.erase(t.unsafeGetTensorImpl());
      return;
    }
    const c10::FunctionSchema &fs = schemaOf(op);
    // Pieces: split, split_with_sizes, chunk, unbind.
    if ((op.name == "aten::split" || op.name == "aten::split_with_sizes" ||
         op.name == "aten::chunk" || op.name == "aten::unbind" ||
         op.name == "aten::unsafe_split") &&
        op.results.size() == 1 && op.results[0].isTensorList()) {
      const at::Tensor &self = op.arguments[0].toTensor();
      int64_t dim = op.name == "aten::unbind" ? op.arguments[1].toInt() : op.arguments[2].toInt();
      dim = *normalizeDim(dim, self.dim());
      int64_t start = 0;
      for (const at::Tensor &piece : op.results[0].toTensorVector()) {
        View v{self, nullptr, {}, {}, 0};
        v.sliceDim = dim;
        v.sliceStart = start;
        v.squeeze = op.name == "aten::unbind";
        int64_t len = v.squeeze ? 1 : piece.size(dim);
        v.sliceEnd = start + len;
        start += len;
        views[piece.unsafeGetTensorImpl()] = v;
        cur.erase(piece.unsafeGetTensorImpl());
      }
      return;
    }
    // cross_entropy reaches the fake backend as log_softmax + nll_loss:
    // one tdx.cross_entropy again (its sharding rule knows the classes).
    if (op.name == "aten::nll_loss_forward" && op.results.size() == 2 &&
        (op.arguments[2].isNone() ||
         (op.arguments[2].isTensor() && !op.arguments[2].toTensor().defined()))) {
      Value logp = read(op.arguments[0].toTensor());
      auto ls = logp.getDefiningOp<AtenOp>();
      auto lt = cast<RankedTensorType>(logp.getType());
      int64_t classDim = lt.getRank() == 1 ? 0 : 1;
      auto lsDim = ls && ls.getArgsAttr() ? ls.getArgsAttr().getAs<IntegerAttr>("dim") : IntegerAttr();
      if (ls && (ls.getSchema() == "aten::_log_softmax" || ls.getSchema() == "aten::log_softmax.int") &&
          ls->getNumOperands() == 1 && ls.getOperand(0).getType() == lt && lsDim &&
          normalizeDim(lsDim.getInt(), lt.getRank()) == classDim) {
        static const LossReduction reductions[] = {LossReduction::none, LossReduction::mean,
                                                   LossReduction::sum};
        int64_t r = op.arguments[3].toInt();
        if (r >= 0 && r <= 2) {
          const at::Tensor &out = op.results[0].toTensor();
          Value target = read(op.arguments[1].toTensor());
          auto loss = [&](LossReduction reduction) {
            return CrossEntropyOp::create(
                b, loc, tensorType(b, out), ls.getOperand(0), target,
                LossReductionAttr::get(b.getContext(), reduction),
                b.getI64IntegerAttr(op.arguments[4].toInt()), b.getF64FloatAttr(0.0));
          };
          if (!auxiliaryResultsRead(op, 1)) {
            define(out, loss(reductions[r]));
            return;
          }
          // nll_loss_backward reads the total weight: without class weights,
          // the count of targets that are not ignored. A mean is then the
          // sum over that count, as ATen computes it, which a split batch
          // keeps split (two Partial sums) where a mean would gather it.
          auto tt = cast<RankedTensorType>(target.getType());
          Type f = lt.getElementType();
          Value ignore = FullOp::create(b, loc, RankedTensorType::get({}, tt.getElementType()),
                                        b.getF64FloatAttr(static_cast<double>(op.arguments[4].toInt())));
          Value kept = CmpOp::create(b, loc, RankedTensorType::get(tt.getShape(), b.getI1Type()),
                                     CmpPredicate::ne, target, ignore);
          Value ones = CastOp::create(b, loc, RankedTensorType::get(tt.getShape(), f), kept);
          SmallVector<int64_t> all;
          for (int64_t d = 0; d < tt.getRank(); ++d)
            all.push_back(d);
          auto scalar = RankedTensorType::get({}, f);
          Value total = SumOp::create(b, loc, scalar, ones, b.getDenseI64ArrayAttr(all), UnitAttr());
          define(op.results[1].toTensor(), total);
          if (reductions[r] == LossReduction::mean)
            define(out, DivOp::create(b, loc, scalar, loss(LossReduction::sum), total));
          else
            define(out, loss(reductions[r]));
          return;
        }
      }
    }
    if (op.name == "aten::native_layer_norm" && !auxiliaryResultsRead(op, 1)) {
      const at::Tensor &x = op.arguments[0].toTensor();
      std::vector<int64_t> normalized = op.arguments[1].toIntVector();
      SmallVector<Value> ops = {read(x)};
      Value w, bias;
      if (op.arguments[2].isTensor() && op.arguments[2].toTensor().defined())
        w = read(op.arguments[2].toTensor());
      if (op.arguments[3].isTensor() && op.arguments[3].toTensor().defined())
        bias = read(op.arguments[3].toTensor());
      define(op.results[0].toTensor(),
             LayerNormOp::create(b, loc, tensorType(b, op.results[0].toTensor()), read(x), w, bias,
                                 b.getDenseI64ArrayAttr(normalized),
                                 b.getF64FloatAttr(op.arguments[4].toDouble())));
      return;
    }
    // Views: results that alias an argument without writing it. (`to` and
    // `contiguous` alias only when nothing changes: values, not views.)
    bool handled = false;
    bool mayAlias = op.name != "aten::to" && op.name != "aten::contiguous";
    for (size_t i = 0; mayAlias && i < fs.returns().size() && i < op.results.size(); ++i) {
      const c10::AliasInfo *info = fs.returns()[i].alias_info();
      if (!info || info->isWrite() || !op.results[i].isTensor())
        continue;
      for (size_t j = 0; j < fs.arguments().size(); ++j) {
        const c10::AliasInfo *ai = fs.arguments()[j].alias_info();
        if (ai && ai->beforeSets() == info->beforeSets() && op.arguments[j].isTensor()) {
          const at::Tensor &result = op.results[i].toTensor();
          views[result.unsafeGetTensorImpl()] = View{op.arguments[j].toTensor(), &op, {}, {}, 0};
          cur.erase(result.unsafeGetTensorImpl());
          handled = true;
        }
      }
    }
    if (handled)
      return;
    // In-place (or out=) ops: the written argument gets the op's value.
    int written = -1;
    for (size_t j = 0; j < fs.arguments().size(); ++j) {
      const c10::AliasInfo *ai = fs.arguments()[j].alias_info();
      if (ai && ai->isWrite() && op.arguments[j].isTensor()) {
        written = static_cast<int>(j);
        break;
      }
    }
    if (written >= 0) {
      const at::Tensor &target = op.arguments[written].toTensor();
      Value v = functional(op, target);
      if (!v) {
        // The functional variant of name_ is name, when libtorch has it.
        std::string fname = op.name;
        if (!fname.empty() && fname.back() == '_' &&
            c10::Dispatcher::singleton().findSchema({fname.substr(0, fname.size() - 1), op.overload}))
          fname = fname.substr(0, fname.size() - 1);
        std::string schema = fname + (op.overload.empty() ? "" : "." + op.overload);
        v = generic(schema, op, {tensorType(b, target)});
      }
      write(target, v);
      for (const c10::IValue &r : op.results)
        if (r.isTensor() && r.toTensor().defined())
          define(r.toTensor(), cur[target.unsafeGetTensorImpl()]);
      return;
    }
    // Functional ops.
    if (op.results.size() == 1 && op.results[0].isTensor()) {
      const at::Tensor &out = op.results[0].toTensor();
      Value v = functional(op, out);
      if (!v)
        v = generic(fullName(op), op, {tensorType(b, out)});
      define(out, v);
      return;
    }
    SmallVector<Type> types;
    for (const c10::IValue &r : op.results)
      if (r.isTensor())
        // An undefined result (a gradient output_mask did not ask for) is
        // an empty tensor that nothing reads.
        types.push_back(r.toTensor().defined()
                            ? Type(tensorType(b, r.toTensor()))
                            : Type(RankedTensorType::get({0}, b.getF32Type())));
    if (types.empty())
      return; // ops without tensor results change nothing we track
    SmallVector<Value> operands;
    Value first = generic(fullName(op), op, types);
    Operation *g = first ? first.getDefiningOp() : nullptr;
    size_t k = 0;
    for (const c10::IValue &r : op.results) {
      if (!r.isTensor() || !g)
        continue;
      Value result = g->getResult(k++);
      if (r.toTensor().defined())
        define(r.toTensor(), result);
    }
  }
};

} // namespace

namespace tdx::capture {

std::string captureToMlir(const Recording &recording, const std::vector<StateEntry> &entries,
                          int64_t seed, const ForwardSpec *forward) {
  MLIRContext ctx;
  capture::registerProgramDialects(ctx);
  OpBuilder b(&ctx);
  Location loc = b.getUnknownLoc();
  OwningOpRef<ModuleOp> module = ModuleOp::create(loc);
  // The whole recording, functionalized, in a scratch function; each
  // declaration then takes the slice its value needs.
  b.setInsertionPointToEnd(module->getBody());
  auto scratch = func::FuncOp::create(b, loc, "__tdx_init", b.getFunctionType({}, {}));
  Block *body = scratch.addEntryBlock();
  b.setInsertionPointToEnd(body);
  Functionalizer f(b, loc, seed);
  f.run(recording.ops());
  std::vector<Value> finals;
  for (const StateEntry &e : entries)
    finals.push_back(e.tiedTo.empty() ? f.read(e.tensor) : Value());

  b.setInsertionPoint(scratch);
  for (auto [i, e] : llvm::enumerate(entries)) {
    RankedTensorType type = tensorType(b, e.tensor);
    Operation *decl;
    if (!e.tiedTo.empty()) {
      auto tied = FlatSymbolRefAttr::get(&ctx, e.tiedTo);
      decl = e.isBuffer
                 ? BufferOp::create(b, loc, e.name, type, tied, ShardingAttr()).getOperation()
                 : ParameterOp::create(b, loc, e.name, type, tied, ShardingAttr()).getOperation();
      continue;
    }
    decl = e.isBuffer
               ? BufferOp::create(b, loc, e.name, type, FlatSymbolRefAttr(), ShardingAttr()).getOperation()
               : ParameterOp::create(b, loc, e.name, type, FlatSymbolRefAttr(), ShardingAttr()).getOperation();
    Region &region = decl->getRegion(0);
    Block *init = b.createBlock(&region);
    OpBuilder ib = OpBuilder::atBlockEnd(init);
    SetVector<Operation *> slice;
    BackwardSliceOptions options;
    options.inclusive = true;
    Value value = finals[i];
    if (Operation *def = value.getDefiningOp()) {
      (void)getBackwardSlice(def, &slice, options);
    }
    IRMapping map;
    for (Operation *op : slice)
      ib.clone(*op, map);
    Value yielded = map.lookupOrDefault(value);
    if (yielded.getType() != type)
      throw CaptureError("tdx: the init program of " + e.name + " ends in a " +
                         "value of another type");
    YieldOp::create(ib, loc, ValueRange{yielded});
    b.setInsertionPointAfter(decl);
  }
  scratch.erase();
  if (forward) {
    b.setInsertionPointToEnd(module->getBody());
    SmallVector<Type> inputs, outputs;
    for (const at::Tensor &t : forward->inputs)
      inputs.push_back(tensorType(b, t));
    for (const at::Tensor &t : forward->outputs)
      outputs.push_back(tensorType(b, t));
    auto fn = func::FuncOp::create(b, loc, forward->function, b.getFunctionType(inputs, outputs));
    Block *entry = fn.addEntryBlock();
    b.setInsertionPointToEnd(entry);
    Functionalizer g(b, loc, seed);
    // Parameters and buffers are read by name where the forward first uses
    // them (a tied name reads its owner).
    std::unordered_map<const c10::TensorImpl *, std::string> nameOf;
    std::unordered_map<const c10::StorageImpl *, std::pair<std::string, at::Tensor>> nameOfStorage;
    for (const StateEntry &e : entries) {
      nameOf.emplace(e.tensor.unsafeGetTensorImpl(), e.tiedTo.empty() ? e.name : e.tiedTo);
      if (e.tiedTo.empty())
        nameOfStorage.emplace(e.tensor.storage().unsafeGetStorageImpl(), std::make_pair(e.name, e.tensor));
    }
    g.resolver = [&](const at::Tensor &t) -> Value {
      auto it = nameOf.find(t.unsafeGetTensorImpl());
      std::string name;
      at::Tensor declared = t;
      if (it != nameOf.end()) {
        name = it->second;
      } else {
        auto st = nameOfStorage.find(t.storage().unsafeGetStorageImpl());
        if (st == nameOfStorage.end() || st->second.second.sizes() != t.sizes())
          return {};
        name = st->second.first;
        declared = st->second.second;
      }
      return ParamRefOp::create(b, loc, tensorType(b, declared),
                                FlatSymbolRefAttr::get(&ctx, name));
    };
    for (auto [i, t] : llvm::enumerate(forward->inputs))
      g.bindInput(t, entry->getArgument(i));
    g.run(forward->trace->ops);
    SmallVector<Value> results;
    for (const at::Tensor &t : forward->outputs)
      results.push_back(g.read(t));
    if (forward->writeState)
      for (const StateEntry &e : entries) {
        if (!e.tiedTo.empty())
          continue;
        // A state the step did not write reads as its own param_ref.
        Value now = g.read(e.tensor);
        auto ref = now.getDefiningOp<ParamRefOp>();
        if (ref && ref.getName() == e.name) {
          if (ref->use_empty())
            ref->erase();
          continue;
        }
        if (now.getType() != tensorType(b, e.tensor))
          throw CaptureError("tdx: the step leaves " + e.name + " with another shape or dtype; "
                             "a training step keeps every state's type");
        AssignOp::create(b, loc, FlatSymbolRefAttr::get(&ctx, e.name), now);
      }
    func::ReturnOp::create(b, loc, results);
  }
  // Generic aten ops that tdx knows become first-class ops.
  {
    PassManager pm(&ctx);
    pm.addPass(createRaiseAten());
    std::string why;
    ScopedDiagnosticHandler handler(&ctx, [&](Diagnostic &d) {
      why += d.str() + "\n";
      return success();
    });
    if (failed(pm.run(*module)))
      throw CaptureError("tdx: raising the captured aten ops failed (a tdx bug): " + why);
  }
  if (failed(verify(*module))) {
    std::string text;
    llvm::raw_string_ostream os(text);
    module->print(os);
    throw CaptureError("tdx: the captured IR does not verify (a tdx bug); IR:\n" + text);
  }
  std::string text;
  llvm::raw_string_ostream os(text);
  module->print(os);
  return text;
}

} // namespace tdx::capture
