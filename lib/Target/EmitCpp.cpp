//===- EmitCpp.cpp - tdx programs as C++ on the CPU runtime ---------------===//
//
// The step as a whole (Emitter.h says where the rest is): lifetimes and the
// arena plan, the step's parts, the signature the runtimes' drivers read,
// and main().
//
//===----------------------------------------------------------------------===//

#include "Emitter.h"
#include "tdx/Target/Cpp.h"
#include "tdx/Dialect/TdxOps.h"
#include "tdx/Target/Fusion.h"
#include "tdx/Sharding/Layout.h"
#include "tdx/Target/InitEvaluator.h"

#include "mlir/Dialect/Arith/IR/Arith.h"
#include "mlir/Dialect/Func/IR/FuncOps.h"
#include "llvm/ADT/TypeSwitch.h"
#include "llvm/Support/FormatVariadic.h"

#include <algorithm>
#include <cmath>
#include <map>
#include <utility>

using namespace mlir;
using namespace mlir::tdx;
using namespace mlir::tdx::cpp;

namespace {

/// Where each tensor the step makes is last needed, so the emitted code
/// drops its handle there and ATen (or the CUDA pool) reuses the buffer for
/// what comes next, instead of every intermediate living until the step
/// returns; and where each state write goes. A value is read where its
/// reader is emitted: an op where it stands, a fused kernel where its last
/// member stands. Arguments, returned values and written values live on.
///
/// A state written once, by a value an op makes, is written right after
/// both that op and the last param_ref of the state (a captured step
/// assigns everything at its end): every param_ref still reads the value
/// the state had on entry, and the old tensor is freed as soon as its last
/// reader is done, so an update holds one copy of the state, not two, as
/// an update in place would. Other writes happen when the step returns.
class Lifetimes {
public:
  using Write = std::pair<std::string, Value>; // state key, new value

  Lifetimes(Block &block, const FusionPlan &plan) {
    DenseSet<Value> kept(block.getArguments().begin(), block.getArguments().end());
    DenseMap<Value, Operation *> last;
    SmallVector<Value> made;
    std::map<std::string, SmallVector<AssignOp>> assigns;
    std::map<std::string, SmallVector<ParamRefOp>> refs;
    for (Operation &op : block) {
      if (plan.inlinedConstants.contains(&op))
        continue;
      if (auto a = dyn_cast<AssignOp>(op))
        assigns[stateKey(a, a.getNameAttr())].push_back(a);
      if (isa<AssignOp, func::ReturnOp>(op)) {
        kept.insert(op.operand_begin(), op.operand_end());
        continue;
      }
      if (auto r = dyn_cast<ParamRefOp>(op))
        refs[stateKey(r, r.getNameAttr())].push_back(r);
      ArrayRef<Value> reads, results;
      SmallVector<Value> operands(op.getOperands()), opResults(op.getResults());
      if (auto it = plan.kernelOf.find(&op); it != plan.kernelOf.end()) {
        const FusedKernel &k = plan.kernels[it->second];
        if (k.ops.back() != &op || k.outputs.empty())
          continue;
        reads = k.inputs;
        results = k.outputs;
      } else {
        reads = operands;
        results = opResults;
      }
      position[&op] = static_cast<int64_t>(points.size());
      points.push_back(&op);
      for (Value v : reads) {
        last[v] = &op;
        firstReader.try_emplace(v, &op);
      }
      resultsAt[&op].assign(results.begin(), results.end());
      for (Value v : results) {
        last[v] = &op; // a result nobody reads ends where it is made
        madeAt[v] = position[&op];
        made.push_back(v);
      }
    }
    // A started reduce_scatter's or all_gather's input is read until the
    // wait, where its result is first read (the return, when nothing else
    // reads it).
    for (Operation *op : points)
      if (isa<ReduceScatterOp, AllGatherOp>(op)) {
        Value input = op->getOperand(0);
        Operation *wait = firstReader.lookup(op->getResult(0));
        if (!wait)
          kept.insert(input);
        else if (position.lookup(wait) > position.lookup(last[input]))
          last[input] = wait;
      }
    for (Value v : made)
      // A collective nobody reads is waited for when the step returns.
      if (!kept.contains(v) && !(isAsyncCollective(v.getDefiningOp()) && last[v] == v.getDefiningOp()))
        ending[last[v]].push_back(v);
    plan_(made, kept, last, assigns, refs);
  }

