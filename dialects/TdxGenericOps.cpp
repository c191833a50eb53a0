//===- TdxGenericOps.cpp - any other aten op ------------------------------===//

#include "tdx/Dialect/TdxOps.h"

#include <cctype>

using namespace mlir;
using namespace mlir::tdx;


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
  return success();
}
