//===- ManualRegions.cpp - the user's per-rank code in a placed program ---===//

#include "tdx/IR/ManualRegions.h"

#include "mlir/IR/Builders.h"

#include "llvm/ADT/StringExtras.h"

using namespace mlir;
using namespace mlir::tdx;

namespace {

StringRef stringArg(AtenOp op, StringRef name) {
  DictionaryAttr args = op.getArgsAttr();
  auto s = args ? args.getAs<StringAttr>(name) : StringAttr();
  return s ? s.getValue() : StringRef();
}

std::optional<int64_t> intArg(AtenOp op, StringRef name) {
  DictionaryAttr args = op.getArgsAttr();
  auto i = args ? args.getAs<IntegerAttr>(name) : IntegerAttr();
  if (!i)
    return std::nullopt;
  return i.getInt();
}

} // namespace

Location mlir::tdx::userSite(Operation *op) {
  // `file:line`, or `file:line (backward)` for the adjoint of that call.
  StringRef site;
  if (auto aten = dyn_cast<AtenOp>(op))
    site = stringArg(aten, "site");
  else if (auto s = op->getAttrOfType<StringAttr>("site"))
    site = s.getValue();
  site = site.split(' ').first;
  auto [file, line] = site.rsplit(':');
  unsigned n = 0;
  if (file.empty() || line.getAsInteger(10, n))
    return op->getLoc();
  return FileLineColLoc::get(op->getContext(), file, n, 0);
}


SmallVector<StringRef> mlir::tdx::userCollectiveAxes(AtenOp op) {
  SmallVector<StringRef> names;
  llvm::SplitString(stringArg(op, "axes"), names, ",");
  return names;
}

bool mlir::tdx::isUserCollective(Operation *op) {
  auto aten = dyn_cast<AtenOp>(op);
  return aten && aten.getSchema().starts_with("tdx::") &&
         aten.getSchema() != "tdx::trunc_normal_";
}

DenseSet<Operation *> mlir::tdx::manualRegionOps(Operation *fn) {
  DenseSet<Operation *> region;
  SmallVector<Operation *> work;
  auto enter = [&](Value v) {
    for (Operation *user : v.getUsers())
      if (!isa<FromLocalOp>(user) && region.insert(user).second)
        work.push_back(user);
  };
  SmallVector<Operation *> ops;
  fn->walk([&](Operation *op) {
    if (op == fn)
      return;
    ops.push_back(op);
    if (auto to = dyn_cast<ToLocalOp>(op))
      enter(to.getResult());
  });
  while (!work.empty()) {
    Operation *op = work.pop_back_val();
    for (Value r : op->getResults())
      enter(r);
  }
  if (region.empty())
    return region;
  // Operand-free producers and what they feed only the region: in reverse
  // program order, users come first.
  for (Operation *op : llvm::reverse(ops)) {
    if (region.contains(op) || op->getNumResults() == 0 || op->getNumRegions() ||
        isa<ParamRefOp, ToLocalOp, FromLocalOp>(op) ||
        (!isMemoryEffectFree(op) && !isa<AtenOp>(op)))
      continue;
    bool onlyRegion = true, used = false;
    for (Value r : op->getResults())
      for (Operation *user : r.getUsers()) {
        used = true;
        onlyRegion &= region.contains(user);
      }
    if (used && onlyRegion)
      region.insert(op);
  }
  return region;
}

