//===- Emitter.h - what the C++ and CUDA emitters share -----------*- C++ -*-===//
//
// Internal to lib/Target. The printing of a partitioned program as C++ on
// the CPU runtime or CUDA on the CUDA runtime is split by job:
//  - EmitText.cpp: the text of types, shapes, numbers and layouts;
//  - EmitOps.cpp: one runtime call per op (Emitter::emitOp), init programs
//    and generic aten ops' arguments;
//  - EmitKernels.cpp: fused elementwise kernels (CPU rows, CUDA launches);
//  - EmitCpp.cpp: the step as a whole: its parts, the handles it drops
//    (Lifetimes), the ABI the runtimes' drivers read, and main().
// What they print was decided by the tdx-backend passes: kernels are
// tdx.fused regions, collectives in flight tdx.start/tdx.wait pairs, and the
// memory plan and the parts attributes (tdx.arena, tdx.part).
//
//===----------------------------------------------------------------------===//

#ifndef TDX_LIB_TARGET_EMITTER_H
#define TDX_LIB_TARGET_EMITTER_H

#include "tdx/IR/TdxOps.h"
#include "tdx/Runtime/InitProgram.h"
#include "tdx/Target/Cpp.h"
#include "tdx/Target/Fusion.h"

#include "llvm/ADT/SetVector.h"
#include "llvm/ADT/StringSet.h"
#include "llvm/ADT/StringExtras.h"
#include "llvm/Support/raw_ostream.h"

#include <map>
#include <string>

namespace mlir::tdx::cpp {

/// The emitted dtype of element type `t` ("T::kFloat"), "" when none.
std::string dtype(Type t);
std::string runnableTypes(bool kernels = false);
/// "{2, 3}".
std::string list(ArrayRef<int64_t> xs);
/// A double as C++ text, exactly (INFINITY, NAN included).
std::string number(double v);
/// A C++ string literal of `s`.
std::string quoted(StringRef s);
/// A mesh's axis names as a C++ initializer list of strings.
std::string strings(ArrayAttr axes);
/// "[Shard(0), Replicate]" of `sharding` (all Replicate when null) on a
/// mesh of `rank` axes.
std::string layoutText(ShardingAttr sharding, int64_t rank);

/// The C type of a tensor value's elements.
std::string elem(Value v);
/// The CPU loop over one row of kernel `k` (see tdx::rt::KernelRow).
void emitKernelRow(const FusedKernel &k, llvm::raw_ostream &os);
/// The CUDA kernel of `k` that ends in a row op, and its launch.
void emitRowKernelLaunch(const FusedKernel &k, llvm::raw_ostream &os);
/// The CUDA kernel around `k`'s body (one thread per element) and its launch.
void emitKernelLaunch(const FusedKernel &k, llvm::raw_ostream &os);

/// Prints the step's ops, one runtime call each, into `os`.
class Emitter {
public:
  Emitter(int64_t meshRank, Backend backend, llvm::raw_ostream &os)
      : meshRank(meshRank), backend(backend), os(os) {}

  std::string name(Value v) {
    auto it = names.find(v);
    if (it != names.end())
      return it->second;
    return names[v] = "v" + std::to_string(names.size());
  }

