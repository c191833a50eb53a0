//===- TdxShardingOps.cpp - annotations, redistribute, collectives --------===//

#include "tdx/IR/TdxOps.h"
#include "tdx/IR/LocalTypes.h"

#include "llvm/ADT/DenseSet.h"
#include "llvm/ADT/StringSet.h"

using namespace mlir;
using namespace mlir::tdx;

LogicalResult AnnotateOp::verifySymbolUses(SymbolTableCollection &symbols) {
  if (static_cast<int64_t>(getPriority()) < 0)
    return emitOpError("priority must be >= 0 (0 is the highest)");
  return getSharding().verifyFor(*this, getType(), symbols, "sharding");
}

LogicalResult RedistributeOp::verifySymbolUses(SymbolTableCollection &symbols) {
  if (failed(getSource().verifyFor(*this, getType(), symbols, "source sharding")) ||
      failed(getTarget().verifyFor(*this, getType(), symbols, "target sharding")))
    return failure();
  if (getSource().getMesh() != getTarget().getMesh())
    return emitOpError() << "moves between meshes " << getSource().getMesh()
                         << " and " << getTarget().getMesh()
                         << "; source and target must use one mesh";
  return success();
}

/// `local` must be `global`'s even piece under `sharding`.
static LogicalResult verifyLocalPiece(Operation *op, ShardingAttr sharding, Type globalType,
                                      Type localType, SymbolTableCollection &symbols) {
  if (failed(sharding.verifyFor(op, globalType, symbols, "sharding")))
    return failure();
  auto mesh = symbols.lookupNearestSymbolFrom<MeshOp>(op, sharding.getMesh());
  auto global = cast<RankedTensorType>(globalType);
  RankedTensorType want = ::mlir::tdx::localType(global, sharding.getPlacements(),
                                                 mesh.getShape());
  if (!want.hasStaticShape() && global.hasStaticShape())
    return op->emitOpError() << "splits " << global << " unevenly under " << sharding
                             << "; a manual region's pieces are equal (pad the tensor)";
  if (want != localType)
    return op->emitOpError() << "has local type " << localType << ", but " << global
                             << " under " << sharding << " is " << want << " per rank";
  return success();
}

LogicalResult ToLocalOp::verifySymbolUses(SymbolTableCollection &symbols) {
  return verifyLocalPiece(*this, getSharding(), getInput().getType(), getType(), symbols);
}

LogicalResult FromLocalOp::verifySymbolUses(SymbolTableCollection &symbols) {
  return verifyLocalPiece(*this, getSharding(), getType(), getInput().getType(), symbols);
}

//===----------------------------------------------------------------------===//
// Collectives
//===----------------------------------------------------------------------===//

template <typename Op>
static FailureOr<int64_t> verifyCollectiveGroup(Op op,
                                                SymbolTableCollection &symbols) {
  auto mesh = symbols.lookupNearestSymbolFrom<MeshOp>(op, op.getMeshAttr());
  if (!mesh) {
    op.emitOpError() << "refers to mesh " << op.getMeshAttr()
                     << ", which is not a 'tdx.mesh' in scope";
    return failure();
  }
  if (op.getMeshAxes().empty()) {
    op.emitOpError("names no mesh axes; give at least one");
    return failure();
  }
  int64_t group = 1;
  llvm::StringSet<> seen;
  for (StringRef axis : op.getMeshAxes().template getAsValueRange<StringAttr>()) {
    int64_t index = mesh.getAxisIndex(axis);
    if (index < 0) {
      InFlightDiagnostic diag = op.emitOpError()
                                << "names axis \"" << axis << "\", which mesh "
                                << op.getMeshAttr() << " does not have; its axes are ";
      llvm::interleaveComma(mesh.getAxes().template getAsValueRange<StringAttr>(),
                            diag, [&](StringRef a) { diag << "\"" << a << "\""; });
      return failure();
    }
    if (!seen.insert(axis).second) {
      op.emitOpError() << "names axis \"" << axis << "\" twice";
      return failure();
    }
    group *= mesh.getShape()[index];
  }
  return group;
}

#define TDX_GROUP_METHOD(Op)                                                   \
  FailureOr<int64_t> Op::verifyGroup(SymbolTableCollection &symbols) {         \
    return verifyCollectiveGroup(*this, symbols);                              \
  }
TDX_GROUP_METHOD(AllGatherOp)
TDX_GROUP_METHOD(AllReduceOp)
TDX_GROUP_METHOD(ReduceScatterOp)
TDX_GROUP_METHOD(AllToAllOp)
TDX_GROUP_METHOD(BroadcastOp)
TDX_GROUP_METHOD(CollectivePermuteOp)
#undef TDX_GROUP_METHOD

