//===- EmitCpp.cpp - tdx programs as C++ on the CPU runtime ---------------===//
//
// The step as a whole (Emitter.h says where the rest is): its parts and the
// handles it drops, the signature the runtimes' drivers read, and main().
//
//===----------------------------------------------------------------------===//

#include "Emitter.h"
#include "tdx/Target/Cpp.h"
#include "tdx/IR/TdxOps.h"
#include "tdx/Target/Fusion.h"
#include "tdx/Sharding/Layout.h"
#include "tdx/Target/InitEvaluator.h"
#include "tdx/Target/Lifetimes.h"

#include "mlir/Dialect/Arith/IR/Arith.h"
#include "mlir/Dialect/Func/IR/FuncOps.h"
#include "llvm/ADT/TypeSwitch.h"
#include "llvm/Support/FormatVariadic.h"

#include <algorithm>
#include <cmath>
#include <map>
#include <set>
#include <tuple>
#include <utility>

using namespace mlir;
using namespace mlir::tdx;
using namespace mlir::tdx::cpp;

namespace {

/// The global type and layout text of each function argument and result.
struct Signature {
  SmallVector<std::pair<RankedTensorType, std::string>> inputs, outputs;
};

FailureOr<Signature> signatureOf(func::FuncOp fn, int64_t meshRank) {
  Signature sig;
  FunctionType type = fn.getFunctionType();
  for (auto [i, local] : llvm::enumerate(type.getInputs())) {
    Type t = local;
    if (auto global = fn.getArgAttrOfType<TypeAttr>(i, ::mlir::tdx::TdxDialect::kGlobalTypeAttrName))
      t = global.getValue();
    auto ranked = dyn_cast<RankedTensorType>(t);
    if (!ranked || dtype(ranked.getElementType()).empty())
      return fn.emitError() << "argument #" << i << " has type " << t
                            << ", which the CPU backend cannot pass; use a ranked tensor of "
                            << runnableTypes();
    sig.inputs.push_back(
        {ranked, layoutText(fn.getArgAttrOfType<ShardingAttr>(i, ::mlir::tdx::TdxDialect::kShardingAttrName), meshRank)});
  }
  auto ret = cast<func::ReturnOp>(fn.getBody().front().getTerminator());
  for (auto [i, local] : llvm::enumerate(type.getResults())) {
    Type t = local;
    if (auto global = fn.getResultAttrOfType<TypeAttr>(i, ::mlir::tdx::TdxDialect::kGlobalTypeAttrName))
      t = global.getValue();
    auto ranked = dyn_cast<RankedTensorType>(t);
    if (!ranked || dtype(ranked.getElementType()).empty())
      return fn.emitError() << "result #" << i << " has type " << t
                            << ", which the CPU backend cannot return; return a ranked "
                               "tensor of "
                            << runnableTypes();
    ShardingAttr sharding = valueSharding(ret.getOperand(i));
    // The runtimes assemble a result by copying or adding its boxes.
    if (sharding && llvm::any_of(sharding.getPlacements(), [](PlacementAttr p) {
          return p.isPartial() && p.getReduce() != ReduceKind::Sum;
        }))
      return fn.emitError() << "result #" << i << " is " << sharding
                            << ", which the runtimes cannot assemble; reduce it first (place "
                               "the result Replicate or Partial(sum))";
    sig.outputs.push_back({ranked, layoutText(sharding, meshRank)});
  }
  return sig;
}

/// `layout` ("[Replicate, Shard(0)]") with axis `axis` as `Stage(rank)`.
std::string stageLayout(StringRef layout, int64_t axis, int64_t rank) {
  SmallVector<StringRef> parts;
  layout.drop_front().drop_back().split(parts, ", ");
  std::string out = "[";
  for (auto [i, part] : llvm::enumerate(parts))
    out += (i ? ", " : "") +
           (static_cast<int64_t>(i) == axis ? "Stage(" + std::to_string(rank) + ")" : part.str());
  return out + "]";
}

} // namespace

