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


// -----

func.func @mixed_statistics(%x: tensor<8x4xf32>, %dy: tensor<8x4xf32>) -> tensor<8x4xf32> {
  %0:3 = tdx.aten "aten::native_batch_norm"(%x) {args = {weight = unit, bias = unit, running_mean = unit, running_var = unit, eps = 1.000000e-05 : f64, momentum = 1.000000e-01 : f64, training = true}} : (tensor<8x4xf32>) -> (tensor<8x4xf32>, tensor<4xf32>, tensor<4xf32>)
  %1:3 = tdx.aten "aten::native_batch_norm"(%0#0) {args = {weight = unit, bias = unit, running_mean = unit, running_var = unit, eps = 1.000000e-05 : f64, momentum = 1.000000e-01 : f64, training = true}} : (tensor<8x4xf32>) -> (tensor<8x4xf32>, tensor<4xf32>, tensor<4xf32>)
  // expected-error @+1 {{'tdx.aten' op (native_batch_norm_backward) reads the saved statistics of two different native_batch_norms}}
  %2:3 = tdx.aten "aten::native_batch_norm_backward"(%dy, %x, %0#1, %1#2) {args = {weight = unit, running_mean = unit, running_var = unit, eps = 1.000000e-05 : f64, output_mask = [true, false, false], train = true}} : (tensor<8x4xf32>, tensor<8x4xf32>, tensor<4xf32>, tensor<4xf32>) -> (tensor<8x4xf32>, tensor<0xf32>, tensor<0xf32>)
  return %2#0 : tensor<8x4xf32>
}