/// A send's or recv's one axis, and its peer on it.
template <typename Op>
static LogicalResult verifyPointToPoint(Op op, SymbolTableCollection &symbols) {
  FailureOr<int64_t> size = verifyCollectiveGroup(op, symbols);
  if (failed(size))
    return failure();
  if (op.getMeshAxes().size() != 1)
    return op.emitOpError() << "names " << op.getMeshAxes().size()
                            << " mesh axes; a point-to-point message goes along one";
  int64_t peer = static_cast<int64_t>(op.getPeer()), tag = static_cast<int64_t>(op.getTag());
  if (peer < 0 || peer >= *size)
    return op.emitOpError() << "peer " << peer << " is not a coordinate of axis "
                            << op.getMeshAxes()[0] << " (size " << *size << ")";
  if (tag < 0)
    return op.emitOpError() << "tag " << tag << " must be >= 0";
  return success();
}

LogicalResult SendOp::verifySymbolUses(SymbolTableCollection &symbols) {
  return verifyPointToPoint(*this, symbols);
}

LogicalResult RecvOp::verifySymbolUses(SymbolTableCollection &symbols) {
  if (failed(verifyPointToPoint(*this, symbols)))
    return failure();
  auto t = cast<RankedTensorType>(getType());
  if (llvm::count_if(t.getShape(), ShapedType::isDynamic) > 1)
    return emitOpError() << "receives " << t
                         << ", with more than one `?` dim: the message's size gives one";
  return success();
}

namespace {
/// Checks the per-rank shapes of a collective: dims other than those it
/// changes stay; `grow` dims are multiplied by the group size; `split` dims
/// are divided (torch.chunk; an uneven split leaves a `?` dim).
struct ShapeCheck {
  Operation *op;
  RankedTensorType in, out;
  int64_t group;

  LogicalResult check(std::optional<int64_t> grow, std::optional<int64_t> split) {
    if (in.getElementType() != out.getElementType() || in.getRank() != out.getRank())
      return op->emitOpError() << "result " << out
                               << " must keep the input's rank and element type "
                               << in;
    for (int64_t d = 0; d < in.getRank(); ++d) {
      int64_t have = in.getDimSize(d), got = out.getDimSize(d);
      int64_t want = have;
      // An uneven (`?`) input dim differs between ranks: what the group
      // gathers or splits from it is not known here.
      if (ShapedType::isDynamic(have) &&
          ((grow && d == *grow) || (split && d == *split)))
        continue;
      if (grow && d == *grow && split && d == *split)
        want = have;
      else if (grow && d == *grow && !ShapedType::isDynamic(have))
        want = have * group;
      else if (split && d == *split && !ShapedType::isDynamic(have))
        want = have % group == 0 ? have / group : ShapedType::kDynamic;
      if (ShapedType::isDynamic(want) ? !ShapedType::isDynamic(got)
                                      : (!ShapedType::isDynamic(got) && got != want)) {
        InFlightDiagnostic diag = op->emitOpError()
                                  << "result dim " << d << " is "
                                  << (ShapedType::isDynamic(got) ? std::string("?")
                                                                 : std::to_string(got))
                                  << " but a group of " << group << " rank(s) gives ";
        if (ShapedType::isDynamic(want))
          diag << "? (an uneven torch.chunk split differs between ranks)";
        else
          diag << want;
        return diag;
      }
    }
    return success();
  }
};
} // namespace

static FailureOr<int64_t> checkCollectiveDim(Operation *op, StringRef what,
                                             int64_t dim, int64_t rank) {
  if (std::optional<int64_t> d = normalizeDim(dim, rank))
    return *d;
  op->emitOpError() << what << " " << dim << " is out of range for rank "
                    << rank;
  return failure();
}

LogicalResult AllGatherOp::verifySymbolUses(SymbolTableCollection &symbols) {
  FailureOr<int64_t> group = verifyGroup(symbols);
  if (failed(group))
    return failure();
  auto in = cast<RankedTensorType>(getInput().getType());
  FailureOr<int64_t> dim =
      checkCollectiveDim(*this, "dim", static_cast<int64_t>(getGatherDim()), in.getRank());
  if (failed(dim))
    return failure();
  return ShapeCheck{*this, in, cast<RankedTensorType>(getType()), *group}.check(*dim, {});
}

