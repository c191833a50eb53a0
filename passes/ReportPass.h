//===- ReportPass.h - what the passes that write a report share -*- C++ -*-===//
//
// tdx-comm-report, tdx-memory-report, tdx-pipeline-report,
// tdx-model-summary, tdx-explain and tdx-linear-pairs write to an `output`
// file and (but the summary) read the module's step function: one way to
// open the one, check its format and find the other, and one wording for
// their errors.
//
//===----------------------------------------------------------------------===//

#ifndef TDX_PASSES_REPORTPASS_H
#define TDX_PASSES_REPORTPASS_H

#include "tdx/Target/StepMemory.h"

#include "mlir/Dialect/Func/IR/FuncOps.h"
#include "mlir/Support/FileUtilities.h"
#include "llvm/Support/ToolOutputFile.h"

namespace mlir::tdx {

/// The report file `path` ('-': stdout), or null after an error at
/// `module` that names `pass`.
inline std::unique_ptr<llvm::ToolOutputFile> openReport(ModuleOp module, StringRef pass,
                                                        StringRef path) {
  std::string error;
  std::unique_ptr<llvm::ToolOutputFile> file = openOutputFile(path, &error);
  if (!file)
    module.emitError() << pass << ": cannot open '" << path << "': " << error;
  return file;
}

/// Whether `format` is one of `known`; else an error at `module` naming
/// `pass` and the formats ("use 'table' or 'json'").
inline bool knownFormat(ModuleOp module, StringRef pass, StringRef format,
                        ArrayRef<StringRef> known) {
  if (llvm::is_contained(known, format))
    return true;
  InFlightDiagnostic d = module.emitError();
  d << pass << ": unknown format '" << format << "'; use ";
  for (auto [i, k] : llvm::enumerate(known))
    d << (i == 0 ? "" : i + 1 == known.size() ? " or " : ", ") << "'" << k << "'";
  return false;
}

/// The module's step function (stepFunction) with its one block, or null
/// after an error that names `pass` and what it does with it (`verb`).
inline func::FuncOp stepWithBody(ModuleOp module, StringRef pass, StringRef verb) {
  func::FuncOp fn = stepFunction(module);
  if (fn && fn.getBody().hasOneBlock())
    return fn;
  module.emitError() << pass << ": the module has no function with a body to " << verb;
  return {};
}

} // namespace mlir::tdx

#endif // TDX_PASSES_REPORTPASS_H
