//===- tdx-translate.cpp - tdx programs to source code --------------------===//
//
// mlir-translate with the tdx targets:
//   --tdx-to-cpp   a partitioned program as C++ on the CPU runtime
//
//===----------------------------------------------------------------------===//

#include "tdx/Dialect/TdxDialect.h"
#include "tdx/Target/Cpp.h"

#include "mlir/Dialect/Arith/IR/Arith.h"
#include "mlir/Dialect/Func/IR/FuncOps.h"
#include "mlir/IR/BuiltinOps.h"
#include "mlir/Tools/mlir-translate/MlirTranslateMain.h"
#include "mlir/Tools/mlir-translate/Translation.h"

int main(int argc, char **argv) {
  mlir::TranslateFromMLIRRegistration toCpp(
      "tdx-to-cpp",
      "emit a partitioned tdx program as one C++ source on the CPU runtime (ATen + MPI)",
      [](mlir::Operation *op, llvm::raw_ostream &os) -> mlir::LogicalResult {
        auto module = llvm::dyn_cast<mlir::ModuleOp>(op);
        if (!module)
          return op->emitError("expected a builtin.module");
        return mlir::tdx::emitCpp(module, os);
      },
      [](mlir::DialectRegistry &registry) {
        registry.insert<mlir::tdx::TdxDialect, mlir::func::FuncDialect,
                        mlir::arith::ArithDialect>();
      });
  return mlir::failed(
      mlir::mlirTranslateMain(argc, argv, "tdx-translate: tdx programs to source code\n"));
}
