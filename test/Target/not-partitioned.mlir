// RUN: tdx-translate --tdx-to-cpp %s -verify-diagnostics

// expected-error @+1 {{the module is not partitioned; run `tdx-opt --tdx-propagate-sharding --tdx-insert-collectives --tdx-partition` first}}
module {
  tdx.mesh @mesh shape = [1] axes = ["x"]
}
