//===- Toolchain.cpp - what tdx-compile compiles emitted code against -----===//

#include "Toolchain.h"

#include "llvm/ADT/StringExtras.h"
#include "llvm/ADT/StringRef.h"
#include "llvm/Support/FileSystem.h"
#include "llvm/Support/Path.h"
#include "llvm/Support/Process.h"
#include "llvm/Support/Program.h"
#include "llvm/Support/SHA256.h"
#include "llvm/Support/raw_ostream.h"

#include "CompileCache.h"
#include "CompileConfig.inc"

using namespace llvm;

namespace tdx {

Toolchain findToolchain(const char *argv0, std::string &error) {
  Toolchain tc;
  tc.compiler = kCompiler;
  tc.torchAbi = kTorchAbi;
  tc.cudaCompiler = kCudaCompiler;
  tc.pchDir = kPchDir;
  tc.torchLibDir = kTorchLibDir;
  for (const char *dir : kIncludes)
    tc.includes.push_back(dir);
  for (const char *lib : kLibraries)
    tc.libraries.push_back(lib);
  for (const char *dir : kCudaIncludes)
    tc.cudaIncludes.push_back(dir);
  for (const char *lib : kCudaLibraries)
    tc.cudaLibraries.push_back(lib);

  // The wheel's layout: tdx/bin/tdx-compile beside tdx/runtime/.
  std::string exe = sys::fs::getMainExecutable(argv0, (void *)&findToolchain);
  SmallString<256> runtime(sys::path::parent_path(sys::path::parent_path(exe)));
  sys::path::append(runtime, "runtime");
  if (!sys::fs::is_directory(runtime + "/include/tdx/Runtime")) {
    tc.runtimeHeaders = std::string(kSourceInclude) + "/tdx/Runtime";
    return tc;
  }
  tc.installed = true;
  std::optional<std::string> torch = sys::Process::GetEnv("TDX_TORCH_DIR");
  if (!torch || torch->empty()) {
    error = "tdx-compile: set TDX_TORCH_DIR to the folder of the torch to compile against "
            "(python -c 'import torch, os; print(os.path.dirname(torch.__file__))'); the "
            "tdx-compile command and tdx.compile set it to their environment's torch";
    tc.compiler.clear();
    return tc;
  }
  if (!sys::fs::is_directory(*torch + "/include/ATen")) {
    error = "tdx-compile: TDX_TORCH_DIR=" + *torch + " holds no torch (no include/ATen); name "
            "the folder of an installed torch (its torch/__init__.py's)";
    tc.compiler.clear();
    return tc;
  }
  // Configured paths under the checkout's include/, the build's lib/ or the
  // build's torch, moved to the wheel's runtime and the given torch; an -L
  // flag's prefix kept.
  std::string include = (runtime + "/include").str(), lib = (runtime + "/lib").str();
  auto move = [&](const std::string &item) {
    StringRef flag = StringRef(item).starts_with("-L") ? "-L" : "";
    StringRef path = StringRef(item).drop_front(flag.size());
    for (auto [from, to] : {std::pair<StringRef, StringRef>{kSourceInclude, include},
                            {kBuildLib, lib},
                            {kTorchDir, *torch}})
      if (path == from || path.starts_with((from + "/").str()))
        return (flag + to + path.drop_front(from.size())).str();
    return item;
  };
  for (auto *list : {&tc.includes, &tc.libraries, &tc.cudaIncludes, &tc.cudaLibraries})
    for (std::string &item : *list)
      item = move(item);
  tc.torchLibDir = move(tc.torchLibDir);
  tc.runtimeHeaders = include + "/tdx/Runtime";
  // The compiler configured on the build machine, else the one on PATH.
  if (!sys::fs::can_execute(tc.compiler)) {
    ErrorOr<std::string> found = sys::findProgramByName(sys::path::filename(tc.compiler));
    if (!found) {
      error = "tdx-compile: " + tc.compiler + " not found: install Open MPI's compiler "
              "wrapper (Debian: libopenmpi-dev) and a C++ compiler";
      tc.compiler.clear();
      return tc;
    }
    tc.compiler = *found;
  }
  if (!tc.cudaCompiler.empty() && !sys::fs::can_execute(tc.cudaCompiler))
    tc.cudaCompiler.clear();
  // The precompiled header: one per (runtime, torch, compiler), in the
  // compile cache's folder (whose pruning removes only its keys' files).
  std::string cache = CompileCache::defaultDir();
  if (cache.empty()) {
    tc.pchDir.clear();
    return tc;
  }
  SHA256 hash;
  for (StringRef part : {StringRef(runtime), StringRef(*torch), StringRef(tc.compiler)}) {
    hash.update(part);
    hash.update(StringRef("\0", 1));
  }
  std::array<uint8_t, 32> digest = hash.final();
  SmallString<256> pch(cache);
  sys::path::append(pch, "pch", toHex(ArrayRef<uint8_t>(digest).take_front(8), true));
  tc.pchDir = std::string(pch);
  return tc;
}

} // namespace tdx
