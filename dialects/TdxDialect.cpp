//===- TdxDialect.cpp - dialect registration and generated definitions ----===//

#include "tdx/Dialect/TdxDialect.h"
#include "tdx/Dialect/TdxOps.h"

#include "mlir/IR/Builders.h"
#include "mlir/IR/DialectImplementation.h"
#include "llvm/ADT/TypeSwitch.h"

using namespace mlir;
using namespace mlir::tdx;

#include "tdx/Dialect/TdxDialect.cpp.inc"
#include "tdx/Dialect/TdxEnums.cpp.inc"

#define GET_ATTRDEF_CLASSES
#include "tdx/Dialect/TdxAttrs.cpp.inc"

#define GET_OP_CLASSES
#include "tdx/Dialect/TdxOps.cpp.inc"

void TdxDialect::initialize() {
  addAttributes<
#define GET_ATTRDEF_LIST
#include "tdx/Dialect/TdxAttrs.cpp.inc"
      >();
  addOperations<
#define GET_OP_LIST
#include "tdx/Dialect/TdxOps.cpp.inc"
      >();
}
