//===- TypeInference.h - PyTorch shape rules shared by tdx ops ---*- C++ -*-===//
//
// The result-type rules of PyTorch that several tdx ops share: broadcasting,
// reductions and dim normalization. Each reports through the optional
// location given, naming the op and what would be valid.
//
//===----------------------------------------------------------------------===//

#ifndef TDX_DIALECT_TYPEINFERENCE_H
#define TDX_DIALECT_TYPEINFERENCE_H

#include "mlir/IR/BuiltinTypes.h"
#include "mlir/IR/Location.h"
#include "mlir/IR/OpDefinition.h"
#include "mlir/IR/TypeRange.h"
#include "mlir/Support/LLVM.h"
#include <optional>
#include <string>

namespace mlir::tdx {

/// Formats a number for a diagnostic the way a user writes it (0.5, 1e-05).
std::string formatNumber(double value);

/// Normalizes a possibly negative `dim` against `rank` like PyTorch
/// (`-1` is the last dim). Returns std::nullopt when out of range.
std::optional<int64_t> normalizeDim(int64_t dim, int64_t rank);

/// The broadcast of `operandTypes` (numpy rules). All operands must be ranked
/// tensors sharing one element type, except a leading i1 condition when
/// `firstIsCondition`. The result element type is `resultElementType` when
/// given, else the operands' element type.
LogicalResult inferBroadcastResult(std::optional<Location> loc,
                                   StringRef opName, TypeRange operandTypes,
                                   Type resultElementType,
                                   SmallVectorImpl<Type> &inferred,
                                   bool firstIsCondition = false);

/// The result of reducing `inputType` over `dims` (all dims when empty or
/// absent), with or without `keepdim`.
LogicalResult inferReduceResult(std::optional<Location> loc, StringRef opName,
                                Type inputType, std::optional<ArrayRef<int64_t>> dims,
                                bool keepdim, SmallVectorImpl<Type> &inferred);

/// The result of 2-D max (`isMax`) or average pooling of `inputType`
/// ([N, C, H, W]) with the window attributes of tdx.max_pool / tdx.avg_pool.
LogicalResult inferPoolResult(std::optional<Location> loc, StringRef opName, Type inputType,
                              ArrayRef<int64_t> kernel, ArrayRef<int64_t> stride,
                              ArrayRef<int64_t> padding, ArrayRef<int64_t> dilation,
                              bool ceilMode, bool countIncludePad, bool isMax,
                              SmallVectorImpl<Type> &inferred);

} // namespace mlir::tdx

#endif // TDX_DIALECT_TYPEINFERENCE_H
