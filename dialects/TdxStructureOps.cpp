//===- TdxStructureOps.cpp - meshes, parameters, buffers ------------------===//

#include "tdx/IR/LocalTypes.h"
#include "tdx/IR/TdxOps.h"

#include "llvm/ADT/StringSet.h"

using namespace mlir;
using namespace mlir::tdx;

//===----------------------------------------------------------------------===//
// MeshOp
//===----------------------------------------------------------------------===//

LogicalResult MeshOp::verify() {
  ArrayRef<int64_t> shape = getShape();
  if (shape.empty())
    return emitOpError("needs at least one axis; a single device is shape = "
                       "[1] axes = [\"x\"]");
  if (shape.size() != getAxes().size())
    return emitOpError() << "has " << shape.size() << " dims in shape but "
                         << getAxes().size()
                         << " axis names; give one name per mesh dim";
  llvm::StringSet<> seen;
  for (auto [size, name] :
       llvm::zip(shape, getAxes().getAsValueRange<StringAttr>())) {
    if (size <= 0)
      return emitOpError() << "axis \"" << name << "\" has size " << size
                           << "; mesh axis sizes must be positive";
    if (name.empty())
      return emitOpError("has an empty axis name");
    if (!seen.insert(name).second)
      return emitOpError() << "names axis \"" << name
                           << "\" twice; axis names must be unique";
  }
  if (std::optional<ArrayRef<int64_t>> ranks = getRanks()) {
    if (ranks->size() != shape.size())
      return emitOpError() << "has " << ranks->size() << " entries in ranks for "
                           << shape.size() << " axes; give one per mesh axis";
    for (auto [size, r, name] :
         llvm::zip(shape, *ranks, getAxes().getAsValueRange<StringAttr>()))
      if (r != 1 && r != size)
        return emitOpError() << "runs axis \"" << name << "\" of size " << size << " on " << r
                             << " ranks; an axis runs on 1 rank (folded) or on one rank "
                                "per device";
  }
  return success();
}

int64_t MeshOp::getNumDevices() {
  int64_t n = 1;
  for (int64_t s : getShape())
    n *= s;
  return n;
}

int64_t MeshOp::getAxisIndex(StringRef name) {
  for (auto [i, a] : llvm::enumerate(getAxes().getAsValueRange<StringAttr>()))
    if (a == name)
      return i;
  return -1;
}

//===----------------------------------------------------------------------===//
// ParameterOp / BufferOp
//===----------------------------------------------------------------------===//

template <typename StateOp>
static LogicalResult verifyStateRegion(StateOp op) {
  Region &init = op.getInit();
  if (op.getTiedTo()) {
    if (!init.empty())
      return op.emitOpError()
             << "is tied to " << op.getTiedToAttr()
             << " and so takes its value from there; remove the init region";
    return success();
  }
  if (init.empty())
    return op.emitOpError("has no init region; give one ending in 'tdx.yield' "
                          "or tie it to another name with 'tied_to @name'");
  if (!init.hasOneBlock())
    return op.emitOpError("init region must have exactly one block");
  Block &block = init.front();
  if (block.getNumArguments() != 0)
    return op.emitOpError("init region takes no arguments");
  auto yield = block.mightHaveTerminator()
                   ? dyn_cast<YieldOp>(block.getTerminator())
                   : YieldOp();
  if (!yield)
    return op.emitOpError("init region must end in 'tdx.yield'");
  if (yield.getValues().size() != 1 ||
      yield.getValues().front().getType() != op.getType())
    return yield.emitOpError()
           << "must yield exactly one value of the declared type "
           << op.getType() << " of "
           << FlatSymbolRefAttr::get(op.getSymNameAttr());
  return success();
}

template <typename StateOp>
static LogicalResult verifyStateSymbols(StateOp op,
                                        SymbolTableCollection &symbols) {
  if (auto sharding = op.getShardingAttr())
    if (failed(sharding.verifyFor(op, op.getType(), symbols, "sharding")))
      return failure();
  if (!op.getTiedTo())
    return success();
  Operation *target =
      symbols.lookupNearestSymbolFrom(op.getOperation(), op.getTiedToAttr());
  if (!target || !isa<ParameterOp, BufferOp>(target))
    return op.emitOpError() << "is tied to " << op.getTiedToAttr()
                            << ", which is not a tdx.parameter or tdx.buffer";
  if (target == op.getOperation())
    return op.emitOpError("is tied to itself");
  auto targetType = isa<ParameterOp>(target)
                        ? cast<ParameterOp>(target).getType()
                        : cast<BufferOp>(target).getType();
  if (targetType != op.getType())
    return op.emitOpError() << "has type " << op.getType() << " but is tied to "
                            << op.getTiedToAttr() << " of type " << targetType
                            << "; tied names must have one type";
  bool targetTied = isa<ParameterOp>(target)
                        ? bool(cast<ParameterOp>(target).getTiedTo())
                        : bool(cast<BufferOp>(target).getTiedTo());
  if (targetTied)
    return op.emitOpError() << "is tied to " << op.getTiedToAttr()
                            << ", which is itself tied; tie to the name that "
                               "owns the init region";
  return success();
}

LogicalResult ParameterOp::verifyRegions() { return verifyStateRegion(*this); }
LogicalResult BufferOp::verifyRegions() { return verifyStateRegion(*this); }
LogicalResult ParameterOp::verifySymbolUses(SymbolTableCollection &symbols) {
  return verifyStateSymbols(*this, symbols);
}
LogicalResult BufferOp::verifySymbolUses(SymbolTableCollection &symbols) {
  return verifyStateSymbols(*this, symbols);
}

