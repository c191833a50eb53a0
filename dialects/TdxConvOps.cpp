//===- TdxConvOps.cpp - convolution and pooling shapes --------------------===//

#include "tdx/IR/TdxOps.h"
#include "tdx/Runtime/Conv.h"

using namespace mlir;
using namespace mlir::tdx;

namespace {

std::string listStr(ArrayRef<int64_t> xs) {
  std::string s = "[";
  for (auto [i, x] : llvm::enumerate(xs))
    s += (i ? ", " : "") + std::to_string(x);
  return s + "]";
}

/// The output size of one spatial dim: the runtimes' own formula.
int64_t outSize(int64_t in, int64_t k, int64_t s, int64_t p, int64_t d, bool ceil) {
  return ::tdx::kern::windowOutputSize(in, k, s, p, d, ceil);
}

/// Checks the per-spatial-dim attributes: `spatial` entries, stride and
/// dilation positive, padding non-negative.
LogicalResult checkWindow(std::optional<Location> loc, StringRef name, int64_t spatial,
                          ArrayRef<std::pair<StringRef, ArrayRef<int64_t>>> attrs) {
  for (auto [attr, xs] : attrs) {
    if (static_cast<int64_t>(xs.size()) != spatial)
      return emitOptionalError(loc, "'", name, "' op ", attr, " ", listStr(xs), " needs ",
                               spatial, " entries, one per spatial dim");
    for (int64_t x : xs)
      if (attr == "padding" ? x < 0 : x < 1)
        return emitOptionalError(loc, "'", name, "' op ", attr, " ", listStr(xs), " must be ",
                                 attr == "padding" ? "non-negative" : "positive");
  }
  return success();
}

} // namespace

LogicalResult ConvOp::inferReturnTypes(MLIRContext *, std::optional<Location> loc,
                                       Adaptor adaptor, SmallVectorImpl<Type> &inferred) {
  StringRef name = getOperationName();
  auto x = cast<RankedTensorType>(adaptor.getInput().getType());
  auto w = cast<RankedTensorType>(adaptor.getWeight().getType());
  if (x.getRank() != 3 && x.getRank() != 4)
    return emitOptionalError(loc, "'", name, "' op input must be [N, C, L] or [N, C, H, W], got ",
                             x);
  int64_t spatial = x.getRank() - 2;
  if (w.getRank() != x.getRank())
    return emitOptionalError(loc, "'", name, "' op weight ", w, " must have rank ", x.getRank(),
                             " ([O, C / groups, kernel...])");
  for (Value v : adaptor.getOperands().drop_front())
    if (cast<RankedTensorType>(v.getType()).getElementType() != x.getElementType())
      return emitOptionalError(loc, "'", name, "' op weight and bias must have the input's "
                               "element type ", x.getElementType(), "; insert a 'tdx.cast'");
  if (failed(checkWindow(loc, name, spatial,
                         {{"stride", adaptor.getStride()},
                          {"padding", adaptor.getPadding()},
                          {"dilation", adaptor.getDilation()}})))
    return failure();
  int64_t groups = adaptor.getGroups();
  int64_t c = x.getDimSize(1), o = w.getDimSize(0);
  if (groups < 1 || c % groups || o % groups || w.getDimSize(1) * groups != c)
    return emitOptionalError(loc, "'", name, "' op ", c, " input channels, weight ", w,
                             " and groups = ", groups, " do not fit: C and O must be "
                             "divisible by groups and the weight's dim 1 be C / groups");
  if (adaptor.getBias()) {
    auto b = cast<RankedTensorType>(adaptor.getBias().getType());
    if (b.getRank() != 1 || b.getDimSize(0) != o)
      return emitOptionalError(loc, "'", name, "' op bias ", b, " must be [", o, "]");
  }
  SmallVector<int64_t> shape = {x.getDimSize(0), o};
  for (int64_t d = 0; d < spatial; ++d) {
    int64_t out = outSize(x.getDimSize(2 + d), w.getDimSize(2 + d), adaptor.getStride()[d],
                          adaptor.getPadding()[d], adaptor.getDilation()[d], false);
    if (out < 1)
      return emitOptionalError(loc, "'", name, "' op kernel ", w,
                               " is larger than the padded input ", x);
    shape.push_back(out);
  }
  inferred.push_back(RankedTensorType::get(shape, x.getElementType()));
  return success();
}


LogicalResult mlir::tdx::inferPoolResult(std::optional<Location> loc, StringRef name,
                                         Type inputType, ArrayRef<int64_t> kernel,
                                         ArrayRef<int64_t> stride, ArrayRef<int64_t> padding,
                                         ArrayRef<int64_t> dilation, bool ceilMode,
                                         bool countIncludePad, bool isMax,
                                         SmallVectorImpl<Type> &inferred) {
  auto x = cast<RankedTensorType>(inputType);
  if (x.getRank() != 4)
    return emitOptionalError(loc, "'", name, "' op input must be [N, C, H, W], got ", x);
  if (failed(checkWindow(loc, name, 2,
                         {{"kernel", kernel},
                          {"stride", stride},
                          {"padding", padding},
                          {"dilation", dilation}})))
    return failure();
  if (isMax && countIncludePad)
    return emitOptionalError(loc, "'", name, "' op count_include_pad is for average pooling");
  if (!isMax && llvm::any_of(dilation, [](int64_t d) { return d != 1; }))
    return emitOptionalError(loc, "'", name, "' op average pooling has no dilation; use [1, 1]");
  SmallVector<int64_t> shape = {x.getDimSize(0), x.getDimSize(1)};
  for (int64_t d = 0; d < 2; ++d) {
    int64_t k = kernel[d], p = padding[d];
    if (2 * p > k)
      return emitOptionalError(loc, "'", name, "' op padding ", listStr(padding),
                               " must be at most half of the kernel ", listStr(kernel));
    int64_t out = outSize(x.getDimSize(2 + d), k, stride[d], p, dilation[d], ceilMode);
    if (out < 1)
      return emitOptionalError(loc, "'", name, "' op kernel ", listStr(kernel),
                               " is larger than the padded input ", x);
    shape.push_back(out);
  }
  inferred.push_back(RankedTensorType::get(shape, x.getElementType()));
  return success();
}
