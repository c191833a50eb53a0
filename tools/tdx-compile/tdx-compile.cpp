//===- tdx-compile.cpp - tdx programs to model binaries -------------------===//
//
//   tdx-compile model.mlir -o model [--target cpu|cuda] [--cuda-arch sm_90] [--emit-source] [--shared]
//   tdx-compile model.mlir --check [--target cpu|cuda]
//   tdx-compile --build-pch DIR
//
// Runs whatever of the pipeline has not run yet (tdx-place unless values
// carry placements already, then tdx-spmd: passes/Pipelines.cpp),
// lowers the partitioned program to C++ on the CPU runtime or CUDA C++ on the
// CUDA runtime, and compiles and links it into a binary that runs as
//   mpirun -np N ./model --inputs in.safetensors --outputs out.safetensors
//
//===----------------------------------------------------------------------===//

#include "tdx/IR/TdxDialect.h"
#include "tdx/Transforms/Passes.h"
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
#include "llvm/Support/Path.h"
#include "llvm/Support/Process.h"
#include "llvm/Support/Program.h"
#include "llvm/Support/SourceMgr.h"
#include "llvm/Support/ToolOutputFile.h"

#include <optional>

#include "CompileCache.h"
#include "Toolchain.h"

using namespace llvm;

static cl::OptionCategory options("tdx-compile options");
static cl::opt<std::string> input(cl::Positional, cl::desc("<model.mlir>"), cl::cat(options));
static cl::opt<std::string> output("o", cl::desc("the model binary to write"),
                                   cl::value_desc("path"), cl::cat(options));
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
    cl::desc("print a rank's bytes by kind (parameters, optimizer, inputs, gradients, "
             "activations, peak: tdx-memory-report) and the step's memory plan: its working "
             "memory (the most bytes of the step's tensors alive at once) and the arena its "
             "tensors are placed in"),
    cl::cat(options));
static cl::opt<bool> shared(
    "shared",
    cl::desc("write a shared object instead of a binary (either --target): the in-process "
             "library SPMD Python scripts load (tdx_open, tdx_call, ...: "
             "lib/Runtime/Library.cpp)"),
    cl::cat(options));
static cl::opt<bool> progress(
    "progress", cl::desc("print each stage as it starts: \"tdx-compile: [K/3] what\""),
    cl::cat(options));
static cl::opt<bool> check(
    "check",
    cl::desc("run the pipeline and the emitter, then stop: no source is written and no C++ "
             "compiled (exit 0: the program would compile; else the located errors). -o is "
             "not needed"),
    cl::cat(options));
static cl::opt<bool> verbose("v", cl::desc("print the compiler command"), cl::cat(options));
static cl::opt<std::string> cacheDir(
    "cache-dir",
    cl::desc("keep compiled objects (CUDA: binaries) in DIR by the hash of their source, "
             "command and runtime, and link (copy) from there instead of compiling again: a "
             "binary and its --shared object compile once (default: "
             "$TDX_CACHE_DIR, else ~/.cache/tdx/compile; --no-cache for none)"),
    cl::value_desc("DIR"), cl::cat(options));
static cl::opt<bool> noCache("no-cache", cl::desc("compile without the cache"), cl::cat(options));
static cl::opt<unsigned> optLevel(
    "opt-level",
    cl::desc("the C++/CUDA optimization level, 0 to 3 (default 2, for binaries you run; 0 "
             "compiles in a third to half of the time and runs its kernels slower: tests)"),
    cl::init(2), cl::cat(options));
static cl::opt<std::string> buildPch(
    "build-pch",
    cl::desc("precompile the CPU runtime's header into DIR (the build does this once into "
             "build/lib/pch, which every CPU compile then uses) and exit"),
    cl::value_desc("DIR"), cl::cat(options));

namespace {
enum class Capability { Default, Avx2, Avx512 };
} // namespace