//===----------------------------------------------------------------------===//
// ParamRefOp
//===----------------------------------------------------------------------===//

Operation *mlir::tdx::detail::lookupStateOwner(Operation *from, FlatSymbolRefAttr name,
                                               SymbolTableCollection *symbols) {
  auto lookup = [&](FlatSymbolRefAttr n) {
    return symbols ? symbols->lookupNearestSymbolFrom(from, n)
                   : SymbolTable::lookupNearestSymbolFrom(from, n);
  };
  auto decl = dyn_cast_or_null<StateOpInterface>(lookup(name));
  if (!decl)
    return nullptr;
  FlatSymbolRefAttr tied = decl.getTiedState();
  return tied ? dyn_cast_or_null<StateOpInterface>(lookup(tied)) : decl;
}

ShardingAttr mlir::tdx::valueSharding(Value v) {
  if (auto arg = dyn_cast<BlockArgument>(v)) {
    Operation *owner = arg.getOwner()->getParentOp();
    if (auto fused = dyn_cast_or_null<FusedOp>(owner)) // a kernel's input
      return valueSharding(fused.getInputs()[arg.getArgNumber()]);
    auto fn = dyn_cast_or_null<func::FuncOp>(owner);
    return fn ? fn.getArgAttrOfType<ShardingAttr>(arg.getArgNumber(),
                                                  TdxDialect::kShardingAttrName)
              : ShardingAttr();
  }
  // The backend's ops keep the placements where they were decided: a
  // kernel's result is its body's, a wait's the started collective's.
  if (auto fused = v.getDefiningOp<FusedOp>())
    return valueSharding(
        fused.getBody().front().getTerminator()->getOperand(cast<OpResult>(v).getResultNumber()));
  if (auto wait = v.getDefiningOp<WaitOp>())
    if (auto start = wait.getToken().getDefiningOp<StartOp>())
      return valueSharding(start.getCollective()->getResult(0));
  auto attr = v.getDefiningOp()->getAttrOfType<ArrayAttr>(TdxDialect::kShardingsAttrName);
  unsigned i = cast<OpResult>(v).getResultNumber();
  return attr && i < attr.size() ? dyn_cast<ShardingAttr>(attr[i]) : ShardingAttr();
}

/// Checks that `op` names a tdx.parameter or tdx.buffer and that `type` is
/// its declared type, or in a partitioned module its local type.
static LogicalResult verifyStateAccess(Operation *op, FlatSymbolRefAttr name, Type type,
                                       StringRef what, SymbolTableCollection &symbols) {
  Operation *target = symbols.lookupNearestSymbolFrom(op, name);
  if (!target || !isa<ParameterOp, BufferOp>(target))
    return op->emitOpError() << "refers to " << name
                             << ", which is not a tdx.parameter or tdx.buffer in scope";
  Type declared = isa<ParameterOp>(target) ? cast<ParameterOp>(target).getType()
                                           : cast<BufferOp>(target).getType();
  // In a partitioned module a function reads and writes this rank's shard.
  auto module = op->getParentOfType<ModuleOp>();
  if (module && module->hasAttr(::mlir::tdx::TdxDialect::kPartitionedAttrName)) {
    // A tied name is the value it shares, placed as that one is.
    auto owner = dyn_cast_or_null<StateOpInterface>(
        ::mlir::tdx::detail::lookupStateOwner(op, name, &symbols));
    if (ShardingAttr sharding = (owner ? owner : cast<StateOpInterface>(target)).getStateSharding())
      if (auto mesh = symbols.lookupNearestSymbolFrom<MeshOp>(op, sharding.getMesh()))
        declared = localType(cast<RankedTensorType>(declared),
                             sharding.getPlacements(), mesh.getShape());
    if (declared != type)
      return op->emitOpError() << what << " " << type << " differs from " << name
                               << "'s local (per-rank) type " << declared;
    return success();
  }
  if (declared != type)
    return op->emitOpError() << what << " " << type << " differs from " << name
                             << "'s declared type " << declared;
  return success();
}

LogicalResult ParamRefOp::verifySymbolUses(SymbolTableCollection &symbols) {
  return verifyStateAccess(*this, getNameAttr(), getType(), "result type", symbols);
}

//===----------------------------------------------------------------------===//
// AssignOp
//===----------------------------------------------------------------------===//

LogicalResult AssignOp::verifySymbolUses(SymbolTableCollection &symbols) {
  if (failed(verifyStateAccess(*this, getNameAttr(), getValue().getType(), "value type",
                               symbols)))
    return failure();
  // Two writes of one state in one function would race. The first write
  // of its block checks every write of the function once (each write
  // walking the function made verifying a deep model's step quadratic).
  for (Operation *prev = (*this)->getPrevNode(); prev; prev = prev->getPrevNode())
    if (isa<AssignOp>(prev))
      return success();
  llvm::StringMap<Operation *> writer;
  WalkResult twice = (*this)->getParentOp()->walk([&](AssignOp other) {
    auto [it, fresh] = writer.try_emplace(other.getName(), other);
    if (fresh)
      return WalkResult::advance();
    other.emitOpError() << "writes " << other.getNameAttr()
                        << " a second time in one function; write each state once";
    return WalkResult::interrupt();
  });
  return failure(twice.wasInterrupted());
}
