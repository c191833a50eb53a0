//===- FuseElementwise.cpp - elementwise chains as tdx.fused kernels ------===//
//
// Groups chains of elementwise ops over one iteration shape into
// `tdx.fused` regions, each of which the backends run as one kernel (the
// CPU backend loops its body over rows, the CUDA backend launches it). A
// kernel may end in a row op over the last dim, whose input the body
// computes; a linear whose every reader is fused leaves its bias to the
// kernels that read it.
//
//===----------------------------------------------------------------------===//

#include "tdx/IR/TdxOps.h"
#include "tdx/Transforms/Passes.h"
#include "tdx/Runtime/Rows.h"

#include "mlir/Dialect/Arith/IR/Arith.h"
#include "mlir/Dialect/Func/IR/FuncOps.h"
#include "mlir/IR/IRMapping.h"
#include "llvm/ADT/SetVector.h"

#include <optional>
#include <vector>

namespace mlir::tdx {
#define GEN_PASS_DEF_FUSEELEMENTWISE
#include "tdx/Transforms/Passes.h.inc"
} // namespace mlir::tdx

using namespace mlir;
using namespace mlir::tdx;

namespace {

using ::tdx::kern::kMaxOperands;

RankedTensorType tensorType(Value v) { return dyn_cast<RankedTensorType>(v.getType()); }
bool isFloatType(Type t) { return t.isF32() || t.isF64(); }

struct Kernel {
  /// Members in program order; the kernel runs where the last one stood.
  SmallVector<Operation *> ops;
  SmallVector<Value> inputs, outputs;
  RankedTensorType space;
  /// Inputs that are the result of a linear whose bias the kernel adds.
  SmallVector<std::pair<Value, Value>> biased;
};

struct FusionPlan {
  std::vector<Kernel> kernels;
  DenseMap<Operation *, unsigned> kernelOf;
  /// Splat constants whose every user is a kernel member (no tensor made).
  DenseSet<Operation *> inlinedConstants;
  /// The result of each linear whose every reader is a kernel member, and
  /// its bias: the linear runs without it and each kernel that reads the
  /// result adds it (the bias + activation epilogue of a linear).
  DenseMap<Value, Value> biasOf;
};

/// What a launch of a kernel of `members` takes: the tensors it reads, in
/// the order the members (in program order) first read them, and the member
/// results something else reads.
std::pair<SmallVector<Value>, SmallVector<Value>>
launchOperands(ArrayRef<Operation *> members, const DenseMap<Value, Value> &biasOf) {
  DenseSet<Operation *> in(members.begin(), members.end());
  llvm::SetVector<Value> reads;
  SmallVector<Value> outputs;
  for (Operation *op : members) {
    for (Value v : op->getOperands())
      if (!in.contains(v.getDefiningOp()) && !splatValue(v)) {
        reads.insert(v);
        if (Value bias = biasOf.lookup(v))
          reads.insert(bias);
      }
    Value r = op->getResult(0);
    if (llvm::any_of(r.getUsers(), [&](Operation *u) { return !in.contains(u); }))
      outputs.push_back(r);
  }
  return {reads.takeVector(), outputs};
}

FusionPlan planFusion(Block &block) {
  FusionPlan plan;
  // Every fusable op is a kernel member: a linear read by fusable ops only
  // leaves its bias to them. (cuBLAS's gemm cannot add it on the way; ATen's
  // addmm can, but no faster than the kernel's add, which a CPU step then
  // shares with the CUDA one.)
  for (Operation &op : block)
    if (auto linear = dyn_cast<LinearOp>(op)) {
      Value bias = linear.getBias(), y = linear.getResult();
      auto type = bias ? tensorType(bias) : RankedTensorType();
      if (!type || type.getRank() != 1 || !isFloatType(type.getElementType()) ||
          type.getElementType() != tensorType(y).getElementType() || splatValue(bias) ||
          y.use_empty() || !llvm::all_of(y.getUsers(), isFusable))
        continue;
      plan.biasOf[y] = bias;
    }
  std::vector<bool> open;
  auto kernelOf = [&](Value v) -> std::optional<unsigned> {
    Operation *def = v.getDefiningOp();
    auto it = def ? plan.kernelOf.find(def) : plan.kernelOf.end();
    if (it == plan.kernelOf.end())
      return std::nullopt;
    return it->second;
  };
  for (Operation &op : block) {
    if (isa<CastOp>(op) && splatValue(op.getResult(0)))
      continue; // a constant: inlined into the kernels that read it
    // A row op ends the open kernel over its shape that makes its input.
    if (std::optional<unsigned> k = isRowOp(&op) ? kernelOf(op.getOperand(0)) : std::nullopt;
        k && open[*k] && plan.kernels[*k].space.getShape() ==
                             tensorType(op.getResult(0)).getShape()) {
      SmallVector<Operation *> members(plan.kernels[*k].ops);
      members.push_back(&op);
      auto [reads, outputs] = launchOperands(members, plan.biasOf);
      if (reads.size() + outputs.size() <= static_cast<size_t>(kMaxOperands)) {
        for (Value v : op.getOperands())
          if (auto other = kernelOf(v))
            open[*other] = false;
        plan.kernels[*k].ops.push_back(&op);
        plan.kernelOf[&op] = *k;
        continue;
      }
    }
    if (!isFusable(&op)) {
      // A kernel whose value is used here runs before this op: close it.
      for (Value v : op.getOperands())
        if (auto k = kernelOf(v))
          open[*k] = false;
      continue;
    }
    auto space = tensorType(op.getResult(0));
    // The open kernels over this shape that `op` reads: it joins the first,
    // and the others merge into it (an open kernel's values are read by its
    // own members only, so it may run later, where `op` stands), as long as
    // the merged kernel's operands fit a launch.
    std::optional<unsigned> join;
    for (Value v : op.getOperands()) {
      std::optional<unsigned> k = kernelOf(v);
      if (!k || !open[*k] || k == join || plan.kernels[*k].space.getShape() != space.getShape())
        continue;
      SmallVector<Operation *> members{&op};
      if (join)
        members.append(plan.kernels[*join].ops.begin(), plan.kernels[*join].ops.end());
      members.append(plan.kernels[*k].ops.begin(), plan.kernels[*k].ops.end());
      auto [reads, outputs] = launchOperands(members, plan.biasOf);
      if (reads.size() + outputs.size() > static_cast<size_t>(kMaxOperands))
        continue;
      if (!join) {
        join = k;
        continue;
      }
      Kernel &into = plan.kernels[*join], &from = plan.kernels[*k];
      for (Operation *m : from.ops)
        plan.kernelOf[m] = *join;
      into.ops.append(from.ops.begin(), from.ops.end());
      llvm::sort(into.ops, [](Operation *a, Operation *b) { return a->isBeforeInBlock(b); });
      from.ops.clear();
      open[*k] = false;
    }
    for (Value v : op.getOperands())
      if (auto k = kernelOf(v); k && k != join)
        open[*k] = false;
    if (!join) {
      join = plan.kernels.size();
      Kernel k;
      k.space = space;
      plan.kernels.push_back(std::move(k));
      open.push_back(true);
    }
    plan.kernels[*join].ops.push_back(&op);
    plan.kernelOf[&op] = *join;
  }

  for (Kernel &k : plan.kernels) {
    std::tie(k.inputs, k.outputs) = launchOperands(k.ops, plan.biasOf);
    for (Value v : k.inputs)
      if (Value bias = plan.biasOf.lookup(v))
        k.biased.push_back({v, bias});
  }

  // Splat constants only kernels read need no tensor (users come later in
  // the block, so walking backwards sees them first).
  for (Operation &op : llvm::reverse(block)) {
    if (!isa<FullOp, arith::ConstantOp, CastOp>(op) || !splatValue(op.getResult(0)) ||
        op.getResult(0).use_empty())
      continue;
    if (llvm::all_of(op.getResult(0).getUsers(), [&](Operation *u) {
          return plan.kernelOf.count(u) || plan.inlinedConstants.contains(u);
        }))
      plan.inlinedConstants.insert(&op);
    else if (isa<CastOp>(op)) {
      // Read by something else too: it is a kernel of its own.
      Kernel k;
      k.space = tensorType(op.getResult(0));
      k.ops.push_back(&op);
      k.outputs.push_back(op.getResult(0));
      plan.kernelOf[&op] = plan.kernels.size();
      plan.kernels.push_back(std::move(k));
    }
  }
  return plan;
}


/// Clones the splat constant `v` (a cast of one included) into the body
/// `b` builds, once.
Value cloneConstant(OpBuilder &b, Value v, IRMapping &map) {
  if (Value known = map.lookupOrNull(v))
    return known;
  Operation *def = v.getDefiningOp();
  for (Value operand : def->getOperands())
    cloneConstant(b, operand, map);
  return b.clone(*def, map)->getResult(0);
}

/// Builds kernel `k`'s tdx.fused where its last member stands; its members
/// stay until every kernel is built (buildKernels).
FusedOp buildKernel(const Kernel &k) {
  Operation *last = k.ops.back();
  OpBuilder b(last);
  SmallVector<Type> resultTypes;
  for (Value v : k.outputs)
    resultTypes.push_back(v.getType());
  auto fused = FusedOp::create(b, last->getLoc(), resultTypes, k.inputs);
  Block *body = b.createBlock(&fused.getBody());
  IRMapping map;
  for (Value v : k.inputs)
    map.map(v, body->addArgument(v.getType(), v.getLoc()));
  // The bias a linear left to its readers, added first.
  for (auto [y, bias] : k.biased)
    map.map(y, AddOp::create(b, y.getLoc(), y.getType(), map.lookup(y), map.lookup(bias)).getResult());
  for (Operation *op : k.ops) {
    for (Value v : op->getOperands())
      if (!map.contains(v))
        cloneConstant(b, v, map);
    b.clone(*op, map);
  }
  SmallVector<Value> yielded;
  for (Value v : k.outputs)
    yielded.push_back(map.lookup(v));
  YieldOp::create(b, last->getLoc(), yielded);
  return fused;
}

/// Replaces the kernels' members by tdx.fused ops (a kernel nothing reads
/// is erased), and the splat constants only they read.
void buildKernels(const FusionPlan &plan) {
  SmallVector<std::pair<const Kernel *, FusedOp>> built;
  DenseSet<Operation *> members;
  for (const Kernel &k : plan.kernels) {
    members.insert(k.ops.begin(), k.ops.end());
    if (!k.ops.empty() && !k.outputs.empty())
      built.push_back({&k, buildKernel(k)});
  }
  for (auto [k, fused] : built)
    for (auto [v, r] : llvm::zip(k->outputs, fused.getResults()))
      Value(v).replaceUsesWithIf(r, [&](OpOperand &use) { return !members.contains(use.getOwner()); });
  SmallVector<Operation *> dead(members.begin(), members.end());
  dead.append(plan.inlinedConstants.begin(), plan.inlinedConstants.end());
  // Users first: they come later in the block.
  llvm::sort(dead, [](Operation *a, Operation *b) { return b->isBeforeInBlock(a); });
  for (Operation *op : dead)
    if (op->use_empty())
      op->erase();
}

struct FuseElementwisePass : public mlir::tdx::impl::FuseElementwiseBase<FuseElementwisePass> {
  void runOnOperation() override {
    getOperation().walk([&](func::FuncOp fn) {
      if (!fn.getBody().hasOneBlock())
        return;
      FusionPlan plan = planFusion(fn.getBody().front());
      for (auto [y, bias] : plan.biasOf)
        cast<LinearOp>(y.getDefiningOp()).getBiasMutable().clear();
      buildKernels(plan);
    });
  }
};

} // namespace
