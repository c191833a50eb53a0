//===- Cpp.h - tdx programs as C++ on the CPU runtime ------------*- C++ -*-===//

#ifndef TDX_TARGET_CPP_H
#define TDX_TARGET_CPP_H

#include "mlir/IR/BuiltinOps.h"
#include "llvm/Support/raw_ostream.h"

namespace mlir::tdx {

/// Emits a partitioned module as one self-contained C++ source for the CPU
/// runtime (include/tdx/Runtime/Runtime.h): an init entry that makes each
/// parameter's local shard from its init program, a forward entry over
/// ATen and MPI collectives, and main(). Reports unsupported ops at their
/// location.
LogicalResult emitCpp(ModuleOp module, llvm::raw_ostream &os);

} // namespace mlir::tdx

#endif // TDX_TARGET_CPP_H
