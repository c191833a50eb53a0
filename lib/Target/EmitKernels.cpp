//===- EmitKernels.cpp - fused elementwise kernels as C++ and CUDA --------===//

#include "Emitter.h"

#include "llvm/ADT/TypeSwitch.h"

using namespace mlir;
using namespace mlir::tdx;

namespace mlir::tdx::cpp {

/// The C type of a tensor value's elements.
std::string elem(Value v) { return cType(cast<RankedTensorType>(v.getType()).getElementType()); }

/// The start of a call of `k`'s body on single elements: "k3<float>(" or,
/// for a body with concrete types, "k3(".
static std::string scalarCall(const FusedKernel &k) {
  return k.name + (k.vectorizable ? "<" + elem(k.outputs.front()) + ">(" : std::string("("));
}

/// The call of the row op that ends kernel `k` on the row `y` of `n`
/// elements, in place: tdx::rt::rows (FusedRows.h) on the CPU, the lanes'
/// functions of tdx/Runtime/Rows.h on a CUDA block. A weight or bias is the
/// kernel input of that index (`a<i>` on the CPU, with its stride `s[i]`;
/// `w<i>`, dense, on CUDA).
static std::string rowCall(const FusedKernel &k, Backend backend, StringRef y) {
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

void Emitter::emitKernelCall(FusedOp op) {
  const FusedKernel &k = kernels.at(op);
  std::string shape = "{";
  for (auto [i, d] : llvm::enumerate(k.space.getShape()))
    shape += (i ? ", " : "") + std::to_string(ShapedType::isDynamic(d) ? -1 : d);
  shape += "}";
  std::string ins = "{", types = "{";
  for (auto [i, v] : llvm::enumerate(op.getInputs()))
    ins += (i ? ", " : "") + name(v);
  for (auto [i, v] : llvm::enumerate(op.getResults()))
    types += (i ? ", " : "") + dtype(cast<RankedTensorType>(v.getType()).getElementType());
  std::string results = "r" + std::to_string(tmps++);
  os << "  std::vector<T::Tensor> " << results << " = elementwise(" << shape << ", " << ins
     << "}, " << types << "}, " << k.name << (backend == Backend::CUDA ? "_launch" : "_row")
     << (k.row && backend == Backend::CPU ? ", true" : "") << ");\n";
  for (auto [i, v] : llvm::enumerate(op.getResults()))
    os << "  " << decl(v) << " = std::move(" << results << "[" << i << "]);\n";
}

} // namespace mlir::tdx::cpp
