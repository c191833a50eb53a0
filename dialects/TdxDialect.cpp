//===- TdxDialect.cpp - dialect registration and generated definitions ----===//

#include "tdx/IR/TdxDialect.h"
#include "tdx/IR/TdxOps.h"

#include "mlir/IR/Builders.h"
#include "mlir/IR/DialectImplementation.h"
#include "llvm/ADT/TypeSwitch.h"

using namespace mlir;
using namespace mlir::tdx;

#include "tdx/IR/TdxDialect.cpp.inc"
#include "tdx/IR/TdxEnums.cpp.inc"

#define GET_ATTRDEF_CLASSES
#include "tdx/IR/TdxAttrs.cpp.inc"

#define GET_TYPEDEF_CLASSES
#include "tdx/IR/TdxTypes.cpp.inc"

#define GET_OP_CLASSES
#include "tdx/IR/TdxOps.cpp.inc"

void TdxDialect::initialize() {
  addTypes<
#define GET_TYPEDEF_LIST
#include "tdx/IR/TdxTypes.cpp.inc"
      >();
  addAttributes<
#define GET_ATTRDEF_LIST
#include "tdx/IR/TdxAttrs.cpp.inc"
      >();
  addOperations<
#define GET_OP_LIST
#include "tdx/IR/TdxOps.cpp.inc"
      >();
}

//===----------------------------------------------------------------------===//
// Discardable attributes
//===----------------------------------------------------------------------===//