  /// The values whose last reader (or maker) is `op`, in program order.
  ArrayRef<Value> endingAt(Operation *op) const { return lookup(ending, op); }
  /// The state writes that go right after `op`.
  ArrayRef<Write> writesAt(Operation *op) const { return lookup(writes, op); }
  /// The state writes that go when the step returns: by state, each
  /// state's in program order.
  ArrayRef<Write> writesAtReturn() const { return atReturn; }

  /// The most bytes of the step's own tensors alive at once (the step's
  /// working memory): each tensor from where it is made to where the last
  /// reader of it or of a view of it stands (returned and written values: to
  /// the end), less each state's old tensor from where it is freed. Views,
  /// parameters and arguments hold no bytes of their own; ATen's workspaces
  /// are not seen.
  int64_t peakBytes() const { return peak; }

  /// The memory plan: every tensor the step makes and drops within the step
  /// (not a view, not returned, not written to a state, not a collective
  /// nobody waits for before the return) gets an offset in one arena, and
  /// tensors alive at once get disjoint ranges of 64-byte lines (greedy by
  /// size: the largest first, each at the lowest offset that fits). The
  /// slots of the results `op` makes, in result order (offset, bytes; -1:
  /// not planned), none when it makes no planned tensor.
  ArrayRef<std::pair<int64_t, int64_t>> slotsAt(Operation *op) const {
    return lookup(slots, op);
  }
  /// The arena's bytes: the end of its highest slot.
  int64_t arenaBytes() const { return arena; }
  /// The tensors placed in it.
  int64_t arenaTensors() const { return placedTensors; }

private:
  template <class T>
  static ArrayRef<T> lookup(const DenseMap<Operation *, SmallVector<T>> &m, Operation *op) {
    auto it = m.find(op);
    return it == m.end() ? ArrayRef<T>() : ArrayRef<T>(it->second);
  }
  static bool isView(Operation *op) {
    return isa<ReshapeOp, TransposeOp, PermuteOp, SliceOp, ExpandOp>(op);
  }
  static int64_t bytesOf(Value v) {
    auto t = dyn_cast<RankedTensorType>(v.getType());
    return t && t.hasStaticShape() ? t.getNumElements() * elementBytes(t.getElementType()) : 0;
  }

  void plan_(ArrayRef<Value> made, const DenseSet<Value> &kept, DenseMap<Value, Operation *> &last,
             std::map<std::string, SmallVector<AssignOp>> &assigns,
             std::map<std::string, SmallVector<ParamRefOp>> &refs) {
    int64_t end = static_cast<int64_t>(points.size());
    // The tensor whose storage each value uses (null: not the step's, or a
    // state's), and where that storage is last needed.
    DenseMap<Value, Value> root;
    DenseMap<Value, int64_t> until;
    DenseMap<Value, std::string> stateOf; // param_ref results and views of them
    std::map<std::string, int64_t> lastStateRead;
    for (Value v : made) {
      Operation *def = v.getDefiningOp();
      if (auto r = dyn_cast<ParamRefOp>(def))
        stateOf[v] = stateKey(r, r.getNameAttr());
      else if (isView(def) && stateOf.count(def->getOperand(0)))
        stateOf[v] = stateOf[def->getOperand(0)];
      if (auto it = stateOf.find(v); it != stateOf.end())
        lastStateRead[it->second] = std::max(lastStateRead[it->second], position.lookup(last[v]));
      Value r = stateOf.count(v) ? Value() : isView(def) ? root.lookup(def->getOperand(0)) : v;
      root[v] = r;
      if (r)
        until[r] = std::max(until.lookup(r), kept.contains(v) ? end : position.lookup(last[v]));
    }
    std::vector<int64_t> grow(end + 1, 0), shrink(end + 1, 0);
    for (Value v : made)
      if (root.lookup(v) == v) {
        grow[madeAt.lookup(v)] += bytesOf(v);
        shrink[until.lookup(v)] += bytesOf(v);
      }
    for (auto &[key, ops] : assigns) {
      Value value = ops.front().getValue();
      Operation *maker = value.getDefiningOp();
      if (ops.size() != 1 || !maker || isAsyncCollective(maker) || !madeAt.count(value)) {
        for (AssignOp a : ops)
          atReturn.push_back({key, a.getValue()});
        continue;
      }
      int64_t at = madeAt.lookup(value);
      for (ParamRefOp r : refs[key])
        at = std::max(at, position.lookup(r));
      writes[points[at]].push_back({key, value});
      // The old tensor (of the state's type, the value's) goes with its
      // last handle.
      shrink[std::max(at, lastStateRead.count(key) ? lastStateRead[key] : at)] += bytesOf(value);
    }
    int64_t live = 0;
    for (int64_t i = 0; i <= end; ++i) {
      live += grow[i];
      peak = std::max(peak, live);
      live -= shrink[i];
    }
    assignOffsets(made, kept, last, root, until);
  }

