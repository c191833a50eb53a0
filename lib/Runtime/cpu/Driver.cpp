//===- Driver.cpp - the command line of CPU model binaries ----------------===//
//
// A binary's ranks run the one step engine (tdx/Runtime/Serve.h) on a CPU
// Session: the runner's requests (--serve DIR) or its command line's.
//
//===----------------------------------------------------------------------===//

#include "tdx/Runtime/Runtime.h"
#include "tdx/Runtime/Serve.h"

#include <iostream>
#include <memory>

using namespace tdx::rt;

int tdx::rt::runMain(int argc, char **argv, const Program &program) {
  Options o;
  if (int code = parseOptions(argc, argv, o); code >= 0)
    return code;
  if (o.signature) {
    std::cout << signatureJson(program, [](at::ScalarType t) { return dtypeName(dtypeOf(t)); })
              << "\n";
    return 0;
  }
  std::vector<EntryShapes> shapes;
  for (size_t k = 0; k <= program.entries.size(); ++k) {
    EntryShapes &e = shapes.emplace_back();
    for (const Program::Value &v : program.inputsOf(k))
      e.inputs.push_back(v.shape);
    for (const Program::Value &v : program.outputsOf(k))
      e.outputs.push_back(v.shape);
  }
  return runEngine(o, [&] { return openEngine(&program, o, /*ownsProcess=*/true); }, shapes);
}