/// Checks a `tdx.*` attribute found on `op` (or one of its region's
/// arguments or results): a known name with the kind of value it holds.
static LogicalResult verifyTdxAttribute(Operation *op, NamedAttribute attr, bool onValue) {
  StringRef name = attr.getName().getValue();
  Attribute value = attr.getValue();
  auto wrong = [&](StringRef what) {
    return op->emitError() << "'" << name << "' must be " << what << ", got " << value;
  };
  if (onValue) {
    if (name == TdxDialect::kShardingAttrName)
      return isa<ShardingAttr>(value) ? success() : wrong("a #tdx.sharding");
    if (name == TdxDialect::kGlobalTypeAttrName)
      return isa<TypeAttr>(value) ? success() : wrong("a type");
    if (name == TdxDialect::kShardingPriorityAttrName) {
      auto i = dyn_cast<IntegerAttr>(value);
      return i && i.getType().isInteger(64) && i.getInt() >= 0
                 ? success()
                 : wrong("an i64 priority >= 0");
    }
    return op->emitError() << "unknown tdx attribute '" << name
                           << "' on a function argument or result; tdx uses '"
                           << TdxDialect::kShardingAttrName << "', '"
                           << TdxDialect::kShardingPriorityAttrName << "' and '"
                           << TdxDialect::kGlobalTypeAttrName << "' there";
  }
  if (name == TdxDialect::kShardingsAttrName) {
    auto array = dyn_cast<ArrayAttr>(value);
    if (!array || !llvm::all_of(array, [](Attribute a) { return isa<ShardingAttr>(a); }))
      return wrong("an array of #tdx.sharding, one per result");
    return success();
  }
  if (name == TdxDialect::kPartitionedAttrName || name == TdxDialect::kRecomputedAttrName)
    return isa<UnitAttr>(value) ? success() : wrong("a unit attribute");
  if (name == TdxDialect::kPayloadBytesAttrName)
    return isa<IntegerAttr>(value) ? success() : wrong("an integer");
  if (name == TdxDialect::kMemoryBudgetAttrName) {
    auto i = dyn_cast<IntegerAttr>(value);
    if (!i || !i.getType().isInteger(64) || i.getInt() <= 0 || !isa<ModuleOp>(op))
      return wrong("an i64 byte count > 0 on a module");
    return success();
  }
  if (name == TdxDialect::kStageAttrName) {
    auto i = dyn_cast<IntegerAttr>(value);
    return i && i.getType().isInteger(64) && i.getInt() >= 0 ? success()
                                                             : wrong("an i64 chunk index >= 0");
  }
  if (name == TdxDialect::kPipelineAttrName) {
    auto d = dyn_cast<DictionaryAttr>(value);
    if (!d || !isa<ModuleOp>(op))
      return wrong("a dictionary {axis, microbatches, schedule, stages_per_rank} on a module");
    auto axis = d.getAs<StringAttr>("axis");
    auto micro = d.getAs<IntegerAttr>("microbatches");
    auto schedule = d.getAs<StringAttr>("schedule");
    auto perRank = d.getAs<IntegerAttr>("stages_per_rank");
    if (!axis || !micro || micro.getInt() < 1 || !schedule || !perRank || perRank.getInt() < 1)
      return wrong("a dictionary with axis (a string), microbatches (>= 1), schedule (a "
                   "string) and stages_per_rank (>= 1)");
    if (!llvm::is_contained({"gpipe", "1f1b", "interleaved-1f1b", "zb-h1"},
                            schedule.getValue()))
      return op->emitError() << "'" << name << "' has schedule \"" << schedule.getValue()
                             << "\"; the schedules are \"gpipe\", \"1f1b\", "
                                "\"interleaved-1f1b\" and \"zb-h1\"";
    // What the pipeline passes add (PipelineStages.h reads them).
    auto strings = [](Attribute a) {
      auto array = dyn_cast<ArrayAttr>(a);
      return array && llvm::all_of(array, [](Attribute s) { return isa<StringAttr>(s); });
    };
    if (Attribute stages = d.get("stages");
        stages && !(isa<ArrayAttr>(stages) && llvm::all_of(cast<ArrayAttr>(stages), strings)))
      return wrong("stages as an array of each stage's layer names");
    for (StringRef key : {"layer_seconds", "chunk_seconds"})
      if (Attribute seconds = d.get(key); seconds && !isa<DenseF64ArrayAttr>(seconds))
        return wrong((key + " as an array<f64>").str());
    if (Attribute timeline = d.get("timeline")) {
      auto tasks = dyn_cast<ArrayAttr>(timeline);
      if (!tasks || !llvm::all_of(tasks, [](Attribute t) {
            auto task = dyn_cast<DenseF64ArrayAttr>(t);
            return task && task.size() == 6;
          }))
        return wrong("timeline as an array of array<f64: rank, phase, stage, micro-batch, "
                     "start, end>");
    }
    return success();
  }
  if (name == TdxDialect::kReduceTypeAttrName) {
    auto type = dyn_cast<TypeAttr>(value);
    auto f = type ? dyn_cast<FloatType>(type.getValue()) : FloatType();
    if (!f || f.getWidth() < 32 || !isa<ModuleOp>(op))
      return wrong("f32 or f64 on a module");
    return success();
  }
  if (name == TdxDialect::kBatchNormAttrName) {
    auto spec = dyn_cast<DictionaryAttr>(value);
    auto axis = spec ? spec.getAs<StringAttr>("axis") : StringAttr();
    auto statistics = spec ? spec.getAs<StringAttr>("statistics") : StringAttr();
    if (!axis || axis.getValue().empty() || !statistics ||
        (statistics.getValue() != "global" && statistics.getValue() != "local") ||
        spec.size() != 2 || !isa<ModuleOp>(op))
      return wrong("{axis = \"<mesh axis>\", statistics = \"global\" or \"local\"} on a "
                   "module");
    return success();
  }
  if (name == TdxDialect::kArenaAttrName) {
    auto offsets = dyn_cast<DenseI64ArrayAttr>(value);
    if (!offsets || offsets.size() != static_cast<int64_t>(op->getNumResults()))
      return wrong("an array<i64> of one arena offset per result (" +
                   std::to_string(op->getNumResults()) + ")");
    for (int64_t offset : offsets.asArrayRef())
      if (offset != -1 && (offset < 0 || offset % 64 != 0))
        return wrong("offsets that are multiples of 64 bytes, or -1");
    return success();
  }
  if (name == TdxDialect::kArenaBytesAttrName || name == TdxDialect::kStepBytesAttrName) {
    auto i = dyn_cast<IntegerAttr>(value);
    if (!i || !i.getType().isInteger(64) || i.getInt() < 0 || !isa<func::FuncOp>(op))
      return wrong("an i64 >= 0 on a function");
    return success();
  }
  if (name == TdxDialect::kPartAttrName) {
    auto part = dyn_cast<IntegerAttr>(value);
    if (!part || !part.getType().isInteger(64) || part.getInt() < 0)
      return wrong("an i64 part index >= 0");
    for (Operation *prev = op->getPrevNode(); prev; prev = prev->getPrevNode())
      if (auto before = prev->getAttrOfType<IntegerAttr>(TdxDialect::kPartAttrName)) {
        if (before.getInt() > part.getInt())
          return op->emitError() << "is in part " << part.getInt()
                                 << " after an op of part " << before.getInt()
                                 << "; parts run in order, so they never decrease";
        break;
      }
    return success();
  }
  return op->emitError() << "unknown tdx attribute '" << name << "'; tdx puts '"
                         << TdxDialect::kShardingsAttrName << "', '"
                         << TdxDialect::kPartitionedAttrName << "', '"
                         << TdxDialect::kPayloadBytesAttrName << "', '"
                         << TdxDialect::kArenaAttrName << "', '"
                         << TdxDialect::kArenaBytesAttrName << "', '"
                         << TdxDialect::kStepBytesAttrName << "', '"
                         << TdxDialect::kRecomputedAttrName << "', '"
                         << TdxDialect::kStageAttrName << "' and '"
                         << TdxDialect::kPartAttrName << "' on ops, and '"
                         << TdxDialect::kReduceTypeAttrName << "', '"
                         << TdxDialect::kBatchNormAttrName << "', '"
                         << TdxDialect::kPipelineAttrName << "' and '"
                         << TdxDialect::kMemoryBudgetAttrName << "' on a module";
}

LogicalResult TdxDialect::verifyOperationAttribute(Operation *op, NamedAttribute attr) {
  return verifyTdxAttribute(op, attr, false);
}

LogicalResult TdxDialect::verifyRegionArgAttribute(Operation *op, unsigned, unsigned,
                                                   NamedAttribute attr) {
  return verifyTdxAttribute(op, attr, true);
}

LogicalResult TdxDialect::verifyRegionResultAttribute(Operation *op, unsigned, unsigned,
                                                      NamedAttribute attr) {
  return verifyTdxAttribute(op, attr, true);
}
