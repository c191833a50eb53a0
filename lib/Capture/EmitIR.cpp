//===- EmitIR.cpp - a recording as tdx IR, functionalized -----------------===//
//
// Replays a recording symbolically: every fake tensor gets an SSA value,
// in-place ops and writes through views become new values (a write into a
// view is scattered back into its base, and other views of the base are
// recomputed when next read), and each parameter's init program is the
// backward slice of its final value.
//
//===----------------------------------------------------------------------===//

#include "CaptureInternal.h"
#include "Functionalizer.h"

#include "tdx/IR/TdxOps.h"
#include "tdx/Transforms/Passes.h"

#include "mlir/Dialect/Arith/IR/Arith.h"
#include "mlir/Dialect/Func/IR/FuncOps.h"
#include "mlir/Dialect/Linalg/IR/Linalg.h"
#include "mlir/Dialect/Tensor/IR/Tensor.h"
#include "mlir/Analysis/SliceAnalysis.h"
#include "mlir/AsmParser/AsmParser.h"
#include "mlir/IR/Builders.h"
#include "mlir/IR/BuiltinOps.h"
#include "mlir/IR/Diagnostics.h"
#include "mlir/IR/IRMapping.h"
#include "mlir/IR/Verifier.h"
#include "mlir/Parser/Parser.h"
#include "mlir/Pass/PassManager.h"
#include "mlir/Transforms/Passes.h"
#include "llvm/ADT/ScopeExit.h"
#include "llvm/ADT/SetVector.h"

#include <ATen/ATen.h>

#include <unordered_set>
#include <ATen/core/dispatch/Dispatcher.h>

using namespace mlir;
using namespace mlir::tdx;
namespace capture = ::tdx::capture;
using ::tdx::capture::CaptureError;
using ::tdx::capture::RecordedOp;


using namespace ::tdx::capture::detail;