  struct Planned {
    Value value;
    int64_t bytes, from, to, offset = 0;
  };

  void assignOffsets(ArrayRef<Value> made, const DenseSet<Value> &kept,
                     DenseMap<Value, Operation *> &last, const DenseMap<Value, Value> &root,
                     const DenseMap<Value, int64_t> &until) {
    int64_t end = static_cast<int64_t>(points.size());
    std::vector<Planned> planned;
    for (Value v : made) {
      int64_t bytes = (bytesOf(v) + 63) / 64 * 64;
      Operation *def = v.getDefiningOp();
      if (root.lookup(v) != v || bytes == 0 || until.lookup(v) >= end || kept.contains(v) ||
          (isAsyncCollective(def) && last[v] == def))
        continue;
      planned.push_back({v, bytes, madeAt.lookup(v), until.lookup(v)});
    }
    std::vector<size_t> order(planned.size());
    for (size_t i = 0; i < order.size(); ++i)
      order[i] = i;
    std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) {
      return planned[a].bytes != planned[b].bytes ? planned[a].bytes > planned[b].bytes
                                                  : planned[a].from < planned[b].from;
    });
    std::vector<const Planned *> done, overlapping;
    for (size_t i : order) {
      Planned &t = planned[i];
      overlapping.clear();
      for (const Planned *o : done)
        if (o->from <= t.to && t.from <= o->to)
          overlapping.push_back(o);
      llvm::sort(overlapping, [](const Planned *a, const Planned *b) { return a->offset < b->offset; });
      for (const Planned *o : overlapping) {
        if (t.offset + t.bytes <= o->offset)
          break;
        t.offset = std::max(t.offset, o->offset + o->bytes);
      }
      arena = std::max(arena, t.offset + t.bytes);
      done.push_back(&t);
    }
    placedTensors = static_cast<int64_t>(planned.size());
    DenseMap<Value, std::pair<int64_t, int64_t>> slotOf;
    for (const Planned &t : planned)
      slotOf[t.value] = {t.offset, bytesOf(t.value)};
    // Every result, so the runtime matches allocations to results in
    // order: one the plan leaves out has offset -1.
    for (Operation *op : points) {
      SmallVector<std::pair<int64_t, int64_t>> here;
      bool any = false;
      for (Value v : resultsAt.lookup(op)) {
        auto it = slotOf.find(v);
        any |= it != slotOf.end();
        here.push_back(it != slotOf.end() ? it->second : std::make_pair(int64_t(-1), bytesOf(v)));
      }
      if (any)
        slots[op] = std::move(here);
    }
  }

  SmallVector<Operation *> points; // emission points in order
  DenseMap<Operation *, int64_t> position;
  DenseMap<Value, int64_t> madeAt;
  DenseMap<Operation *, SmallVector<Value>> ending;
  DenseMap<Operation *, SmallVector<Write>> writes;
  SmallVector<Write> atReturn;
  DenseMap<Operation *, SmallVector<Value>> resultsAt;
  DenseMap<Value, Operation *> firstReader;
  DenseMap<Operation *, SmallVector<std::pair<int64_t, int64_t>>> slots;
  int64_t peak = 0, arena = 0, placedTensors = 0;
};

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
                               "f32/f64/f16/bf16/i64/i32/i1";
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
                            << ", which the CPU backend cannot return";
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

} // namespace

