//===- TdxShapeOps.cpp - reshape, transpose, permute, slice, concat, expand ===//

#include "tdx/IR/TdxOps.h"

#include "llvm/ADT/SmallSet.h"
#include "llvm/Support/MathExtras.h"

using namespace mlir;
using namespace mlir::tdx;

/// Normalizes `dim` or reports that it is out of range for `rank`.
static FailureOr<int64_t> checkDim(std::optional<Location> loc, StringRef name,
                                   StringRef what, int64_t dim, int64_t rank) {
  if (std::optional<int64_t> d = normalizeDim(dim, rank))
    return *d;
  (void)emitOptionalError(loc, "'", name, "' op ", what, " ", dim,
                          " is out of range for a tensor of rank ", rank,
                          rank ? "; valid dims are " : "", rank ? -rank : 0,
                          rank ? " to " : "", rank ? rank - 1 : 0);
  return failure();
}

LogicalResult ReshapeOp::inferReturnTypes(MLIRContext *, std::optional<Location> loc,
                                          Adaptor adaptor, SmallVectorImpl<Type> &inferred) {
  auto in = cast<RankedTensorType>(adaptor.getInput().getType());
  SmallVector<int64_t> shape(adaptor.getShape());
  int64_t inferIndex = -1, known = 1;
  for (auto [i, d] : llvm::enumerate(shape)) {
    if (d == -1) {
      if (inferIndex >= 0)
        return emitOptionalError(loc, "'", getOperationName(),
                                 "' op shape has more than one -1; only one dim can "
                                 "be inferred");
      inferIndex = i;
    } else if (d < 0) {
      return emitOptionalError(loc, "'", getOperationName(), "' op shape has invalid size ",
                               d, "; sizes are >= 0, or -1 to infer one");
    } else if (llvm::MulOverflow(known, d, known)) {
      return emitOptionalError(loc, "'", getOperationName(),
                               "' op shape has more elements than an int64 counts");
    }
  }
  if (!in.hasStaticShape()) {
    if (inferIndex >= 0)
      shape[inferIndex] = ShapedType::kDynamic;
    inferred.push_back(RankedTensorType::get(shape, in.getElementType()));
    return success();
  }
  int64_t total = in.getNumElements();
  if (inferIndex >= 0) {
    if (known == 0 || total % known != 0)
      return emitOptionalError(loc, "'", getOperationName(), "' op cannot infer the -1 in ",
                               "the shape: ", total, " elements are not a multiple of ",
                               known);
    shape[inferIndex] = total / known;
  } else if (known != total) {
    return emitOptionalError(loc, "'", getOperationName(), "' op changes the element count from ",
                             total, " to ", known,
                             "; a reshape must keep every element");
  }
  inferred.push_back(RankedTensorType::get(shape, in.getElementType()));
  return success();
}

LogicalResult TransposeOp::inferReturnTypes(MLIRContext *, std::optional<Location> loc,
                                            Adaptor adaptor, SmallVectorImpl<Type> &inferred) {
  auto in = cast<RankedTensorType>(adaptor.getInput().getType());
  int64_t rank = in.getRank();
  FailureOr<int64_t> d0 = checkDim(loc, getOperationName(), "dim0",
                                   static_cast<int64_t>(adaptor.getDim0()), rank);
  if (failed(d0))
    return failure();
  FailureOr<int64_t> d1 = checkDim(loc, getOperationName(), "dim1",
                                   static_cast<int64_t>(adaptor.getDim1()), rank);
  if (failed(d1))
    return failure();
  SmallVector<int64_t> shape(in.getShape());
  std::swap(shape[*d0], shape[*d1]);
  inferred.push_back(RankedTensorType::get(shape, in.getElementType()));
  return success();
}

LogicalResult PermuteOp::inferReturnTypes(MLIRContext *, std::optional<Location> loc,
                                          Adaptor adaptor, SmallVectorImpl<Type> &inferred) {
  auto in = cast<RankedTensorType>(adaptor.getInput().getType());
  ArrayRef<int64_t> perm = adaptor.getPermutation();
  int64_t rank = in.getRank();
  if (static_cast<int64_t>(perm.size()) != rank)
    return emitOptionalError(loc, "'", getOperationName(), "' op permutation has ",
                             perm.size(), " entries for a tensor of rank ", rank);
  llvm::SmallSet<int64_t, 8> seen;
  SmallVector<int64_t> shape;
  for (int64_t p : perm) {
    FailureOr<int64_t> d = checkDim(loc, getOperationName(), "permutation entry", p, rank);
    if (failed(d))
      return failure();
    if (!seen.insert(*d).second)
      return emitOptionalError(loc, "'", getOperationName(), "' op permutation names dim ",
                               *d, " twice; it must be a permutation of 0..",
                               rank - 1);
    shape.push_back(in.getDimSize(*d));
  }
  inferred.push_back(RankedTensorType::get(shape, in.getElementType()));
  return success();
}

LogicalResult SliceOp::inferReturnTypes(MLIRContext *, std::optional<Location> loc,
                                        Adaptor adaptor, SmallVectorImpl<Type> &inferred) {
  auto in = cast<RankedTensorType>(adaptor.getInput().getType());
  FailureOr<int64_t> dim = checkDim(loc, getOperationName(), "dim",
                                    static_cast<int64_t>(adaptor.getDim()), in.getRank());
  if (failed(dim))
    return failure();
  auto step = static_cast<int64_t>(adaptor.getStep());
  if (step <= 0)
    return emitOptionalError(loc, "'", getOperationName(), "' op step ", step,
                             " must be positive");
  SmallVector<int64_t> shape(in.getShape());
  int64_t n = shape[*dim];
  if (!ShapedType::isDynamic(n)) {
    // Python slice semantics, as aten::slice applies them.
    auto clampIndex = [n](int64_t i) {
      if (i < 0)
        i += n;
      return std::clamp<int64_t>(i, 0, n);
    };
    int64_t start = clampIndex(static_cast<int64_t>(adaptor.getStart()));
    int64_t end = clampIndex(static_cast<int64_t>(adaptor.getEnd()));
    shape[*dim] = end > start ? (end - start - 1) / step + 1 : 0;
  }
  inferred.push_back(RankedTensorType::get(shape, in.getElementType()));
  return success();
}

