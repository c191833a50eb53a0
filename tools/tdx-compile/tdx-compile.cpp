//===- tdx-compile.cpp - tdx programs to model binaries -------------------===//
//
//   tdx-compile model.mlir -o model [--target cpu|cuda] [--cuda-arch sm_90] [--emit-source]
//
// Runs whatever of the pipeline has not run yet (sharding propagation unless
// values carry placements already, collective insertion, partitioning),
// lowers the partitioned program to C++ on the CPU runtime or CUDA C++ on the
// CUDA runtime, and compiles and links it into a binary that runs as
//   mpirun -np N ./model --inputs in.safetensors --outputs out.safetensors
//
//===----------------------------------------------------------------------===//

#include "tdx/Dialect/TdxDialect.h"
#include "tdx/Passes/Passes.h"
#include "tdx/Target/Cpp.h"

#include "mlir/Dialect/Arith/IR/Arith.h"
#include "mlir/Dialect/Func/IR/FuncOps.h"
#include "mlir/IR/MLIRContext.h"
#include "mlir/Parser/Parser.h"
#include "mlir/Pass/PassManager.h"
#include "mlir/Transforms/Passes.h"
#include "llvm/Support/CommandLine.h"
#include "llvm/Support/FileSystem.h"
#include "llvm/Support/InitLLVM.h"
#include "llvm/Support/Program.h"
#include "llvm/Support/SourceMgr.h"
#include "llvm/Support/ToolOutputFile.h"

#include "CompileConfig.inc"

using namespace llvm;

static cl::OptionCategory options("tdx-compile options");
static cl::opt<std::string> input(cl::Positional, cl::desc("<model.mlir>"), cl::Required,
                                  cl::cat(options));
static cl::opt<std::string> output("o", cl::desc("the model binary to write"),
                                   cl::value_desc("path"), cl::Required, cl::cat(options));
static cl::opt<std::string> target("target",
                                   cl::desc("cpu (ATen + MPI) or cuda (cuBLAS + NCCL + MPI)"),
                                   cl::init("cpu"), cl::cat(options));
static cl::opt<std::string> cudaArch("cuda-arch",
                                     cl::desc("the GPU architecture of --target cuda (nvcc -arch)"),
                                     cl::init("sm_90"), cl::cat(options));
static cl::opt<bool> emitSource("emit-source",
                                cl::desc("keep the emitted source next to the binary (<o>.cpp or "
                                         "<o>.cu)"),
                                cl::cat(options));
static cl::opt<bool> memoryReport(
    "memory-report",
    cl::desc("print the step's memory plan per rank: its working memory (the most bytes of "
             "the step's tensors alive at once) and the arena its tensors are placed in"),
    cl::cat(options));
static cl::opt<bool> verbose("v", cl::desc("print the compiler command"), cl::cat(options));

