// RUN: tdx-translate --tdx-to-cpp %s -verify-diagnostics

// expected-error @+1 {{the module is not partitioned; run `tdx-opt --tdx-place --tdx-spmd` first (tdx-compile runs them for you)}}
module {
  tdx.mesh @mesh shape = [1] axes = ["x"]
}