  LogicalResult emitOp(Operation *op);
  /// The declaration of the local that holds `v`, which the current part
  /// of the step holds from here until `release` (see endPart).
  std::string decl(Value v) {
    declared.insert(v);
    return "T::Tensor " + name(v);
  }
  /// Drops the handles of `values` (see Lifetimes).
  void release(ArrayRef<Value> values) {
    for (Value v : values) {
      os << "  " << name(v) << " = T::Tensor();\n";
      declared.remove(v);
      if (auto it = slots.find(v); it != slots.end()) {
        freeSlots.push_back(it->second);
        slots.erase(it);
      }
    }
  }
  /// The step is emitted as parts (tdx.part, tdx-split-parts); `forward`
  /// calls them in order. A tensor still held where a part ends moves into
  /// a slot of `carry`, which every later part names with the tensor's
  /// name, until its release; the handles of collectives in flight go
  /// through `handles`.
  /// The step's arguments bound to their names.
  std::string bindArguments(ArrayRef<BlockArgument> args) {
    std::string text;
    for (BlockArgument arg : args)
      text += "  const T::Tensor &" + name(arg) + " = in[" + std::to_string(arg.getArgNumber()) +
              "];\n";
    return text;
  }
  /// The start of a part's function, with the step's arguments bound to
  /// their names.
  std::string partHeader(int part, ArrayRef<BlockArgument> args) {
    return "static std::vector<T::Tensor> " + function + std::to_string(part) +
           "(Context &ctx, State &s, const std::vector<T::Tensor> &in, uint64_t call, "
           "T::Tensor *carry, int64_t *handles) {\n  (void)call;\n  (void)carry;\n"
           "  (void)handles;\n" +
           bindArguments(args);
  }
  /// Ends the current part and opens the next.
  void endPart(ArrayRef<BlockArgument> args) {
    for (Value v : declared) {
      int64_t slot = carrySize();
      if (!freeSlots.empty())
        slot = freeSlots.pop_back_val();
      slots[v] = slot;
      os << "  carry[" << slot << "] = std::move(" << name(v) << ");\n";
    }
    declared.clear();
    for (auto [i, f] : llvm::enumerate(inFlight))
      os << "  handles[" << i << "] = " << f.second << ";\n";
    os << "  return {};\n}\n";
    finishPart();
    os << "\n" << partHeader(++parts, args);
    // In slot order, so the text does not depend on hashing.
    std::map<int64_t, Value> bySlot;
    for (auto [v, slot] : slots)
      bySlot[slot] = v;
    for (auto [slot, v] : bySlot)
      carried.push_back({name(v), "  T::Tensor &" + name(v) + " = carry[" +
                                      std::to_string(slot) + "];\n"});
    os.flush();
    bindAt = text ? text->size() : std::string::npos;
    if (!text)
      for (auto &binding : carried)
        os << binding.second;
    if (!text)
      carried.clear();
    for (auto [i, f] : llvm::enumerate(inFlight))
      os << "  const int64_t " << f.second << " = handles[" << i << "];\n";
    handed = std::max(handed, inFlight.size());
  }
  /// Binds, at the top of the part just emitted, the carried tensors it
  /// names: a part names a few, while the step carries every activation
  /// the backward reads (binding them all made the source quadratic in
  /// depth). Call once the part's text is written.
  void finishPart() {
    if (!text || bindAt == std::string::npos)
      return;
    os.flush();
    llvm::StringSet<> used;
    llvm::StringRef part = llvm::StringRef(*text).drop_front(bindAt);
    for (size_t i = 0; i < part.size(); ++i) {
      if (part[i] != 'v' || (i && (llvm::isAlnum(part[i - 1]) || part[i - 1] == '_')))
        continue;
      size_t j = i + 1;
      while (j < part.size() && llvm::isDigit(part[j]))
        ++j;
      if (j > i + 1 && (j == part.size() || !(llvm::isAlnum(part[j]) || part[j] == '_')))
        used.insert(part.slice(i, j));
      i = j - 1;
    }
    std::string bindings;
    for (auto &[local, binding] : carried)
      if (used.contains(local))
        bindings += binding;
    text->insert(bindAt, bindings);
    carried.clear();
    bindAt = std::string::npos;
  }
  /// The text `os` writes to, when parts are to bind only what they use.
  std::string *text = nullptr;
  size_t bindAt = std::string::npos;
  std::vector<std::pair<std::string, std::string>> carried;
  /// Values whose locals the current part declared, and the carried ones'
  /// slots; every slot ever made is taken or free.
  llvm::SetVector<Value> declared;
  DenseMap<Value, int64_t> slots;
  SmallVector<int64_t> freeSlots;
  size_t carrySize() const { return slots.size() + freeSlots.size(); }
  int parts = 0;
  size_t handed = 0;
  /// The C++ name of the entry being emitted (its parts are name0, ...).
  std::string function = "forward";
  /// Places the tensors the op emitted next allocates at their arena
  /// offsets (tdx.arena), and forgets those its op did not take.
  void place(Operation *op);
  void placed(Operation *op) {
    if (op->hasAttr(TdxDialect::kArenaAttrName))
      os << "  ctx.placed();\n";
  }
  /// Lets the collectives in flight move on after an op.
  void progress() {
    if (!inFlight.empty())
      os << "  ctx.progress();\n";
  }
  void emitKernelCall(FusedOp op);
  /// The kernel each tdx.fused runs (kernels of one text share one).
  DenseMap<Operation *, FusedKernel> kernels;
  FailureOr<std::string> atenArgument(AtenOp o, NamedAttribute kv);
  /// The init program of state `decl`, made in the box of `layout`.
  LogicalResult emitInit(Operation *decl, StringRef name, RankedTensorType type,
                         StringRef layout);
  /// Writes `program` with the init programs; returns its variable's name.
  std::string programVar(const ::tdx::rt::InitProgram &program);

  int64_t meshRank;
  Backend backend;
  /// The module's init programs as constant tables (every emitter of the
  /// module adds to one), and init()'s entries; text() goes before init().
  struct InitTables {
    std::vector<std::string> nodes;         // a tdx::rt::InitNodeData each
    std::vector<std::pair<size_t, size_t>> ranges; // a program's nodes
    std::map<std::string, std::string> arrays;      // initializer -> name
    std::string arraysText;
    std::vector<std::string> entries;       // init()'s: name, program, layout
    /// State whose init program cannot be made shard by shard: it must be
    /// given (--params, a checkpoint, a store).
    std::vector<std::string> needsParams;
    /// A static array of `type` holding `items` ("nullptr" when empty).
    std::string array(const std::string &type, const std::string &items);
    std::string text() const;
  };
  InitTables *tables = nullptr;
  llvm::raw_ostream &os;
  DenseMap<Value, std::string> names;
  /// Collectives started and not yet waited for: result -> handle variable.
  SmallVector<std::pair<Value, std::string>> inFlight;
  int tmps = 0;
  /// Whether the step sent a pipeline message (its return waits for them).
  bool sends = false;
};


} // namespace mlir::tdx::cpp

#endif // TDX_LIB_TARGET_EMITTER_H