LogicalResult ConcatOp::inferReturnTypes(MLIRContext *, std::optional<Location> loc,
                                         Adaptor adaptor, SmallVectorImpl<Type> &inferred) {
  ValueRange operands = adaptor.getOperands();
  if (operands.empty())
    return emitOptionalError(loc, "'", getOperationName(), "' op needs at least one input");
  auto first = cast<RankedTensorType>(operands[0].getType());
  FailureOr<int64_t> dim = checkDim(loc, getOperationName(), "dim",
                                    static_cast<int64_t>(adaptor.getDim()), first.getRank());
  if (failed(dim))
    return failure();
  SmallVector<int64_t> shape(first.getShape());
  for (auto [i, v] : llvm::enumerate(operands.drop_front())) {
    auto t = cast<RankedTensorType>(v.getType());
    if (t.getElementType() != first.getElementType() || t.getRank() != first.getRank())
      return emitOptionalError(loc, "'", getOperationName(), "' op input #", i + 1, " ", t,
                               " must have the rank and element type of input #0 ",
                               first);
    for (int64_t d = 0; d < t.getRank(); ++d) {
      int64_t a = shape[d], b = t.getDimSize(d);
      if (d == *dim) {
        int64_t sum = 0;
        if (!ShapedType::isDynamic(a) && !ShapedType::isDynamic(b) &&
            llvm::AddOverflow(a, b, sum))
          return emitOptionalError(loc, "'", getOperationName(),
                                   "' op concatenated size overflows int64");
        shape[d] = ShapedType::isDynamic(a) || ShapedType::isDynamic(b) ? ShapedType::kDynamic
                                                                         : sum;
      } else if (!ShapedType::isDynamic(a) && !ShapedType::isDynamic(b) && a != b) {
        return emitOptionalError(loc, "'", getOperationName(), "' op input #", i + 1,
                                 " has size ", b, " in dim ", d, " but input #0 has ",
                                 a, "; only dim ", *dim, " may differ");
      }
    }
  }
  inferred.push_back(RankedTensorType::get(shape, first.getElementType()));
  return success();
}

LogicalResult ExpandOp::inferReturnTypes(MLIRContext *, std::optional<Location> loc,
                                         Adaptor adaptor, SmallVectorImpl<Type> &inferred) {
  auto in = cast<RankedTensorType>(adaptor.getInput().getType());
  ArrayRef<int64_t> sizes = adaptor.getSizes();
  int64_t rank = in.getRank(), n = sizes.size();
  if (n < rank)
    return emitOptionalError(loc, "'", getOperationName(), "' op gives ", n,
                             " sizes for a tensor of rank ", rank,
                             "; expand can only add dims");
  SmallVector<int64_t> shape;
  for (int64_t i = 0; i < n; ++i) {
    int64_t want = sizes[i];
    int64_t inDim = i - (n - rank);
    if (inDim < 0) {
      if (want < 0)
        return emitOptionalError(loc, "'", getOperationName(), "' op new leading dim ", i,
                                 " needs an explicit size, got ", want);
      shape.push_back(want);
      continue;
    }
    int64_t have = in.getDimSize(inDim);
    if (want == -1 || want == have) {
      shape.push_back(have);
    } else if (have == 1 && want >= 0) {
      shape.push_back(want);
    } else {
      return emitOptionalError(loc, "'", getOperationName(), "' op cannot expand dim ",
                               inDim, " of size ", have, " to ", want,
                               "; only dims of size 1 grow (use -1 to keep a dim)");
    }
  }
  inferred.push_back(RankedTensorType::get(shape, in.getElementType()));
  return success();
}


//===----------------------------------------------------------------------===//
// Folders
//===----------------------------------------------------------------------===//

OpFoldResult ReshapeOp::fold(FoldAdaptor) {
  // A reshape to the same type, or back to the type a reshape came from.
  // (Chains are kept otherwise: their dims tell sharding which factors move.)
  if (getInput().getType() == getType())
    return getInput();
  if (auto inner = getInput().getDefiningOp<ReshapeOp>())
    if (inner.getInput().getType() == getType())
      return inner.getInput();
  return {};
}

OpFoldResult TransposeOp::fold(FoldAdaptor) {
  // A transpose of one dim with itself, or the same two dims swapped back
  // (autograd's weight gradient of a linear is mm(...).t().t()).
  int64_t rank = getType().getRank();
  auto dims = [&](int64_t a, int64_t b) {
    a = a < 0 ? a + rank : a, b = b < 0 ? b + rank : b;
    return std::make_pair(std::min(a, b), std::max(a, b));
  };
  auto mine = dims(getDim0(), getDim1());
  if (mine.first == mine.second && getInput().getType() == getType())
    return getInput();
  if (auto inner = getInput().getDefiningOp<TransposeOp>())
    if (dims(inner.getDim0(), inner.getDim1()) == mine && inner.getInput().getType() == getType())
      return inner.getInput();
  return {};
}

OpFoldResult ExpandOp::fold(FoldAdaptor) {
  if (getInput().getType() == getType())
    return getInput();
  return {};
}