LogicalResult AllReduceOp::verifySymbolUses(SymbolTableCollection &symbols) {
  FailureOr<int64_t> group = verifyGroup(symbols);
  if (failed(group))
    return failure();
  if (getInput().getType() != getType())
    return emitOpError() << "result type " << getType()
                         << " must equal the input type " << getInput().getType();
  return success();
}

LogicalResult ReduceScatterOp::verifySymbolUses(SymbolTableCollection &symbols) {
  FailureOr<int64_t> group = verifyGroup(symbols);
  if (failed(group))
    return failure();
  auto in = cast<RankedTensorType>(getInput().getType());
  FailureOr<int64_t> dim =
      checkCollectiveDim(*this, "dim", static_cast<int64_t>(getScatterDim()), in.getRank());
  if (failed(dim))
    return failure();
  return ShapeCheck{*this, in, cast<RankedTensorType>(getType()), *group}.check({}, *dim);
}

LogicalResult AllToAllOp::verifySymbolUses(SymbolTableCollection &symbols) {
  FailureOr<int64_t> group = verifyGroup(symbols);
  if (failed(group))
    return failure();
  auto in = cast<RankedTensorType>(getInput().getType());
  FailureOr<int64_t> split =
      checkCollectiveDim(*this, "split dim", static_cast<int64_t>(getSplitDim()), in.getRank());
  if (failed(split))
    return failure();
  FailureOr<int64_t> concat = checkCollectiveDim(
      *this, "concat dim", static_cast<int64_t>(getConcatDim()), in.getRank());
  if (failed(concat))
    return failure();
  return ShapeCheck{*this, in, cast<RankedTensorType>(getType()), *group}.check(*concat, *split);
}

LogicalResult RaggedAllToAllOp::verifySymbolUses(SymbolTableCollection &symbols) {
  FailureOr<int64_t> group = verifyCollectiveGroup(*this, symbols);
  if (failed(group))
    return failure();
  auto in = cast<RankedTensorType>(getInput().getType());
  auto out = cast<RankedTensorType>(getType());
  if (in.getRank() < 1 || out.getRank() != in.getRank())
    return emitOpError() << "moves rows of dim 0: its input and result need the same rank, at "
                            "least 1; they are "
                         << in << " and " << out;
  if (in.getElementType() != out.getElementType())
    return emitOpError() << "result element type " << out.getElementType()
                         << " is not the input's " << in.getElementType();
  if (!in.hasStaticShape() || !out.hasStaticShape())
    return emitOpError() << "needs static buffers (its counts are values, its shapes are "
                            "not); the types are "
                         << in << " and " << out;
  for (int64_t d = 1; d < in.getRank(); ++d)
    if (in.getDimSize(d) != out.getDimSize(d))
      return emitOpError() << "rows of " << in << " do not fit rows of " << out
                           << ": dim " << d << " differs";
  auto sizes = cast<RankedTensorType>(getSendSizes().getType());
  if (sizes.getRank() != 1 || !sizes.getElementType().isInteger(64) ||
      sizes.getDimSize(0) != *group)
    return emitOpError() << "offsets and sizes must be tensor<" << *group
                         << "xi64> (one entry per rank of the group); they are " << sizes;
  return success();
}

LogicalResult BroadcastOp::verifySymbolUses(SymbolTableCollection &symbols) {
  FailureOr<int64_t> group = verifyGroup(symbols);
  if (failed(group))
    return failure();
  auto mesh = symbols.lookupNearestSymbolFrom<MeshOp>(*this, getMeshAttr());
  ArrayRef<int64_t> root = getRoot();
  if (root.size() != getMeshAxes().size())
    return emitOpError() << "root has " << root.size() << " coordinate(s) for "
                         << getMeshAxes().size()
                         << " mesh axes; give one coordinate per named axis";
  for (auto [coord, axis] :
       llvm::zip(root, getMeshAxes().getAsValueRange<StringAttr>())) {
    int64_t size = mesh.getShape()[mesh.getAxisIndex(axis)];
    if (coord < 0 || coord >= size)
      return emitOpError() << "root coordinate " << coord << " on axis \"" << axis
                           << "\" is outside [0, " << size << ")";
  }
  return success();
}

int64_t CollectivePermuteOp::sourceOf(int64_t rank) {
  ArrayRef<int64_t> pairs = getPairs();
  for (size_t i = 0; i + 1 < pairs.size(); i += 2)
    if (pairs[i + 1] == rank)
      return pairs[i];
  return -1;
}