int main(int argc, char **argv) {
  InitLLVM init(argc, argv);
  cl::HideUnrelatedOptions(options);
  cl::ParseCommandLineOptions(
      argc, argv,
      "tdx-compile: a tdx program to a model binary\n\n"
      "Runs --tdx-propagate-sharding, --tdx-insert-collectives and --tdx-partition unless the\n"
      "program is already partitioned, emits C++ (as tdx-translate --tdx-to-cpp) or CUDA\n"
      "(--tdx-to-cuda) and compiles it against that runtime. Run the result with\n"
      "  mpirun -np N ./model --inputs in.safetensors --outputs out.safetensors\n");
  if (target != "cpu" && target != "cuda") {
    errs() << "tdx-compile: unknown --target " << target << "; use cpu or cuda\n";
    return 2;
  }
  bool cuda = target == "cuda";
  if (cuda && !*kCudaCompiler) {
    errs() << "tdx-compile: this tdx was built without nvcc, so --target cuda cannot compile; "
              "install the CUDA toolkit (nvcc, cuBLAS, NCCL) and rebuild tdx, or use --target "
              "cpu\n";
    return 2;
  }
  mlir::DialectRegistry registry;
  registry.insert<mlir::tdx::TdxDialect, mlir::func::FuncDialect, mlir::arith::ArithDialect>();
  mlir::MLIRContext context(registry);
  llvm::SourceMgr sources;
  mlir::SourceMgrDiagnosticHandler diagnostics(sources, &context);
  auto file = MemoryBuffer::getFileOrSTDIN(input);
  if (!file) {
    errs() << "tdx-compile: cannot read " << input << ": " << file.getError().message() << "\n";
    return 1;
  }
  sources.AddNewSourceBuffer(std::move(*file), SMLoc());
  mlir::OwningOpRef<mlir::ModuleOp> module =
      mlir::parseSourceFile<mlir::ModuleOp>(sources, &context);
  if (!module)
    return 1;
  if (!(*module)->hasAttr(::mlir::tdx::TdxDialect::kPartitionedAttrName)) {
    auto pm = mlir::PassManager::on<mlir::ModuleOp>(&context);
    // Propagation runs once: a program it placed already (tdx.parallelize
    // does) keeps its placements.
    bool placed = false;
    module->walk([&](mlir::Operation *op) {
      placed |= op->hasAttr(::mlir::tdx::TdxDialect::kShardingsAttrName);
      return placed ? mlir::WalkResult::interrupt() : mlir::WalkResult::advance();
    });
    if (!placed) {
      mlir::tdx::buildPlacePipeline(pm, {});
    }
    mlir::tdx::buildSpmdPipeline(pm);
    if (failed(pm.run(*module)))
      return 1;
  }
  std::string source = output + (cuda ? ".cu" : ".cpp");
  {
    std::error_code ec;
    ToolOutputFile out(source, ec, sys::fs::OF_Text);
    if (ec) {
      errs() << "tdx-compile: cannot write " << source << ": " << ec.message() << "\n";
      return 1;
    }
    mlir::tdx::MemoryPlan plan;
    if (failed(mlir::tdx::emitCpp(*module, out.os(),
                                  cuda ? mlir::tdx::Backend::CUDA : mlir::tdx::Backend::CPU,
                                  &plan)))
      return 1;
    out.keep();
    if (memoryReport)
      outs() << "tdx-compile: memory plan per rank: working memory of a step " << plan.workingBytes
             << " bytes, arena " << plan.arenaBytes << " bytes for " << plan.arenaTensors
             << " tensors\n";
  }
  SmallVector<std::string> args;
  if (cuda) {
    args = {kCudaCompiler, "-std=c++17", "-O2", "--fmad=false", "-arch=" + cudaArch,
            "-DOMPI_SKIP_MPICXX=1", "-o", output, source};
    for (const char *dir : kCudaIncludes)
      args.push_back(std::string("-I") + dir);
    for (const char *lib : kCudaLibraries)
      args.push_back(lib);
    args.push_back("-Xlinker=-rpath,/usr/lib/x86_64-linux-gnu");
  } else {
    // GCC's points-to analysis is superlinear in the size of the one step
    // function (a training step's: 20 of 55 s); the kernels do not need it.
    args = {kCompiler, "-std=c++17", "-O2", "-fno-tree-pta", "-ffp-contract=off", "-o", output,
            source};
    // Emitted kernels run on ATen's vector lanes; use the widest ATen's
    // headers offer that this machine runs (the binary is built where it runs).
    __builtin_cpu_init();
    if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
        __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq") &&
        __builtin_cpu_supports("fma"))
      args.append({"-mavx512f", "-mavx512bw", "-mavx512vl", "-mavx512dq", "-mfma",
                   "-DCPU_CAPABILITY=AVX512", "-DCPU_CAPABILITY_AVX512"});
    else if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma"))
      args.append({"-mavx2", "-mfma", "-DCPU_CAPABILITY=AVX2", "-DCPU_CAPABILITY_AVX2"});
    for (const char *dir : kIncludes)
      args.push_back(std::string("-I") + dir);
    for (const char *lib : kLibraries)
      args.push_back(lib);
    args.push_back("-Wl,-rpath,/usr/lib/x86_64-linux-gnu");
  }
  SmallVector<StringRef> refs(args.begin(), args.end());
  if (verbose) {
    for (StringRef a : refs)
      errs() << a << " ";
    errs() << "\n";
  }
  std::string error;
  int rc = sys::ExecuteAndWait(args.front(), refs, std::nullopt, {}, 0, 0, &error);
  if (!emitSource)
    sys::fs::remove(source);
  if (rc != 0) {
    errs() << "tdx-compile: compiling the emitted " << (cuda ? "CUDA" : "C++") << " failed (" << (error.empty() ? "exit " + std::to_string(rc) : error)
           << "); rerun with --emit-source -v to see the source and the command\n";
    return 1;
  }
  return 0;
}
