//===- ManualProgram.cpp - a program written per rank: user collectives ---===//
//
// A program whose communication the user wrote (tdx.mpi's calls, recorded
// as the `tdx::` torch ops of python/tdx/collectives.py) is per-rank code
// already: every shape in it is a rank's own. This pass makes it the
// partitioned program of its mesh, as tdx-partition would leave one:
//
// - the mesh is declared (or checked, when the module has it);
// - every parameter and buffer is Replicate (the ranks start from one
//   state, as an mpi4torch script's do); the user's collectives keep them
//   equal, or not: that is the user's program;
// - every function argument of rank >= 1 is this rank's rows of a global
//   input split along dim 0 over the mesh's axes (`tdx.global_type`,
//   `Shard(0)`): an SPMD runner passes each rank's own rows, the single
//   controller splits a global batch; 0-D arguments (hyperparameters) and
//   results are Replicate;
// - each `tdx.aten "tdx::..."` becomes the dialect's collective over the
//   named axes, its `site` argument (the user's source line) its location,
//   and `tdx::rank` becomes `tdx.mesh_coord`.
//
//===----------------------------------------------------------------------===//

#include "tdx/IR/ManualRegions.h"
#include "tdx/IR/TdxOps.h"
#include "tdx/Transforms/Passes.h"

#include "mlir/Dialect/Func/IR/FuncOps.h"
#include "mlir/IR/Builders.h"

#include "llvm/ADT/StringExtras.h"

namespace mlir::tdx {
#define GEN_PASS_DEF_MANUALPROGRAM
#include "tdx/Transforms/Passes.h.inc"
} // namespace mlir::tdx

using namespace mlir;
using namespace mlir::tdx;

namespace {

struct ManualProgramPass : public mlir::tdx::impl::ManualProgramBase<ManualProgramPass> {
  using ManualProgramBase::ManualProgramBase;

  void runOnOperation() override {
    ModuleOp module = getOperation();
    MLIRContext *ctx = module.getContext();
    if (module->hasAttr(TdxDialect::kPartitionedAttrName)) {
      module.emitError("tdx-manual-program: the module is partitioned already");
      return signalPassFailure();
    }
    name = meshName;
    meshShape.assign(shape.begin(), shape.end());
    meshAxes.assign(axes.begin(), axes.end());
    if (meshShape.empty() && meshAxes.empty()) {
      // The mesh the trace declared (tdx.trace of tdx.mpi calls does).
      auto meshes = module.getOps<MeshOp>();
      if (std::distance(meshes.begin(), meshes.end()) != 1) {
        module.emitError("tdx-manual-program: give the mesh (shape=... axes=...) or declare "
                         "exactly one tdx.mesh in the module");
        return signalPassFailure();
      }
      MeshOp only = *meshes.begin();
      name = only.getSymName().str();
      meshShape.assign(only.getShape().begin(), only.getShape().end());
      for (StringRef a : only.getAxes().getAsValueRange<StringAttr>())
        meshAxes.push_back(a.str());
    }
    if (meshShape.empty() || meshShape.size() != meshAxes.size()) {
      module.emitError() << "tdx-manual-program: give the mesh as shape=... axes=... with one "
                            "name per dim (got "
                         << meshShape.size() << " sizes and " << meshAxes.size() << " names)";
      return signalPassFailure();
    }
    MeshOp mesh = lookupOrDeclareMesh(module);
    if (!mesh)
      return signalPassFailure();
    auto meshRef = FlatSymbolRefAttr::get(ctx, mesh.getSymName());
    int64_t devices = mesh.getNumDevices();
    SmallVector<PlacementAttr> replicate(meshShape.size(), PlacementAttr::replicate(ctx));
    SmallVector<PlacementAttr> rows(meshShape.size(), PlacementAttr::shard(ctx, 0));
    auto replicated = ShardingAttr::get(ctx, meshRef, replicate);
    auto split = ShardingAttr::get(ctx, meshRef, rows);

    for (Operation &op : module.getBody()->getOperations()) {
      if (!isa<ParameterOp, BufferOp>(op))
        continue;
      if (auto given = op.getAttrOfType<ShardingAttr>("sharding"); given && given != replicated) {
        op.emitError() << "is placed (" << given
                       << "), but its program's communication is the user's (tdx.mpi): such a "
                          "program runs per rank on replicated state; drop the placement";
        return signalPassFailure();
      }
      op.setAttr("sharding", replicated);
    }

    for (auto fn : module.getOps<func::FuncOp>()) {
      if (fn.isExternal())
        continue;
      for (unsigned i = 0; i < fn.getNumArguments(); ++i) {
        auto t = dyn_cast<RankedTensorType>(fn.getArgument(i).getType());
        if (!t)
          continue;
        if (t.getRank() == 0) {
          fn.setArgAttr(i, TdxDialect::kGlobalTypeAttrName, TypeAttr::get(t));
          fn.setArgAttr(i, TdxDialect::kShardingAttrName, replicated);
          continue;
        }
        SmallVector<int64_t> global(t.getShape());
        if (!ShapedType::isDynamic(global[0]))
          global[0] *= devices;
        fn.setArgAttr(i, TdxDialect::kGlobalTypeAttrName,
                      TypeAttr::get(RankedTensorType::get(global, t.getElementType())));
        fn.setArgAttr(i, TdxDialect::kShardingAttrName, split);
      }
      for (unsigned i = 0; i < fn.getNumResults(); ++i)
        fn.setResultAttr(i, TdxDialect::kGlobalTypeAttrName, TypeAttr::get(fn.getResultTypes()[i]));
      SmallVector<AtenOp> calls;
      fn.walk([&](AtenOp op) {
        if (isUserCollective(op))
          calls.push_back(op);
      });
      for (AtenOp op : calls)
        if (failed(raiseUserCollective(op, mesh)))
          return signalPassFailure();
    }
    module->setAttr(TdxDialect::kPartitionedAttrName, UnitAttr::get(ctx));
  }

  MeshOp lookupOrDeclareMesh(ModuleOp module) {
    MLIRContext *ctx = module.getContext();
    for (MeshOp m : module.getOps<MeshOp>()) {
      if (m.getSymName() != name)
        continue;
      SmallVector<std::string> names;
      for (StringRef a : m.getAxes().getAsValueRange<StringAttr>())
        names.push_back(a.str());
      if (ArrayRef<int64_t>(m.getShape()) != ArrayRef<int64_t>(meshShape) || names != meshAxes) {
        m.emitError() << "is not the mesh the program's communicators name ("
                      << llvm::join(meshAxes, ", ") << ")";
        return nullptr;
      }
      return m;
    }
    OpBuilder b(ctx);
    b.setInsertionPointToStart(module.getBody());
    SmallVector<StringRef> names(meshAxes.begin(), meshAxes.end());
    return MeshOp::create(b, module.getLoc(), b.getStringAttr(name),
                          b.getDenseI64ArrayAttr(meshShape), b.getStrArrayAttr(names),
                          DenseI64ArrayAttr());
  }

  std::string name;
  SmallVector<int64_t> meshShape;
  SmallVector<std::string> meshAxes;

};

} // namespace
