//===- TdxAttrs.cpp - placements and shardings ----------------------------===//

#include "tdx/IR/TdxOps.h"

#include "mlir/IR/DialectImplementation.h"
#include "llvm/ADT/STLExtras.h"

using namespace mlir;
using namespace mlir::tdx;

//===----------------------------------------------------------------------===//
// PlacementAttr
//===----------------------------------------------------------------------===//

LogicalResult
PlacementAttr::verify(function_ref<InFlightDiagnostic()> emitError,
                      PlacementKind kind, int64_t dim, ReduceKind reduce) {
  if (kind == PlacementKind::Shard && dim < 0)
    return emitError() << "Shard(" << dim
                       << ") has a negative dim; tdx placements use "
                          "non-negative dims (write Shard(rank - 1) for the last)";
  return success();
}

void PlacementAttr::printBody(AsmPrinter &printer) const {
  switch (getKind()) {
  case PlacementKind::Shard:
    printer << "Shard(" << getDim() << ")";
    return;
  case PlacementKind::Replicate:
    printer << "Replicate";
    return;
  case PlacementKind::Partial:
    printer << "Partial(" << stringifyReduceKind(getReduce()) << ")";
    return;
  }
}

PlacementAttr PlacementAttr::parseBody(AsmParser &parser) {
  SMLoc loc = parser.getCurrentLocation();
  StringRef keyword;
  if (failed(parser.parseKeyword(&keyword))) {
    parser.emitError(loc, "expected a placement: Shard(<dim>), Replicate or "
                          "Partial(sum|avg|max|min)");
    return {};
  }
  MLIRContext *ctx = parser.getContext();
  auto emitError = [&] { return parser.emitError(loc); };
  if (keyword == "Replicate") {
    // `Replicate()` as PyTorch prints it is accepted too.
    if (succeeded(parser.parseOptionalLParen()) && failed(parser.parseRParen()))
      return {};
    return PlacementAttr::replicate(ctx);
  }
  if (keyword == "Shard") {
    int64_t dim;
    if (parser.parseLParen() || parser.parseInteger(dim) || parser.parseRParen())
      return {};
    return PlacementAttr::getChecked(emitError, ctx, PlacementKind::Shard, dim,
                                     ReduceKind::Sum);
  }
  if (keyword == "Partial") {
    ReduceKind reduce = ReduceKind::Sum;
    if (succeeded(parser.parseOptionalLParen())) {
      StringRef name;
      SMLoc nameLoc = parser.getCurrentLocation();
      if (parser.parseKeyword(&name))
        return {};
      std::optional<ReduceKind> parsed = symbolizeReduceKind(name);
      if (!parsed) {
        parser.emitError(nameLoc) << "unknown Partial reduction '" << name
                                  << "'; expected sum, avg, max or min";
        return {};
      }
      reduce = *parsed;
      if (parser.parseRParen())
        return {};
    }
    return PlacementAttr::partial(ctx, reduce);
  }
  parser.emitError(loc) << "unknown placement '" << keyword
                        << "'; expected Shard(<dim>), Replicate or "
                           "Partial(sum|avg|max|min)";
  return {};
}

Attribute PlacementAttr::parse(AsmParser &parser, Type) {
  if (parser.parseLess())
    return {};
  PlacementAttr attr = parseBody(parser);
  if (!attr || parser.parseGreater())
    return {};
  return attr;
}

void PlacementAttr::print(AsmPrinter &printer) const {
  printer << "<";
  printBody(printer);
  printer << ">";
}

//===----------------------------------------------------------------------===//
// ShardingAttr
//===----------------------------------------------------------------------===//

Attribute ShardingAttr::parse(AsmParser &parser, Type) {
  FlatSymbolRefAttr mesh;
  SmallVector<PlacementAttr> placements;
  if (parser.parseLess() || parser.parseAttribute(mesh) || parser.parseComma())
    return {};
  if (parser.parseCommaSeparatedList(AsmParser::Delimiter::Square, [&] {
        PlacementAttr p = PlacementAttr::parseBody(parser);
        if (!p)
          return failure();
        placements.push_back(p);
        return success();
      }))
    return {};
  if (parser.parseGreater())
    return {};
  return ShardingAttr::get(parser.getContext(), mesh, placements);
}

void ShardingAttr::print(AsmPrinter &printer) const {
  printer << "<" << getMesh() << ", [";
  llvm::interleaveComma(getPlacements(), printer,
                        [&](PlacementAttr p) { p.printBody(printer); });
  printer << "]>";
}

bool ShardingAttr::isFullyReplicated() const {
  return llvm::all_of(getPlacements(),
                      [](PlacementAttr p) { return p.isReplicate(); });
}

LogicalResult ShardingAttr::verifyFor(Operation *op, Type tensorType,
                                      SymbolTableCollection &symbols,
                                      StringRef what) const {
  auto mesh = symbols.lookupNearestSymbolFrom<MeshOp>(op, getMesh());
  if (!mesh)
    return op->emitOpError() << what << " refers to mesh " << getMesh()
                             << ", which is not a 'tdx.mesh' in scope; declare "
                                "it with 'tdx.mesh "
                             << getMesh() << " shape = [...] axes = [...]'";
  size_t numAxes = mesh.getShape().size();
  if (getPlacements().size() != numAxes) {
    InFlightDiagnostic diag = op->emitOpError()
                              << what << " has " << getPlacements().size()
                              << " placement(s) but mesh " << getMesh()
                              << " has " << numAxes << " axes (";
    llvm::interleaveComma(mesh.getAxes().getAsValueRange<StringAttr>(), diag,
                          [&](StringRef a) { diag << "\"" << a << "\""; });
    diag << "); give exactly one placement per mesh axis";
    return diag;
  }
  auto ranked = dyn_cast<RankedTensorType>(tensorType);
  if (!ranked)
    return op->emitOpError() << what << " lays out " << tensorType
                             << ", which is not a ranked tensor";
  for (auto [axis, p] : llvm::enumerate(getPlacements())) {
    if (!p.isShard() || p.getDim() < ranked.getRank())
      continue;
    if (ranked.getRank() == 0)
      return op->emitOpError() << what << " places Shard(" << p.getDim()
                               << ") on a 0-D tensor, which has no dim to "
                                  "split; use Replicate";
    return op->emitOpError()
             << what << " places Shard(" << p.getDim() << ") on mesh axis \""
             << cast<StringAttr>(mesh.getAxes()[axis]).getValue()
             << "\" but the tensor " << tensorType << " has rank "
             << ranked.getRank() << "; valid shard dims are 0 to "
             << ranked.getRank() - 1;
  }
  return success();
}