namespace tdx::capture {

std::string captureToMlir(const Recording &recording, const std::vector<StateEntry> &entries,
                          int64_t seed, const ForwardSpec *forward) {
  MLIRContext ctx;
  capture::registerProgramDialects(ctx);
  OpBuilder b(&ctx);
  Location loc = b.getUnknownLoc();
  OwningOpRef<ModuleOp> module = ModuleOp::create(loc);
  // The whole recording, functionalized, in a scratch function; each
  // declaration then takes the slice its value needs.
  b.setInsertionPointToEnd(module->getBody());
  auto scratch = func::FuncOp::create(b, loc, "__tdx_init", b.getFunctionType({}, {}));
  Block *body = scratch.addEntryBlock();
  b.setInsertionPointToEnd(body);
  Functionalizer f(b, loc, seed);
  f.run(recording.ops());
  std::vector<Value> finals;
  for (const StateEntry &e : entries)
    finals.push_back(e.tiedTo.empty() ? f.read(e.tensor) : Value());

  b.setInsertionPoint(scratch);
  for (auto [i, e] : llvm::enumerate(entries)) {
    RankedTensorType type = tensorType(b, e.tensor);
    auto tied = e.tiedTo.empty() ? FlatSymbolRefAttr() : FlatSymbolRefAttr::get(&ctx, e.tiedTo);
    Operation *decl =
        e.isBuffer ? BufferOp::create(b, loc, e.name, type, tied, ShardingAttr(), !e.persistent)
                         .getOperation()
                   : ParameterOp::create(b, loc, e.name, type, tied, ShardingAttr()).getOperation();
    if (tied)
      continue; // a tied name takes the value of the one it names: no init
    Region &region = decl->getRegion(0);
    Block *init = b.createBlock(&region);
    OpBuilder ib = OpBuilder::atBlockEnd(init);
    SetVector<Operation *> slice;
    BackwardSliceOptions options;
    options.inclusive = true;
    Value value = finals[i];
    if (Operation *def = value.getDefiningOp()) {
      (void)getBackwardSlice(def, &slice, options);
    }
    IRMapping map;
    for (Operation *op : slice)
      ib.clone(*op, map);
    Value yielded = map.lookupOrDefault(value);
    if (yielded.getType() != type)
      throw CaptureError("tdx: the init program of " + e.name + " ends in a " +
                         "value of another type");
    YieldOp::create(ib, loc, ValueRange{yielded});
    b.setInsertionPointAfter(decl);
  }
  scratch.erase();
  if (forward) {
    b.setInsertionPointToEnd(module->getBody());
    SmallVector<Type> inputs, outputs;
    for (const at::Tensor &t : forward->inputs)
      inputs.push_back(tensorType(b, t));
    for (const at::Tensor &t : forward->outputs)
      outputs.push_back(tensorType(b, t));
    auto fn = func::FuncOp::create(b, loc, forward->function, b.getFunctionType(inputs, outputs));
    Block *entry = fn.addEntryBlock();
    b.setInsertionPointToEnd(entry);
    Functionalizer g(b, loc, seed);
    // Parameters and buffers are read by name where the forward first uses
    // them (a tied name reads its owner).
    std::unordered_map<const c10::TensorImpl *, std::string> nameOf;
    std::unordered_map<const c10::StorageImpl *, std::pair<std::string, at::Tensor>> nameOfStorage;
    for (const StateEntry &e : entries) {
      nameOf.emplace(e.tensor.unsafeGetTensorImpl(), e.tiedTo.empty() ? e.name : e.tiedTo);
      if (e.tiedTo.empty())
        nameOfStorage.emplace(e.tensor.storage().unsafeGetStorageImpl(), std::make_pair(e.name, e.tensor));
    }
    g.resolver = [&](const at::Tensor &t) -> Value {
      auto it = nameOf.find(t.unsafeGetTensorImpl());
      std::string name;
      at::Tensor declared = t;
      if (it != nameOf.end()) {
        name = it->second;
      } else {
        auto st = nameOfStorage.find(t.storage().unsafeGetStorageImpl());
        if (st == nameOfStorage.end())
          return {};
        name = st->second.first;
        declared = st->second.second;
      }
      Value ref = ParamRefOp::create(b, loc, tensorType(b, declared),
                                     FlatSymbolRefAttr::get(&ctx, name));
      if (t.sizes() == declared.sizes() && t.strides() == declared.strides() &&
          t.storage_offset() == declared.storage_offset())
        return ref;
      // Another view of the parameter's storage that no recorded op made
      // (autograd's saved `weight.t()`, detached): as_strided of it, never
      // the parameter itself (a square weight's transpose has its shape).
      return asStrided(b, loc, ref, tensorType(b, t), t.sizes().vec(), t.strides().vec(),
                       t.storage_offset());
    };
    for (auto [i, t] : llvm::enumerate(forward->inputs))
      g.bindInput(t, entry->getArgument(i));
    g.run(forward->trace->ops, forward->outputs);
    SmallVector<Value> results;
    for (const at::Tensor &t : forward->outputs)
      results.push_back(g.read(t));
    if (forward->writeState)
      for (const StateEntry &e : entries) {
        if (!e.tiedTo.empty())
          continue;
        // A state the step did not write reads as its own param_ref.
        Value now = g.read(e.tensor);
        auto ref = now.getDefiningOp<ParamRefOp>();
        if (ref && ref.getName() == e.name) {
          if (ref->use_empty())
            ref->erase();
          continue;
        }
        if (now.getType() != tensorType(b, e.tensor))
          throw CaptureError("tdx: the step leaves " + e.name + " with another shape or dtype; "
                             "a training step keeps every state's type");
        AssignOp::create(b, loc, FlatSymbolRefAttr::get(&ctx, e.name), now);
      }
    func::ReturnOp::create(b, loc, results);
  }
  // Generic aten ops that tdx knows become first-class ops.
  {
    PassManager pm(&ctx);
    pm.addPass(createRaiseAten());
    std::string why;
    ScopedDiagnosticHandler handler(&ctx, [&](Diagnostic &d) {
      why += d.str() + "\n";
      return success();
    });
    if (failed(pm.run(*module)))
      throw CaptureError("tdx: raising the captured aten ops failed (a tdx bug): " + why);
  }
  if (failed(verify(*module))) {
    std::string text;
    llvm::raw_string_ostream os(text);
    module->print(os);
    throw CaptureError("tdx: the captured IR does not verify (a tdx bug); IR:\n" + text);
  }
  std::string text;
  llvm::raw_string_ostream os(text);
  module->print(os);
  return text;
}

} // namespace tdx::capture
