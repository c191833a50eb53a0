//===- Toolchain.h - what tdx-compile compiles emitted code against -*- C++ -*-===//
//
// The compiler, include folders and libraries of a model binary's compile,
// fixed when tdx was configured (CompileConfig.inc) and found again where
// tdx-compile runs from:
//  - from a build (build/bin/tdx-compile): as configured, the checkout's
//    include/ and the build's runtime archives;
//  - installed from the wheel (site-packages/tdx/bin/tdx-compile, with
//    tdx/runtime/{include,lib} beside bin/): the wheel's runtime headers and
//    archives, the torch that TDX_TORCH_DIR names (the console command and
//    tdx.compile set it to the environment's torch), and the runtime's
//    precompiled header made once per torch under the user's cache.
//
//===----------------------------------------------------------------------===//

#ifndef TDX_TOOLS_TOOLCHAIN_H
#define TDX_TOOLS_TOOLCHAIN_H

#include <string>
#include <vector>

namespace tdx {

struct Toolchain {
  std::string compiler;       // mpicxx
  std::string torchAbi;       // -D_GLIBCXX_USE_CXX11_ABI=...
  std::vector<std::string> includes, libraries;
  std::string cudaCompiler;   // empty: built without nvcc
  std::vector<std::string> cudaIncludes, cudaLibraries;
  std::string pchDir;         // the runtime's precompiled header; may be empty
  std::string torchLibDir;    // the binaries' rpath
  std::string runtimeHeaders; // include/tdx/Runtime
  bool installed = false;     // from the wheel's layout
};

/// The toolchain of the tdx-compile running as `argv0`; on failure an
/// empty compiler and `error` saying what to do.
Toolchain findToolchain(const char *argv0, std::string &error);

} // namespace tdx

#endif // TDX_TOOLS_TOOLCHAIN_H
