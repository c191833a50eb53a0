// RUN: tdx-translate --tdx-to-cpp %s -split-input-file -verify-diagnostics -o /dev/null

// An argument the CPU backend cannot pass is named at its location.
module attributes {tdx.partitioned} {
  tdx.mesh @mesh shape = [1] axes = ["x"]
  func.func @forward(%x: tensor<4xf32>) -> tensor<4xf32> {
    // expected-error @+1 {{'tdx.aten' op (aten::mylib) argument 'weird' = {a = 1 : i64} has no C++ lowering; generic arguments are None (unit), bool, i64, f64, string, array<i64>, bool arrays, f64 arrays and tensor lists}}
    %y = tdx.aten "aten::mylib"(%x) {args = {weird = {a = 1}}} : (tensor<4xf32>) -> tensor<4xf32>
    return %y : tensor<4xf32>
  }
}
