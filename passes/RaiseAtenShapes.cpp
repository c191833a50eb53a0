//===- RaiseAtenShapes.cpp - tdx-raise-aten's rows: shapes and windows ----===//
//
// Concatenation, rolling, padding, scatters, strided views, indexing,
// convolution and pooling (RaiseAtenCall.h).
//
//===----------------------------------------------------------------------===//

#include "RaiseAtenCall.h"

#include "llvm/ADT/StringMap.h"

#include <algorithm>
#include <cmath>

using namespace mlir;
using namespace mlir::tdx;

namespace mlir::tdx::raise {

//===----------------------------------------------------------------------===//
// Shapes
//===----------------------------------------------------------------------===//

Value raiseCat(Call &c) {
  std::optional<SmallVector<Value>> xs = c.tensors("tensors");
  std::optional<int64_t> dim = c.i64("dim");
  if (!xs || !dim || xs->empty() || llvm::is_contained(*xs, Value()))
    return {};
  return ConcatOp::create(c.b, c.loc, c.resultType(), *xs, c.b.getI64IntegerAttr(*dim));
}

/// stack = concat of the inputs with a new dim of size 1.
Value raiseStack(Call &c) {
  std::optional<SmallVector<Value>> xs = c.tensors("tensors");
  RankedTensorType t = c.resultType();
  std::optional<int64_t> d = c.i64("dim");
  if (!xs || !d || xs->empty() || llvm::is_contained(*xs, Value()))
    return {};
  int64_t dim = *normalizeDim(*d, t.getRank());
  SmallVector<Value> inputs;
  for (Value x : *xs) {
    SmallVector<int64_t> shape(cast<RankedTensorType>(x.getType()).getShape());
    shape.insert(shape.begin() + dim, 1);
    inputs.push_back(c.reshape(x, shape));
  }
  return ConcatOp::create(c.b, c.loc, t, inputs, c.b.getI64IntegerAttr(dim));
}

/// x[start:end] along `dim` (a slice op; null when empty).
static Value slab(Call &c, Value x, int64_t dim, int64_t start, int64_t end) {
  auto t = cast<RankedTensorType>(x.getType());
  if (end <= start)
    return {};
  if (start == 0 && end == t.getDimSize(dim))
    return x;
  SmallVector<int64_t> shape(t.getShape());
  shape[dim] = end - start;
  return SliceOp::create(c.b, c.loc, RankedTensorType::get(shape, t.getElementType()), x,
                         c.b.getI64IntegerAttr(dim), c.b.getI64IntegerAttr(start),
                         c.b.getI64IntegerAttr(end), c.b.getI64IntegerAttr(1));
}

/// The pieces (nulls skipped) concatenated along `dim`.
static Value join(Call &c, ArrayRef<Value> pieces, int64_t dim) {
  SmallVector<Value> xs;
  for (Value v : pieces)
    if (v)
      xs.push_back(v);
  if (xs.size() == 1)
    return xs[0];
  auto t = cast<RankedTensorType>(xs[0].getType());
  SmallVector<int64_t> shape(t.getShape());
  shape[dim] = 0;
  for (Value v : xs)
    shape[dim] += cast<RankedTensorType>(v.getType()).getDimSize(dim);
  return ConcatOp::create(c.b, c.loc, RankedTensorType::get(shape, t.getElementType()), xs,
                          c.b.getI64IntegerAttr(dim));
}

/// roll(x, shifts, dims) = per dim, concat(x[n - s:], x[:n - s]).
Value raiseRoll(Call &c) {
  auto shifts = c.ints("shifts"), dims = c.ints("dims");
  RankedTensorType t = c.resultType();
  if (c.plain.size() != 1 || !shifts || !dims || dims->empty() ||
      shifts->size() != dims->size() || !t.hasStaticShape())
    return {};
  Value x = c.plain[0];
  for (auto [shift, d] : llvm::zip(*shifts, *dims)) {
    std::optional<int64_t> dim = normalizeDim(d, t.getRank());
    if (!dim)
      return {};
    int64_t n = t.getDimSize(*dim);
    if (n == 0)
      continue;
    int64_t s = ((shift % n) + n) % n;
    if (s)
      x = join(c, {slab(c, x, *dim, n - s, n), slab(c, x, *dim, 0, n - s)}, *dim);
  }
  return x;
}

/// constant_pad_nd(x, pad, value): pad pairs from the last dim backwards;
/// blocks of `value` are concatenated on, negative pads slice.
Value raiseConstantPad(Call &c) {
  auto pad = c.ints("pad");
  std::optional<double> value = c.number("value");
  if (c.plain.size() != 1 || !pad || pad->size() % 2 || !value ||
      !cast<RankedTensorType>(c.plain[0].getType()).hasStaticShape())
    return {};
  Value x = c.plain[0];
  int64_t rank = c.resultType().getRank();
  for (size_t i = 0; i < pad->size() / 2; ++i) {
    int64_t dim = rank - 1 - static_cast<int64_t>(i), lo = (*pad)[2 * i], hi = (*pad)[2 * i + 1];
    if (dim < 0)
      return {};
    auto t = cast<RankedTensorType>(x.getType());
    int64_t n = t.getDimSize(dim);
    x = slab(c, x, dim, lo < 0 ? -lo : 0, hi < 0 ? n + hi : n);
    if (!x)
      return {};
    auto block = [&](int64_t size) -> Value {
      if (size <= 0)
        return {};
      SmallVector<int64_t> shape(cast<RankedTensorType>(x.getType()).getShape());
      shape[dim] = size;
      return FullOp::create(c.b, c.loc, RankedTensorType::get(shape, t.getElementType()),
                            c.b.getF64FloatAttr(*value));
    };
    x = join(c, {block(lo), x, block(hi)}, dim);
  }
  return x;
}

/// slice_scatter(base, src, dim, start, end, step=1) and
/// select_scatter(base, src, dim, index): base with src written in,
/// as concat(base[:start], src, base[end:]).
Value raiseScatter(Call &c) {
  RankedTensorType t = c.resultType();
  std::optional<int64_t> d = c.i64("dim");
  if (c.plain.size() != 2 || !d || c.plain[0].getType() != t || !t.hasStaticShape())
    return {};
  std::optional<int64_t> dim = normalizeDim(*d, t.getRank());
  if (!dim)
    return {};
  int64_t n = t.getDimSize(*dim), start, end;
  Value src = c.cast(c.plain[1], t.getElementType());
  if (c.name == "aten::select_scatter") {
    std::optional<int64_t> index = c.i64("index");
    if (!index)
      return {};
    start = *index < 0 ? *index + n : *index;
    end = start + 1;
    SmallVector<int64_t> shape(t.getShape());
    shape[*dim] = 1;
    src = c.reshape(src, shape);
  } else {
    if (c.i64("step").value_or(1) != 1)
      return {};
    auto bound = [&](StringRef name, int64_t otherwise) {
      int64_t v = c.isNone(name) || !c.i64(name) ? otherwise : *c.i64(name);
      v = v < 0 ? v + n : v;
      return std::clamp<int64_t>(v, 0, n);
    };
    start = bound("start", 0);
    end = std::max(start, bound("end", n));
  }
  if (cast<RankedTensorType>(src.getType()).getDimSize(*dim) != end - start)
    return {};
  return join(c, {slab(c, c.plain[0], *dim, 0, start), src, slab(c, c.plain[0], *dim, end, n)},
              *dim);
}

/// as_strided(x, size, stride, 0) that reads x in row-major order (every dim
/// longer than 1 has its contiguous stride) is a reshape of x.
/// Whether as_strided's (size, stride, storage_offset) view every element of
/// a contiguous base of `elements` once, in order: a reshape.
static bool wholeContiguousView(Call &c, int64_t elements) {
  auto size = c.ints("size"), stride = c.ints("stride");
  if (!size || !stride || size->size() != stride->size() ||
      c.i64("storage_offset").value_or(0) != 0)
    return false;
  int64_t expected = 1;
  for (int64_t d = static_cast<int64_t>(size->size()) - 1; d >= 0; --d) {
    if ((*size)[d] != 1 && (*stride)[d] != expected)
      return false;
    expected *= (*size)[d];
  }
  return expected == elements;
}

/// A view of a contiguous `base` that keeps its rank and strides and
/// narrows one dim (autograd's replay of a split or narrow, as the
/// backward of torch.cat or of a split through a view writes it):
/// that dim and its [start, end).
struct Narrowed {
  int64_t dim, start, end;
};
static std::optional<Narrowed> narrowedView(Call &c, RankedTensorType base) {
  auto size = c.ints("size"), stride = c.ints("stride");
  std::optional<int64_t> offset = c.i64("storage_offset");
  int64_t rank = base.getRank();
  if (!size || !stride || !offset || !base.hasStaticShape() ||
      static_cast<int64_t>(size->size()) != rank || static_cast<int64_t>(stride->size()) != rank)
    return std::nullopt;
  std::optional<Narrowed> found;
  int64_t expected = 1, rest = *offset;
  if (base.getNumElements() == 0)
    return std::nullopt;
  for (int64_t d = rank - 1; d >= 0; --d) {
    int64_t n = base.getDimSize(d);
    if ((*stride)[d] != expected && n != 1)
      return std::nullopt;
    int64_t start = rest % n;
    rest /= n;
    expected *= n;
    if ((*size)[d] == n && start == 0)
      continue;
    if (found || start + (*size)[d] > n)
      return std::nullopt;
    found = Narrowed{d, start, start + (*size)[d]};
  }
  if (rest != 0)
    return std::nullopt;
  return found;
}

Value raiseAsStrided(Call &c) {
  RankedTensorType t = c.resultType();
  auto x = c.plain.size() == 1 ? dyn_cast<RankedTensorType>(c.plain[0].getType()) : nullptr;
  if (!x || !x.hasStaticShape() || x.getElementType() != t.getElementType())
    return {};
  if (wholeContiguousView(c, x.getNumElements()))
    return x == t ? c.plain[0] : c.reshape(c.plain[0], t.getShape());
  if (std::optional<Narrowed> n = narrowedView(c, x))
    return slab(c, c.plain[0], n->dim, n->start, n->end);
  return {};
}

/// as_strided_scatter(self, src, size, stride, storage_offset) writing
/// every element of `self` in order (a flattened view's backward): src
/// reshaped.
/// Writing one narrowed dim's box (narrowedView): the rest of `self`
/// around `src` along that dim.
Value raiseAsStridedScatter(Call &c) {
  RankedTensorType t = c.resultType();
  auto src = c.plain.size() == 2 ? dyn_cast<RankedTensorType>(c.plain[1].getType()) : nullptr;
  if (!src || !t.hasStaticShape() || src.getElementType() != t.getElementType())
    return {};
  if (wholeContiguousView(c, t.getNumElements()) && src.getNumElements() == t.getNumElements())
    return src == t ? c.plain[1] : c.reshape(c.plain[1], t.getShape());
  std::optional<Narrowed> n = narrowedView(c, t);
  if (!n || src.getShape() != *c.ints("size"))
    return {};
  return join(c, {slab(c, c.plain[0], n->dim, 0, n->start), c.plain[1],
                  slab(c, c.plain[0], n->dim, n->end, t.getDimSize(n->dim))},
              n->dim);
}

/// x[idx] (index.Tensor with one integer index tensor, on dim 0): rows of
/// x flattened to 2-D, gathered as an embedding lookup.
Value raiseIndex(Call &c) {
  std::optional<SmallVector<Value>> idx = c.tensors("indices");
  if (c.overload != "Tensor" || !idx || idx->size() != 1 || !(*idx)[0] || c.plain.size() != 1)
    return {};
  auto x = cast<RankedTensorType>(c.plain[0].getType());
  auto it = cast<RankedTensorType>((*idx)[0].getType());
  if (x.getRank() < 1 || !x.hasStaticShape() || !it.getElementType().isInteger(64))
    return {};
  int64_t rest = 1;
  for (int64_t d : x.getShape().drop_front())
    rest *= d;
  Value table = c.reshape(c.plain[0], {x.getDimSize(0), rest});
  // Indexing counts negative indices from the end; a lookup does not.
  Value ids = (*idx)[0];
  Value negative = CmpOp::create(c.b, c.loc, RankedTensorType::get(it.getShape(), c.b.getI1Type()),
                                 CmpPredicate::lt, ids, c.full(0, it.getElementType()));
  ids = WhereOp::create(c.b, c.loc, it, negative,
                        c.binary<AddOp>(ids, c.full(x.getDimSize(0), it.getElementType())), ids);
  SmallVector<int64_t> shape(it.getShape());
  shape.push_back(rest);
  Value rows = EmbeddingOp::create(c.b, c.loc, RankedTensorType::get(shape, x.getElementType()),
                                   table, ids, IntegerAttr());
  return c.reshape(rows, c.resultType().getShape());
}

//===----------------------------------------------------------------------===//
// Convolution and pooling
//===----------------------------------------------------------------------===//

Value raiseConvolution(Call &c) {
  auto stride = c.ints("stride"), padding = c.ints("padding"), dilation = c.ints("dilation");
  std::optional<int64_t> groups = c.i64("groups");
  if (c.boolean("transposed").value_or(true) || !stride || !padding || !dilation || !groups ||
      c.plain.size() < 2 || c.plain.size() > 3)
    return {};
  auto x = cast<RankedTensorType>(c.plain[0].getType());
  if (x.getRank() != 3 && x.getRank() != 4)
    return {};
  Value bias = c.plain.size() == 3 ? c.plain[2] : Value();
  auto op = ConvOp::create(c.b, c.loc, c.resultType(), c.plain[0], c.plain[1], bias,
                           c.b.getDenseI64ArrayAttr(*stride), c.b.getDenseI64ArrayAttr(*padding),
                           c.b.getDenseI64ArrayAttr(*dilation), c.b.getI64IntegerAttr(*groups));
  return op;
}

/// The pooling window's attributes (stride [] means the kernel).
template <typename PoolOp> Value raisePool(Call &c, bool isMax) {
  auto kernel = c.ints("kernel_size"), stride = c.ints("stride"), padding = c.ints("padding");
  if (c.plain.size() != 1 || !kernel || !stride || !padding || !c.onlyFirstResultUsed() ||
      !c.absentOrNone("divisor_override"))
    return {};
  auto two = [](ArrayRef<int64_t> xs) {
    return xs.size() == 1 ? SmallVector<int64_t>{xs[0], xs[0]} : SmallVector<int64_t>(xs);
  };
  SmallVector<int64_t> k = two(*kernel), s = stride->empty() ? k : two(*stride), p = two(*padding);
  SmallVector<int64_t> d = isMax && c.ints("dilation") ? two(*c.ints("dilation"))
                                                       : SmallVector<int64_t>{1, 1};
  bool ceil = c.boolean("ceil_mode").value_or(false);
  bool countPad = !isMax && c.boolean("count_include_pad").value_or(true);
  return PoolOp::create(c.b, c.loc, c.resultType(), c.plain[0], c.b.getDenseI64ArrayAttr(k),
                        c.b.getDenseI64ArrayAttr(s), c.b.getDenseI64ArrayAttr(p),
                        c.b.getDenseI64ArrayAttr(d), ceil ? c.b.getUnitAttr() : UnitAttr(),
                        countPad ? c.b.getUnitAttr() : UnitAttr());
}
Value raiseMaxPool(Call &c) { return raisePool<MaxPoolOp>(c, true); }
Value raiseAvgPool(Call &c) { return raisePool<AvgPoolOp>(c, false); }

/// adaptive_avg_pool2d to 1x1 is a mean over the spatial dims.
Value raiseAdaptiveAvgPool(Call &c) {
  auto size = c.ints("output_size");
  if (c.plain.size() != 1 || !size || llvm::any_of(*size, [](int64_t s) { return s != 1; }))
    return {};
  return MeanOp::create(c.b, c.loc, c.resultType(), c.plain[0], c.b.getDenseI64ArrayAttr({-2, -1}),
                        c.b.getUnitAttr());
}

} // namespace mlir::tdx::raise
