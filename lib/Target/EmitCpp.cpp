//===- EmitCpp.cpp - tdx programs as C++ on the CPU runtime ---------------===//

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

namespace {

/// The emitted dtype of element type `t` ("T::kFloat"), "" when none.
std::string dtype(Type t) {
#define TDX_DTYPE(Name, stored, bytes, aten, ctype, mlir)                                  \
  if (t.mlir)                                                                              \
    return "T::" #aten;
#include "tdx/Runtime/DTypes.def"
  return "";
}

std::string list(ArrayRef<int64_t> xs) {
  std::string s = "{";
  for (auto [i, x] : llvm::enumerate(xs))
    s += (i ? ", " : "") + std::to_string(x);
  return s + "}";
}

std::string number(double v) {
  if (std::isinf(v))
    return v > 0 ? "INFINITY" : "-INFINITY";
  if (std::isnan(v))
    return "NAN";
  return llvm::formatv("{0:e17}", v).str();
}

/// A C++ string literal of `s`.
std::string quoted(StringRef s) {
  std::string out = "\"";
  for (char c : s) {
    if (c == '"' || c == '\\')
      out += '\\';
    if (c == '\n') {
      out += "\\n";
      continue;
    }
    out += c;
  }
  return out + "\"";
}

std::string strings(ArrayAttr axes) {
  std::string s = "{";
  for (auto [i, a] : llvm::enumerate(axes.getAsValueRange<StringAttr>()))
    s += (i ? ", \"" : "\"") + a.str() + "\"";
  return s + "}";
}

std::string layoutText(ShardingAttr sharding, int64_t rank) {
  if (!sharding) {
    std::string s = "[";
    for (int64_t i = 0; i < rank; ++i)
      s += i ? ", Replicate" : "Replicate";
    return s + "]";
  }
  std::string text;
  llvm::raw_string_ostream os(text);
  static_cast<Attribute>(sharding).print(os);
  return text.substr(text.find('['), text.rfind(']') - text.find('[') + 1);
}

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
  /// of the step holds from here until `release` (see maybeEndPart).
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
  /// The step is emitted as parts of about partBytes of source each (see
  /// kDefaultPartBytes); `forward` calls them in order. A tensor still held
  /// where a part ends moves into a slot of `carry`, which every later part
  /// names with the tensor's name, until its release; the handles of
  /// collectives in flight go through `handles`.
  int64_t partBytes = kDefaultPartBytes;
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
    return "static std::vector<T::Tensor> forward" + std::to_string(part) +
           "(Context &ctx, State &s, const std::vector<T::Tensor> &in, uint64_t call, "
           "T::Tensor *carry, int64_t *handles) {\n  (void)call;\n  (void)carry;\n"
           "  (void)handles;\n" +
           bindArguments(args);
  }
  /// Ends the current part and opens the next if the current one is long.
  void maybeEndPart(ArrayRef<BlockArgument> args) {
    if (static_cast<int64_t>(os.tell() - partStart) < partBytes)
      return;
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
    os << "  return {};\n}\n\n" << partHeader(++parts, args);
    // In slot order, so the text does not depend on hashing.
    std::map<int64_t, Value> bySlot;
    for (auto [v, slot] : slots)
      bySlot[slot] = v;
    for (auto [slot, v] : bySlot)
      os << "  T::Tensor &" << name(v) << " = carry[" << slot << "];\n";
    for (auto [i, f] : llvm::enumerate(inFlight))
      os << "  const int64_t " << f.second << " = handles[" << i << "];\n";
    handed = std::max(handed, inFlight.size());
    partStart = os.tell();
  }
  /// Values whose locals the current part declared, and the carried ones'
  /// slots; every slot ever made is taken or free.
  llvm::SetVector<Value> declared;
  DenseMap<Value, int64_t> slots;
  SmallVector<int64_t> freeSlots;
  size_t carrySize() const { return slots.size() + freeSlots.size(); }
  uint64_t partStart = 0;
  int parts = 0;
  size_t handed = 0;
  /// Waits for the collectives in flight whose results `reads` holds.
  void waitFor(ArrayRef<Value> reads) {
    for (Value v : reads) {
      auto it = llvm::find_if(inFlight, [&](auto &f) { return f.first == v; });
      if (it == inFlight.end())
        continue;
      os << "  " << decl(v) << " = ctx.wait(" << it->second << ");\n";
      inFlight.erase(it);
    }
  }
  /// The arena slots of the results of the op emitted next (see Lifetimes),
  /// and forgetting those its op did not take.
  void place(ArrayRef<std::pair<int64_t, int64_t>> slots) {
    if (slots.empty())
      return;
    os << "  ctx.place({";
    llvm::interleaveComma(slots, os, [&](auto s) { os << "{" << s.first << ", " << s.second << "}"; });
    os << "});\n";
  }
  void placed(ArrayRef<std::pair<int64_t, int64_t>> slots) {
    if (!slots.empty())
      os << "  ctx.placed();\n";
  }
  void waitAll() {
    while (!inFlight.empty())
      waitFor(inFlight.front().first);
  }
  /// Lets the collectives in flight move on after an op.
  void progress() {
    if (!inFlight.empty())
      os << "  ctx.progress();\n";
  }
  void emitKernelCall(const FusedKernel &k);
  /// Linear results whose bias the kernels that read them add.
  DenseSet<Value> biasInKernels;
  FailureOr<std::string> atenArgument(AtenOp o, NamedAttribute kv);
  LogicalResult emitReduce(Operation *op, StringRef fn, std::optional<ArrayRef<int64_t>> dims,
                           bool keep);
  LogicalResult emitInit(Operation *decl, StringRef name, RankedTensorType type,
                         ShardingAttr sharding);
  /// Writes `program` with the init programs; returns its variable's name.
  std::string programVar(const ::tdx::rt::InitProgram &program);

  int64_t meshRank;
  Backend backend;
  /// The init programs, emitted before init().
  std::string initText;
  llvm::raw_string_ostream inits_{initText};
  /// Writes states (see Lifetimes).
  void writeStates(ArrayRef<std::pair<std::string, Value>> writes) {
    for (auto &[key, value] : writes)
      os << "  s[\"" << key << "\"] = " << name(value) << ";\n";
  }
  int inits = 0;
  llvm::raw_ostream &os;
  DenseMap<Value, std::string> names;
  /// Collectives started and not yet waited for: result -> handle variable.
  SmallVector<std::pair<Value, std::string>> inFlight;
  int tmps = 0;
};

