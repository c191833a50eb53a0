//===- TorchInitTest.cpp - torch.nn.init bounds and builders --------------===//
//
// Expected numbers are what torch 1.13's torch.nn.init computes for the same
// shapes (printed with /usr/bin/python3 and torch.nn.init.calculate_gain /
// _calculate_fan_in_and_fan_out).
//
//===----------------------------------------------------------------------===//

#include "tdx/Dialect/TdxOps.h"
#include "tdx/Init/TorchInit.h"

#include "mlir/IR/BuiltinOps.h"
#include "mlir/IR/MLIRContext.h"
#include "mlir/IR/Verifier.h"

#include <gtest/gtest.h>

using namespace mlir;
using namespace mlir::tdx;

namespace {

double value(llvm::Expected<double> v) {
  if (!v) {
    ADD_FAILURE() << llvm::toString(v.takeError());
    return NAN;
  }
  return *v;
}

std::string error(llvm::Expected<double> v) {
  if (v)
    return "";
  return llvm::toString(v.takeError());
}

TEST(TorchInit, FansFollowTorch) {
  llvm::Expected<Fans> conv = computeFans({32, 16, 3, 3});
  ASSERT_TRUE(bool(conv));
  EXPECT_EQ(conv->fanIn, 144);
  EXPECT_EQ(conv->fanOut, 288);
  llvm::Expected<Fans> bias = computeFans({32});
  ASSERT_FALSE(bool(bias));
  EXPECT_NE(llvm::toString(bias.takeError()).find("at least 2 dims"),
            std::string::npos);
}

TEST(TorchInit, GainsFollowTorch) {
  EXPECT_DOUBLE_EQ(value(calculateGain("leaky_relu", std::sqrt(5.0))),
                   0.5773502691896257);
  EXPECT_DOUBLE_EQ(value(calculateGain("relu")), 1.4142135623730951);
  EXPECT_DOUBLE_EQ(value(calculateGain("tanh")), 1.6666666666666667);
  EXPECT_DOUBLE_EQ(value(calculateGain("selu")), 0.75);
  EXPECT_DOUBLE_EQ(value(calculateGain("conv2d")), 1.0);
  EXPECT_NE(error(calculateGain("swish")).find("unsupported nonlinearity 'swish'"),
            std::string::npos);
}

TEST(TorchInit, BoundsFollowTorch) {
  // nn.Linear(16, 32).reset_parameters(): kaiming_uniform_(a=sqrt(5)).
  EXPECT_NEAR(value(kaimingUniformBound({32, 16}, std::sqrt(5.0), FanMode::FanIn,
                                        "leaky_relu")),
              0.25, 1e-15);
  EXPECT_DOUBLE_EQ(value(xavierUniformBound({32, 16}, 1.0)), 0.3535533905932738);
  EXPECT_DOUBLE_EQ(value(kaimingNormalStd({32, 16, 3, 3}, 0.0, FanMode::FanOut,
                                          "relu")),
                   0.08333333333333334);
  EXPECT_DOUBLE_EQ(value(xavierNormalStd({32, 16, 3, 3}, 2.0)),
                   0.13608276348795434);
  EXPECT_NE(error(kaimingUniformBound({0, 0}, 0.0, FanMode::FanIn, "relu"))
                .find("zero-element fan"),
            std::string::npos);
}

TEST(TorchInit, BuildersMakeVerifiedRandomOps) {
  MLIRContext ctx;
  ctx.loadDialect<TdxDialect>();
  OpBuilder b(&ctx);
  Location loc = b.getUnknownLoc();
  OwningOpRef<ModuleOp> module = ModuleOp::create(loc);
  b.setInsertionPointToEnd(module->getBody());
  auto type = RankedTensorType::get({32, 16}, b.getF32Type());

  llvm::Expected<Value> u =
      buildKaimingUniform(b, loc, type, {7, 3}, std::sqrt(5.0));
  ASSERT_TRUE(bool(u));
  auto uniform = u->getDefiningOp<UniformOp>();
  ASSERT_TRUE(uniform);
  EXPECT_NEAR(uniform.getHigh().convertToDouble(), 0.25, 1e-15);
  EXPECT_NEAR(uniform.getLow().convertToDouble(), -0.25, 1e-15);
  EXPECT_EQ(uniform.getSeed(), 7u);
  EXPECT_EQ(uniform.getStream(), 3u);
  EXPECT_EQ(uniform.getType(), type);

  llvm::Expected<Value> n = buildXavierNormal(b, loc, type, {7, 4}, 2.0);
  ASSERT_TRUE(bool(n));
  auto normal = n->getDefiningOp<NormalOp>();
  ASSERT_TRUE(normal);
  EXPECT_DOUBLE_EQ(normal.getStd().convertToDouble(),
                   2.0 * std::sqrt(2.0 / 48.0));
  EXPECT_TRUE(succeeded(verify(*module)));

  auto vector = RankedTensorType::get({32}, b.getF32Type());
  llvm::Expected<Value> bad = buildXavierUniform(b, loc, vector, {7, 5});
  ASSERT_FALSE(bool(bad));
  llvm::consumeError(bad.takeError());
}

} // namespace
