//===- ProgramImpl.h - a tdx.Program's MLIR module, held --------*- C++ -*-===//
//
// What Module (tdx/Capture/Capture.h) holds: the program parsed in a context
// of its own and the diagnostics it collects. ProgramOps.cpp edits it,
// ProgramJson.cpp reads it out.
//
//===----------------------------------------------------------------------===//

#ifndef TDX_CAPTURE_PROGRAMIMPL_H
#define TDX_CAPTURE_PROGRAMIMPL_H

#include "CaptureInternal.h"

#include "mlir/IR/BuiltinOps.h"
#include "mlir/IR/Diagnostics.h"
#include "mlir/IR/MLIRContext.h"
#include "mlir/IR/OwningOpRef.h"

#include <memory>
#include <string>

namespace tdx::capture {

/// Every diagnostic the context emits, with its location and notes.
struct Diagnostics {
  std::string text;
  std::unique_ptr<mlir::ScopedDiagnosticHandler> handler;
  explicit Diagnostics(mlir::MLIRContext &ctx) {
    handler = std::make_unique<mlir::ScopedDiagnosticHandler>(&ctx, [this](mlir::Diagnostic &d) {
      llvm::raw_string_ostream os(text);
      os << d.getLocation() << ": " << d << "\n";
      for (mlir::Diagnostic &note : d.getNotes())
        os << note.getLocation() << ": note: " << note << "\n";
      return mlir::success();
    });
  }
};

/// A program parsed in a context of its own, with its diagnostics collected.
struct Module::Impl {
  mlir::MLIRContext ctx;
  Diagnostics diags{ctx};
  mlir::OwningOpRef<mlir::ModuleOp> module;

  Impl() { registerProgramDialects(ctx); }
  /// Diagnostics since the last call.
  std::string takeDiagnostics() { return std::exchange(diags.text, ""); }
};

} // namespace tdx::capture

#endif // TDX_CAPTURE_PROGRAMIMPL_H
