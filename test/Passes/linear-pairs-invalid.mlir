// RUN: tdx-opt %s -split-input-file -verify-diagnostics --tdx-linear-pairs=output=%t.json -o /dev/null

// expected-error @+1 {{tdx-linear-pairs: the module has no function with a body to read}}
module {
}