/// The vector unit the emitted kernels are compiled for. They run on ATen's
/// vector lanes (at::vec, Sleef) next to ATen's own kernels, so they take
/// the capability ATen runs with: the widest this machine has (the binary
/// is built where it runs), or less where ATEN_CPU_CAPABILITY asks for less
/// (as ATen itself reads it: "default", "avx2", "avx512"). A fused kernel
/// then rounds as the ATen kernel it replaces does on that capability.
static Capability cpuCapability() {
  __builtin_cpu_init();
  Capability widest = Capability::Default;
  if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
      __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq") &&
      __builtin_cpu_supports("fma"))
    widest = Capability::Avx512;
  else if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma"))
    widest = Capability::Avx2;
  StringRef asked = std::getenv("ATEN_CPU_CAPABILITY") ? std::getenv("ATEN_CPU_CAPABILITY") : "";
  Capability cap = asked.equals_insensitive("default") ? Capability::Default
                   : asked.equals_insensitive("avx2")  ? Capability::Avx2
                                                       : widest;
  return std::min(cap, widest);
}

static StringRef capabilityName(Capability cap) {
  return cap == Capability::Avx512 ? "avx512" : cap == Capability::Avx2 ? "avx2" : "default";
}

/// What emitted sources compile against (findToolchain, in main).
static tdx::Toolchain toolchain;

/// The compiler and its flags for a CPU source or header at optimization
/// level `level`, up to the file.
static SmallVector<std::string> cpuCompileCommand(unsigned level) {
  // GCC's points-to analysis is superlinear in the size of the one step
  // function (a training step's: 20 of 55 s); the kernels do not need it.
  // -fPIC: one precompiled header serves binaries and shared objects.
  // C++20 and torch's C++ ABI: what torch 2.x's headers and libraries need.
  SmallVector<std::string> args = {toolchain.compiler, "-std=c++20", toolchain.torchAbi,
                                   "-O" + std::to_string(level),
                                   "-fPIC", "-fno-tree-pta", "-ffp-contract=off"};
  switch (cpuCapability()) {
  case Capability::Avx512:
    args.append({"-mavx512f", "-mavx512bw", "-mavx512vl", "-mavx512dq", "-mfma",
                 "-DCPU_CAPABILITY=AVX512", "-DCPU_CAPABILITY_AVX512"});
    break;
  case Capability::Avx2:
    args.append({"-mavx2", "-mfma", "-mf16c", "-DCPU_CAPABILITY=AVX2", "-DCPU_CAPABILITY_AVX2"});
    break;
  case Capability::Default:
    break;
  }
  for (const std::string &dir : toolchain.includes)
    args.push_back("-I" + dir);
  return args;
}

/// The header every emitted CPU source includes first, and its precompiled
/// form: parsing ATen's headers is most of a small program's compile.
static constexpr const char *kPchHeader = "tdx-runtime.h";

/// The precompiled form of the runtime's header at -O`level` for the CPU
/// capability ATen runs with, under the header's .gch folder `gchDir`.
static std::string pchFile(StringRef gchDir, unsigned level) {
  return (gchDir + "/O" + Twine(level) + "-" + capabilityName(cpuCapability()) + ".gch").str();
}

static int run(ArrayRef<std::string> args, std::string &error) {
  SmallVector<StringRef> refs(args.begin(), args.end());
  if (verbose) {
    for (StringRef a : refs)
      errs() << a << " ";
    errs() << "\n";
  }
  return sys::ExecuteAndWait(args.front(), refs, std::nullopt, {}, 0, 0, &error);
}