LogicalResult mlir::tdx::emitCpp(ModuleOp module, llvm::raw_ostream &os, Backend backend,
                                 MemoryPlan *memoryPlan, int64_t partBytes) {
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
  auto fn = module.lookupSymbol<func::FuncOp>("forward");
  if (!fn) {
    SmallVector<func::FuncOp> fns(module.getOps<func::FuncOp>());
    if (fns.size() != 1)
      return module.emitError() << backendName
                                << " needs one entry function (named @forward when there are "
                                   "several)";
    fn = fns.front();
  }
  if (!fn.getBody().hasOneBlock())
    return fn.emitError() << "has more than one block; " << backendName
                          << " emits straight-line code";
  int64_t meshRank = mesh ? mesh.getShape().size() : 0;
  FailureOr<Signature> sig = signatureOf(fn, meshRank);
  if (failed(sig))
    return failure();

  std::string body;
  llvm::raw_string_ostream bs(body);
  Emitter e(meshRank, backend, bs);
  e.partBytes = partBytes;

  bs << "static void init(Context &ctx, State &s) {\n";
  SmallVector<std::tuple<std::string, RankedTensorType, std::string>> params;
  for (Operation &op : module.getBody()->getOperations()) {
    if (!isa<ParameterOp, BufferOp>(op))
      continue;
    auto name = op.getAttrOfType<StringAttr>(SymbolTable::getSymbolAttrName()).getValue();
    auto type = cast<RankedTensorType>(op.getAttrOfType<TypeAttr>("type").getValue());
    auto sharding = op.getAttrOfType<ShardingAttr>("sharding");
    if (op.getAttr("tied_to"))
      continue;
    if (dtype(type.getElementType()).empty())
      return op.emitOpError() << "has element type " << type.getElementType()
                              << ", which the CPU backend does not support";
    params.push_back({name.str(), type, layoutText(sharding, meshRank)});
    if (failed(e.emitInit(&op, name, type, sharding)))
      return failure();
  }
  bs << "}\n\n";

  // One function, or (a long step) the first of its parts: see maybeEndPart.
  uint64_t forwardStart = bs.tell();
  std::string header = "static std::vector<T::Tensor> forward(Context &ctx, State &s, "
                       "const std::vector<T::Tensor> &in) {\n"
                       // The call's index, which the random ops of the function draw with.
                       "  const uint64_t call = ctx.nextCall();\n  (void)call;\n" +
                       e.bindArguments(fn.getArguments());
  bs << header;
  e.partStart = bs.tell();
  FusionPlan plan = planFusion(fn.getBody().front());
  for (auto [y, bias] : plan.biasOf)
    e.biasInKernels.insert(y);
  // Kernels with one text share one function (an optimizer's update repeated
  // per parameter compiles once); `kernels` holds each text once.
  std::string kernels;
  llvm::raw_string_ostream ks(kernels);
  std::map<std::string, std::string> byText;
  for (FusedKernel &k : plan.kernels) {
    if (k.outputs.empty())
      continue;
    std::string own = std::exchange(k.name, "TDX_KERNEL"), text;
    llvm::raw_string_ostream ts(text);
    emitKernelBody(k, ts);
    if (backend == Backend::CUDA)
      emitKernelLaunch(k, ts);
    else
      emitKernelRow(k, ts);
    auto [it, inserted] = byText.try_emplace(text, own);
    k.name = it->second;
    if (!inserted)
      continue;
    for (llvm::StringRef rest = text; !rest.empty();) {
      auto [head, tail] = rest.split("TDX_KERNEL");
      ks << head;
      if (tail.size() != rest.size() - head.size())
        ks << own;
      rest = tail;
    }
  }
  Lifetimes lifetimes(fn.getBody().front(), plan);
  int64_t plannedStepBytes = lifetimes.peakBytes();
  for (Operation &op : fn.getBody().front()) {
    if (plan.inlinedConstants.contains(&op))
      continue;
    if (auto it = plan.kernelOf.find(&op); it != plan.kernelOf.end()) {
      const FusedKernel &k = plan.kernels[it->second];
      if (k.ops.back() == &op && !k.outputs.empty()) {
        e.waitFor(k.inputs);
        e.place(lifetimes.slotsAt(&op));
        e.emitKernelCall(k);
        e.placed(lifetimes.slotsAt(&op));
        e.writeStates(lifetimes.writesAt(&op));
        e.release(lifetimes.endingAt(&op));
        e.progress();
        e.maybeEndPart(fn.getArguments());
      }
      continue;
    }
    e.waitFor(SmallVector<Value>(op.getOperands()));
    if (isa<func::ReturnOp>(op)) {
      e.waitAll();
      e.writeStates(lifetimes.writesAtReturn());
    }
    e.place(lifetimes.slotsAt(&op));
    if (failed(e.emitOp(&op)))
      return failure();
    e.placed(lifetimes.slotsAt(&op));
    e.writeStates(lifetimes.writesAt(&op));
    e.release(lifetimes.endingAt(&op));
    e.progress();
    if (!isa<func::ReturnOp>(op))
      e.maybeEndPart(fn.getArguments());
  }
  bs << "}\n";
  if (e.parts) {
    // The parts, then the step that calls them.
    body.replace(forwardStart, header.size(), e.partHeader(0, fn.getArguments()));
    bs << "\nstatic std::vector<T::Tensor> forward(Context &ctx, State &s, "
          "const std::vector<T::Tensor> &in) {\n"
          "  const uint64_t call = ctx.nextCall();\n"
          "  std::vector<T::Tensor> carry("
       << e.carrySize() << ");\n  std::vector<int64_t> handles(" << e.handed << ");\n";
    for (int i = 0; i < e.parts; ++i)
      bs << "  forward" << i << "(ctx, s, in, call, carry.data(), handles.data());\n";
    bs << "  return forward" << e.parts
       << "(ctx, s, in, call, carry.data(), handles.data());\n}\n";
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
          "// Build: c++ -std=c++17 this.cpp -ltdx_runtime_cpu (tdx-compile does it).\n"
          "#include \"tdx/Runtime/Runtime.h\"\n\n"
          "#include <cmath>\n#include <stdexcept>\n\n"
          "namespace T = at;\nusing namespace tdx::rt;\n\n";
  os << kernels << "\n" << e.initText << "\n" << body << "\n";
  os << "int main(int argc, char **argv) {\n  Program p;\n";
  if (mesh) {
    os << "  p.meshShape = " << list(mesh.getShape()) << ";\n";
    os << "  p.axes = " << strings(mesh.getAxes()) << ";\n";
  }
  for (auto &[name, type, layout] : params)
    os << "  p.params.push_back({\"" << name << "\", " << list(type.getShape()) << ", "
       << dtype(type.getElementType()) << ", \"" << layout << "\"});\n";
  for (auto &[type, layout] : sig->inputs)
    os << "  p.inputs.push_back({" << list(type.getShape()) << ", " << dtype(type.getElementType())
       << ", \"" << layout << "\"});\n";
  for (auto &[type, layout] : sig->outputs)
    os << "  p.outputs.push_back({" << list(type.getShape()) << ", "
       << dtype(type.getElementType()) << ", \"" << layout << "\"});\n";
  // What --verbose compares the step's measured working memory with.
  os << "  p.plannedStepBytes = " << plannedStepBytes << ";\n";
  os << "  p.arenaBytes = " << lifetimes.arenaBytes() << ";\n";
  if (memoryPlan)
    *memoryPlan = {plannedStepBytes, lifetimes.arenaBytes(), lifetimes.arenaTensors()};
  os << "  p.init = init;\n  p.forward = forward;\n  return runMain(argc, argv, p);\n}\n";
  return success();
}
