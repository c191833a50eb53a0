//===- Fusion.cpp - elementwise kernels shared by the tdx backends --------===//

#include "tdx/Target/Fusion.h"
#include "tdx/Dialect/TdxOps.h"
#include "tdx/Runtime/Rows.h"

#include "mlir/Dialect/Arith/IR/Arith.h"
#include "llvm/ADT/SetVector.h"
#include "llvm/ADT/TypeSwitch.h"
#include "llvm/Support/FormatVariadic.h"

#include <cmath>

using namespace mlir;
using namespace mlir::tdx;

namespace {

// What one kernel launch takes (tdx::kern::Iter): rank, inputs plus outputs.
using ::tdx::kern::kMaxOperands;
using ::tdx::kern::kMaxRank;

RankedTensorType tensorType(Value v) { return dyn_cast<RankedTensorType>(v.getType()); }

bool isFloatType(Type t) { return t.isF32() || t.isF64(); }

/// The scalar a splat constant holds, if `v` is one (casts of splat
/// constants included: the literal is converted as the cast would).
std::optional<double> splatValue(Value v) {
  Operation *def = v.getDefiningOp();
  if (auto c = dyn_cast_or_null<CastOp>(def))
    return splatValue(c.getInput());
  if (auto full = dyn_cast_or_null<FullOp>(def))
    return full.getValue().convertToDouble();
  if (auto c = dyn_cast_or_null<arith::ConstantOp>(def)) {
    auto dense = dyn_cast<DenseElementsAttr>(c.getValue());
    if (!dense || !dense.isSplat())
      return std::nullopt;
    if (isa<FloatType>(dense.getElementType()))
      return dense.getSplatValue<APFloat>().convertToDouble();
    if (dense.getElementType().isInteger(1))
      return dense.getSplatValue<bool>() ? 1.0 : 0.0;
    if (dense.getElementType().isIntOrIndex())
      return static_cast<double>(dense.getSplatValue<APInt>().getSExtValue());
  }
  return std::nullopt;
}

std::string literal(double v) {
  if (std::isinf(v))
    return v > 0 ? "INFINITY" : "-INFINITY";
  if (std::isnan(v))
    return "NAN";
  return llvm::formatv("{0:e17}", v).str();
}

} // namespace

std::string mlir::tdx::cType(Type t) {
#define TDX_DTYPE(Name, stored, bytes, aten, ctype, mlir)                                  \
  if (t.mlir)                                                                              \
    return ctype;
#include "tdx/Runtime/DTypes.def"
  return "";
}

bool mlir::tdx::isElementwise(Operation *op) {
  return op->hasTrait<OpTrait::TdxTableElementwise>() || isa<CmpOp, WhereOp, GeluOp, CastOp>(op);
}

bool mlir::tdx::isFusable(Operation *op) {
  if (!isElementwise(op))
    return false;
  auto result = tensorType(op->getResult(0));
  if (!result || result.getRank() > kMaxRank || cType(result.getElementType()).empty())
    return false;
  for (Value v : op->getOperands()) {
    auto t = tensorType(v);
    if (!t || cType(t.getElementType()).empty())
      return false;
  }
  // Integer division and powers follow torch's type promotion, not C's.
  if (isa<DivOp, PowOp>(op) && !isFloatType(result.getElementType()))
    return false;
  return true;
}