/// --build-pch DIR: DIR/tdx-runtime.h and its precompiled forms, built with
/// exactly the flags a CPU compile uses. GCC ignores a precompiled header
/// whose flags differ (a mismatch costs time, never correctness), and -O0
/// differs from the others (__OPTIMIZE__), so DIR/tdx-runtime.h.gch is a
/// directory of two per CPU capability (cpuCapability()), O0-CAP.gch and
/// O2-CAP.gch, of which GCC takes the one that fits (-O1 and -O3 take
/// O2's). The build makes this machine's; ATEN_CPU_CAPABILITY=avx2
/// tdx-compile --build-pch DIR adds AVX2's beside them.
static int buildPrecompiledHeader(StringRef dir) {
  if (std::error_code ec = sys::fs::create_directories(dir)) {
    errs() << "tdx-compile: cannot create " << dir << ": " << ec.message() << "\n";
    return 1;
  }
  std::string header = (dir + "/" + kPchHeader).str();
  StringRef text = "// Generated by tdx-compile --build-pch: the header emitted CPU sources "
                   "start with.\n#include \"tdx/Runtime/Runtime.h\"\n";
  // Rewritten only when it differs: a compile may be reading it.
  auto old = MemoryBuffer::getFile(header);
  if (!old || (*old)->getBuffer() != text) {
    std::error_code ec;
    raw_fd_ostream os(header, ec, sys::fs::OF_Text);
    if (ec) {
      errs() << "tdx-compile: cannot write " << header << ": " << ec.message() << "\n";
      return 1;
    }
    os << text;
  }
  std::string gchDir = header + ".gch";
  if (sys::fs::is_regular_file(gchDir)) // one .gch, as builds before made it
    sys::fs::remove(gchDir);
  if (std::error_code ec = sys::fs::create_directories(gchDir)) {
    errs() << "tdx-compile: cannot create " << gchDir << ": " << ec.message() << "\n";
    return 1;
  }
  for (const char *before : {"O0.gch", "O2.gch"}) // named before capabilities were
    sys::fs::remove(gchDir + "/" + before);
  for (unsigned level : {0u, 2u}) {
    // Written under another name (this process's: ranks installed from the
    // wheel may precompile at once) and renamed, so a compile running
    // meanwhile never reads half a precompiled header.
    std::string gch = pchFile(gchDir, level),
                partial = gch + ".partial." + std::to_string(sys::Process::getProcessId());
    SmallVector<std::string> args = cpuCompileCommand(level);
    args.append({"-c", "-x", "c++-header", header, "-o", partial});
    std::string error;
    if (int rc = run(args, error)) {
      errs() << "tdx-compile: precompiling " << header << " failed ("
             << (error.empty() ? "exit " + std::to_string(rc) : error) << ")\n";
      sys::fs::remove(partial);
      return 1;
    }
    if (std::error_code ec = sys::fs::rename(partial, gch)) {
      errs() << "tdx-compile: cannot write " << gch << ": " << ec.message() << "\n";
      return 1;
    }
  }
  // Another capability's, precompiled before the runtime's headers last
  // changed, is stale: GCC would take it and compile against the old
  // runtime. Removed, that capability compiles from the header (slower,
  // right) until tdx-compile --build-pch runs under it again.
  sys::TimePoint<> newest;
  std::error_code ec;
  const std::string &runtime = toolchain.runtimeHeaders;
  for (sys::fs::recursive_directory_iterator it(runtime, ec), end; it != end && !ec;
       it.increment(ec)) {
    sys::fs::file_status st;
    if (!sys::fs::status(it->path(), st) && st.getLastModificationTime() > newest)
      newest = st.getLastModificationTime();
  }
  std::string ours = (Twine("-") + capabilityName(cpuCapability()) + ".gch").str();
  for (sys::fs::directory_iterator it(gchDir, ec), end; it != end && !ec; it.increment(ec)) {
    StringRef name = sys::path::filename(it->path());
    sys::fs::file_status st;
    if (name.ends_with(ours) ||
        sys::fs::status(it->path(), st) || st.getLastModificationTime() >= newest)
      continue;
    sys::fs::remove(it->path());
  }
  return 0;
}

