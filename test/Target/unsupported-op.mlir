// RUN: tdx-translate --tdx-to-cpp %s -verify-diagnostics -o /dev/null

// An op the CPU backend cannot lower is named at its location.
module attributes {tdx.partitioned} {
  tdx.mesh @mesh shape = [1] axes = ["x"]
  func.func @forward(%x: tensor<4xf32>) -> tensor<4xf32> {
    // expected-error @+1 {{'tdx.aten' op argument 'tensors' = "tensor_list:0" has no C++ lowering yet}}
    %y = tdx.aten "aten::stack"(%x) {args = {tensors = "tensor_list:0"}} : (tensor<4xf32>) -> tensor<4xf32>
    return %y : tensor<4xf32>
  }
}
