//===- TorchInit.cpp - torch.nn.init as tdx random ops --------------------===//

#include "tdx/Init/TorchInit.h"
#include "tdx/Dialect/TdxOps.h"

#include <cmath>

using namespace mlir;
using namespace mlir::tdx;

static llvm::Error initError(const llvm::Twine &msg) {
  return llvm::createStringError(llvm::inconvertibleErrorCode(), msg);
}

llvm::Expected<Fans> mlir::tdx::computeFans(ArrayRef<int64_t> shape) {
  if (shape.size() < 2)
    return initError("fan in and fan out need a tensor of at least 2 dims, got " +
                     llvm::Twine(shape.size()));
  int64_t receptive = 1;
  for (int64_t d : shape.drop_front(2))
    receptive *= d;
  return Fans{shape[1] * receptive, shape[0] * receptive};
}

llvm::Expected<double> mlir::tdx::calculateGain(StringRef nonlinearity,
                                                std::optional<double> param) {
  if (llvm::is_contained({"linear", "conv1d", "conv2d", "conv3d",
                          "conv_transpose1d", "conv_transpose2d",
                          "conv_transpose3d", "sigmoid"},
                         nonlinearity))
    return 1.0;
  if (nonlinearity == "tanh")
    return 5.0 / 3.0;
  if (nonlinearity == "relu")
    return std::sqrt(2.0);
  if (nonlinearity == "leaky_relu") {
    double slope = param.value_or(0.01);
    return std::sqrt(2.0 / (1.0 + slope * slope));
  }
  if (nonlinearity == "selu")
    return 3.0 / 4.0;
  return initError("unsupported nonlinearity '" + nonlinearity +
                   "'; expected linear, conv*, sigmoid, tanh, relu, "
                   "leaky_relu or selu");
}

static llvm::Expected<double> kaimingStd(ArrayRef<int64_t> shape, double a,
                                         FanMode mode, StringRef nonlinearity) {
  llvm::Expected<Fans> fans = computeFans(shape);
  if (!fans)
    return fans.takeError();
  int64_t fan = mode == FanMode::FanIn ? fans->fanIn : fans->fanOut;
  if (fan == 0)
    return initError("kaiming init of a tensor with a zero-element fan");
  llvm::Expected<double> gain = calculateGain(nonlinearity, a);
  if (!gain)
    return gain.takeError();
  return *gain / std::sqrt(static_cast<double>(fan));
}

llvm::Expected<double> mlir::tdx::kaimingUniformBound(ArrayRef<int64_t> shape,
                                                      double a, FanMode mode,
                                                      StringRef nonlinearity) {
  llvm::Expected<double> std = kaimingStd(shape, a, mode, nonlinearity);
  if (!std)
    return std.takeError();
  return std::sqrt(3.0) * *std;
}

llvm::Expected<double> mlir::tdx::kaimingNormalStd(ArrayRef<int64_t> shape,
                                                   double a, FanMode mode,
                                                   StringRef nonlinearity) {
  return kaimingStd(shape, a, mode, nonlinearity);
}

static llvm::Expected<double> xavierStd(ArrayRef<int64_t> shape, double gain) {
  llvm::Expected<Fans> fans = computeFans(shape);
  if (!fans)
    return fans.takeError();
  if (fans->fanIn + fans->fanOut == 0)
    return initError("xavier init of a tensor with zero fans");
  return gain * std::sqrt(2.0 / static_cast<double>(fans->fanIn + fans->fanOut));
}

llvm::Expected<double> mlir::tdx::xavierUniformBound(ArrayRef<int64_t> shape,
                                                     double gain) {
  llvm::Expected<double> std = xavierStd(shape, gain);
  if (!std)
    return std.takeError();
  return std::sqrt(3.0) * *std;
}

llvm::Expected<double> mlir::tdx::xavierNormalStd(ArrayRef<int64_t> shape,
                                                  double gain) {
  return xavierStd(shape, gain);
}

static Value uniform(OpBuilder &b, Location loc, RankedTensorType type,
                     RandomKey key, double bound) {
  return UniformOp::create(b, loc, type, b.getF64FloatAttr(-bound),
                             b.getF64FloatAttr(bound),
                             b.getI64IntegerAttr(key.seed),
                             b.getI64IntegerAttr(key.stream));
}

static Value normal(OpBuilder &b, Location loc, RankedTensorType type,
                    RandomKey key, double std) {
  return NormalOp::create(b, loc, type, b.getF64FloatAttr(0.0),
                            b.getF64FloatAttr(std), b.getI64IntegerAttr(key.seed),
                            b.getI64IntegerAttr(key.stream));
}

llvm::Expected<Value> mlir::tdx::buildKaimingUniform(OpBuilder &b, Location loc,
                                                     RankedTensorType type,
                                                     RandomKey key, double a,
                                                     FanMode mode,
                                                     StringRef nonlinearity) {
  llvm::Expected<double> bound =
      kaimingUniformBound(type.getShape(), a, mode, nonlinearity);
  if (!bound)
    return bound.takeError();
  return uniform(b, loc, type, key, *bound);
}

llvm::Expected<Value> mlir::tdx::buildKaimingNormal(OpBuilder &b, Location loc,
                                                    RankedTensorType type,
                                                    RandomKey key, double a,
                                                    FanMode mode,
                                                    StringRef nonlinearity) {
  llvm::Expected<double> std =
      kaimingNormalStd(type.getShape(), a, mode, nonlinearity);
  if (!std)
    return std.takeError();
  return normal(b, loc, type, key, *std);
}

llvm::Expected<Value> mlir::tdx::buildXavierUniform(OpBuilder &b, Location loc,
                                                    RankedTensorType type,
                                                    RandomKey key, double gain) {
  llvm::Expected<double> bound = xavierUniformBound(type.getShape(), gain);
  if (!bound)
    return bound.takeError();
  return uniform(b, loc, type, key, *bound);
}

llvm::Expected<Value> mlir::tdx::buildXavierNormal(OpBuilder &b, Location loc,
                                                   RankedTensorType type,
                                                   RandomKey key, double gain) {
  llvm::Expected<double> std = xavierNormalStd(type.getShape(), gain);
  if (!std)
    return std.takeError();
  return normal(b, loc, type, key, *std);
}
