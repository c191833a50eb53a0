// RUN: tdx-translate --tdx-to-cuda %s -split-input-file -verify-diagnostics -o /dev/null

// The CUDA backend has no generic ATen: a tdx.aten op is named with what to do.
module attributes {tdx.partitioned} {
  tdx.mesh @mesh shape = [1] axes = ["x"]
  func.func @forward(%x: tensor<4x4xf32>) -> tensor<4x4xf32> {
    // expected-error @+1 {{'tdx.aten' op (aten::cumsum) has no CUDA lowering: the CUDA backend runs first-class tdx ops and the generic ops of tdx/Runtime/cuda/AtenOps.def; compile for --target cpu, or express the op with tdx ops}}
    %y = tdx.aten "aten::cumsum"(%x) {args = {dim = 1 : i64}} : (tensor<4x4xf32>) -> tensor<4x4xf32>
    return %y : tensor<4x4xf32>
  }
}

// -----

// Elementwise ops on element types without a kernel are named.
module attributes {tdx.partitioned} {
  tdx.mesh @mesh shape = [1] axes = ["x"]
  func.func @forward(%x: tensor<4xf32>) -> tensor<4xf32> {
    // expected-error @+1 {{'tdx.cast' op on these element types has no kernel yet; the backends fuse elementwise ops on f32/f64/f16/bf16/i64/i32/i1/i16/i8/ui8 (cast the operands to f32 first)}}
    %y = tdx.cast %x : tensor<4xf32> to tensor<4xf8E5M2>
    %z = tdx.cast %y : tensor<4xf8E5M2> to tensor<4xf32>
    return %z : tensor<4xf32>
  }
}

// -----

// A generic op of the CUDA list with an argument CUDA's Arg cannot hold.
module attributes {tdx.partitioned} {
  tdx.mesh @mesh shape = [1] axes = ["x"]
  func.func @forward(%g: tensor<2x4xf32>, %y: tensor<2x4xf32>) -> tensor<2x4xf32> {
    // expected-error @+1 {{'tdx.aten' op (aten::_softmax_backward_data) argument 'scales' = [1.000000e+00] has no CUDA lowering}}
    %x = tdx.aten "aten::_softmax_backward_data"(%g, %y) {args = {dim = 1 : i64, scales = [1.0 : f64]}} : (tensor<2x4xf32>, tensor<2x4xf32>) -> tensor<2x4xf32>
    return %x : tensor<2x4xf32>
  }
}
