//===- ProgramJson.cpp - a tdx program's function as JSON -----------------===//
//
// Module::functionToJson: a function of the program, op by op, as the
// Python side reads it (tdx.Program's interpreter and reports).
//
//===----------------------------------------------------------------------===//

#include "ProgramImpl.h"

#include "tdx/IR/TdxOps.h"

#include "mlir/Dialect/Func/IR/FuncOps.h"
#include "llvm/ADT/TypeSwitch.h"
#include "llvm/Support/FormatVariadic.h"
#include "llvm/Support/JSON.h"

#include <cmath>

using namespace mlir;
using namespace mlir::tdx;

namespace tdx::capture {

namespace {

llvm::json::Value typeToJson(Type type) {
  auto t = dyn_cast<RankedTensorType>(type);
  if (!t)
    return llvm::json::Object{{"other", llvm::formatv("{0}", type).str()}};
  llvm::json::Array shape;
  for (int64_t d : t.getShape())
    shape.push_back(ShapedType::isDynamic(d) ? llvm::json::Value(nullptr) : llvm::json::Value(d));
  std::string dtype;
  llvm::raw_string_ostream os(dtype);
  t.getElementType().print(os);
  return llvm::json::Object{{"shape", std::move(shape)}, {"dtype", dtype}};
}

/// A float as JSON, which has no infinities: "inf", "-inf", "nan".
llvm::json::Value floatToJson(double v) {
  if (!std::isfinite(v))
    return std::isnan(v) ? "nan" : (v > 0 ? "inf" : "-inf");
  return v;
}

/// An attribute as JSON. In a tdx.aten op's args `unit` is None (null) and
/// an `index` integer is an operand reference {"operand": n}.
llvm::json::Value attrToJson(Attribute a, bool atenArgs = false) {
  if (atenArgs && isa<UnitAttr>(a))
    return nullptr;
  if (auto i = dyn_cast<IntegerAttr>(a); i && atenArgs && i.getType().isIndex())
    return llvm::json::Object{{"operand", i.getInt()}};
  if (auto i = dyn_cast<IntegerAttr>(a))
    return i.getType().isInteger(1) ? llvm::json::Value(i.getValue().getBoolValue())
                                    : llvm::json::Value(i.getValue().getSExtValue());
  if (auto f = dyn_cast<FloatAttr>(a))
    return floatToJson(f.getValueAsDouble());
  if (auto b = dyn_cast<BoolAttr>(a))
    return b.getValue();
  if (auto s = dyn_cast<StringAttr>(a))
    return s.getValue().str();
  if (isa<UnitAttr>(a))
    return true;
  if (auto d = dyn_cast<DenseI64ArrayAttr>(a)) {
    llvm::json::Array out;
    for (int64_t x : d.asArrayRef())
      out.push_back(x);
    return out;
  }
  if (auto arr = dyn_cast<ArrayAttr>(a)) {
    llvm::json::Array out;
    for (Attribute e : arr)
      out.push_back(attrToJson(e, atenArgs));
    return out;
  }
  if (auto dict = dyn_cast<DictionaryAttr>(a)) {
    llvm::json::Object out;
    for (NamedAttribute n : dict)
      out[n.getName().str()] = attrToJson(n.getValue(), atenArgs);
    return out;
  }
  if (auto dense = dyn_cast<DenseElementsAttr>(a)) {
    llvm::json::Array out;
    if (isa<FloatType>(dense.getElementType()))
      for (APFloat v : dense.getValues<APFloat>())
        out.push_back(floatToJson(v.convertToDouble()));
    else
      for (APInt v : dense.getValues<APInt>())
        out.push_back(v.getSExtValue());
    return llvm::json::Object{{"dense", std::move(out)}};
  }
  if (auto sym = dyn_cast<FlatSymbolRefAttr>(a))
    return sym.getValue().str();
  std::string text;
  llvm::raw_string_ostream os(text);
  a.print(os);
  return text;
}

/// An operand or attribute of a registered op's torch reference as JSON
/// (`arg` in tdx/IR/TdxOpRegistry.inc): operands are {"operand":
/// name}, enums their names, absent optionals null.
struct ReferenceArg {
  const DenseMap<Value, std::string> &names;
  llvm::json::Value operator()(Value v) const {
    if (!v)
      return nullptr;
    return llvm::json::Object{{"operand", names.lookup(v)}};
  }
  llvm::json::Value operator()(OperandRange vs) const {
    llvm::json::Array out;
    for (Value v : vs)
      out.push_back((*this)(v));
    return out;
  }
  llvm::json::Value operator()(ArrayRef<int64_t> xs) const {
    return llvm::json::Array(llvm::to_vector(xs));
  }
  template <typename X> llvm::json::Value operator()(const std::optional<X> &x) const {
    return x ? (*this)(*x) : llvm::json::Value(nullptr);
  }
  llvm::json::Value operator()(bool b) const { return b; }
  template <typename I, std::enable_if_t<std::is_integral_v<I>, int> = 0>
  llvm::json::Value operator()(I i) const {
    return static_cast<int64_t>(i); // I64Attr getters return uint64_t
  }
  template <typename E, std::enable_if_t<std::is_enum_v<E>, int> = 0>
  llvm::json::Value operator()(E kind) const {
    return ::mlir::tdx::stringifyEnum(kind).str();
  }
  llvm::json::Value operator()(const APFloat &f) const {
    return floatToJson(f.convertToDouble());
  }
  llvm::json::Value operator()(StringRef s) const { return s.str(); }
  llvm::json::Value operator()(ArrayAttr a) const { return attrToJson(a); }
};

/// A registered op's torch reference ("reference": the text, "args": its
/// operands and attributes by name), for the reference executor.
void addReference(Operation *op, const DenseMap<Value, std::string> &names,
                  llvm::json::Object &entry) {
  ReferenceArg arg{names};
  auto dtypeOf = [](Value v) {
    std::string text;
    llvm::raw_string_ostream os(text);
    cast<RankedTensorType>(v.getType()).getElementType().print(os);
    return text;
  };
#define TDX_TORCH_REFERENCE(Op, text, ...)                                                    \
  .Case([&](Op o) {                                                                          \
    entry["reference"] = text;                                                               \
    entry["args"] = llvm::json::Object{__VA_ARGS__};                                         \
  })
  llvm::TypeSwitch<Operation *>(op)
#include "tdx/IR/TdxOpRegistry.inc"
      .Default([](Operation *) {});
}

} // namespace

std::string Module::functionToJson(const std::string &function) const {
  ModuleOp module = *impl->module;
  MLIRContext &ctx = impl->ctx;
  auto fn = SymbolTable::lookupNearestSymbolFrom<func::FuncOp>(
      module, StringAttr::get(&ctx, function));
  if (!fn)
    throw CaptureError("tdx: the program has no function @" + function);
  DenseMap<Value, std::string> names;
  llvm::json::Array args;
  for (BlockArgument arg : fn.getArguments()) {
    names[arg] = "arg" + std::to_string(arg.getArgNumber());
    llvm::json::Object a{{"type", typeToJson(arg.getType())}};
    if (auto s = fn.getArgAttr(arg.getArgNumber(), ::mlir::tdx::TdxDialect::kShardingAttrName))
      a["sharding"] = attrToJson(s);
    args.push_back(std::move(a));
  }
  llvm::json::Array ops;
  int counter = 0;
  for (Operation &op : fn.getBody().front()) {
    llvm::json::Object o{{"name", op.getName().getStringRef().str()}};
    llvm::json::Array operands, results, types;
    for (Value v : op.getOperands())
      operands.push_back(names.lookup(v));
    for (Value r : op.getResults()) {
      names[r] = "v" + std::to_string(counter++);
      results.push_back(names[r]);
      types.push_back(typeToJson(r.getType()));
    }
    llvm::json::Object attrs;
    for (NamedAttribute n : op.getAttrs())
      attrs[n.getName().str()] = attrToJson(n.getValue(), isa<AtenOp>(op) && n.getName() == "args");
    o["operands"] = std::move(operands);
    o["results"] = std::move(results);
    o["types"] = std::move(types);
    o["attrs"] = std::move(attrs);
    // The trait that makes an op a collective (the executor runs those
    // over the mesh's ranks, not through a reference).
    if (op.hasTrait<OpTrait::TdxCollective>())
      o["collective"] = true;
    addReference(&op, names, o);
    ops.push_back(std::move(o));
  }
  std::string out;
  llvm::raw_string_ostream os(out);
  os << llvm::json::Value(llvm::json::Object{{"args", std::move(args)}, {"ops", std::move(ops)}});
  return out;
}

} // namespace tdx::capture
