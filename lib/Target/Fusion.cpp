//===- Fusion.cpp - elementwise kernels shared by the tdx backends --------===//

#include "tdx/Target/Fusion.h"
#include "tdx/IR/TdxOps.h"

#include "llvm/ADT/TypeSwitch.h"
#include "llvm/Support/FormatVariadic.h"

#include <cmath>

using namespace mlir;
using namespace mlir::tdx;

namespace {

RankedTensorType tensorType(Value v) { return dyn_cast<RankedTensorType>(v.getType()); }

bool isFloatType(Type t) { return t.isF32() || t.isF64(); }

std::string literal(double v) {
  if (std::isinf(v))
    return v > 0 ? "INFINITY" : "-INFINITY";
  if (std::isnan(v))
    return "NAN";
  return llvm::formatv("{0:e17}", v).str();
}

} // namespace

FusedKernel mlir::tdx::fusedKernel(FusedOp op, std::string name) {
  FusedKernel k;
  k.name = std::move(name);
  Block &body = op.getBody().front();
  k.inputs.assign(body.getArguments().begin(), body.getArguments().end());
  Operation *yield = body.getTerminator();
  k.outputs.assign(yield->operand_begin(), yield->operand_end());
  k.space = op.getSpace();
  k.row = op.getRowOp();
  for (Operation &member : body.without_terminator()) {
    bool yielded = llvm::is_contained(k.outputs, member.getResult(0));
    if (splatValue(member.getResult(0)) && !yielded)
      continue; // a literal where it is read
    k.ops.push_back(&member);
  }
  Type floatType;
  auto note = [&](Type t) {
    if (!isFloatType(t) || (floatType && floatType != t))
      k.vectorizable = false;
    floatType = t;
  };
  for (Operation *member : k.ops) {
    // A kernel that makes a constant's tensor (a cast of a splat read
    // elsewhere) has a body of concrete types.
    if (splatValue(member->getResult(0)))
      k.vectorizable = false;
    for (Value v : member->getOperands())
      note(tensorType(v).getElementType());
    note(tensorType(member->getResult(0)).getElementType());
  }
  return k;
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
  // bf16 and f16 values take part in each op as float (ATen's opmath
  // type); the op's result is rounded to its type where it is stored.
  auto narrowFloat = [&](Value v) {
    Type e = tensorType(v).getElementType();
    return !k.vectorizable && (e.isBF16() || e.isF16());
  };
  auto computeType = [&](Value v) { return narrowFloat(v) ? std::string("float") : typeOf(v); };
  auto name = [&](Value v) -> std::string {
    auto it = names.find(v);
    std::string stored = it != names.end()
                             ? it->second
                             : typeOf(v) + "(" + literal(*splatValue(v)) + ")";
    return narrowFloat(v) ? "static_cast<float>(" + stored + ")" : stored;
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
      power = powerByConstant(p, in(0), computeType(p.getResult()));
    std::string expr =
        power ? *power :
        llvm::TypeSwitch<Operation *, std::string>(op)
// The elementwise table: ::tdx::kern::<fn>(operands).
#define TDX_UNARY(Name, fn, aten, linear, ...) .Case([&](Name##Op) { return call(#fn); })
#define TDX_BINARY(Name, fn, aten, ...) .Case([&](Name##Op) { return call(#fn, 2); })
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
              // A float to an 8- or 16-bit integer goes through int64_t, as
              // c10::convert does (in range of int64_t: defined, wrapping).
              Type from = tensorType(o.getInput()).getElementType();
              Type to = tensorType(o.getResult()).getElementType();
              std::string x = in(0);
              if (isa<FloatType>(from) && to.isInteger() && to.getIntOrFloatBitWidth() > 1 &&
                  to.getIntOrFloatBitWidth() < 32)
                x = "static_cast<int64_t>(" + x + ")";
              return "static_cast<" + typeOf(o.getResult()) + ">(" + x + ")";
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
