// tdx-expand-batch-norm's errors.
// RUN: tdx-opt %s -split-input-file -verify-diagnostics --tdx-expand-batch-norm

// expected-error @+1 {{tdx-expand-batch-norm: 'tdx.batch_norm' names mesh axis 'dp', which no tdx.mesh has; declare the mesh first}}
module attributes {tdx.batch_norm = {axis = "dp", statistics = "global"}} {
}

// -----

module attributes {tdx.batch_norm = {axis = "dp", statistics = "local"}} {
tdx.mesh @mesh shape = [2] axes = ["dp"]
func.func @uneven(%x: tensor<5x4xf32>) -> tensor<5x4xf32> {
  // expected-error @+1 {{'tdx.aten' op (native_batch_norm) cannot take each rank's statistics (batch_norm="local"): a batch of 5 does not split into 2 equal shards; use batch_norm="global" or a batch that splits evenly}}
  %0:3 = tdx.aten "aten::native_batch_norm"(%x) {args = {weight = unit, bias = unit, running_mean = unit, running_var = unit, eps = 1.000000e-05 : f64, momentum = 1.000000e-01 : f64, training = true}} : (tensor<5x4xf32>) -> (tensor<5x4xf32>, tensor<4xf32>, tensor<4xf32>)
  return %0#0 : tensor<5x4xf32>
}
}