int64_t CollectivePermuteOp::targetOf(int64_t rank) {
  ArrayRef<int64_t> pairs = getPairs();
  for (size_t i = 0; i + 1 < pairs.size(); i += 2)
    if (pairs[i] == rank)
      return pairs[i + 1];
  return -1;
}

LogicalResult CollectivePermuteOp::verifySymbolUses(SymbolTableCollection &symbols) {
  FailureOr<int64_t> group = verifyGroup(symbols);
  if (failed(group))
    return failure();
  if (getMeshAxes().size() != 1)
    return emitOpError() << "names " << getMeshAxes().size()
                         << " mesh axes; a permutation goes along one";
  ArrayRef<int64_t> pairs = getPairs();
  if (pairs.size() % 2)
    return emitOpError() << "pairs has " << pairs.size()
                         << " entries; give (source, target) pairs, flattened";
  llvm::SmallDenseSet<int64_t> sources, targets;
  for (size_t i = 0; i < pairs.size(); i += 2) {
    for (int64_t r : {pairs[i], pairs[i + 1]})
      if (r < 0 || r >= *group)
        return emitOpError() << "pair (" << pairs[i] << ", " << pairs[i + 1] << ") names rank "
                             << r << ", outside the group of " << *group << " on axis "
                             << getMeshAxes()[0];
    if (!sources.insert(pairs[i]).second)
      return emitOpError() << "rank " << pairs[i] << " is the source of two pairs; each rank "
                           << "sends once";
    if (!targets.insert(pairs[i + 1]).second)
      return emitOpError() << "rank " << pairs[i + 1] << " is the target of two pairs; each "
                           << "rank receives once";
  }
  return success();
}

//===----------------------------------------------------------------------===//
// MeshCoordOp / ChunkOp
//===----------------------------------------------------------------------===//

LogicalResult MeshCoordOp::verifySymbolUses(SymbolTableCollection &symbols) {
  auto mesh = symbols.lookupNearestSymbolFrom<MeshOp>(*this, getMeshAttr());
  if (!mesh)
    return emitOpError() << "refers to mesh " << getMeshAttr()
                         << ", which is not a 'tdx.mesh' in scope";
  if (mesh.getAxisIndex(getAxis()) < 0)
    return emitOpError() << "names axis \"" << getAxis() << "\", which mesh "
                         << getMeshAttr() << " does not have";
  return success();
}

LogicalResult ChunkOp::verify() {
  auto in = cast<RankedTensorType>(getInput().getType());
  auto out = cast<RankedTensorType>(getType());
  auto chunks = static_cast<int64_t>(getChunks());
  if (chunks <= 0)
    return emitOpError() << "chunks must be positive, got " << chunks;
  std::optional<int64_t> dim = normalizeDim(static_cast<int64_t>(getDim()), in.getRank());
  if (!dim)
    return emitOpError() << "dim " << static_cast<int64_t>(getDim())
                         << " is out of range for rank " << in.getRank();
  SmallVector<int64_t> shape(in.getShape());
  int64_t n = shape[*dim];
  if (!ShapedType::isDynamic(n))
    shape[*dim] = n % chunks == 0 ? n / chunks : ShapedType::kDynamic;
  auto want = RankedTensorType::get(shape, in.getElementType());
  if (want != out)
    return emitOpError() << "result type " << out << " differs from the chunk type "
                         << want << " (torch.chunk into " << chunks
                         << "; an uneven split is '?')";
  return success();
}

OpFoldResult ChunkOp::fold(FoldAdaptor) {
  auto gather = getInput().getDefiningOp<AllGatherOp>();
  auto coord = getIndex().getDefiningOp<MeshCoordOp>();
  if (!gather || !coord || gather.getMeshAxes().size() != 1 ||
      coord.getMeshAttr() != gather.getMeshAttr() ||
      coord.getAxisAttr() != gather.getMeshAxes()[0])
    return {};
  auto piece = cast<RankedTensorType>(gather.getInput().getType());
  auto gathered = cast<RankedTensorType>(getInput().getType());
  std::optional<int64_t> dim = normalizeDim(static_cast<int64_t>(getDim()), gathered.getRank());
  // Even pieces only: the gathered dim is `chunks` of this rank's piece,
  // which is then exactly its torch.chunk.
  if (!dim || static_cast<int64_t>(gather.getGatherDim()) != *dim || piece != getType() ||
      !piece.hasStaticShape() || !gathered.hasStaticShape() ||
      gathered.getDimSize(*dim) != piece.getDimSize(*dim) * static_cast<int64_t>(getChunks()))
    return {};
  return gather.getInput();
}
