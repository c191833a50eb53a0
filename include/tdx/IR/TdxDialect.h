//===- TdxDialect.h - the tdx dialect, its enums and attributes -*- C++ -*-===//

#ifndef TDX_DIALECT_TDXDIALECT_H
#define TDX_DIALECT_TDXDIALECT_H

#include "mlir/Dialect/Func/IR/FuncOps.h"
#include "mlir/IR/BuiltinAttributes.h"
#include "mlir/IR/Dialect.h"
#include "mlir/IR/SymbolTable.h"

#include "tdx/IR/TdxDialect.h.inc"
#include "tdx/IR/TdxEnums.h.inc"

#define GET_ATTRDEF_CLASSES
#include "tdx/IR/TdxAttrs.h.inc"

#define GET_TYPEDEF_CLASSES
#include "tdx/IR/TdxTypes.h.inc"

#endif // TDX_DIALECT_TDXDIALECT_H
