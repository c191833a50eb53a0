// RUN: tdx-opt %s -split-input-file --tdx-linear-pairs -o /dev/null | FileCheck %s

// An MLP block written the usual ways: up (tdx.linear) and gate (a matmul by
// the transposed weight, nn.Linear without bias) feed down through the
// activation: up and gate are column parallel, down row parallel. The head
// after the residual is fed by a row-parallel layer and feeds none: whole.
// The scale the column-parallel layers' input is made with (an RMSNorm's)
// is the norm sequence parallelism would keep split.
// CHECK: {"column":["gate","up"],"in_out":[],"norm":["scale"],"row":["down"]}
module {
  tdx.parameter @up : tensor<16x8xf32> init {
    %0 = tdx.full 0.0 : tensor<16x8xf32>
    tdx.yield %0 : tensor<16x8xf32>
  }
  tdx.parameter @gate : tensor<16x8xf32> init {
    %0 = tdx.full 0.0 : tensor<16x8xf32>
    tdx.yield %0 : tensor<16x8xf32>
  }
  tdx.parameter @down : tensor<8x16xf32> init {
    %0 = tdx.full 0.0 : tensor<8x16xf32>
    tdx.yield %0 : tensor<8x16xf32>
  }
  tdx.parameter @head : tensor<4x8xf32> init {
    %0 = tdx.full 0.0 : tensor<4x8xf32>
    tdx.yield %0 : tensor<4x8xf32>
  }
  tdx.parameter @scale : tensor<8xf32> init {
    %0 = tdx.full 1.0 : tensor<8xf32>
    tdx.yield %0 : tensor<8xf32>
  }
  func.func @forward(%x0: tensor<2x8xf32>) -> tensor<2x4xf32> {
    %scale = tdx.param_ref @scale : tensor<8xf32>
    %x = tdx.mul %x0, %scale : (tensor<2x8xf32>, tensor<8xf32>) -> tensor<2x8xf32>
    %up = tdx.param_ref @up : tensor<16x8xf32>
    %u = tdx.linear %x, %up : (tensor<2x8xf32>, tensor<16x8xf32>) -> tensor<2x16xf32>
    %gate = tdx.param_ref @gate : tensor<16x8xf32>
    %gt = tdx.transpose %gate 0, 1 : tensor<16x8xf32> -> tensor<8x16xf32>
    %g = tdx.matmul %x, %gt : (tensor<2x8xf32>, tensor<8x16xf32>) -> tensor<2x16xf32>
    %s = tdx.silu %g : tensor<2x16xf32>
    %m = tdx.mul %s, %u : (tensor<2x16xf32>, tensor<2x16xf32>) -> tensor<2x16xf32>
    %down = tdx.param_ref @down : tensor<8x16xf32>
    %d = tdx.linear %m, %down : (tensor<2x16xf32>, tensor<8x16xf32>) -> tensor<2x8xf32>
    %r = tdx.add %d, %x : (tensor<2x8xf32>, tensor<2x8xf32>) -> tensor<2x8xf32>
    %head = tdx.param_ref @head : tensor<4x8xf32>
    %y = tdx.linear %r, %head : (tensor<2x8xf32>, tensor<4x8xf32>) -> tensor<2x4xf32>
    return %y : tensor<2x4xf32>
  }
}

// -----

// A lone linear pairs with nothing.
// CHECK: {"column":[],"in_out":[],"norm":[],"row":[]}
module {
  tdx.parameter @w : tensor<4x8xf32> init {
    %0 = tdx.full 0.0 : tensor<4x8xf32>
    tdx.yield %0 : tensor<4x8xf32>
  }
  func.func @forward(%x: tensor<2x8xf32>) -> tensor<2x4xf32> {
    %w = tdx.param_ref @w : tensor<4x8xf32>
    %y = tdx.linear %x, %w : (tensor<2x8xf32>, tensor<4x8xf32>) -> tensor<2x4xf32>
    return %y : tensor<2x4xf32>
  }
}

// -----

// Hugging Face's GPT-2 MLP: Conv1D layers, addmm of the flattened input by a
// weight stored (in, out), then the bias. c_fc feeds c_proj through the
// activation: a pair, both reported as stored (in, out).
// CHECK: {"column":["c_fc"],"in_out":["c_fc","c_proj"],"norm":[],"row":["c_proj"]}
module {
  tdx.parameter @c_fc : tensor<8x32xf32> init {
    %0 = tdx.full 0.0 : tensor<8x32xf32>
    tdx.yield %0 : tensor<8x32xf32>
  }
  tdx.parameter @c_fc_bias : tensor<32xf32> init {
    %0 = tdx.full 0.0 : tensor<32xf32>
    tdx.yield %0 : tensor<32xf32>
  }
  tdx.parameter @c_proj : tensor<32x8xf32> init {
    %0 = tdx.full 0.0 : tensor<32x8xf32>
    tdx.yield %0 : tensor<32x8xf32>
  }
  func.func @forward(%x: tensor<2x8xf32>) -> tensor<2x8xf32> {
    %w1 = tdx.param_ref @c_fc : tensor<8x32xf32>
    %b1 = tdx.param_ref @c_fc_bias : tensor<32xf32>
    %h0 = tdx.matmul %x, %w1 : (tensor<2x8xf32>, tensor<8x32xf32>) -> tensor<2x32xf32>
    %h1 = tdx.add %h0, %b1 : (tensor<2x32xf32>, tensor<32xf32>) -> tensor<2x32xf32>
    %h = tdx.relu %h1 : tensor<2x32xf32>
    %w2 = tdx.param_ref @c_proj : tensor<32x8xf32>
    %y = tdx.matmul %h, %w2 : (tensor<2x32xf32>, tensor<32x8xf32>) -> tensor<2x8xf32>
    return %y : tensor<2x8xf32>
  }
}
