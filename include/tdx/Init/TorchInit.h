//===- TorchInit.h - torch.nn.init as tdx random ops -------------*- C++ -*-===//
//
// The torch.nn.init family expressed through the dialect's counter-based
// random ops: each initializer computes its bound or std from the tensor's
// fans exactly as torch.nn.init does (torch 1.13) and builds one
// `tdx.uniform` or `tdx.normal`. Capture uses these when it records
// `kaiming_uniform_`, `xavier_normal_`, nn.Linear's default init, and so on.
//
//===----------------------------------------------------------------------===//

#ifndef TDX_INIT_TORCHINIT_H
#define TDX_INIT_TORCHINIT_H

#include "mlir/IR/Builders.h"
#include "mlir/IR/BuiltinTypes.h"
#include "llvm/Support/Error.h"
#include <optional>

namespace mlir::tdx {

struct Fans {
  int64_t fanIn;
  int64_t fanOut;
};

/// torch.nn.init._calculate_fan_in_and_fan_out: dim 1 times the receptive
/// field is fan_in, dim 0 times it fan_out. Fails for fewer than 2 dims.
llvm::Expected<Fans> computeFans(llvm::ArrayRef<int64_t> shape);

/// torch.nn.init.calculate_gain. `param` is the negative slope for
/// leaky_relu (default 0.01). Fails for an unknown nonlinearity.
llvm::Expected<double> calculateGain(llvm::StringRef nonlinearity,
                                     std::optional<double> param = std::nullopt);

enum class FanMode { FanIn, FanOut };

/// The distribution parameters an initializer computes: the bound of a
/// uniform `[-bound, bound)` or the std of a zero-mean normal.
llvm::Expected<double> kaimingUniformBound(llvm::ArrayRef<int64_t> shape,
                                           double a, FanMode mode,
                                           llvm::StringRef nonlinearity);
llvm::Expected<double> kaimingNormalStd(llvm::ArrayRef<int64_t> shape,
                                        double a, FanMode mode,
                                        llvm::StringRef nonlinearity);
llvm::Expected<double> xavierUniformBound(llvm::ArrayRef<int64_t> shape,
                                          double gain);
llvm::Expected<double> xavierNormalStd(llvm::ArrayRef<int64_t> shape,
                                       double gain);

/// Random stream of one op: `seed` is the user's seed, `stream` numbers the
/// random op within the program so that no two ops share random bits.
struct RandomKey {
  int64_t seed;
  int64_t stream;
};

/// Builders: one `tdx.uniform` / `tdx.normal` of `type` with the computed
/// parameters, or the error that torch would raise.
llvm::Expected<Value> buildKaimingUniform(OpBuilder &b, Location loc,
                                          RankedTensorType type, RandomKey key,
                                          double a = 0.0,
                                          FanMode mode = FanMode::FanIn,
                                          llvm::StringRef nonlinearity = "leaky_relu");
llvm::Expected<Value> buildKaimingNormal(OpBuilder &b, Location loc,
                                         RankedTensorType type, RandomKey key,
                                         double a = 0.0,
                                         FanMode mode = FanMode::FanIn,
                                         llvm::StringRef nonlinearity = "leaky_relu");
llvm::Expected<Value> buildXavierUniform(OpBuilder &b, Location loc,
                                         RankedTensorType type, RandomKey key,
                                         double gain = 1.0);
llvm::Expected<Value> buildXavierNormal(OpBuilder &b, Location loc,
                                        RankedTensorType type, RandomKey key,
                                        double gain = 1.0);

} // namespace mlir::tdx

#endif // TDX_INIT_TORCHINIT_H