bool mlir::tdx::isRowOp(Operation *op) {
  if (!isa<SoftmaxOp, LogSoftmaxOp, LayerNormOp, RmsNormOp>(op))
    return false;
  auto type = tensorType(op->getOperand(0));
  if (!type || type.getRank() < 1 || type.getRank() > kMaxRank ||
      !isFloatType(type.getElementType()) || op->getResult(0).getType() != type ||
      op->getResult(0).use_empty())
    return false;
  int64_t rank = type.getRank();
  // Over the last dim only; a norm's weight and bias are of that dim.
  if (auto s = dyn_cast<SoftmaxOp>(op))
    return static_cast<int64_t>(s.getDim()) == rank - 1 || static_cast<int64_t>(s.getDim()) == -1;
  if (auto s = dyn_cast<LogSoftmaxOp>(op))
    return static_cast<int64_t>(s.getDim()) == rank - 1 || static_cast<int64_t>(s.getDim()) == -1;
  ArrayRef<int64_t> normalized = isa<LayerNormOp>(op) ? cast<LayerNormOp>(op).getNormalizedShape()
                                                      : cast<RmsNormOp>(op).getNormalizedShape();
  if (normalized.size() != 1)
    return false;
  for (Value v : op->getOperands().drop_front()) {
    auto t = tensorType(v);
    if (!t || t.getRank() != 1 || t.getElementType() != type.getElementType() || splatValue(v))
      return false;
  }
  return true;
}

/// What a launch of a kernel of `members` takes: the tensors it reads, in
/// the order the members (in program order) first read them, and the member
/// results something else reads.
static std::pair<SmallVector<Value>, SmallVector<Value>>
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

FusionPlan mlir::tdx::planFusion(Block &block) {
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
        plan.kernels[*k].row = &op;
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
      FusedKernel &into = plan.kernels[*join], &from = plan.kernels[*k];
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
      FusedKernel k;
      k.name = "k" + std::to_string(*join);
      k.space = space;
      plan.kernels.push_back(std::move(k));
      open.push_back(true);
    }
    plan.kernels[*join].ops.push_back(&op);
    plan.kernelOf[&op] = *join;
  }

  for (FusedKernel &k : plan.kernels) {
    std::tie(k.inputs, k.outputs) = launchOperands(k.ops, plan.biasOf);
    for (Value v : k.inputs)
      if (Value bias = plan.biasOf.lookup(v))
        k.biased.push_back({v, bias});
    Type floatType;
    auto note = [&](Type t) {
      if (!isFloatType(t) || (floatType && floatType != t))
        k.vectorizable = false;
      floatType = t;
    };
    for (Operation *op : k.ops) {
      for (Value v : op->getOperands())
        note(tensorType(v).getElementType());
      note(tensorType(op->getResult(0)).getElementType());
    }
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
      FusedKernel k;
      k.name = "k" + std::to_string(plan.kernels.size());
      k.space = tensorType(op.getResult(0));
      k.ops.push_back(&op);
      k.outputs.push_back(op.getResult(0));
      k.vectorizable = false;
      plan.kernelOf[&op] = plan.kernels.size();
      plan.kernels.push_back(std::move(k));
    }
  }
  return plan;
}

/// x ** c for a constant c as ATen computes it on float tensors
/// (torch.pow(Tensor, Scalar): fill, copy, x*x, x*x*x, 1/(x*x), sqrt, rsqrt,
/// reciprocal; other exponents call pow): the same numbers as eager, and no
/// exp/log per element for the squares autograd writes.
static std::optional<std::string> powerByConstant(PowOp op, const std::string &x,
                                                  const std::string &type) {
  std::optional<double> c = splatValue(op.getRhs());
  if (!c || !isa<FloatType>(tensorType(op.getResult()).getElementType()))
    return std::nullopt;
  if (*c == 0)
    return type + "(1)";
  if (*c == 1)
    return x;
  if (*c == 2)
    return x + " * " + x;
  if (*c == 3)
    return x + " * " + x + " * " + x;
  if (*c == -2)
    return type + "(1) / (" + x + " * " + x + ")";
  if (*c == -1)
    return type + "(1) / " + x;
  if (*c == 0.5)
    return "::tdx::kern::sqrt(" + x + ")";
  if (*c == -0.5)
    return "::tdx::kern::rsqrt(" + x + ")";
  return std::nullopt;
}

