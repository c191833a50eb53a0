//===- tdx-opt.cpp - the tdx pass driver ----------------------------------===//
//
// mlir-opt with the tdx dialect and passes, plus the upstream dialects that
// tdx programs mix in (func, arith, tensor, linalg, shard).
//
//===----------------------------------------------------------------------===//

#include "tdx/IR/TdxDialect.h"
#include "tdx/Transforms/Passes.h"

#include "mlir/Dialect/Arith/IR/Arith.h"
#include "mlir/Dialect/Func/IR/FuncOps.h"
#include "mlir/Dialect/Linalg/IR/Linalg.h"
#include "mlir/Dialect/Shard/IR/ShardDialect.h"
#include "mlir/Dialect/Tensor/IR/Tensor.h"
#include "mlir/IR/DialectRegistry.h"
#include "mlir/Tools/mlir-opt/MlirOptMain.h"
#include "mlir/Transforms/Passes.h"

int main(int argc, char **argv) {
  mlir::DialectRegistry registry;
  registry.insert<mlir::tdx::TdxDialect, mlir::func::FuncDialect,
                  mlir::arith::ArithDialect, mlir::tensor::TensorDialect,
                  mlir::linalg::LinalgDialect, mlir::shard::ShardDialect>();
  mlir::tdx::registerTdxPasses();
  mlir::tdx::registerTdxPipelines();
  // The generic transforms users chain with ours (canonicalize, cse, ...).
  mlir::registerTransformsPasses();
  return mlir::asMainReturnCode(mlir::MlirOptMain(
      argc, argv, "tdx-opt: the tdx pass driver\n\n"
                  "Parses, verifies and transforms tdx IR (and the upstream "
                  "func, arith, tensor, linalg and shard dialects).\n",
      registry));
}
