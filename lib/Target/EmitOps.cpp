//===- EmitOps.cpp - one runtime call per op ------------------------------===//

#include "Emitter.h"
#include "tdx/Sharding/Layout.h"
#include "tdx/Target/InitEvaluator.h"

#include "mlir/Dialect/Arith/IR/Arith.h"
#include "mlir/Dialect/Func/IR/FuncOps.h"
#include "llvm/ADT/TypeSwitch.h"

using namespace mlir;
using namespace mlir::tdx;

namespace mlir::tdx::cpp {

LogicalResult Emitter::emitInit(Operation *decl, StringRef name, RankedTensorType type,
                                StringRef layout) {
  // A program that is not pointwise in the global index makes a binary that
  // needs --params for this parameter; the reason is kept for the message.
  std::string why;
  FailureOr<::tdx::rt::InitProgram> program;
  {
    ScopedDiagnosticHandler capture(decl->getContext(), [&](Diagnostic &d) {
      why = d.str();
      return success();
    });
    program = buildInitProgram(decl);
  }
  // Only what the state lacks (read from --params, a checkpoint or a
  // store) is made: init() loops over the entries.
  if (failed(program)) {
    tables->needsParams.push_back(name.str());
    os << "  if (!s.count(\"" << name << "\"))\n    throw std::runtime_error("
       << quoted("tdx: the init program of '" + name.str() + "': " + why) << ");\n";
    return success();
  }
  std::string var = programVar(*program);
  tables->entries.push_back("{" + quoted(name) + ", " +
                            var.substr(var.find('(') + 1, var.size() - var.find('(') - 2) +
                            ", " + quoted(layout) + "}");
  return success();
}

std::string Emitter::programVar(const ::tdx::rt::InitProgram &program) {
  size_t first = tables->nodes.size();
  for (const ::tdx::rt::InitProgram::Node &n : program.nodes) {
    std::string values;
    for (auto [i, v] : llvm::enumerate(n.values))
      values += (i ? ", " : "") + number(v);
    std::string shape;
    for (auto [i, d] : llvm::enumerate(n.shape))
      shape += (i ? ", " : "") + std::to_string(d);
    tables->nodes.push_back(
        std::string("{tdx::rt::InitProgram::") + ::tdx::rt::InitProgram::kindName(n.kind) +
        ", tdx::rt::DType::" + ::tdx::rt::dtypeEnumerator(n.dtype) + ", " +
        tables->array("int64_t", shape) + ", " + std::to_string(n.shape.size()) + ", " +
        std::to_string(n.a) + ", " + std::to_string(n.b) + ", {" + number(n.p[0]) + ", " +
        number(n.p[1]) + ", " + number(n.p[2]) + ", " + number(n.p[3]) + "}, " +
        std::to_string(n.seed) + "ull, " + std::to_string(n.stream) + "ull, " +
        tables->array("double", values) + ", " + std::to_string(n.values.size()) + ", " +
        std::to_string(n.c) + "}");
  }
  tables->ranges.push_back({first, program.nodes.size()});
  return "kInit(" + std::to_string(tables->ranges.size() - 1) + ")";
}

std::string Emitter::InitTables::array(const std::string &type, const std::string &items) {
  if (items.empty())
    return "nullptr";
  auto [it, fresh] = arrays.try_emplace(type + " " + items);
  if (fresh) {
    it->second = "kInitArray" + std::to_string(arrays.size() - 1);
    arraysText += "static const " + type + " " + it->second + "[] = {" + items + "};\n";
  }
  return it->second;
}

std::string Emitter::InitTables::text() const {
  if (ranges.empty())
    return "";
  std::string out = arraysText + "static const tdx::rt::InitNodeData kInitNodes[] = {\n";
  for (const std::string &n : nodes)
    out += "    " + n + ",\n";
  out += "};\nstatic const int kInitRanges[][2] = {";
  for (auto [i, r] : llvm::enumerate(ranges))
    out += (i ? ", {" : "{") + std::to_string(r.first) + ", " + std::to_string(r.second) + "}";
  out += "};\n"
         "static const tdx::rt::InitProgram &kInit(int k) {\n"
         "  static const std::vector<tdx::rt::InitProgram> all =\n"
         "      tdx::rt::initPrograms(kInitNodes, kInitRanges, " +
         std::to_string(ranges.size()) + ");\n  return all[k];\n}\n";
  if (!entries.empty()) {
    out += "struct EmittedInit {\n  const char *name;\n  int program;\n  const char *layout;\n};\n"
           "static const EmittedInit kInitEntries[] = {\n";
    for (const std::string &e : entries)
      out += "    " + e + ",\n";
    out += "};\n";
  }
  return out;
}

/// Whether the CUDA runtime runs the generic op `schema` (a row of
/// tdx/Runtime/cuda/AtenOps.def, by name).
static bool hasCudaAten(StringRef schema) {
  StringRef name = schema.split('.').first;
#define TDX_CUDA_ATEN(row, fn)                                                                 \
  if (name == row)                                                                             \
    return true;
#include "tdx/Runtime/cuda/AtenOps.def"
  return false;
}

/// One argument of a tdx.aten op (see its description): a c10::IValue on
/// the CPU backend, a tdx::cu::Arg on CUDA.
FailureOr<std::string> Emitter::atenArgument(AtenOp o, NamedAttribute kv) {
  Attribute a = kv.getValue();
  bool cuda = backend == Backend::CUDA;
  std::string value = cuda ? "Arg" : "c10::IValue";
  if (isa<UnitAttr>(a))
    return value + "()";
  if (auto refs = AtenOp::tensorListRefs(a); refs && !cuda) {
    std::string xs = "c10::List<c10::optional<at::Tensor>>({";
    for (auto [i, r] : llvm::enumerate(*refs))
      xs += (i ? ", " : "") + (r ? name(o.getOperand(*r)) : std::string("c10::nullopt"));
    return "c10::IValue(" + xs + "}))";
  }
  if (auto b = dyn_cast<BoolAttr>(a))
    return value + (b.getValue() ? "(true)" : "(false)");
  if (auto i = dyn_cast<IntegerAttr>(a))
    return value + "(int64_t(" + std::to_string(i.getValue().getSExtValue()) + "))";
  if (auto f = dyn_cast<FloatAttr>(a))
    return value + "(double(" + number(f.getValueAsDouble()) + "))";
  if (auto xs = dyn_cast<DenseI64ArrayAttr>(a))
    return value + "(std::vector<int64_t>" + list(xs.asArrayRef()) + ")";
  if (auto str = dyn_cast<StringAttr>(a))
    return value + "(std::string(" + quoted(str.getValue()) + "))";
  if (auto arr = dyn_cast<ArrayAttr>(a)) {
    if (llvm::all_of(arr, [](Attribute e) { return isa<BoolAttr>(e); })) {
      std::string xs = cuda ? "std::vector<bool>{" : "c10::List<bool>({";
      for (auto [i, e] : llvm::enumerate(arr))
        xs += (i ? ", " : "") + std::string(cast<BoolAttr>(e).getValue() ? "true" : "false");
      return value + "(" + xs + (cuda ? "})" : "}))");
    }
    if (!cuda && llvm::all_of(arr, [](Attribute e) { return isa<FloatAttr>(e); })) {
      std::string xs = "c10::List<double>({";
      for (auto [i, e] : llvm::enumerate(arr))
        xs += (i ? ", " : "") + number(cast<FloatAttr>(e).getValueAsDouble());
      return "c10::IValue(" + xs + "}))";
    }
  }
  return o.emitOpError() << "(" << o.getSchema() << ") argument '" << kv.getName().getValue()
                         << "' = " << a << " has no "
                         << (cuda ? "CUDA" : "C++")
                         << " lowering; generic arguments are None (unit), bool, i64, f64, "
                            "string, array<i64>, bool arrays"
                         << (cuda ? "" : ", f64 arrays and tensor lists");
}

namespace {

/// The C++ text of an operand or attribute in a generated runtime call
/// (`arg` in tdx/IR/TdxOpRegistry.inc), by the type of its ODS getter.
struct CallArg {
  Emitter &e;
  std::string operator()(Value v) const { return v ? e.name(v) : std::string("{}"); }
  std::string operator()(OperandRange vs) const {
    std::string xs = "{";
    for (auto [i, v] : llvm::enumerate(vs))
      xs += (i ? ", " : "") + e.name(v);
    return xs + "}";
  }
  std::string operator()(ArrayRef<int64_t> xs) const { return list(xs); }
  /// Optional lists are reduction dims: typed, as `{-1}` alone is
  /// ambiguous with ATen's named-dim overloads.
  std::string operator()(std::optional<ArrayRef<int64_t>> xs) const {
    return "std::vector<int64_t>" + (xs ? list(*xs) : std::string("{}"));
  }
  std::string operator()(bool b) const { return b ? "true" : "false"; }
  template <typename I, std::enable_if_t<std::is_integral_v<I>, int> = 0>
  std::string operator()(I i) const {
    // I64Attr getters return uint64_t: a negative dim reads back signed.
    return std::to_string(static_cast<int64_t>(i));
  }
  template <typename E, std::enable_if_t<std::is_enum_v<E>, int> = 0>
  std::string operator()(E kind) const {
    return std::to_string(static_cast<int>(kind));
  }
  std::string operator()(const APFloat &f) const { return number(f.convertToDouble()); }
  std::string operator()(ArrayAttr axes) const { return strings(axes); }
  std::string operator()(StringRef s) const { return quoted(s); }
};

/// Whether a `[...]` group of a runtime call is printed: its optional
/// operands and attributes are present (and a list is not empty).
template <typename X> bool has(const X &) { return true; }
template <typename X> bool has(const std::optional<X> &x) { return x.has_value(); }
bool has(const std::optional<ArrayRef<int64_t>> &xs) { return xs && !xs->empty(); }
[[maybe_unused]] bool has(Value v) { return static_cast<bool>(v); }

} // namespace

LogicalResult Emitter::emitOp(Operation *op) {
  auto in = [&](size_t i) { return name(op->getOperand(i)); };
  auto assign = [&](const std::string &expr) {
    os << "  " << decl(op->getResult(0)) << " = " << expr << ";\n";
    return success();
  };
  auto start = [&](const std::string &expr) -> LogicalResult {
    if (!isa_and_nonnull<StartOp>(op->getParentOp()))
      return op->emitOpError("is not started by a tdx.start; run tdx-async-collectives (in "
                             "tdx-opt --tdx-backend, which tdx-translate runs) first");
    std::string handle = "c" + std::to_string(tmps++);
    os << "  const int64_t " << handle << " = " << expr << ";\n";
    inFlight.push_back({op->getResult(0), handle});
    return success();
  };
  // A generated runtime call: an async collective's is started.
  auto call = [&](Operation *o, const std::string &expr) {
    return isAsyncCollective(o) ? start(expr) : assign(expr);
  };
  CallArg arg{*this};
  auto dtypeOf = [&](Value v) {
    return dtype(cast<RankedTensorType>(v.getType()).getElementType());
  };
  auto type = [&]() { return cast<RankedTensorType>(op->getResult(0).getType()); };
  // A filled tensor split unevenly: this rank's box of its global shape.
  auto createdShape = [&](auto o) {
    std::optional<ArrayRef<int64_t>> global = o.getGlobalShape();
    if (!global)
      return list(type().getShape());
    return "ctx.localShape(" + list(*global) + ", parseLayout(\"" +
           layoutText(valueSharding(o.getResult()), meshRank) + "\"))";
  };
#define TDX_RUNTIME_CALL(Op, expr) .Case([&](Op o) { return call(o, expr); })
  return llvm::TypeSwitch<Operation *, LogicalResult>(op)
  // The ops whose ODS def gives their runtimeCall.
#include "tdx/IR/TdxOpRegistry.inc"
      .Case([&](ParamRefOp o) {
        return assign("s.at(\"" + o.getStateName().str() + "\")");
      })
      .Case([&](FullOp o) {
        return assign("T::full(" + createdShape(o) + ", " +
                      number(o.getValue().convertToDouble()) + ", " + dtypeOf(o.getResult()) + ")");
      })
      .Case([&](EmptyOp o) {
        return assign("T::zeros(" + createdShape(o) + ", " + dtypeOf(o.getResult()) + ")");
      })
      .Case<UniformOp, NormalOp, TruncNormalOp, BernoulliOp>([&](Operation *o) -> LogicalResult {
        // This rank's box of the global draw of this call (`call`).
        FailureOr<::tdx::rt::InitProgram> program = buildValueProgram(o->getResult(0));
        if (failed(program))
          return failure();
        return assign("ctx.init(tdx::rt::atCall(" + programVar(*program) +
                      ", call), parseLayout(\"" + layoutText(valueSharding(o->getResult(0)), meshRank) +
                      "\"))");
      })
      .Case([&](arith::ConstantOp o) -> LogicalResult {
        auto dense = dyn_cast<DenseElementsAttr>(o.getValue());
        if (!dense)
          return o.emitOpError("is not a dense tensor constant");
        std::string values = "{";
        bool isFloat = isa<FloatType>(dense.getElementType());
        int64_t i = 0;
        if (isFloat)
          for (APFloat v : dense.getValues<APFloat>())
            values += (i++ ? ", " : "") + number(v.convertToDouble());
        else
          for (APInt v : dense.getValues<APInt>())
            values += (i++ ? ", " : "") + std::to_string(v.getSExtValue()) + ".0";
        values += "}";
        return assign("constant(std::vector<double>" + values + ", " + list(type().getShape()) +
                      ", " + dtypeOf(o.getResult()) + ")");
      })

      // A pipeline's messages (tdx-schedule-pipeline).
      .Case([&](SendOp o) {
        sends = true;
        // sized: the receiver learns an open dim from the message.
        bool sized = !cast<RankedTensorType>(o.getInput().getType()).hasStaticShape();
        os << "  ctx.send(" << in(0) << ", " << strings(o.getMeshAxes()) << ", " << o.getPeer()
           << ", " << o.getTag() << ", " << (sized ? "true" : "false") << ");\n";
        return success();
      })
      .Case([&](RecvOp o) {
        std::string shape = "{";
        for (auto [i, d] : llvm::enumerate(type().getShape()))
          shape += (i ? ", " : "") + std::to_string(ShapedType::isDynamic(d) ? -1 : d);
        return assign("ctx.recv(" + shape + "}, " + dtypeOf(o.getResult()) + ", " +
                      strings(o.getMeshAxes()) + ", " + std::to_string(o.getPeer()) + ", " +
                      std::to_string(o.getTag()) + ")");
      })
      .Case([&](RaggedAllToAllOp o) -> LogicalResult {
        // The sizes stay tensors: the CPU runtime reads them where MPI
        // does, in host memory. CUDA's would need them read on the device.
        if (backend == Backend::CUDA)
          return o.emitOpError("runs on the CPU runtime only: CUDA's ragged all-to-all (sizes "
                               "read on the device, no copy to the host) is not built; compile "
                               "this program for the CPU");
        std::string site;
        llvm::raw_string_ostream where(site);
        if (auto fl = dyn_cast<FileLineColLoc>(o.getLoc()))
          where << fl.getFilename().getValue() << ":" << fl.getLine();
        else
          o.getLoc().print(where);
        std::string args = in(0) + ", " + in(1) + ", " + in(2) + ", " + in(3) + ", " + in(4) +
                           ", " + std::to_string(type().getDimSize(0)) + ", " +
                           strings(o.getMeshAxes()) + ", " + quoted(site) + ")";
        return isa_and_nonnull<StartOp>(o->getParentOp())
                   ? start("ctx.startRaggedAllToAll(" + args)
                   : assign("ctx.raggedAllToAll(" + args);
      })
      .Case([&](AllGatherOp o) {
        // The gathered size, when the program knows it, spares the runtime
        // exchanging the pieces' sizes.
        int64_t dim = static_cast<int64_t>(o.getGatherDim());
        auto type = cast<RankedTensorType>(o.getType());
        int64_t total = type.isDynamicDim(dim) ? -1 : type.getDimSize(dim);
        return start("ctx.startAllGather(" + in(0) + ", " + strings(o.getMeshAxes()) + ", " +
                     std::to_string(dim) + ", " + std::to_string(total) + ")");
      })
      .Case([&](AtenOp o) -> LogicalResult {
        if (backend == Backend::CUDA && !hasCudaAten(o.getSchema()))
          return o.emitOpError() << "(" << o.getSchema()
                                 << ") has no CUDA lowering: the CUDA backend runs first-class tdx "
                                    "ops and the generic ops of tdx/Runtime/cuda/AtenOps.def; "
                                    "compile for --target cpu, or express the op with tdx ops";
        // Operands that a Tensor[] argument holds are passed in that list.
        std::string tensors = "{", args = "{";
        for (auto [i, v] : llvm::enumerate(o.getPlainOperands()))
          tensors += (i ? ", " : "") + name(v);
        if (DictionaryAttr dict = o.getArgsAttr())
          for (NamedAttribute kv : dict) {
            FailureOr<std::string> value = atenArgument(o, kv);
            if (failed(value))
              return failure();
            args += (args.size() > 1 ? ", {\"" : "{\"") + kv.getName().getValue().str() +
                    "\", " + *value + "}";
          }
        std::string results = "r" + std::to_string(tmps++);
        os << "  std::vector<T::Tensor> " << results << " = callAten(\"" << o.getSchema()
           << "\", " << tensors << "}, " << args << "}";
        // On the CPU, ATen's results are checked against the shapes capture
        // recorded (a meta kernel that disagrees with the CPU kernel).
        if (backend == Backend::CPU) {
          os << ", {";
          for (auto [i, r] : llvm::enumerate(o.getResults())) {
            os << (i ? ", " : "") << "{";
            if (r.use_empty()) // nothing reads it: not checked
              os << "-2";
            else
              for (auto [j, d] : llvm::enumerate(cast<RankedTensorType>(r.getType()).getShape()))
                os << (j ? ", " : "") << (ShapedType::isDynamic(d) ? -1 : d);
            os << "}";
          }
          os << "}";
        }
        os << ");\n";
        for (auto [i, r] : llvm::enumerate(o.getResults()))
          os << "  " << decl(r) << " = std::move(" << results << ".at(" << i << "));\n";
        return success();
      })
      // Attention: torch's fused CPU kernels (ATen's flash attention for
      // the CPU), forward and backward; on CUDA the runtime's row kernels
      // (tdx/Runtime/Attention.h). Several results.
      .Case<SdpaOp, SdpaBackwardOp>([&](Operation *o) -> LogicalResult {
        bool cuda = backend == Backend::CUDA;
        auto attention = [&](auto op) {
          std::string mask = op.getAttnMask()
                                 ? (cuda ? name(op.getAttnMask())
                                         : "std::optional<at::Tensor>(" + name(op.getAttnMask()) + ")")
                                 : std::string(cuda ? "T::Tensor()" : "std::nullopt");
          std::string scale = op.getScale() ? "std::optional<double>(" +
                                                  number(op.getScale()->convertToDouble()) + ")"
                                            : std::string("std::nullopt");
          if (cuda) // tdx::cu::sdpa(q, k, v, mask, causal, scale)
            return ", " + mask + ", " + (op.getIsCausal() ? "true" : "false") + ", " + scale + ")";
          return std::string(", 0.0, ") + (op.getIsCausal() ? "true" : "false") + ", " + mask +
                 ", " + scale + ")";
        };
        std::string results = "r" + std::to_string(tmps++), call;
        if (auto fwd = dyn_cast<SdpaOp>(o))
          call = std::string(cuda ? "T::sdpa(" : "T::_scaled_dot_product_flash_attention_for_cpu(") +
                 in(0) + ", " + in(1) + ", " + in(2) + attention(fwd);
        else
          call = std::string(cuda ? "T::sdpa_backward("
                                  : "T::_scaled_dot_product_flash_attention_for_cpu_backward(") +
                 in(0) + ", " + in(1) + ", " + in(2) + ", " + in(3) + ", " + in(4) + ", " +
                 in(5) + attention(cast<SdpaBackwardOp>(o));
        os << "  auto " << results << " = " << call << ";\n";
        for (auto [i, r] : llvm::enumerate(o->getResults()))
          os << "  " << decl(r) << " = std::move(std::get<" << i << ">(" << results << "));\n";
        return success();
      })
      // State writes are placed by Lifetimes.
      .Case([&](AssignOp o) {
        os << "  s[\"" << o.getStateName().getValue() << "\"] = " << in(0) << ";\n";
        return success();
      })
      .Case([&](FusedOp o) {
        emitKernelCall(o);
        return success();
      })
      .Case([&](StartOp o) { return emitOp(o.getCollective()); })
      .Case([&](WaitOp o) -> LogicalResult {
        Value started = o.getToken().getDefiningOp<StartOp>().getCollective()->getResult(0);
        auto it = llvm::find_if(inFlight, [&](auto &f) { return f.first == started; });
        if (it == inFlight.end())
          return o.emitOpError("waits for a collective that is not in flight");
        os << "  " << decl(o.getResult()) << " = ctx.wait(" << it->second << ");\n";
        inFlight.erase(it);
        return success();
      })
      .Case([&](func::ReturnOp o) {
        // A pipeline rank's sends are received before its step ends.
        if (sends)
          os << "  ctx.finishSends();\n";
        os << "  return {";
        for (auto [i, v] : llvm::enumerate(o.getOperands()))
          os << (i ? ", " : "") << name(v);
        os << "};\n";
        return success();
      })
      .Default([&](Operation *other) {
        if (isElementwise(other))
          return other->emitOpError()
                 << "on these element types has no kernel yet; the backends fuse elementwise "
                    "ops on "
                 << runnableTypes(/*kernels=*/true) << " (cast the operands to f32 first)";
        return other->emitOpError()
               << "has no C++ lowering yet; the CPU backend supports the first-class tdx "
                  "ops and the collectives";
      });
}

} // namespace mlir::tdx::cpp