LogicalResult Emitter::emitInit(Operation *decl, StringRef name, RankedTensorType type,
                                ShardingAttr sharding) {
  std::string layout = "parseLayout(\"" + layoutText(sharding, meshRank) + "\")";
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
  // store) is made.
  os << "  if (!s.count(\"" << name << "\"))\n    ";
  if (failed(program)) {
    os << "throw std::runtime_error(" << quoted("tdx: the init program of '" + name.str() +
                                                "': " + why)
       << ");\n";
    return success();
  }
  os << "s[\"" << name << "\"] = ctx.init(" << programVar(*program) << ", " << layout
     << ");\n";
  return success();
}

std::string Emitter::programVar(const ::tdx::rt::InitProgram &program) {
  std::string var = "kInit" + std::to_string(inits++);
  inits_ << "static const tdx::rt::InitProgram " << var << "{{\n";
  for (const ::tdx::rt::InitProgram::Node &n : program.nodes) {
    std::string values = "{";
    for (auto [i, v] : llvm::enumerate(n.values))
      values += (i ? ", " : "") + number(v);
    values += "}";
    inits_ << "    {tdx::rt::InitProgram::" << ::tdx::rt::InitProgram::kindName(n.kind) << ", tdx::rt::DType::"
           << ::tdx::rt::dtypeEnumerator(n.dtype) << ", " << list(n.shape) << ", "
           << n.a << ", " << n.b << ", {" << number(n.p[0]) << ", " << number(n.p[1]) << ", "
           << number(n.p[2]) << ", " << number(n.p[3]) << "}, " << n.seed << "ull, " << n.stream
           << "ull, " << values << "},\n";
  }
  inits_ << "}};\n";
  return var;
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

/// The runtime's key of the state `name` names from `op`: a tied name reads
/// and writes the value it shares.
static std::string stateKey(Operation *op, FlatSymbolRefAttr name) {
  Operation *owner = lookupStateOwner(op, name);
  return (owner ? SymbolTable::getSymbolName(owner).getValue() : name.getValue()).str();
}

LogicalResult Emitter::emitOp(Operation *op) {
  auto out = [&](size_t i = 0) { return name(op->getResult(i)); };
  auto in = [&](size_t i) { return name(op->getOperand(i)); };
  auto assign = [&](const std::string &expr) {
    os << "  " << decl(op->getResult(0)) << " = " << expr << ";\n";
    return success();
  };
  auto start = [&](const std::string &expr) {
    std::string handle = "c" + std::to_string(tmps++);
    os << "  const int64_t " << handle << " = " << expr << ";\n";
    inFlight.push_back({op->getResult(0), handle});
    return success();
  };
  auto type = [&]() { return cast<RankedTensorType>(op->getResult(0).getType()); };
  auto opts = [&]() { return dtype(type().getElementType()); };
  // A filled tensor split unevenly: this rank's box of its global shape.
  auto createdShape = [&](auto o) {
    std::optional<ArrayRef<int64_t>> global = o.getGlobalShape();
    if (!global)
      return list(type().getShape());
    return "ctx.localShape(" + list(*global) + ", parseLayout(\"" +
           layoutText(valueSharding(o.getResult()), meshRank) + "\"))";
  };
  return llvm::TypeSwitch<Operation *, LogicalResult>(op)
      .Case([&](ParamRefOp o) {
        return assign("s.at(\"" + stateKey(o, o.getNameAttr()) + "\")");
      })
      .Case([&](FullOp o) {
        return assign("T::full(" + createdShape(o) + ", " +
                      number(o.getValue().convertToDouble()) + ", " + opts() + ")");
      })
      .Case([&](EmptyOp o) { return assign("T::zeros(" + createdShape(o) + ", " + opts() + ")"); })
      .Case<UniformOp, NormalOp, TruncNormalOp, BernoulliOp>([&](Operation *o) -> LogicalResult {
        // This rank's box of the global draw of this call (`call`).
        FailureOr<::tdx::rt::InitProgram> program = buildValueProgram(o->getResult(0));
        if (failed(program))
          return failure();
        return assign("ctx.init(tdx::rt::atCall(" + programVar(*program) +
                      ", call), parseLayout(\"" + layoutText(valueSharding(o->getResult(0)), meshRank) +
                      "\"))");
      })
      .Case([&](ArangeOp o) {
        return assign("T::arange(" + number(o.getStart().convertToDouble()) + ", " +
                      number(o.getEnd().convertToDouble()) + ", " +
                      number(o.getStep().convertToDouble()) + ", " + opts() + ")");
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
                      ", " + dtype(type().getElementType()) + ")");
      })
      .Case([&](ReshapeOp o) { return assign(in(0) + ".reshape(" + list(o.getShape()) + ")"); })
      .Case([&](TransposeOp o) {
        return assign(in(0) + ".transpose(" + std::to_string(static_cast<int64_t>(o.getDim0())) +
                      ", " + std::to_string(static_cast<int64_t>(o.getDim1())) + ")");
      })
      .Case([&](PermuteOp o) { return assign(in(0) + ".permute(" + list(o.getPermutation()) + ")"); })
      .Case([&](SliceOp o) {
        return assign(in(0) + ".slice(" + std::to_string(static_cast<int64_t>(o.getDim())) + ", " +
                      std::to_string(static_cast<int64_t>(o.getStart())) + ", " +
                      std::to_string(static_cast<int64_t>(o.getEnd())) + ", " +
                      std::to_string(static_cast<int64_t>(o.getStep())) + ")");
      })
      .Case([&](ConcatOp o) {
        std::string xs = "{";
        for (auto [i, v] : llvm::enumerate(o.getInputs()))
          xs += (i ? ", " : "") + name(v);
        return assign("concat(" + xs + "}, " + std::to_string(static_cast<int64_t>(o.getDim())) + ")");
      })
      .Case([&](ExpandOp o) { return assign(in(0) + ".expand(" + list(o.getSizes()) + ")"); })
      .Case([&](MatmulOp) { return assign("T::matmul(" + in(0) + ", " + in(1) + ")"); })
      .Case([&](LinearOp o) {
        // Without its bias when the kernels that read it add it.
        bool bias = o.getBias() && !biasInKernels.contains(o.getResult());
        return assign("T::linear(" + in(0) + ", " + in(1) + ", " +
                      (bias ? name(o.getBias()) : std::string("{}")) + ")");
      })
      .Case([&](ConvOp o) {
        int64_t spatial = o.getStride().size();
        return assign("T::convolution(" + in(0) + ", " + in(1) + ", " +
                      (o.getBias() ? name(o.getBias()) : std::string("{}")) + ", " +
                      list(o.getStride()) + ", " + list(o.getPadding()) + ", " +
                      list(o.getDilation()) + ", false, " +
                      list(SmallVector<int64_t>(spatial, 0)) + ", " +
                      std::to_string(o.getGroups()) + ")");
      })
      .Case([&](MaxPoolOp o) {
        return assign("T::max_pool2d(" + in(0) + ", " + list(o.getKernel()) + ", " +
                      list(o.getStride()) + ", " + list(o.getPadding()) + ", " +
                      list(o.getDilation()) + ", " + (o.getCeilMode() ? "true" : "false") + ")");
      })
      .Case([&](AvgPoolOp o) {
        return assign("T::avg_pool2d(" + in(0) + ", " + list(o.getKernel()) + ", " +
                      list(o.getStride()) + ", " + list(o.getPadding()) + ", " +
                      (o.getCeilMode() ? "true" : "false") + ", " +
                      (o.getCountIncludePad() ? "true" : "false") + ")");
      })
      .Case([&](SumOp o) { return emitReduce(op, "T::sum", o.getDims(), o.getKeepdim()); })
      .Case([&](MeanOp o) { return emitReduce(op, "T::mean", o.getDims(), o.getKeepdim()); })
      .Case([&](MaxOp o) { return emitReduce(op, "T::amax", o.getDims(), o.getKeepdim()); })
      .Case([&](SoftmaxOp o) {
        return assign("T::softmax(" + in(0) + ", " + std::to_string(static_cast<int64_t>(o.getDim())) + ")");
      })
      .Case([&](LogSoftmaxOp o) {
        return assign("T::log_softmax(" + in(0) + ", " +
                      std::to_string(static_cast<int64_t>(o.getDim())) + ")");
      })
      .Case([&](LayerNormOp o) {
        return assign("T::layer_norm(" + in(0) + ", " + list(o.getNormalizedShape()) + ", " +
                      (o.getWeight() ? name(o.getWeight()) : std::string("{}")) + ", " +
                      (o.getBias() ? name(o.getBias()) : std::string("{}")) + ", " +
                      number(o.getEps().convertToDouble()) + ")");
      })
      .Case([&](RmsNormOp o) {
        return assign("rms_norm(" + in(0) + ", " + list(o.getNormalizedShape()) + ", " +
                      (o.getWeight() ? name(o.getWeight()) : std::string("{}")) + ", " +
                      number(o.getEps().convertToDouble()) + ")");
      })
      .Case([&](EmbeddingOp) { return assign("T::embedding(" + in(0) + ", " + in(1) + ")"); })
      .Case([&](CrossEntropyOp o) {
        return assign("T::cross_entropy_loss(" + in(0) + ", " + in(1) + ", {}, " +
                      std::to_string(static_cast<int>(o.getReduction())) + ", " +
                      std::to_string(static_cast<int64_t>(o.getIgnoreIndex())) + ", " +
                      number(o.getLabelSmoothing().convertToDouble()) + ")");
      })
      .Case([&](MeshCoordOp o) {
        return assign("T::scalar_tensor(ctx.coord(\"" + o.getAxis().str() + "\"), T::kLong)");
      })
      .Case([&](ChunkOp o) {
        return assign("Context::chunk(" + in(0) + ", " + std::to_string(static_cast<int64_t>(o.getChunks())) +
                      ", " + in(1) + ".item<int64_t>(), " +
                      std::to_string(static_cast<int64_t>(o.getDim())) + ")");
      })
      .Case([&](AllReduceOp o) {
        return start("ctx.startAllReduce(" + in(0) + ", " + strings(o.getMeshAxes()) + ", " +
                     std::to_string(static_cast<int>(o.getReduce())) + ")");
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
      .Case([&](ReduceScatterOp o) {
        return start("ctx.startReduceScatter(" + in(0) + ", " + strings(o.getMeshAxes()) + ", " +
                     std::to_string(static_cast<int>(o.getReduce())) + ", " +
                     std::to_string(static_cast<int64_t>(o.getScatterDim())) + ")");
      })
      .Case([&](AllToAllOp o) {
        return assign("ctx.allToAll(" + in(0) + ", " + strings(o.getMeshAxes()) + ", " +
                      std::to_string(static_cast<int64_t>(o.getSplitDim())) + ", " +
                      std::to_string(static_cast<int64_t>(o.getConcatDim())) + ")");
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
           << "\", " << tensors << "}, " << args << "});\n";
        for (auto [i, r] : llvm::enumerate(o.getResults()))
          os << "  " << decl(r) << " = std::move(" << results << ".at(" << i << "));\n";
        return success();
      })
      // State writes are placed by Lifetimes.
      .Case([&](AssignOp) { return success(); })
      .Case([&](func::ReturnOp o) {
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
                    "ops on f32/f64/i64/i32/i1 (cast the operands to f32 first)";
        return other->emitOpError()
               << "has no C++ lowering yet; the CPU backend supports the first-class tdx "
                  "ops and the collectives";
      });
}

LogicalResult Emitter::emitReduce(Operation *op, StringRef fn,
                                  std::optional<ArrayRef<int64_t>> dims, bool keep) {
  std::string x = name(op->getOperand(0));
  std::string e;
  if (!dims || dims->empty())
    e = (fn + "(" + x + ")").str();
  else
    e = (fn + "(" + x + ", std::vector<int64_t>" + list(*dims) + ", " + (keep ? "true" : "false") + ")").str();
  os << "  " << decl(op->getResult(0)) << " = " << e << ";\n";
  return success();
}

/// The C type of a tensor value's elements.
std::string elem(Value v) { return cType(cast<RankedTensorType>(v.getType()).getElementType()); }

/// The start of a call of `k`'s body on single elements: "k3<float>(" or,
/// for a body with concrete types, "k3(".
std::string scalarCall(const FusedKernel &k) {
  return k.name + (k.vectorizable ? "<" + elem(k.outputs.front()) + ">(" : std::string("("));
}

/// The call of the row op that ends kernel `k` on the row `y` of `n`
/// elements, in place: tdx::rt::rows (FusedRows.h) on the CPU, the lanes'
/// functions of tdx/Runtime/Rows.h on a CUDA block. A weight or bias is the
/// kernel input of that index (`a<i>` on the CPU, with its stride `s[i]`;
/// `w<i>`, dense, on CUDA).
std::string rowCall(const FusedKernel &k, Backend backend, StringRef y) {
  Operation *op = k.row;
  bool cuda = backend == Backend::CUDA;
  auto operand = [&](Value v) -> std::string {
    if (!v) // Rows.h's functions deduce the element type from every pointer
      return cuda ? "static_cast<const " + elem(op->getResult(0)) + " *>(nullptr)" : "nullptr, 0";
    std::string index = std::to_string(llvm::find(k.inputs, v) - k.inputs.begin());
    return cuda ? "w" + index : "a" + index + ", s[" + index + "]";
  };
  std::string pre = cuda ? "::tdx::kern::" : "::tdx::rt::rows::";
  std::string lanes = cuda ? "lanes, " : "";
  return llvm::TypeSwitch<Operation *, std::string>(op)
      .Case<SoftmaxOp, LogSoftmaxOp>([&](Operation *o) {
        std::string log = isa<LogSoftmaxOp>(o) ? "true" : "false";
        return cuda ? pre + "softmaxRow(lanes, " + y.str() + ", " + y.str() + ", n, 1, " + log + ")"
                    : pre + "softmax(" + y.str() + ", n, " + log + ")";
      })
      .Case([&](LayerNormOp o) {
        std::string w = operand(o.getWeight()), b = operand(o.getBias());
        std::string eps = number(o.getEps().convertToDouble());
        return cuda ? pre + "layerNormRow(lanes, " + y.str() + ", " + w + ", " + b + ", " + y.str() +
                          ", n, " + eps + ")"
                    : pre + "layerNorm(" + y.str() + ", " + w + ", " + b + ", n, " + eps + ")";
      })
      .Case([&](RmsNormOp o) {
        std::string w = operand(o.getWeight());
        std::string eps = number(o.getEps().convertToDouble());
        return cuda ? pre + "rmsNormRow(lanes, " + y.str() + ", " + w + ", " + y.str() + ", n, " +
                          eps + ")"
                    : pre + "rmsNorm(" + y.str() + ", " + w + ", n, " + eps + ")";
      })
      .Default([](Operation *) -> std::string {
        llvm_unreachable("isRowOp admits only the ops above");
      });
}

/// The CPU loop over one row of kernel `k` (see tdx::rt::KernelRow): whole
/// vector lanes when every input steps by 1 or 0, then element by element;
/// then the row op that ends the kernel, if any, on its result's row.
void emitKernelRow(const FusedKernel &k, llvm::raw_ostream &os) {
  size_t nin = k.inputs.size();
  os << "static void " << k.name << "_row(char *const *p, const int64_t *s, int64_t n) {\n";
  for (auto [i, v] : llvm::enumerate(k.inputs))
    os << "  const " << elem(v) << " *a" << i << " = reinterpret_cast<const " << elem(v)
       << " *>(p[" << i << "]);\n";
  for (auto [i, v] : llvm::enumerate(k.outputs))
    os << "  " << elem(v) << " *y" << i << " = reinterpret_cast<" << elem(v) << " *>(p["
       << nin + i << "]);\n";
  os << "  int64_t j = 0;\n";
  if (k.vectorizable) {
    std::string t = elem(k.outputs.front());
    os << "  if (true";
    for (size_t i = 0; i < nin; ++i)
      os << " && s[" << i << "] <= 1";
    os << ") {\n    using V = at::vec::Vectorized<" << t << ">;\n"
       << "    for (; j + V::size() <= n; j += V::size()) {\n      V";
    for (size_t i = 0; i < k.outputs.size(); ++i)
      os << (i ? ", r" : " r") << i;
    os << ";\n      " << k.name << "<V>(";
    for (size_t i = 0; i < nin; ++i)
      os << (i ? ", " : "") << "s[" << i << "] ? V::loadu(a" << i << " + j) : V(a" << i << "[0])";
    for (size_t i = 0; i < k.outputs.size(); ++i)
      os << (i || nin ? ", " : "") << "r" << i;
    os << ");\n";
    for (size_t i = 0; i < k.outputs.size(); ++i)
      os << "      r" << i << ".store(y" << i << " + j);\n";
    os << "    }\n  }\n";
  }
  os << "  for (; j < n; ++j)\n    " << scalarCall(k);
  for (size_t i = 0; i < nin; ++i)
    os << (i ? ", " : "") << "a" << i << "[j * s[" << i << "]]";
  for (size_t i = 0; i < k.outputs.size(); ++i)
    os << (i || nin ? ", " : "") << "y" << i << "[j]";
  os << ");\n";
  if (k.row)
    os << "  " << rowCall(k, Backend::CPU, "y" + std::to_string(k.outputs.size() - 1)) << ";\n";
  os << "}\n\n";
}

/// The CUDA kernel of `k` that ends in a row op and its launch: one block
/// per row (tdx/Runtime/cuda/Lanes.cuh), whose threads run the body on the
/// row's elements and then the row op on the result's row (each thread
/// reads back only the elements it wrote until the lanes combine).
void emitRowKernelLaunch(const FusedKernel &k, llvm::raw_ostream &os) {
  size_t nin = k.inputs.size();
  std::string t = elem(k.row->getResult(0));
  os << "__global__ void " << k.name << "_kernel(tdx::kern::Iter it) {\n"
     << "  extern __shared__ double rowScratch[];\n"
     << "  ::tdx::cu::BlockLanes lanes{rowScratch};\n"
     << "  int64_t n = it.shape[it.rank - 1], rows = it.numel / n;\n";
  for (unsigned i = 1; i < k.row->getNumOperands(); ++i) {
    auto at = llvm::find(k.inputs, k.row->getOperand(i)) - k.inputs.begin();
    os << "  const " << t << " *w" << at << " = &it.at<" << t << ">(" << at << ", 0);\n";
  }
  os << "  for (int64_t r = blockIdx.x; r < rows; r += gridDim.x) {\n"
     << "    for (int64_t j = threadIdx.x; j < n; j += blockDim.x) {\n"
     << "      int64_t i = r * n + j;\n      " << scalarCall(k);
  for (auto [i, v] : llvm::enumerate(k.inputs))
    os << (i ? ", " : "") << "it.at<" << elem(v) << ">(" << i << ", i)";
  for (auto [i, v] : llvm::enumerate(k.outputs))
    os << (i || nin ? ", " : "") << "it.at<" << elem(v) << ">(" << nin + i << ", i)";
  os << ");\n    }\n"
     << "    " << t << " *y = &it.at<" << t << ">(" << nin + k.outputs.size() - 1 << ", r * n);\n"
     << "    " << rowCall(k, Backend::CUDA, "y") << ";\n  }\n}\n"
     << "static void " << k.name << "_launch(const tdx::kern::Iter &it, cudaStream_t s) {\n";
  for (unsigned i = 1; i < k.row->getNumOperands(); ++i) {
    auto at = llvm::find(k.inputs, k.row->getOperand(i)) - k.inputs.begin();
    os << "  if (it.strides[" << at << "][it.rank - 1] != 1)\n"
       << "    throw std::runtime_error(\"tdx: a fused " << k.row->getName().stripDialect()
       << "'s weight or bias must be dense on CUDA\");\n";
  }
  os << "  " << k.name << "_kernel<<<::tdx::cu::rowBlocks(it.numel / it.shape[it.rank - 1]), "
     << "::tdx::cu::kRowThreads, ::tdx::cu::kRowShared, s>>>(it);\n}\n\n";
}

/// The CUDA kernel around `k`'s body (one thread per element) and its launch.
void emitKernelLaunch(const FusedKernel &k, llvm::raw_ostream &os) {
  if (k.row)
    return emitRowKernelLaunch(k, os);
  size_t nin = k.inputs.size();
  os << "__global__ void " << k.name << "_kernel(tdx::kern::Iter it) {\n"
     << "  int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;\n"
     << "  if (i >= it.numel)\n    return;\n  " << scalarCall(k);
  for (auto [i, v] : llvm::enumerate(k.inputs))
    os << (i ? ", " : "") << "it.at<" << elem(v) << ">(" << i << ", i)";
  for (auto [i, v] : llvm::enumerate(k.outputs))
    os << (i || nin ? ", " : "") << "it.at<" << elem(v) << ">(" << nin + i << ", i)";
  os << ");\n}\n"
     << "static void " << k.name << "_launch(const tdx::kern::Iter &it, cudaStream_t s) {\n  "
     << k.name << "_kernel<<<blocksFor(it.numel), 256, 0, s>>>(it);\n}\n\n";
}

void Emitter::emitKernelCall(const FusedKernel &k) {
  std::string shape = "{";
  for (auto [i, d] : llvm::enumerate(k.space.getShape()))
    shape += (i ? ", " : "") + std::to_string(ShapedType::isDynamic(d) ? -1 : d);
  shape += "}";
  std::string ins = "{", types = "{";
  for (auto [i, v] : llvm::enumerate(k.inputs))
    ins += (i ? ", " : "") + name(v);
  for (auto [i, v] : llvm::enumerate(k.outputs))
    types += (i ? ", " : "") + dtype(cast<RankedTensorType>(v.getType()).getElementType());
  std::string results = "r" + std::to_string(tmps++);
  os << "  std::vector<T::Tensor> " << results << " = elementwise(" << shape << ", " << ins
     << "}, " << types << "}, " << k.name << (backend == Backend::CUDA ? "_launch" : "_row")
     << (k.row && backend == Backend::CPU ? ", true" : "") << ");\n";
  for (auto [i, v] : llvm::enumerate(k.outputs))
    os << "  " << decl(v) << " = std::move(" << results << "[" << i << "]);\n";
}


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
    sig.outputs.push_back({ranked, layoutText(valueSharding(ret.getOperand(i)), meshRank)});
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