int main(int argc, char **argv) {
  InitLLVM init(argc, argv);
  cl::HideUnrelatedOptions(options);
  cl::ParseCommandLineOptions(
      argc, argv,
      "tdx-compile: a tdx program to a model binary\n\n"
      "Unless the program is already partitioned, runs the pipeline tdx-opt registers:\n"
      "--tdx-place (canonicalize, tdx-propagate-sharding; skipped when values carry\n"
      "placements already) then --tdx-spmd (tdx-insert-collectives, tdx-fold-mesh,\n"
      "tdx-partition, tdx-widen-reductions, tdx-regather-parameters,\n"
      "tdx-prefetch-all-gathers, tdx-hoist-collectives, tdx-schedule-waits), then\n"
      "--tdx-backend (tdx-fuse-elementwise, tdx-async-collectives, tdx-recompute,\n"
      "tdx-plan-memory, tdx-memory-report's budget check, tdx-split-parts),\n"
      "whose decisions the emitters print. Emits C++ (as tdx-translate\n"
      "--tdx-to-cpp) or CUDA (--tdx-to-cuda) and compiles it\n"
      "against that runtime, or copies the binary from the compile cache when the same\n"
      "source was compiled before. Run the result with\n"
      "  mpirun -np N ./model --inputs in.safetensors --outputs out.safetensors\n");
  std::string toolchainError;
  toolchain = tdx::findToolchain(argv[0], toolchainError);
  if (toolchain.compiler.empty() && !check) {
    errs() << toolchainError << "\n";
    return 2;
  }
  if (!buildPch.empty())
    return buildPrecompiledHeader(buildPch);
  if (input.empty() || (output.empty() && !check)) {
    errs() << "tdx-compile: give the program and the binary to write: tdx-compile model.mlir -o "
              "model (see --help)\n";
    return 2;
  }
  if (target != "cpu" && target != "cuda") {
    errs() << "tdx-compile: unknown --target " << target << "; use cpu or cuda\n";
    return 2;
  }
  if (optLevel > 3) {
    errs() << "tdx-compile: --opt-level " << optLevel << " is not 0, 1, 2 or 3\n";
    return 2;
  }
  bool cuda = target == "cuda";
  if (cuda && !check && toolchain.cudaCompiler.empty()) {
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
  auto stage = [&](int k, const std::string &what) {
    if (progress) {
      outs() << "tdx-compile: [" << k << "/3] " << what << "\n";
      outs().flush();
    }
  };
  stage(1, "placing and partitioning");
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
  stage(2, cuda ? "emitting CUDA" : "emitting C++");
  if (failed(mlir::tdx::prepareForEmission(*module)))
    return 1;
  if (memoryReport) {
    // A rank's bytes by kind (tdx-memory-report, what prog.memory_report() gives).
    auto pm = mlir::PassManager::on<mlir::ModuleOp>(&context);
    pm.addPass(mlir::tdx::createMemoryReport());
    outs().flush();
    if (failed(pm.run(*module)))
      return 1;
  }
  if (check) {
    mlir::tdx::MemoryPlan plan;
    return failed(mlir::tdx::emitCpp(*module, nulls(),
                                     cuda ? mlir::tdx::Backend::CUDA : mlir::tdx::Backend::CPU,
                                     &plan));
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
  // What the cache keeps: a CUDA binary, or a CPU object (position
  // independent), which links into a binary or, with --shared, a shared
  // object: an SPMD script's tdx.compile and exe.library() compile once.
  std::string artifact = cuda ? output : output + ".o";
  SmallVector<std::string> args, link;
  if (cuda) {
    args = {toolchain.cudaCompiler, "-std=c++17", "-O" + std::to_string(optLevel), "--fmad=false",
            "-arch=" + cudaArch,
            "-DOMPI_SKIP_MPICXX=1", "-o", output, source};
    // A shared object for SPMD scripts: the library's C ABI lives in the
    // runtime archive, pulled in.
    if (shared)
      args.append({"-shared", "-Xcompiler", "-fPIC", "-Xlinker", "-u,tdx_open"});
    for (const std::string &dir : toolchain.cudaIncludes)
      args.push_back("-I" + dir);
    args.append(toolchain.cudaLibraries.begin(), toolchain.cudaLibraries.end());
    args.push_back("-Xlinker=-rpath,/usr/lib/x86_64-linux-gnu");
  } else {
    args = cpuCompileCommand(optLevel);
    // The runtime's precompiled header, where the build made one.
    std::string pch = toolchain.pchDir + "/" + kPchHeader;
    // Installed from the wheel: the header is precompiled on first use (a
    // failure only costs time: the compile reads the header itself).
    if (toolchain.installed && !toolchain.pchDir.empty() &&
        !sys::fs::exists(pchFile(pch + ".gch", 2))) {
      if (progress) {
        outs() << "tdx-compile: precompiling the runtime's header for this torch (once)\n";
        outs().flush();
      }
      (void)buildPrecompiledHeader(toolchain.pchDir);
    }
    if (!toolchain.pchDir.empty() && sys::fs::exists(pch + ".gch"))
      args.append({"-include", pch});
    args.append({"-c", "-o", artifact, source});
    link = {toolchain.compiler, "-o", output, artifact};
    // The library's C ABI lives in the runtime archive: pull it in.
    if (shared)
      link.append({"-shared", "-Wl,-u,tdx_open"});
    link.append(toolchain.libraries.begin(), toolchain.libraries.end());
    link.push_back("-Wl,-rpath," + toolchain.torchLibDir);
  }
  tdx::CompileCache cache(noCache ? "" : cacheDir.empty() ? tdx::CompileCache::defaultDir()
                                                           : cacheDir.getValue());
  std::string key;
  if (cache.enabled()) {
    auto text = MemoryBuffer::getFile(source);
    // The command as it reads: without where this compile writes.
    SmallVector<std::string> command;
    for (const std::string &arg : args)
      command.push_back(arg == artifact ? "<output>" : arg == source ? "<source>" : arg);
    if (text)
      key = cache.key((*text)->getBuffer(), command);
  }
  std::string error;
  // The cached or compiled artifact made into the output: a CPU object is
  // linked (and removed), a CUDA binary is the output.
  auto finish = [&]() {
    if (!emitSource)
      sys::fs::remove(source);
    if (link.empty())
      return 0;
    int rc = run(link, error);
    sys::fs::remove(artifact);
    if (rc != 0) {
      errs() << "tdx-compile: linking " << output << " failed ("
             << (error.empty() ? "exit " + std::to_string(rc) : error)
             << "); rerun with -v to see the command\n";
      return 1;
    }
    return 0;
  };
  auto fromCache = [&]() {
    if (key.empty() || !cache.fetch(key, artifact))
      return false;
    outs() << "tdx-compile: " << output << " from the compile cache (" << key << ")\n";
    outs().flush();
    return true;
  };
  if (fromCache())
    return finish();
  // Another process compiling the same program: wait for it, then take its
  // binary.
  std::optional<tdx::CompileCache::Lock> lock;
  if (!key.empty())
    lock.emplace(cache, key);
  if (fromCache())
    return finish();
  stage(3, cuda ? "compiling CUDA (nvcc)" : "compiling C++");
  int rc = run(args, error);
  if (rc == 0 && !key.empty())
    cache.store(key, artifact);
  lock.reset();
  if (rc != 0) {
    if (!emitSource)
      sys::fs::remove(source);
    sys::fs::remove(artifact);
    errs() << "tdx-compile: compiling the emitted " << (cuda ? "CUDA" : "C++") << " failed (" << (error.empty() ? "exit " + std::to_string(rc) : error)
           << "); rerun with --emit-source -v to see the source and the command\n";
    return 1;
  }
  return finish();
}
