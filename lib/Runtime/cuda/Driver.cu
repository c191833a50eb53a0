//===- Driver.cu - the command line of CUDA model binaries ----------------===//
//
// The same command line and files as the CPU binaries (tdx/Runtime/Options.h,
// tdx/StateFormat/Safetensors.h): a binary's ranks run the one step engine
// (tdx/Runtime/Serve.h) on the CUDA Session (Session.cu), serving the
// runner's requests (--serve DIR) or its command line's.
//
//===----------------------------------------------------------------------===//

#include "tdx/Runtime/Options.h"
#include "tdx/Runtime/Serve.h"
#include "tdx/Runtime/cuda/Runtime.h"

#include <iostream>

int tdx::cu::runMain(int argc, char **argv, const Program &program) {
  tdx::rt::Options o;
  if (int code = tdx::rt::parseOptions(argc, argv, o); code >= 0)
    return code;
  if (o.signature) {
    std::cout << tdx::rt::signatureJson(program, tdx::rt::dtypeName) << "\n";
    return 0;
  }
  return tdx::rt::runEngine(
      o, [&] { return tdx::rt::openEngine(&program, o, /*ownsProcess=*/true); });
}
