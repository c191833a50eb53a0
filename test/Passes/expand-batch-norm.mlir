// tdx-expand-batch-norm: training-mode batch norm and its backward as
// per-channel sums (float64) and elementwise ops; the running statistics
// as assigns of their buffers.
// RUN: tdx-opt %s -split-input-file --tdx-expand-batch-norm | FileCheck %s

// One group (no batch split named): mean, then the sum of squares about
// it, in float64; y = (x - mean) * invstd * w + b in the step's type.
// CHECK-LABEL: func.func @whole
// CHECK: %[[X64:.*]] = tdx.cast %arg0 : tensor<8x4x2x2xf32> to tensor<8x4x2x2xf64>
// CHECK: %[[S:.*]] = tdx.sum %[[X64]] dims = [0, 2, 3] keepdim : tensor<8x4x2x2xf64> -> tensor<1x4x1x1xf64>
// CHECK: %[[MEAN:.*]] = tdx.div %[[S]]
// CHECK: tdx.sub %{{.*}}, %[[MEAN]] : (tensor<8x4x2x2xf64>, tensor<1x4x1x1xf64>)
// CHECK: tdx.sum %{{.*}} dims = [0, 2, 3] keepdim : tensor<8x4x2x2xf64> -> tensor<1x4x1x1xf64>
// CHECK: tdx.rsqrt
// The unbiased variance moves the running one (n - 1 = 31).
// CHECK: tdx.full 3.100000e+01 : tensor<f64>
// The backward's two sums.
// CHECK: tdx.sum %{{.*}} dims = [0, 2, 3] keepdim : tensor<8x4x2x2xf64> -> tensor<1x4x1x1xf64>
// CHECK: tdx.sum %{{.*}} dims = [0, 2, 3] keepdim : tensor<8x4x2x2xf64> -> tensor<1x4x1x1xf64>
// CHECK-NOT: native_batch_norm
// CHECK: tdx.assign @bn.running_mean
// CHECK: tdx.assign @bn.running_var
// CHECK: return
tdx.buffer @bn.running_mean : tensor<4xf32> init {
  %0 = tdx.full 0.0 : tensor<4xf32>
  tdx.yield %0 : tensor<4xf32>
}
tdx.buffer @bn.running_var : tensor<4xf32> init {
  %0 = tdx.full 1.0 : tensor<4xf32>
  tdx.yield %0 : tensor<4xf32>
}
func.func @whole(%x: tensor<8x4x2x2xf32>, %w: tensor<4xf32>, %b: tensor<4xf32>, %dy: tensor<8x4x2x2xf32>) -> (tensor<8x4x2x2xf32>, tensor<8x4x2x2xf32>, tensor<4xf32>, tensor<4xf32>) {
  %rm = tdx.param_ref @bn.running_mean : tensor<4xf32>
  %rv = tdx.param_ref @bn.running_var : tensor<4xf32>
  %0:3 = tdx.aten "aten::native_batch_norm"(%x, %w, %b, %rm, %rv) {args = {eps = 1.000000e-05 : f64, momentum = 1.000000e-01 : f64, training = true}} : (tensor<8x4x2x2xf32>, tensor<4xf32>, tensor<4xf32>, tensor<4xf32>, tensor<4xf32>) -> (tensor<8x4x2x2xf32>, tensor<4xf32>, tensor<4xf32>)
  %1:3 = tdx.aten "aten::native_batch_norm_backward"(%dy, %x, %w, %rm, %rv, %0#1, %0#2) {args = {eps = 1.000000e-05 : f64, output_mask = [true, true, true], train = true}} : (tensor<8x4x2x2xf32>, tensor<8x4x2x2xf32>, tensor<4xf32>, tensor<4xf32>, tensor<4xf32>, tensor<4xf32>, tensor<4xf32>) -> (tensor<8x4x2x2xf32>, tensor<4xf32>, tensor<4xf32>)
  return %0#0, %1#0, %1#1, %1#2 : tensor<8x4x2x2xf32>, tensor<8x4x2x2xf32>, tensor<4xf32>, tensor<4xf32>
}

// -----

// Global statistics over a batch split on "dp": each group's mean and sum
// of squares side by side, replicated (one all_gather of [G, 2, C]), merged
// exactly; the backward's two sums over the whole batch side by side,
// replicated (one all_reduce).
// CHECK-LABEL: func.func @global
// CHECK: tdx.reshape %arg0 [2, 4, 4, 2, 2]
// CHECK: tdx.sum %{{.*}} dims = [1, 3, 4] keepdim : tensor<2x4x4x2x2xf64> -> tensor<2x1x4x1x1xf64>
// CHECK: tdx.sum %{{.*}} dims = [1, 3, 4] keepdim : tensor<2x4x4x2x2xf64> -> tensor<2x1x4x1x1xf64>
// CHECK: %[[G:.*]] = tdx.concat %{{.*}}, %{{.*}} dim 1 : (tensor<2x1x4x1x1xf64>, tensor<2x1x4x1x1xf64>) -> tensor<2x2x4x1x1xf64>
// CHECK: tdx.annotate %[[G]] <@mesh, [Replicate]> : tensor<2x2x4x1x1xf64>
// CHECK: tdx.sum %{{.*}} dims = [0] keepdim : tensor<2x1x4x1x1xf64> -> tensor<1x1x4x1x1xf64>
// CHECK: tdx.sum %{{.*}} dims = [0, 1, 3, 4] keepdim : tensor<2x4x4x2x2xf64> -> tensor<1x1x4x1x1xf64>
// CHECK: tdx.sum %{{.*}} dims = [0, 1, 3, 4] keepdim : tensor<2x4x4x2x2xf64> -> tensor<1x1x4x1x1xf64>
// CHECK: %[[B:.*]] = tdx.concat %{{.*}}, %{{.*}} dim 0 : (tensor<1x1x4x1x1xf64>, tensor<1x1x4x1x1xf64>) -> tensor<2x1x4x1x1xf64>
// CHECK: tdx.annotate %[[B]] <@mesh, [Replicate]>
module attributes {tdx.batch_norm = {axis = "dp", statistics = "global"}} {
tdx.mesh @mesh shape = [2] axes = ["dp"]
tdx.buffer @bn.running_mean : tensor<4xf32> init {
  %0 = tdx.full 0.0 : tensor<4xf32>
  tdx.yield %0 : tensor<4xf32>
}
tdx.buffer @bn.running_var : tensor<4xf32> init {
  %0 = tdx.full 1.0 : tensor<4xf32>
  tdx.yield %0 : tensor<4xf32>
}
func.func @global(%x: tensor<8x4x2x2xf32>, %w: tensor<4xf32>, %b: tensor<4xf32>, %dy: tensor<8x4x2x2xf32>) -> (tensor<8x4x2x2xf32>, tensor<8x4x2x2xf32>, tensor<4xf32>, tensor<4xf32>) {
  %rm = tdx.param_ref @bn.running_mean : tensor<4xf32>
  %rv = tdx.param_ref @bn.running_var : tensor<4xf32>
  %0:3 = tdx.aten "aten::native_batch_norm"(%x, %w, %b, %rm, %rv) {args = {eps = 1.000000e-05 : f64, momentum = 1.000000e-01 : f64, training = true}} : (tensor<8x4x2x2xf32>, tensor<4xf32>, tensor<4xf32>, tensor<4xf32>, tensor<4xf32>) -> (tensor<8x4x2x2xf32>, tensor<4xf32>, tensor<4xf32>)
  %1:3 = tdx.aten "aten::native_batch_norm_backward"(%dy, %x, %w, %rm, %rv, %0#1, %0#2) {args = {eps = 1.000000e-05 : f64, output_mask = [true, true, true], train = true}} : (tensor<8x4x2x2xf32>, tensor<8x4x2x2xf32>, tensor<4xf32>, tensor<4xf32>, tensor<4xf32>, tensor<4xf32>, tensor<4xf32>) -> (tensor<8x4x2x2xf32>, tensor<4xf32>, tensor<4xf32>)
  return %0#0, %1#0, %1#1, %1#2 : tensor<8x4x2x2xf32>, tensor<8x4x2x2xf32>, tensor<4xf32>, tensor<4xf32>
}
}

// -----

// Each rank's own statistics: per group, no replicated statistic in the
// step's path; the running ones are group 0's (one gather), the weight's
// and bias's gradients sum the groups' in the step's type.
// CHECK-LABEL: func.func @local
// CHECK: tdx.sum %{{.*}} dims = [1, 3, 4] keepdim : tensor<2x4x4x2x2xf64> -> tensor<2x1x4x1x1xf64>
// CHECK: %[[R:.*]] = tdx.concat %{{.*}}, %{{.*}} dim 1 : (tensor<2x1x4x1x1xf64>, tensor<2x1x4x1x1xf64>) -> tensor<2x2x4x1x1xf64>
// CHECK: %[[RR:.*]] = tdx.annotate %[[R]] <@mesh, [Replicate]>
// CHECK: %[[M:.*]] = tdx.slice %[[RR]] dim 1 [0 : 1 : 1]
// CHECK: tdx.slice %[[M]] dim 0 [0 : 1 : 1] : tensor<2x1x4x1x1xf64> -> tensor<1x1x4x1x1xf64>
// CHECK: tdx.sum %{{.*}} dims = [1, 3, 4] keepdim : tensor<2x4x4x2x2xf64> -> tensor<2x1x4x1x1xf64>
// CHECK: tdx.sum %{{.*}} dims = [1, 3, 4] keepdim : tensor<2x4x4x2x2xf64> -> tensor<2x1x4x1x1xf64>
// CHECK: tdx.sum %{{.*}} dims = [0, 1, 3, 4] : tensor<2x1x4x1x1xf32> -> tensor<4xf32>
// CHECK: tdx.sum %{{.*}} dims = [0, 1, 3, 4] : tensor<2x1x4x1x1xf32> -> tensor<4xf32>
module attributes {tdx.batch_norm = {axis = "dp", statistics = "local"}} {
tdx.mesh @mesh shape = [2] axes = ["dp"]
tdx.buffer @bn.running_mean : tensor<4xf32> init {
  %0 = tdx.full 0.0 : tensor<4xf32>
  tdx.yield %0 : tensor<4xf32>
}
tdx.buffer @bn.running_var : tensor<4xf32> init {
  %0 = tdx.full 1.0 : tensor<4xf32>
  tdx.yield %0 : tensor<4xf32>
}
func.func @local(%x: tensor<8x4x2x2xf32>, %w: tensor<4xf32>, %b: tensor<4xf32>, %dy: tensor<8x4x2x2xf32>) -> (tensor<8x4x2x2xf32>, tensor<8x4x2x2xf32>, tensor<4xf32>, tensor<4xf32>) {
  %rm = tdx.param_ref @bn.running_mean : tensor<4xf32>
  %rv = tdx.param_ref @bn.running_var : tensor<4xf32>
  %0:3 = tdx.aten "aten::native_batch_norm"(%x, %w, %b, %rm, %rv) {args = {eps = 1.000000e-05 : f64, momentum = 1.000000e-01 : f64, training = true}} : (tensor<8x4x2x2xf32>, tensor<4xf32>, tensor<4xf32>, tensor<4xf32>, tensor<4xf32>) -> (tensor<8x4x2x2xf32>, tensor<4xf32>, tensor<4xf32>)
  %1:3 = tdx.aten "aten::native_batch_norm_backward"(%dy, %x, %w, %rm, %rv, %0#1, %0#2) {args = {eps = 1.000000e-05 : f64, output_mask = [true, true, true], train = true}} : (tensor<8x4x2x2xf32>, tensor<8x4x2x2xf32>, tensor<4xf32>, tensor<4xf32>, tensor<4xf32>, tensor<4xf32>, tensor<4xf32>) -> (tensor<8x4x2x2xf32>, tensor<4xf32>, tensor<4xf32>)
  return %0#0, %1#0, %1#1, %1#2 : tensor<8x4x2x2xf32>, tensor<8x4x2x2xf32>, tensor<4xf32>, tensor<4xf32>
}
}

// -----

// Eval mode is tdx-raise-aten's: left as it is.
// CHECK-LABEL: func.func @eval
// CHECK: tdx.aten "aten::native_batch_norm"
func.func @eval(%x: tensor<8x4xf32>, %m: tensor<4xf32>, %v: tensor<4xf32>) -> tensor<8x4xf32> {
  %0:3 = tdx.aten "aten::native_batch_norm"(%x, %m, %v) {args = {weight = unit, bias = unit, eps = 1.000000e-05 : f64, momentum = 1.000000e-01 : f64, training = false}} : (tensor<8x4xf32>, tensor<4xf32>, tensor<4xf32>) -> (tensor<8x4xf32>, tensor<4xf32>, tensor<4xf32>)
  return %0#0 : tensor<8x4xf32>
}

// -----

// Running statistics of the caller's (F.batch_norm on its own tensors,
// instance norm's repeated ones) are not state the step can write: the
// op, and its backward, stay ATen's.
// CHECK-LABEL: func.func @callers_statistics
// CHECK: tdx.aten "aten::native_batch_norm"
// CHECK: tdx.aten "aten::native_batch_norm_backward"
func.func @callers_statistics(%x: tensor<8x4xf32>, %m: tensor<4xf32>, %v: tensor<4xf32>, %dy: tensor<8x4xf32>) -> (tensor<8x4xf32>, tensor<8x4xf32>) {
  %0:3 = tdx.aten "aten::native_batch_norm"(%x, %m, %v) {args = {weight = unit, bias = unit, eps = 1.000000e-05 : f64, momentum = 1.000000e-01 : f64, training = true}} : (tensor<8x4xf32>, tensor<4xf32>, tensor<4xf32>) -> (tensor<8x4xf32>, tensor<4xf32>, tensor<4xf32>)
  %1:3 = tdx.aten "aten::native_batch_norm_backward"(%dy, %x, %m, %v, %0#1, %0#2) {args = {weight = unit, eps = 1.000000e-05 : f64, output_mask = [true, false, false], train = true}} : (tensor<8x4xf32>, tensor<8x4xf32>, tensor<4xf32>, tensor<4xf32>, tensor<4xf32>, tensor<4xf32>) -> (tensor<8x4xf32>, tensor<0xf32>, tensor<0xf32>)
  return %0#0, %1#0 : tensor<8x4xf32>, tensor<8x4xf32>
}
