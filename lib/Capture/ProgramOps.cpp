//===- ProgramOps.cpp - verify, run passes on and annotate tdx programs ---===//
//
// What the Python `tdx.Program` does to its MLIR text: verify it, run pass
// pipelines on it, and place its parameters and inputs on a mesh.
//
//===----------------------------------------------------------------------===//

#include "CaptureInternal.h"
#include "ProgramImpl.h"

#include "tdx/IR/ManualRegions.h"
#include "tdx/IR/TdxOps.h"
#include "tdx/Transforms/Passes.h"

#include "mlir/Dialect/Arith/IR/Arith.h"
#include "mlir/Dialect/Func/IR/FuncOps.h"
#include "mlir/Dialect/Linalg/IR/Linalg.h"
#include "mlir/Dialect/Tensor/IR/Tensor.h"
#include "mlir/AsmParser/AsmParser.h"
#include "mlir/IR/AsmState.h"
#include "mlir/IR/Builders.h"
#include "mlir/IR/BuiltinOps.h"
#include "mlir/IR/Diagnostics.h"
#include "mlir/IR/Verifier.h"
#include "mlir/Parser/Parser.h"
#include "mlir/Pass/PassManager.h"
#include "mlir/Transforms/Passes.h"
#include "llvm/ADT/ScopeExit.h"
#include "llvm/ADT/TypeSwitch.h"
#include "llvm/Support/FormatVariadic.h"
#include "llvm/Support/JSON.h"

#include <cmath>

using namespace mlir;
using namespace mlir::tdx;
using ::tdx::capture::CaptureError;

