//===- TdxGenericOps.cpp - any other aten op ------------------------------===//

#include "tdx/IR/TdxOps.h"

#include "llvm/ADT/DenseSet.h"

#include <cctype>

using namespace mlir;
using namespace mlir::tdx;


/// Pure, but for an op with no result: it is there for what it does
/// (torch._assert_async's check), so nothing may erase it as dead.
void AtenOp::getEffects(
    SmallVectorImpl<SideEffects::EffectInstance<MemoryEffects::Effect>> &effects) {
  if (getNumResults() == 0)
    effects.emplace_back(MemoryEffects::Write::get());
}

bool AtenOp::isRandom() {
  StringRef s = getSchema();
  for (StringRef word : {"rand", "bernoulli", "normal", "uniform", "dropout", "multinomial",
                         "poisson", "exponential", "geometric", "cauchy"})
    if (s.contains(word))
      return true;
  return false;
}

LogicalResult AtenOp::verify() {
  StringRef schema = getSchema();
  auto [ns, rest] = schema.split("::");
  auto [name, overload] = rest.split('.');
  auto isIdent = [](StringRef s) {
    return !s.empty() && (std::isalpha(s.front()) || s.front() == '_') &&
           llvm::all_of(s, [](char c) { return std::isalnum(c) || c == '_'; });
  };
  if (!schema.contains("::") || !isIdent(ns) || !isIdent(name) ||
      (rest.contains('.') && !isIdent(overload)))
    return emitOpError() << "schema \"" << schema
                         << "\" is not an operator name; expected "
                            "'namespace::name' or 'namespace::name.overload', "
                            "for example \"aten::index_select\"";
  // Tensor-list arguments name operands that exist, each at most once.
  DenseSet<unsigned> used;
  if (DictionaryAttr args = getArgsAttr())
    for (NamedAttribute kv : args) {
      auto arr = dyn_cast<ArrayAttr>(kv.getValue());
      if (!arr || !llvm::any_of(arr, [](Attribute e) {
            auto i = dyn_cast<IntegerAttr>(e);
            return i && i.getType().isIndex();
          }))
        continue;
      for (Attribute e : arr) {
        auto i = dyn_cast<IntegerAttr>(e);
        if (isa<UnitAttr>(e))
          continue;
        if (!i || !i.getType().isIndex())
          return emitOpError() << "tensor-list argument '" << kv.getName().getValue()
                               << "' mixes operand numbers with " << e
                               << "; its elements are `N : index` or `unit` (None)";
        int64_t n = i.getInt();
        if (n < 0 || n >= static_cast<int64_t>(getNumOperands()))
          return emitOpError() << "tensor-list argument '" << kv.getName().getValue()
                               << "' names operand #" << n << " but the op has "
                               << getNumOperands() << " operands";
        if (!used.insert(static_cast<unsigned>(n)).second)
          return emitOpError() << "operand #" << n << " is in more than one tensor list";
      }
    }
  return success();
}

SmallVector<Value> AtenOp::getPlainOperands() {
  DenseSet<unsigned> listed;
  if (DictionaryAttr dict = getArgsAttr())
    for (NamedAttribute kv : dict)
      if (auto refs = tensorListRefs(kv.getValue()))
        for (std::optional<unsigned> r : *refs)
          if (r)
            listed.insert(*r);
  SmallVector<Value> plain;
  for (auto [i, v] : llvm::enumerate(getOperands()))
    if (!listed.contains(i))
      plain.push_back(v);
  return plain;
}

std::optional<SmallVector<std::optional<unsigned>>> AtenOp::tensorListRefs(Attribute arg) {
  auto arr = dyn_cast<ArrayAttr>(arg);
  if (!arr || arr.empty() || !llvm::all_of(arr, [](Attribute e) {
        auto i = dyn_cast<IntegerAttr>(e);
        return isa<UnitAttr>(e) || (i && i.getType().isIndex());
      }))
    return std::nullopt;
  SmallVector<std::optional<unsigned>> refs;
  for (Attribute e : arr)
    refs.push_back(isa<UnitAttr>(e) ? std::nullopt
                                    : std::optional<unsigned>(cast<IntegerAttr>(e).getInt()));
  return refs;
}
