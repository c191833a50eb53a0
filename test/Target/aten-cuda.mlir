// RUN: tdx-translate --tdx-to-cuda %s | FileCheck %s

// A training step's backward ops that stay generic run on CUDA through
// tdx::cu::callAten (tdx/Runtime/cuda/AtenOps.def), their arguments as
// tdx::cu::Arg: None, ints, lists and bool masks.
module attributes {tdx.partitioned} {
  tdx.mesh @mesh shape = [1] axes = ["x"]
  func.func @forward(%g: tensor<2x4xf32>, %x: tensor<2x4xf32>, %s: tensor<2x1xf32>, %w: tensor<4xf32>, %ids: tensor<2xi64>) -> (tensor<2x4xf32>, tensor<4xf32>, tensor<10x4xf32>, tensor<2x8xf32>) {
    // CHECK: callAten("aten::_log_softmax_backward_data", {v0, v1}, {{[{][{]}}"dim", Arg(int64_t(1))}, {"input_dtype", Arg(int64_t(6))}});
    %0 = tdx.aten "aten::_log_softmax_backward_data"(%g, %x) {args = {dim = 1 : i64, input_dtype = 6 : i64}} : (tensor<2x4xf32>, tensor<2x4xf32>) -> tensor<2x4xf32>
    // CHECK: callAten("aten::native_layer_norm_backward", {{.*}}{"bias", Arg()}{{.*}}{"normalized_shape", Arg(std::vector<int64_t>{4})}, {"output_mask", Arg(std::vector<bool>{true, true, false})}});
    %1:3 = tdx.aten "aten::native_layer_norm_backward"(%0, %x, %s, %s, %w) {args = {normalized_shape = array<i64: 4>, bias, output_mask = [true, true, false]}} : (tensor<2x4xf32>, tensor<2x4xf32>, tensor<2x1xf32>, tensor<2x1xf32>, tensor<4xf32>) -> (tensor<2x4xf32>, tensor<4xf32>, tensor<0xf32>)
    // CHECK: callAten("aten::embedding_dense_backward"
    %2 = tdx.aten "aten::embedding_dense_backward"(%1#0, %ids) {args = {num_weights = 10 : i64, padding_idx = -1 : i64, scale_grad_by_freq = false}} : (tensor<2x4xf32>, tensor<2xi64>) -> tensor<10x4xf32>
    // CHECK: callAten("aten::slice_backward"
    %3 = tdx.aten "aten::slice_backward"(%g) {args = {input_sizes = array<i64: 2, 8>, dim = 1 : i64, start = 0 : i64, end = 8 : i64, step = 2 : i64}} : (tensor<2x4xf32>) -> tensor<2x8xf32>
    return %1#0, %1#1, %2, %3 : tensor<2x4xf32>, tensor<4xf32>, tensor<10x4xf32>, tensor<2x8xf32>
  }
}