void mlir::tdx::emitKernelBody(const FusedKernel &k, llvm::raw_ostream &os) {
  DenseMap<Value, std::string> names;
  auto typeOf = [&](Value v) {
    return k.vectorizable ? std::string("V") : cType(tensorType(v).getElementType());
  };
  auto name = [&](Value v) -> std::string {
    auto it = names.find(v);
    if (it != names.end())
      return it->second;
    std::optional<double> splat = splatValue(v);
    return typeOf(v) + "(" + literal(*splat) + ")";
  };
  if (k.vectorizable)
    os << "template <class V>\n";
  os << "TDX_HD inline void " << k.name << "(";
  for (auto [i, v] : llvm::enumerate(k.inputs)) {
    names[v] = "a" + std::to_string(i);
    os << (i ? ", " : "") << typeOf(v) << " " << names[v];
  }
  for (auto [i, v] : llvm::enumerate(k.outputs))
    os << (i || !k.inputs.empty() ? ", " : "") << typeOf(v) << " &y" << i;
  os << ") {\n";
  int temps = 0;
  for (auto [y, bias] : k.biased) { // the linear's result with its bias
    std::string t = "t" + std::to_string(temps++);
    os << "  " << typeOf(y) << " " << t << " = ::tdx::kern::add(" << names[y] << ", " << names[bias]
       << "); // tdx.linear's bias\n";
    names[y] = t;
  }
  for (Operation *op : k.ops) {
    if (op == k.row) { // runs on the rows after the body: its result holds its input
      names[op->getResult(0)] = names.lookup(op->getOperand(0));
      continue;
    }
    auto in = [&](unsigned i) { return name(op->getOperand(i)); };
    auto call = [&](StringRef fn, unsigned arity = 1) {
      std::string s = ("::tdx::kern::" + fn + "(").str();
      for (unsigned i = 0; i < arity; ++i)
        s += (i ? ", " : "") + in(i);
      return s + ")";
    };
    std::optional<std::string> power;
    if (auto p = dyn_cast<PowOp>(op))
      power = powerByConstant(p, in(0), typeOf(p.getResult()));
    std::string expr =
        power ? *power :
        llvm::TypeSwitch<Operation *, std::string>(op)
// The elementwise table: ::tdx::kern::<fn>(operands).
#define TDX_UNARY(Name, fn, aten, linear) .Case([&](Name##Op) { return call(#fn); })
#define TDX_BINARY(Name, fn, aten) .Case([&](Name##Op) { return call(#fn, 2); })
#include "tdx/Runtime/ElementwiseOps.def"
            .Case([&](CmpOp o) {
              static const char *ops[] = {"==", "!=", "<", "<=", ">", ">="};
              return in(0) + " " + ops[static_cast<int>(o.getPredicate())] + " " + in(1);
            })
            .Case([&](WhereOp) { return in(0) + " ? " + in(1) + " : " + in(2); })
            .Case([&](GeluOp o) {
              return call(o.getApproximate() == GeluApproximation::tanh ? "geluTanh" : "gelu");
            })
            .Case([&](CastOp o) {
              return "static_cast<" + typeOf(o.getResult()) + ">(" + in(0) + ")";
            })
            .Default([](Operation *) -> std::string { return ""; });
    if (expr.empty()) // an op isElementwise() admits but no Case writes
      llvm::report_fatal_error(llvm::Twine("tdx: the fused kernel body has no expression for ") +
                               op->getName().getStringRef() +
                               "; add it to include/tdx/Runtime/ElementwiseOps.def");
    Value r = op->getResult(0);
    std::string t = "t" + std::to_string(temps++);
    os << "  " << typeOf(r) << " " << t << " = " << expr << "; // " << op->getName() << "\n";
    names[r] = t;
  }
  for (auto [i, v] : llvm::enumerate(k.outputs))
    os << "  y" << i << " = " << names[v] << ";\n";
  os << "}\n";
}
