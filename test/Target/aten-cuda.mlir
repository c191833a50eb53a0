// RUN: tdx-translate --tdx-to-cuda -split-input-file %s | FileCheck %s

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

// -----

// A conv net's training ops (ResNet's): batch norm in training with its
// running statistics, max pooling with its indices, and the backward of
// the convolution, batch norm, max pool and ReLU (threshold_backward).
module attributes {tdx.partitioned} {
  tdx.mesh @mesh shape = [1] axes = ["x"]
  func.func @forward(%x: tensor<2x4x8x8xf32>, %w: tensor<4x4x3x3xf32>, %c: tensor<4xf32>) -> (tensor<2x4x8x8xf32>, tensor<4x4x3x3xf32>, tensor<4xf32>) {
    // CHECK: callAten("aten::native_batch_norm", {v0, v2, v2, v2, v2}, {{[{][{]}}"eps", Arg(double({{.*}}))}, {"momentum", Arg(double({{.*}}))}, {"training", Arg(true)}});
    %0:3 = tdx.aten "aten::native_batch_norm"(%x, %c, %c, %c, %c) {args = {training = true, momentum = 0.1 : f64, eps = 1.0e-05 : f64}} : (tensor<2x4x8x8xf32>, tensor<4xf32>, tensor<4xf32>, tensor<4xf32>, tensor<4xf32>) -> (tensor<2x4x8x8xf32>, tensor<4xf32>, tensor<4xf32>)
    // CHECK: callAten("aten::max_pool2d_with_indices", {{.*}}{"kernel_size", Arg(std::vector<int64_t>{3, 3})}
    %1:2 = tdx.aten "aten::max_pool2d_with_indices"(%0#0) {args = {kernel_size = array<i64: 3, 3>, stride = array<i64: 2, 2>, padding = array<i64: 1, 1>, dilation = array<i64: 1, 1>, ceil_mode = false}} : (tensor<2x4x8x8xf32>) -> (tensor<2x4x4x4xf32>, tensor<2x4x4x4xi64>)
    // CHECK: callAten("aten::max_pool2d_with_indices_backward", {{.*}}{"ceil_mode", Arg(false)}
    %2 = tdx.aten "aten::max_pool2d_with_indices_backward"(%1#0, %0#0, %1#1) {args = {kernel_size = array<i64: 3, 3>, stride = array<i64: 2, 2>, padding = array<i64: 1, 1>, dilation = array<i64: 1, 1>, ceil_mode = false}} : (tensor<2x4x4x4xf32>, tensor<2x4x8x8xf32>, tensor<2x4x4x4xi64>) -> tensor<2x4x8x8xf32>
    // CHECK: callAten("aten::threshold_backward", {{.*}}{{[{][{]}}"threshold", Arg(int64_t(0))}});
    %3 = tdx.aten "aten::threshold_backward"(%2, %x) {args = {threshold = 0 : i64}} : (tensor<2x4x8x8xf32>, tensor<2x4x8x8xf32>) -> tensor<2x4x8x8xf32>
    // CHECK: callAten("aten::native_batch_norm_backward", {{.*}}{"output_mask", Arg(std::vector<bool>{true, true, true})}, {"train", Arg(true)}});
    %4:3 = tdx.aten "aten::native_batch_norm_backward"(%3, %x, %c, %c, %c, %0#1, %0#2) {args = {train = true, eps = 1.0e-05 : f64, output_mask = [true, true, true]}} : (tensor<2x4x8x8xf32>, tensor<2x4x8x8xf32>, tensor<4xf32>, tensor<4xf32>, tensor<4xf32>, tensor<4xf32>, tensor<4xf32>) -> (tensor<2x4x8x8xf32>, tensor<4xf32>, tensor<4xf32>)
    // CHECK: callAten("aten::convolution_backward", {{.*}}{"groups", Arg(int64_t(1))}, {"output_mask", Arg(std::vector<bool>{true, true, false})}
    %5:3 = tdx.aten "aten::convolution_backward"(%4#0, %x, %w) {args = {bias_sizes = array<i64: 0>, stride = array<i64: 1, 1>, padding = array<i64: 1, 1>, dilation = array<i64: 1, 1>, transposed = false, output_padding = array<i64: 0, 0>, groups = 1 : i64, output_mask = [true, true, false]}} : (tensor<2x4x8x8xf32>, tensor<2x4x8x8xf32>, tensor<4x4x3x3xf32>) -> (tensor<2x4x8x8xf32>, tensor<4x4x3x3xf32>, tensor<0xf32>)
    return %5#0, %5#1, %4#1 : tensor<2x4x8x8xf32>, tensor<4x4x3x3xf32>, tensor<4xf32>
  }
}

// -----

// Attention's forward and backward on CUDA: the runtime's row kernels
// (tdx/Runtime/Attention.h), grouped-query heads and a causal mask.
module attributes {tdx.partitioned} {
  tdx.mesh @mesh shape = [1] axes = ["x"]
  func.func @forward(%q: tensor<2x4x8x16xf32>, %k: tensor<2x2x8x16xf32>, %v: tensor<2x2x8x16xf32>, %g: tensor<2x4x8x16xf32>) -> (tensor<2x4x8x16xf32>, tensor<2x2x8x16xf32>, tensor<2x2x8x16xf32>) {
    // CHECK: T::sdpa(v0, v1, v2, T::Tensor(), true, std::nullopt);
    %o, %lse = tdx.sdpa %q, %k, %v causal : (tensor<2x4x8x16xf32>, tensor<2x2x8x16xf32>, tensor<2x2x8x16xf32>) -> (tensor<2x4x8x16xf32>, tensor<2x4x8xf32>)
    // CHECK: T::sdpa_backward(v3, v0, v1, v2, {{.*}}, T::Tensor(), true, std::nullopt);
    %dq, %dk, %dv = tdx.sdpa_backward %g, %q, %k, %v, %o, %lse causal : (tensor<2x4x8x16xf32>, tensor<2x4x8x16xf32>, tensor<2x2x8x16xf32>, tensor<2x2x8x16xf32>, tensor<2x4x8x16xf32>, tensor<2x4x8xf32>) -> (tensor<2x4x8x16xf32>, tensor<2x2x8x16xf32>, tensor<2x2x8x16xf32>)
    return %dq, %dk, %dv : tensor<2x4x8x16xf32>, tensor<2x2x8x16xf32>, tensor<2x2x8x16xf32>
  }
}
