//===- Passes.h - tdx passes -------------------------------------*- C++ -*-===//

#ifndef TDX_PASSES_PASSES_H
#define TDX_PASSES_PASSES_H

#include "mlir/IR/BuiltinOps.h"
#include "mlir/Pass/Pass.h"

namespace mlir::tdx {

#define GEN_PASS_DECL
#include "tdx/Passes/Passes.h.inc"

#define GEN_PASS_REGISTRATION
#include "tdx/Passes/Passes.h.inc"

} // namespace mlir::tdx

#endif // TDX_PASSES_PASSES_H