LogicalResult mlir::tdx::emitCpp(ModuleOp module, llvm::raw_ostream &os, Backend backend,
                                 MemoryPlan *memoryPlan) {
  const char *backendName = backend == Backend::CUDA ? "the CUDA backend" : "the CPU backend";
  if (!module->hasAttr(::mlir::tdx::TdxDialect::kPartitionedAttrName))
    return module.emitError("the module is not partitioned; run `tdx-opt --tdx-place --tdx-spmd` "
                            "first (tdx-compile runs them for you)");
  SmallVector<MeshOp> meshes(module.getOps<MeshOp>());
  if (meshes.size() > 1)
    return module.emitError() << backendName << " needs at most one tdx.mesh, found "
                              << meshes.size();
  // Without a mesh the program runs on one rank.
  MeshOp mesh = meshes.empty() ? MeshOp() : meshes.front();
  // The main entry (@forward, else @train_step, else the only function) and
  // the others (prog.add_entry), which read the state: entries[k-1].
  SmallVector<func::FuncOp> fns(module.getOps<func::FuncOp>());
  // A pipeline's step is one function per rank of its axis
  // (tdx-schedule-pipeline); `forward` calls this rank's.
  auto pipeline = module->getAttrOfType<DictionaryAttr>(TdxDialect::kPipelineAttrName);
  SmallVector<func::FuncOp> stages;
  if (pipeline) {
    auto names = pipeline.getAs<ArrayAttr>("functions");
    if (!names)
      return module.emitError() << "the pipeline is not scheduled yet; run `tdx-opt --tdx-spmd` "
                                   "(tdx-split-stages, tdx-schedule-pipeline) first";
    for (auto name : names.getAsRange<FlatSymbolRefAttr>()) {
      auto f = module.lookupSymbol<func::FuncOp>(name.getAttr());
      if (!f)
        return module.emitError() << "the pipeline's function " << name << " is missing";
      stages.push_back(f);
    }
  }
  func::FuncOp fn = module.lookupSymbol<func::FuncOp>("forward");
  if (!fn)
    fn = module.lookupSymbol<func::FuncOp>("train_step");
  if (!fn && !stages.empty())
    fn = stages.front();
  if (!fn) {
    if (fns.size() != 1)
      return module.emitError() << backendName
                                << " needs one entry function, or @forward or @train_step "
                                   "among several";
    fn = fns.front();
  }
  SmallVector<func::FuncOp> functions = {fn};
  for (func::FuncOp f : fns)
    if (f != fn && !llvm::is_contained(stages, f))
      functions.push_back(f);
  if (!stages.empty() && functions.size() > 1)
    return functions[1].emitError() << "a pipelined program has one entry (its training step)";
  int64_t meshRank = mesh ? mesh.getShape().size() : 0;
  SmallVector<Signature> sigs;
  int64_t plannedStepBytes = 0, arenaBytes = 0;
  // Every function emitted: the entries, and a pipeline's other ranks' steps.
  SmallVector<func::FuncOp> emitted(functions);
  for (func::FuncOp f : stages)
    if (f != fn)
      emitted.push_back(f);
  for (func::FuncOp f : emitted) {
    if (!f.getBody().hasOneBlock())
      return f.emitError() << "has more than one block; " << backendName
                           << " emits straight-line code";
    auto stepBytes = f->getAttrOfType<IntegerAttr>(TdxDialect::kStepBytesAttrName);
    auto arenaAttr = f->getAttrOfType<IntegerAttr>(TdxDialect::kArenaBytesAttrName);
    if (!stepBytes || !arenaAttr)
      return f.emitError() << "has no memory plan; run `tdx-opt --tdx-backend` first "
                              "(tdx-translate and tdx-compile run it for you)";
    // The main entry's plan is the step's (a pipeline's: its largest
    // rank's); the entries take turns in one arena, as large as the largest
    // asks.
    if (f == fn || llvm::is_contained(stages, f))
      plannedStepBytes = std::max<int64_t>(plannedStepBytes, stepBytes.getInt());
    arenaBytes = std::max<int64_t>(arenaBytes, arenaAttr.getInt());
    if (!llvm::is_contained(functions, f))
      continue; // a pipeline rank's step: the signature is rank 0's
    FailureOr<Signature> sig = signatureOf(f, meshRank);
    if (failed(sig))
      return failure();
    sigs.push_back(*sig);
  }

  std::string body;
  llvm::raw_string_ostream bs(body);
  Emitter e(meshRank, backend, bs);
  e.text = &body;
  Emitter::InitTables tables;
  e.tables = &tables;

  int64_t pipelineAxis =
      pipeline && mesh ? mesh.getAxisIndex(pipeline.getAs<StringAttr>("axis")) : -1;
  if (pipeline && pipelineAxis < 0)
    return module.emitError() << "the pipeline's axis is not an axis of the module's mesh";
  bs << "static void init(Context &ctx, State &s) {\n";
  SmallVector<std::tuple<std::string, RankedTensorType, std::string>> params;
  SmallVector<std::pair<std::string, std::string>> tied;
  SmallVector<std::string> nonPersistent;
  for (Operation &op : module.getBody()->getOperations()) {
    if (!isa<ParameterOp, BufferOp>(op))
      continue;
    auto name = op.getAttrOfType<StringAttr>(SymbolTable::getSymbolAttrName()).getValue();
    auto type = cast<RankedTensorType>(op.getAttrOfType<TypeAttr>("type").getValue());
    auto sharding = op.getAttrOfType<ShardingAttr>("sharding");
    if (op.hasAttr("non_persistent"))
      nonPersistent.push_back(name.str());
    if (auto owner = op.getAttrOfType<FlatSymbolRefAttr>("tied_to")) {
      tied.push_back({name.str(), owner.getValue().str()});
      continue;
    }
    if (dtype(type.getElementType()).empty())
      return op.emitOpError() << "has element type " << type.getElementType()
                              << ", which the CPU backend does not support";
    std::string layout = layoutText(sharding, meshRank);
    // A pipeline stage's state is held by its stage's ranks only.
    if (auto chunk = op.getAttrOfType<IntegerAttr>(TdxDialect::kStageAttrName); chunk && pipeline)
      layout = stageLayout(layout, pipelineAxis, chunk.getInt() % mesh.getShape()[pipelineAxis]);
    params.push_back({name.str(), type, layout});
    if (failed(e.emitInit(&op, name, type, layout)))
      return failure();
  }
  if (!tables.entries.empty())
    bs << "  for (const EmittedInit &e : kInitEntries)\n    if (!s.count(e.name))\n"
          "      s[e.name] = ctx.init(kInit(e.program), parseLayout(e.layout));\n";
  bs << "}\n\n";

  // Kernels with one text share one function (an optimizer's update repeated
  // per parameter compiles once), across entries too; `kernels` holds each
  // text once.
  std::string kernels;
  llvm::raw_string_ostream ks(kernels);
  std::map<std::string, std::string> byText;
  int64_t kernelCount = 0;
  // One entry as the C++ function `cppName`: one function, or (a long step)
  // parts and the function that calls them (see endPart).
  auto emitFunction = [&](func::FuncOp f, Emitter &fe, const std::string &cppName) {
    fe.function = cppName;
    uint64_t start = bs.tell();
    std::string header = "static std::vector<T::Tensor> " + cppName +
                         "(Context &ctx, State &s, const std::vector<T::Tensor> &in) {\n"
                         // The call's index, which the random ops of the function draw with.
                         "  const uint64_t call = ctx.nextCall();\n  (void)call;\n" +
                         fe.bindArguments(f.getArguments());
    bs << header;
    Block &step = f.getBody().front();
    for (FusedOp op : step.getOps<FusedOp>()) {
      std::string own = "k" + std::to_string(kernelCount);
      FusedKernel k = fusedKernel(op, "TDX_KERNEL");
      std::string text;
      llvm::raw_string_ostream ts(text);
      emitKernelBody(k, ts);
      if (backend == Backend::CUDA)
        emitKernelLaunch(k, ts);
      else
        emitKernelRow(k, ts);
      auto [it, inserted] = byText.try_emplace(text, own);
      k.name = it->second;
      fe.kernels[op] = std::move(k);
      if (!inserted)
        continue;
      ++kernelCount;
      for (llvm::StringRef rest = text; !rest.empty();) {
        auto [head, tail] = rest.split("TDX_KERNEL");
        ks << head;
        if (tail.size() != rest.size() - head.size())
          ks << own;
        rest = tail;
      }
    }
    Lifetimes lifetimes(step);
    int64_t part = 0;
    for (Operation &op : step) {
      if (auto p = op.getAttrOfType<IntegerAttr>(TdxDialect::kPartAttrName);
          p && p.getInt() > part && !isa<func::ReturnOp>(op)) {
        part = p.getInt();
        fe.endPart(f.getArguments());
      }
      fe.place(&op);
      if (failed(fe.emitOp(&op)))
        return failure();
      fe.placed(&op);
      fe.release(lifetimes.endingAt(&op));
      // Collectives in flight move on after each op that computes.
      if (!isa<WaitOp, AssignOp, func::ReturnOp>(op))
        fe.progress();
    }
    bs << "}\n";
    fe.finishPart();
    if (fe.parts) {
      // The parts, then the step that calls them.
      body.replace(start, header.size(), fe.partHeader(0, f.getArguments()));
      bs << "\nstatic std::vector<T::Tensor> " << cppName
         << "(Context &ctx, State &s, const std::vector<T::Tensor> &in) {\n"
            "  const uint64_t call = ctx.nextCall();\n"
            "  std::vector<T::Tensor> carry("
         << fe.carrySize() << ");\n  std::vector<int64_t> handles(" << fe.handed << ");\n";
      for (int i = 0; i < fe.parts; ++i)
        bs << "  " << cppName << i << "(ctx, s, in, call, carry.data(), handles.data());\n";
      bs << "  return " << cppName << fe.parts
         << "(ctx, s, in, call, carry.data(), handles.data());\n}\n";
    }
    return success();
  };
  if (stages.empty()) {
    if (failed(emitFunction(fn, e, "forward")))
      return failure();
  } else {
    // Each pipeline rank's step, and the step that runs this rank's.
    for (auto [r, f] : llvm::enumerate(stages)) {
      Emitter stage(meshRank, backend, bs);
      stage.text = &body;
      stage.tables = &tables;
      if (r)
        bs << "\n";
      if (failed(emitFunction(f, r ? stage : e, "forward_pp" + std::to_string(r) + "_")))
        return failure();
    }
    // The ranks of different stages run different collectives first, but
    // making a group (MPI_Comm_split) takes every rank: each makes them all,
    // in one order, before its stage runs.
    // So are the channels of the messages (NCCL's on CUDA): from the
    // sending rank to its peer.
    std::set<std::string> groups;
    std::set<std::tuple<std::string, int64_t, int64_t>> channels;
    for (auto [r, f] : llvm::enumerate(stages))
      f.walk([&](Operation *op) {
        if (auto axes = op->getAttrOfType<ArrayAttr>("mesh_axes"))
          groups.insert(strings(axes));
        if (auto send = dyn_cast<SendOp>(op))
          channels.insert({strings(send.getMeshAxes()), static_cast<int64_t>(r),
                           static_cast<int64_t>(send.getPeer())});
      });
    bs << "\nstatic std::vector<T::Tensor> forward(Context &ctx, State &s, "
          "const std::vector<T::Tensor> &in) {\n";
    for (const std::string &g : groups)
      bs << "  ctx.group(" << g << ");\n";
    for (auto &[axes, from, to] : channels)
      bs << "  ctx.pipelineChannel(" << axes << ", " << from << ", " << to << ");\n";
    bs << "  switch (ctx.coord("
       << quoted(pipeline.getAs<StringAttr>("axis").getValue()) << ")) {\n";
    for (size_t r = 0; r < stages.size(); ++r)
      bs << "  case " << r << ": return forward_pp" << r << "_(ctx, s, in);\n";
    bs << "  }\n  throw std::logic_error(\"tdx: no pipeline stage for this rank\");\n}\n";
  }
  for (size_t k = 1; k < functions.size(); ++k) {
    Emitter other(meshRank, backend, bs);
    other.text = &body;
    other.tables = &tables;
    bs << "\n";
    if (failed(emitFunction(functions[k], other, "entry" + std::to_string(k))))
      return failure();
  }

  if (backend == Backend::CUDA)
    os << "// Generated by tdx-translate --tdx-to-cuda from a partitioned tdx program.\n"
          "// Build: nvcc -std=c++17 this.cu -ltdx_runtime_cuda -lnccl -lcublas (tdx-compile "
          "--target cuda does it).\n"
          "#include \"tdx/Runtime/cuda/Lanes.cuh\"\n#include \"tdx/Runtime/cuda/Runtime.h\"\n\n"
          "#include <cmath>\n#include <stdexcept>\n\n"
          "namespace T = tdx::cu;\nusing namespace tdx::cu;\n\n";
  else
    os << "// Generated by tdx-translate --tdx-to-cpp from a partitioned tdx program.\n"
          "// Build: c++ -std=c++20 this.cpp -ltdx_runtime_cpu (tdx-compile does it).\n"
          "#include \"tdx/Runtime/Runtime.h\"\n\n"
          "#include <cmath>\n#include <stdexcept>\n\n"
          "namespace T = at;\nusing namespace tdx::rt;\n\n";
  bs.flush();
  shareParts(body);
  os << kernels << "\n" << tables.text() << "\n" << body << "\n";
  // describe(): the program for the runtime. main() runs it as a binary;
  // tdx_program() hands it to the runtime's in-process library
  // (lib/Runtime/Library.cpp) when the source is built as a shared object.
  // The parameters as constant tables (a push_back per parameter is a
  // function g++ compiles for seconds at 32 layers).
  if (!params.empty()) {
    os << "struct EmittedParam {\n  const char *name;\n  int dims, rank;\n  decltype(Program::Param::dtype) dtype;\n"
          "  const char *layout;\n};\nstatic const int64_t kParamDims[] = {";
    int64_t dims = 0;
    std::string rows;
    for (auto &[name, type, layout] : params) {
      for (int64_t d : type.getShape())
        os << d << ", ";
      rows += "    {\"" + name + "\", " + std::to_string(dims) + ", " +
              std::to_string(type.getRank()) + ", " + dtype(type.getElementType()) + ", \"" +
              layout + "\"},\n";
      dims += type.getRank();
    }
    os << "0};\nstatic const EmittedParam kParams[] = {\n" << rows << "};\n\n";
  }
  os << "static Program describe() {\n  Program p;\n";
  if (mesh) {
    os << "  p.meshShape = " << list(mesh.getShape()) << ";\n";
    os << "  p.axes = " << strings(mesh.getAxes()) << ";\n";
  }
  if (!params.empty())
    os << "  for (const EmittedParam &e : kParams)\n    p.params.push_back({e.name, "
          "std::vector<int64_t>(kParamDims + e.dims, kParamDims + e.dims + e.rank), e.dtype, "
          "e.layout});\n";
  for (auto &[name, owner] : tied)
    os << "  p.tied.push_back({\"" << name << "\", \"" << owner << "\"});\n";
  for (const std::string &name : nonPersistent)
    os << "  p.nonPersistent.push_back(\"" << name << "\");\n";
  for (const std::string &name : tables.needsParams)
    os << "  p.needsParams.push_back(\"" << name << "\");\n";
  auto values = [&](ArrayRef<std::pair<RankedTensorType, std::string>> vs) {
    std::string text = "{";
    for (auto [i, v] : llvm::enumerate(vs)) {
      auto &[type, layout] = v;
      text += (i ? ", {" : "{") + list(type.getShape()) + ", " + dtype(type.getElementType()) +
              ", \"" + layout + "\"}";
    }
    return text + "}";
  };
  for (auto &[type, layout] : sigs[0].inputs)
    os << "  p.inputs.push_back({" << list(type.getShape()) << ", " << dtype(type.getElementType())
       << ", \"" << layout << "\"});\n";
  for (auto &[type, layout] : sigs[0].outputs)
    os << "  p.outputs.push_back({" << list(type.getShape()) << ", "
       << dtype(type.getElementType()) << ", \"" << layout << "\"});\n";
  for (size_t k = 1; k < functions.size(); ++k)
    os << "  p.entries.push_back({\"" << functions[k].getSymName() << "\", "
       << values(sigs[k].inputs) << ", " << values(sigs[k].outputs) << ", entry" << k
       << "});\n";
  // What --verbose compares the step's measured working memory with.
  os << "  p.plannedStepBytes = " << plannedStepBytes << ";\n";
  os << "  p.arenaBytes = " << arenaBytes << ";\n";
  if (memoryPlan) {
    int64_t placedTensors = 0;
    for (Operation &op : fn.getBody().front())
      if (auto offsets = op.getAttrOfType<DenseI64ArrayAttr>(TdxDialect::kArenaAttrName))
        placedTensors += llvm::count_if(offsets.asArrayRef(), [](int64_t o) { return o >= 0; });
    *memoryPlan = {plannedStepBytes, arenaBytes, placedTensors};
  }
  os << "  p.init = init;\n  p.forward = forward;\n  return p;\n}\n\n"
        "int main(int argc, char **argv) { return runMain(argc, argv, describe()); }\n\n"
        "extern \"C\" const void *tdx_program() {\n"
        "  static const Program program = describe();\n  return &program;\n}\n";
  return success();
}

void mlir::tdx::cpp::Emitter::place(Operation *op) {
  auto offsets = op->getAttrOfType<DenseI64ArrayAttr>(TdxDialect::kArenaAttrName);
  if (!offsets)
    return;
  os << "  ctx.place({";
  llvm::interleaveComma(llvm::zip(offsets.asArrayRef(), allocatedTensors(op)), os, [&](auto slot) {
    auto type = cast<RankedTensorType>(std::get<1>(slot).getType());
    os << "{" << std::get<0>(slot) << ", "
       << type.getNumElements() * elementBytes(type.getElementType()) << "}";
  });
  os << "});\n";
}