LogicalResult mlir::tdx::raiseUserCollective(AtenOp op, MeshOp mesh) {
  auto meshRef = FlatSymbolRefAttr::get(mesh.getSymNameAttr());
  StringRef kind = op.getSchema().drop_front(5);
  Location loc = userSite(op);
  SmallVector<StringRef> names = userCollectiveAxes(op);
  if (names.empty())
    return op.emitOpError() << "(" << op.getSchema() << ") names no mesh axes";
  for (StringRef axis : names)
    if (mesh.getAxisIndex(axis) < 0)
      return op.emitOpError() << "(" << op.getSchema() << ") names axis \"" << axis
                              << "\", which mesh " << meshRef << " does not have";
  SmallVector<Value> in = op.getPlainOperands();
  // The ragged all-to-all: its rows, then the offsets and sizes.
  if (kind == "ragged_all_to_all") {
    if (op.getNumResults() != 1 || in.size() != 5)
      return op.emitOpError() << "(" << op.getSchema()
                              << ") takes the rows, the input offsets, the send sizes, the "
                                 "output offsets and the receive sizes, and gives one; the IR has "
                              << in.size() << " and " << op.getNumResults();
    OpBuilder b(op);
    auto made = RaggedAllToAllOp::create(b, loc, op.getResult(0).getType(), in[0], in[1], in[2],
                                         in[3], in[4], meshRef, b.getStrArrayAttr(names));
    op.getResult(0).replaceAllUsesWith(made.getResult());
    op.erase();
    return success();
  }
  if (op.getNumResults() != 1 || in.size() != 1)
    return op.emitOpError() << "(" << op.getSchema()
                            << ") takes one tensor and gives one; the IR has "
                            << in.size() << " and " << op.getNumResults();
  // Every integer argument the call's schema has, or an error naming it.
  auto integer = [&](StringRef name) -> FailureOr<int64_t> {
    if (std::optional<int64_t> v = intArg(op, name))
      return *v;
    return op.emitOpError() << "(" << op.getSchema() << ") has no integer '" << name << "'";
  };
  OpBuilder b(op);
  ArrayAttr meshAxes = b.getStrArrayAttr(names);
  auto reduceKind = [&]() -> FailureOr<ReduceKind> {
    std::optional<ReduceKind> r = symbolizeReduceKind(stringArg(op, "reduce"));
    if (!r)
      return op.emitOpError() << "(" << op.getSchema() << ") reduces by '"
                              << stringArg(op, "reduce") << "'; sum, avg, max or min";
    return *r;
  };
  Type type = op.getResult(0).getType();
  Operation *made = nullptr;
  if (kind == "all_reduce") {
    FailureOr<ReduceKind> r = reduceKind();
    if (failed(r))
      return failure();
    made = AllReduceOp::create(b, loc, type, in[0], meshRef, meshAxes,
                               ReduceKindAttr::get(b.getContext(), *r));
  } else if (kind == "reduce_scatter") {
    FailureOr<ReduceKind> r = reduceKind();
    FailureOr<int64_t> dim = integer("dim");
    if (failed(r) || failed(dim))
      return failure();
    made = ReduceScatterOp::create(b, loc, type, in[0], meshRef, meshAxes,
                                   ReduceKindAttr::get(b.getContext(), *r),
                                   b.getI64IntegerAttr(*dim));
  } else if (kind == "all_gather") {
    FailureOr<int64_t> dim = integer("dim");
    if (failed(dim))
      return failure();
    made = AllGatherOp::create(b, loc, type, in[0], meshRef, meshAxes,
                               b.getI64IntegerAttr(*dim));
  } else if (kind == "all_to_all") {
    FailureOr<int64_t> split = integer("split_dim"), concat = integer("concat_dim");
    if (failed(split) || failed(concat))
      return failure();
    made = AllToAllOp::create(b, loc, type, in[0], meshRef, meshAxes,
                              b.getI64IntegerAttr(*split), b.getI64IntegerAttr(*concat));
  } else if (kind == "broadcast") {
    // The root is a group index: its coordinates, row-major over the axes.
    FailureOr<int64_t> given = integer("root");
    if (failed(given))
      return failure();
    int64_t root = *given;
    SmallVector<int64_t> coords(names.size());
    for (int64_t i = static_cast<int64_t>(names.size()) - 1; i >= 0; --i) {
      int64_t size = mesh.getShape()[mesh.getAxisIndex(names[i])];
      coords[i] = root % size;
      root /= size;
    }
    made = BroadcastOp::create(b, loc, type, in[0], meshRef, meshAxes,
                               b.getDenseI64ArrayAttr(coords));
  } else if (kind == "permute") {
    auto pairs = op.getArgsAttr().getAs<DenseI64ArrayAttr>("pairs");
    if (!pairs)
      return op.emitOpError() << "(tdx::permute) has no pairs";
    made = CollectivePermuteOp::create(b, loc, type, in[0], meshRef, meshAxes, pairs);
  } else if (kind == "rank") {
    if (names.size() != 1)
      return op.emitOpError() << "(tdx::rank) over " << names.size()
                              << " axes; a rank as a value is one axis' coordinate";
    made = MeshCoordOp::create(b, loc, type, meshRef, b.getStringAttr(names[0]));
  } else {
    return op.emitOpError() << "(" << op.getSchema()
                            << ") is not one of tdx's collectives (all_reduce, all_gather, "
                               "reduce_scatter, all_to_all, ragged_all_to_all, broadcast, permute, rank)";
  }
  op.getResult(0).replaceAllUsesWith(made->getResult(0));
  op.erase();
  return success();
}