namespace tdx::capture {

void registerProgramDialects(MLIRContext &ctx) {
  DialectRegistry registry;
  registry.insert<TdxDialect, func::FuncDialect, arith::ArithDialect,
                  tensor::TensorDialect, linalg::LinalgDialect>();
  ctx.appendDialectRegistry(registry);
  ctx.loadAllAvailableDialects();
}

namespace {
/// Restores the program on scope exit unless committed: an edit that throws
/// leaves the program as it was.
class Transaction {
public:
  explicit Transaction(Module::Impl &impl) : impl(impl), backup(impl.module->clone()) {
    impl.takeDiagnostics();
  }
  ~Transaction() {
    if (backup)
      impl.module = std::move(backup);
  }
  void commit() { backup = nullptr; }

private:
  Module::Impl &impl;
  OwningOpRef<ModuleOp> backup;
};
} // namespace

Module::Module() : impl(std::make_unique<Impl>()) {}
Module::~Module() = default;

std::shared_ptr<Module> Module::parse(const std::string &text) {
  std::shared_ptr<Module> m(new Module());
  m->impl->module = parseSourceString<ModuleOp>(text, &m->impl->ctx);
  if (!m->impl->module) {
    std::string diags = m->impl->takeDiagnostics();
    throw CaptureError("tdx: the program does not parse:\n" +
                       (diags.empty() ? std::string("error: cannot parse the module\n") : diags));
  }
  if (failed(verify(*m->impl->module)))
    throw CaptureError("tdx: the program does not verify:\n" + m->impl->takeDiagnostics());
  return m;
}

std::shared_ptr<Module> Module::clone() const { return parse(print()); }

std::string Module::print() const {
  std::string out;
  llvm::raw_string_ostream os(out);
  impl->module->print(os);
  return out;
}

void Module::runPipeline(const std::string &pipeline) {
  static bool registered = [] {
    mlir::tdx::registerTdxPasses();
    mlir::tdx::registerTdxPipelines();
    mlir::registerTransformsPasses();
    return true;
  }();
  (void)registered;
  MLIRContext &ctx = impl->ctx;
  PassManager pm(&ctx);
  // The manager is anchored on builtin.module: parse what runs inside it.
  llvm::StringRef inner = llvm::StringRef(pipeline).trim();
  if (inner.consume_front("builtin.module(") && inner.consume_back(")"))
    inner = inner.trim();
  std::string error;
  llvm::raw_string_ostream es(error);
  if (failed(parsePassPipeline(inner, pm, es)))
    throw CaptureError("tdx: cannot parse the pass pipeline '" + pipeline + "': " + error);
  // A failed pipeline leaves the program as it was.
  Transaction transaction(*impl);
  if (failed(pm.run(*impl->module)))
    throw CaptureError("tdx: the pipeline '" + pipeline + "' failed:\n" + impl->takeDiagnostics());
  transaction.commit();
}

void Module::declareMesh(const std::string &meshName, const std::vector<int64_t> &shape,
                         const std::vector<std::string> &axes) {
  ModuleOp module = *impl->module;
  MLIRContext &ctx = impl->ctx;
  Diagnostics &diags = impl->diags;
  OpBuilder b(&ctx);
  SymbolTable symbols(module);
  auto mesh = symbols.lookup<MeshOp>(meshName);
  if (!mesh) {
    if (symbols.lookup(meshName))
      throw CaptureError("tdx: '" + meshName + "' already names something that is not a mesh");
    b.setInsertionPointToStart(module.getBody());
    SmallVector<StringRef> names(axes.begin(), axes.end());
    mesh = MeshOp::create(b, module.getLoc(), meshName, b.getDenseI64ArrayAttr(shape),
                          b.getStrArrayAttr(names), DenseI64ArrayAttr());
    symbols.insert(mesh);
    if (failed(verify(mesh))) {
      mesh->erase();
      throw CaptureError("tdx: invalid mesh:\n" + diags.text);
    }
  } else {
    SmallVector<std::string> have;
    for (StringRef a : mesh.getAxes().getAsValueRange<StringAttr>())
      have.push_back(a.str());
    if (mesh.getShape() != ArrayRef<int64_t>(shape) ||
        !std::equal(have.begin(), have.end(), axes.begin(), axes.end()))
      throw CaptureError("tdx: the program already has a mesh '" + meshName +
                         "' of another shape or axis names; use one mesh per program");
  }
}

void Module::setMeshRanks(const std::string &meshName, const std::vector<int64_t> &ranks) {
  auto mesh = SymbolTable(*impl->module).lookup<MeshOp>(meshName);
  if (!mesh)
    throw CaptureError("tdx: the program has no mesh '" + meshName + "' to fold");
  Transaction transaction(*impl);
  mesh.setRanks(ranks);
  if (failed(verify(mesh)))
    throw CaptureError("tdx: cannot fold the mesh:\n" + impl->takeDiagnostics());
  transaction.commit();
}

void Module::setReduceType(const std::string &type) {
  auto t = dyn_cast_or_null<FloatType>(parseType(type, &impl->ctx));
  if (!t || t.getWidth() < 32)
    throw CaptureError("tdx: reduce type '" + type + "': give f32 or f64");
  (*impl->module)->setAttr(TdxDialect::kReduceTypeAttrName, TypeAttr::get(t));
}

void Module::setMemoryBudget(int64_t bytes) {
  if (bytes <= 0)
    throw CaptureError("tdx: memory_budget must be a positive number of bytes, got " +
                       std::to_string(bytes));
  (*impl->module)->setAttr(TdxDialect::kMemoryBudgetAttrName,
                           IntegerAttr::get(IntegerType::get(&impl->ctx, 64), bytes));
}

void Module::setBatchNorm(const std::string &axis, const std::string &statistics) {
  if (statistics != "global" && statistics != "local")
    throw CaptureError("tdx: batch norm statistics are 'global' or 'local', got '" + statistics +
                       "'");
  MLIRContext *ctx = &impl->ctx;
  NamedAttrList spec;
  spec.set("axis", StringAttr::get(ctx, axis));
  spec.set("statistics", StringAttr::get(ctx, statistics));
  (*impl->module)->setAttr(TdxDialect::kBatchNormAttrName, spec.getDictionary(ctx));
}

void Module::setPipeline(const std::string &axis, int64_t microbatches,
                         const std::string &schedule, int64_t stagesPerRank) {
  MLIRContext *ctx = &impl->ctx;
  auto i64 = IntegerType::get(ctx, 64);
  NamedAttrList entries;
  entries.set("axis", StringAttr::get(ctx, axis));
  entries.set("microbatches", IntegerAttr::get(i64, microbatches));
  entries.set("schedule", StringAttr::get(ctx, schedule));
  entries.set("stages_per_rank", IntegerAttr::get(i64, stagesPerRank));
  Operation *module = *impl->module;
  NamedAttribute attr(StringAttr::get(ctx, TdxDialect::kPipelineAttrName),
                      entries.getDictionary(ctx));
  impl->takeDiagnostics();
  if (failed(ctx->getOrLoadDialect<TdxDialect>()->verifyOperationAttribute(module, attr)))
    throw CaptureError("tdx: pipeline: " + impl->takeDiagnostics());
  module->setAttr(attr.getName(), attr.getValue());
}

void Module::annotate(const std::string &target, const std::string &meshName,
                      const std::vector<int64_t> &shape, const std::vector<std::string> &axes,
                      const std::string &placements, int64_t priority) {
  // Every check comes before the one edit; a mesh this call declared goes
  // again if one fails. (No copy of the module: a big model's plan places
  // a thousand tensors.)
  impl->takeDiagnostics();
  bool hadMesh = SymbolTable::lookupSymbolIn(*impl->module, meshName) != nullptr;
  declareMesh(meshName, shape, axes);
  bool placed = false;
  llvm::scope_exit undo([&] {
    if (!placed && !hadMesh)
      if (Operation *mesh = SymbolTable::lookupSymbolIn(*impl->module, meshName))
        mesh->erase();
  });
  ModuleOp module = *impl->module;
  MLIRContext &ctx = impl->ctx;
  Diagnostics &diags = impl->diags;
  SymbolTable symbols(module);

  std::string attrText = "#tdx.sharding<@" + meshName + ", " + placements + ">";
  auto sharding = dyn_cast_or_null<ShardingAttr>(parseAttribute(attrText, &ctx));
  if (!sharding)
    throw CaptureError("tdx: invalid placements " + placements + ":\n" + diags.text);

  SymbolTableCollection collection;
  llvm::StringRef t(target);
  // "input:<i>" of the entry(), or "<function>:input:<i>" of another entry.
  std::string function = entry();
  if (size_t at = t.find(":input:"); at != llvm::StringRef::npos && !t.starts_with("input:")) {
    function = t.take_front(at).str();
    t = t.drop_front(at + 1);
  }
  if (t.consume_front("input:")) {
    unsigned index;
    auto fn = symbols.lookup<func::FuncOp>(function);
    if (!fn)
      throw CaptureError("tdx: the program has no function @" + function +
                         "; trace the model (tdx.trace, tdx.trace_train_step, "
                         "prog.add_entry) to place its inputs");
    if (t.getAsInteger(10, index) || index >= fn.getNumArguments())
      throw CaptureError("tdx: '" + target + "' is not an input of " + function +
                         ", which takes " + std::to_string(fn.getNumArguments()) +
                         " input(s): input:0 ...");
    if (failed(sharding.verifyFor(fn, fn.getArgumentTypes()[index], collection,
                                  "sharding of " + target)))
      throw CaptureError("tdx: cannot place " + target + ":\n" + diags.text);
    fn.setArgAttr(index, ::mlir::tdx::TdxDialect::kShardingAttrName, sharding);
    if (priority >= 0)
      fn.setArgAttr(index, ::mlir::tdx::TdxDialect::kShardingPriorityAttrName,
                    IntegerAttr::get(IntegerType::get(&ctx, 64), priority));
    else
      fn.removeArgAttr(index, ::mlir::tdx::TdxDialect::kShardingPriorityAttrName);
  } else {
    if (priority >= 0)
      throw CaptureError("tdx: a placement with a priority (a preference) is for inputs "
                         "(input:<i>); '" + target + "' is state, placed as given");
    Operation *decl = symbols.lookup(target);
    auto param = dyn_cast_or_null<ParameterOp>(decl);
    auto buffer = dyn_cast_or_null<BufferOp>(decl);
    if (!param && !buffer)
      throw CaptureError("tdx: the program has no parameter or buffer named '" + target +
                         "' (names are as in named_parameters(), or input:<i>)");
    FlatSymbolRefAttr tied = param ? param.getTiedToAttr() : buffer.getTiedToAttr();
    if (tied) {
      decl = symbols.lookup(tied.getValue());
      param = dyn_cast_or_null<ParameterOp>(decl);
      buffer = dyn_cast_or_null<BufferOp>(decl);
    }
    Operation *op = param ? param.getOperation() : buffer.getOperation();
    Type type = param ? param.getType() : buffer.getType();
    if (failed(sharding.verifyFor(op, type, collection, "sharding of " + target)))
      throw CaptureError("tdx: cannot place " + target + ":\n" + diags.text);
    ShardingAttr existing = param ? param.getShardingAttr() : buffer.getShardingAttr();
    if (tied && existing && existing != sharding)
      throw CaptureError("tdx: " + target + " is tied to " + tied.getValue().str() +
                         ", which is already placed otherwise; tied names share one placement");
    if (param)
      param.setShardingAttr(sharding);
    else
      buffer.setShardingAttr(sharding);
  }
  placed = true;
}

void Module::annotateUses(const std::string &param, const std::string &meshName,
                          const std::string &placements, bool reads) {
  impl->takeDiagnostics();
  ModuleOp module = *impl->module;
  MLIRContext &ctx = impl->ctx;
  Diagnostics &diags = impl->diags;
  auto fn = SymbolTable::lookupNearestSymbolFrom<func::FuncOp>(
      module, StringAttr::get(&ctx, entry()));
  if (!fn)
    throw CaptureError("tdx: the program has no forward or train_step function; trace the "
                       "model first");
  std::string attrText = "#tdx.sharding<@" + meshName + ", " + placements + ">";
  auto sharding = dyn_cast_or_null<ShardingAttr>(parseAttribute(attrText, &ctx));
  if (!sharding)
    throw CaptureError("tdx: invalid placements " + placements + ":\n" + diags.text);
  OpBuilder b(&ctx);
  SymbolTableCollection symbols;
  // Users whose results have no dim the placements split (a training step's
  // update of the weight itself) are left to propagation.
  int64_t needed = 0;
  for (PlacementAttr p : sharding.getPlacements())
    if (p.isShard())
      needed = std::max<int64_t>(needed, p.getDim() + 1);
  SmallVector<Operation *> users;
  fn.walk([&](ParamRefOp ref) {
    if (ref.getName() != param)
      return;
    if (reads) {
      // Mixed precision reads a parameter as its cast to the compute dtype:
      // gathering the cast moves the narrow bytes (FSDP2's order), and the
      // update reads the float32 shard it stores.
      bool narrowed = false;
      for (Operation *user : ref->getUsers())
        if (floatWidening(user) < 0) {
          users.push_back(user);
          narrowed = true;
        }
      if (!narrowed)
        users.push_back(ref);
      return;
    }
    auto consider = [&](Operation *user) {
      if (user->getNumResults() == 1)
        if (auto t = dyn_cast<RankedTensorType>(user->getResult(0).getType()))
          if (t.getRank() >= needed)
            users.push_back(user);
    };
    // Under mixed precision the parameter is read through its cast to the
    // compute dtype (and an op computing in f32 casts it back): the casts'
    // users are the parameter's.
    SmallVector<Value> values = {ref.getResult()};
    while (!values.empty())
      for (Operation *user : values.pop_back_val().getUsers()) {
        if (floatWidening(user) != 0)
          values.push_back(user->getResult(0));
        else
          consider(user);
      }
  });
  // Every placement is checked before the first edit.
  for (Operation *user : users)
    if (failed(sharding.verifyFor(user, user->getResult(0).getType(), symbols,
                                  reads ? "sharding of the reads of " + param
                                        : "sharding of the output of " + param + "'s user")))
      throw CaptureError("tdx: cannot place the users of " + param + ":\n" + diags.text);
  if (users.empty())
    throw CaptureError("tdx: the " + entry() + " function does not use parameter '" + param +
                       "'");
  for (Operation *user : users) {
    Value result = user->getResult(0);
    b.setInsertionPointAfter(user);
    auto annotate = AnnotateOp::create(b, user->getLoc(), result, sharding, b.getI64IntegerAttr(0));
    result.replaceAllUsesExcept(annotate.getResult(), annotate);
  }
}

std::vector<Module::StateInfo> Module::state() const {
  std::vector<StateInfo> out;
  for (Operation &op : impl->module->getBody()->getOperations()) {
    auto param = dyn_cast<ParameterOp>(op);
    auto buffer = dyn_cast<BufferOp>(op);
    if (!param && !buffer)
      continue;
    auto type = cast<RankedTensorType>(param ? param.getType() : buffer.getType());
    FlatSymbolRefAttr tied = param ? param.getTiedToAttr() : buffer.getTiedToAttr();
    StateInfo info;
    info.name = (param ? param.getSymName() : buffer.getSymName()).str();
    info.shape.assign(type.getShape().begin(), type.getShape().end());
    llvm::raw_string_ostream os(info.dtype);
    type.getElementType().print(os);
    info.isBuffer = static_cast<bool>(buffer);
    info.tiedTo = tied ? tied.getValue().str() : "";
    out.push_back(std::move(info));
  }
  return out;
}

std::vector<std::pair<std::string, bool>> dialectOps() {
  MLIRContext ctx;
  ctx.loadDialect<TdxDialect>();
  std::vector<std::pair<std::string, bool>> out;
  for (RegisteredOperationName name : ctx.getRegisteredOperations())
    if (name.getDialectNamespace() == TdxDialect::getDialectNamespace())
      out.push_back({name.getStringRef().str(), name.hasInterface<ShardingRuleOpInterface>()});
  return out;
}

std::vector<std::pair<std::string, std::vector<std::string>>> dialectEnums() {
  std::vector<std::pair<std::string, std::vector<std::string>>> out;
  auto add = [&](const char *name, uint64_t max, auto stringify) {
    std::vector<std::string> cases;
    for (uint64_t i = 0; i <= max; ++i)
      cases.push_back(stringify(i).str());
    out.push_back({name, std::move(cases)});
  };
#define TDX_ENUM(E)                                                                            \
  add(#E, getMaxEnumValFor##E(), [](uint64_t i) { return stringify##E(static_cast<E>(i)); });
  TDX_ENUM(ReduceKind)
  TDX_ENUM(PlacementKind)
  TDX_ENUM(CmpPredicate)
  TDX_ENUM(GeluApproximation)
  TDX_ENUM(LossReduction)
#undef TDX_ENUM
  return out;
}

std::string Module::entry() const {
  for (const char *name : {"forward", "train_step"})
    if (impl->module->lookupSymbol<func::FuncOp>(name))
      return name;
  return "forward";
}

std::vector<std::string> Module::entries() const {
  std::string main = entry();
  std::vector<std::string> out;
  if (impl->module->lookupSymbol<func::FuncOp>(main))
    out.push_back(main);
  for (auto fn : impl->module->getOps<func::FuncOp>())
    if (fn.getSymName() != main)
      out.push_back(fn.getSymName().str());
  return out;
}

void Module::addEntry(const std::string &text, const std::string &name, bool writes) {
  ModuleOp module = *impl->module;
  // A program of user collectives (tdx.mpi inside the trace) declares the
  // mesh of its communicators and is placed by nobody: entries join it.
  if (module->hasAttr(TdxDialect::kPartitionedAttrName) || isPlaced() ||
      (!module.getOps<MeshOp>().empty() && !hasUserCollectives()))
    throw CaptureError("tdx: add_entry('" + name + "'): the program is placed already; add "
                       "every entry before tdx.parallelize (or prog.annotate), which places "
                       "them together");
  if (module.lookupSymbol(name))
    throw CaptureError("tdx: add_entry('" + name + "'): the program has a @" + name +
                       " already; give the entry another name");
  OwningOpRef<ModuleOp> other = parseSourceString<ModuleOp>(text, &impl->ctx);
  if (!other)
    throw CaptureError("tdx: add_entry('" + name + "'): the trace does not parse:\n" +
                       impl->takeDiagnostics());
  auto fn = other->lookupSymbol<func::FuncOp>(name);
  if (!fn)
    throw CaptureError("tdx: add_entry('" + name + "'): the trace has no @" + name);
  std::string problem;
  fn.walk([&](Operation *op) {
    if (!problem.empty())
      return;
    if (auto assign = dyn_cast<AssignOp>(op); assign && !writes) {
      problem = "writes " + assign.getName().str() +
                "; an entry reads the state the main entry trains, and writes none (trace it "
                "in eval mode, or under torch.no_grad)";
      return;
    }
    auto ref = dyn_cast<ParamRefOp>(op);
    if (!ref)
      return;
    Operation *mine = module.lookupSymbol(ref.getNameAttr());
    Operation *theirs = other->lookupSymbol(ref.getNameAttr());
    auto typeOf = [](Operation *decl) {
      return decl ? decl->getAttrOfType<TypeAttr>("type") : TypeAttr();
    };
    if (!mine || !isa<ParameterOp, BufferOp>(mine))
      problem = "reads " + ref.getName().str() + ", which the program has no state for";
    else if (typeOf(mine) != typeOf(theirs))
      problem = "reads " + ref.getName().str() + " as another type than the program declares";
  });
  if (!problem.empty())
    throw CaptureError("tdx: add_entry('" + name + "'): the entry " + problem);
  module.getBody()->push_back(fn->clone());
  if (failed(verify(module))) {
    module.lookupSymbol<func::FuncOp>(name)->erase();
    throw CaptureError("tdx: add_entry('" + name + "'): the program does not verify with it:\n" +
                       impl->takeDiagnostics());
  }
}

int64_t Module::numArguments(const std::string &function) const {
  auto fn = impl->module->lookupSymbol<func::FuncOp>(function);
  return fn ? static_cast<int64_t>(fn.getNumArguments()) : -1;
}

std::vector<std::pair<std::vector<int64_t>, bool>>
Module::argumentShapes(const std::string &function) const {
  auto fn = impl->module->lookupSymbol<func::FuncOp>(function);
  if (!fn)
    throw CaptureError("tdx: the program has no function @" + function);
  std::vector<std::pair<std::vector<int64_t>, bool>> out;
  for (BlockArgument arg : fn.getArguments()) {
    auto t = dyn_cast<RankedTensorType>(arg.getType());
    unsigned i = arg.getArgNumber();
    bool fixed = fn.getArgAttr(i, TdxDialect::kShardingAttrName) &&
                 !fn.getArgAttr(i, TdxDialect::kShardingPriorityAttrName);
    out.push_back({t ? std::vector<int64_t>(t.getShape().begin(), t.getShape().end())
                     : std::vector<int64_t>{},
                   fixed});
  }
  return out;
}

bool Module::isPartitioned() const {
  return (*impl->module)->hasAttr(TdxDialect::kPartitionedAttrName);
}

bool Module::isPlaced() const {
  bool placed = false;
  impl->module->walk([&](Operation *op) {
    if (op->hasAttr(TdxDialect::kShardingsAttrName))
      placed = true;
    return placed ? WalkResult::interrupt() : WalkResult::advance();
  });
  return placed;
}

bool Module::hasUserCollectives() const {
  // A manual region's collectives are the region's (tdx.local_map): the
  // program around them is placed as any other.
  bool found = false;
  impl->module->walk([&](func::FuncOp fn) {
    DenseSet<Operation *> region = manualRegionOps(fn);
    fn.walk([&](Operation *op) {
      found |= isUserCollective(op) && !region.contains(op);
      return found ? WalkResult::interrupt() : WalkResult::advance();
    });
    return found ? WalkResult::interrupt() : WalkResult::advance();
  });
  return found;
}

bool Module::hasManualRegions() const {
  return impl->module->walk([](ToLocalOp) { return WalkResult::interrupt(); }).wasInterrupted();
}

std::vector<Module::MeshInfo> Module::meshes() const {
  std::vector<MeshInfo> out;
  for (MeshOp mesh : impl->module->getOps<MeshOp>()) {
    MeshInfo info{mesh.getSymName().str(), {}, {}};
    info.shape.assign(mesh.getShape().begin(), mesh.getShape().end());
    for (StringRef a : mesh.getAxes().getAsValueRange<StringAttr>())
      info.axes.push_back(a.str());
    std::optional<ArrayRef<int64_t>> ranks = mesh.getRanks();
    info.ranks.assign(ranks ? ranks->begin() : mesh.getShape().begin(),
                      ranks ? ranks->end() : mesh.getShape().end());
    out.push_back(std::move(info));
  }
  return out;
}

} // namespace tdx::capture
