//===- tdx-translate.cpp - tdx programs to source code --------------------===//
//
// mlir-translate with the tdx targets:
//   --tdx-to-cpp   a partitioned program as C++ on the CPU runtime
//   --tdx-to-cuda  a partitioned program as CUDA C++ on the CUDA runtime
// Both run the backend pipeline (tdx-backend) first, unless it ran.
//
//===----------------------------------------------------------------------===//

#include "tdx/IR/TdxDialect.h"
#include "tdx/Transforms/Passes.h"
#include "tdx/Target/Cpp.h"

#include "mlir/Dialect/Arith/IR/Arith.h"
#include "mlir/Dialect/Func/IR/FuncOps.h"
#include "mlir/IR/BuiltinOps.h"
#include "mlir/Tools/mlir-translate/MlirTranslateMain.h"
#include "mlir/Tools/mlir-translate/Translation.h"
#include "llvm/Support/CommandLine.h"

static llvm::cl::opt<int64_t> opsPerPart(
    "tdx-ops-per-part",
    llvm::cl::desc("on a module the backend pipeline has not run on: emit the step as "
                   "functions of this many ops each (tdx-split-parts; compile time grows "
                   "faster than a function's size)"),
    llvm::cl::init(mlir::tdx::kDefaultOpsPerPart));

static void registerTarget(const char *name, const char *description,
                           mlir::tdx::Backend backend) {
  mlir::TranslateFromMLIRRegistration(
      name, description,
      [backend](mlir::Operation *op, llvm::raw_ostream &os) -> mlir::LogicalResult {
        auto module = llvm::dyn_cast<mlir::ModuleOp>(op);
        if (!module)
          return op->emitError("expected a builtin.module");
        if (opsPerPart < 1)
          return module.emitError("--tdx-ops-per-part must be positive");
        // The backend's decisions, which the emitter prints (tdx-backend).
        if (module->hasAttr(mlir::tdx::TdxDialect::kPartitionedAttrName) &&
            failed(mlir::tdx::prepareForEmission(module, opsPerPart)))
          return mlir::failure();
        return mlir::tdx::emitCpp(module, os, backend, nullptr);
      },
      [](mlir::DialectRegistry &registry) {
        registry.insert<mlir::tdx::TdxDialect, mlir::func::FuncDialect,
                        mlir::arith::ArithDialect>();
      });
}

int main(int argc, char **argv) {
  registerTarget("tdx-to-cpp",
                 "emit a partitioned tdx program as one C++ source on the CPU runtime (ATen + MPI)",
                 mlir::tdx::Backend::CPU);
  registerTarget("tdx-to-cuda",
                 "emit a partitioned tdx program as one CUDA source on the CUDA runtime (cuBLAS, "
                 "NCCL, fused kernels)",
                 mlir::tdx::Backend::CUDA);
  return mlir::failed(
      mlir::mlirTranslateMain(argc, argv, "tdx-translate: tdx programs to source code\n"));
}
