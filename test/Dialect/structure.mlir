// RUN: tdx-opt %s -split-input-file | tdx-opt -split-input-file | FileCheck %s
// RUN: tdx-opt %s -split-input-file -mlir-print-op-generic | tdx-opt -split-input-file | FileCheck %s

// CHECK: tdx.mesh @mesh shape = [2, 4] axes = ["dp", "tp"]
// CHECK: tdx.mesh @line shape = [8] axes = ["x"]
// CHECK: tdx.mesh @folded shape = [2, 4] axes = ["dp", "tp"] ranks = [1, 4]
tdx.mesh @mesh shape = [2, 4] axes = ["dp", "tp"]
tdx.mesh @line shape = [8] axes = ["x"]
tdx.mesh @folded shape = [2, 4] axes = ["dp", "tp"] ranks = [1, 4]

// -----

tdx.mesh @mesh shape = [2, 2] axes = ["dp", "tp"]

// Qualified names with dots need no quotes; quoted names round-trip too.
// CHECK-LABEL: tdx.parameter @wte.weight : tensor<100x16xf32> sharding <@mesh, [Replicate, Shard(0)]> init {
// CHECK-NEXT:    %[[W:.*]] = tdx.normal(0.000000e+00, 2.000000e-02) seed(0, 0) : tensor<100x16xf32>
// CHECK-NEXT:    tdx.yield %[[W]] : tensor<100x16xf32>
// CHECK-NEXT:  }
tdx.parameter @"wte.weight" : tensor<100x16xf32> sharding <@mesh, [Replicate, Shard(0)]> init {
  %0 = tdx.normal(0.0, 0.02) seed(0, 0) : tensor<100x16xf32>
  tdx.yield %0 : tensor<100x16xf32>
}

// Weight tying: two names, one value.
// CHECK: tdx.parameter @lm_head.weight : tensor<100x16xf32> tied_to @wte.weight{{$}}
tdx.parameter @"lm_head.weight" : tensor<100x16xf32> tied_to @"wte.weight"

// A buffer registered with persistent=False (a rotary table): state, not in
// model.state_dict().
// CHECK: tdx.buffer @rope_cos : tensor<16x4xf32> non_persistent init {
tdx.buffer @rope_cos : tensor<16x4xf32> non_persistent init {
  %0 = tdx.full 1.0 : tensor<16x4xf32>
  tdx.yield %0 : tensor<16x4xf32>
}

// CHECK: tdx.parameter @"layers.0.attn.wq weird name" : tensor<16x16xf32> init {
tdx.parameter @"layers.0.attn.wq weird name" : tensor<16x16xf32> init {
  %0 = tdx.uniform(-0.25, 0.25) seed(0, 1) : tensor<16x16xf32>
  tdx.yield %0 : tensor<16x16xf32>
}

// CHECK: tdx.buffer @bn.running_var : tensor<16xf32> init {
// CHECK:   tdx.full 1.000000e+00 : tensor<16xf32>
tdx.buffer @"bn.running_var" : tensor<16xf32> init {
  %0 = tdx.full 1.0 : tensor<16xf32>
  tdx.yield %0 : tensor<16xf32>
}

// A buffer may be tied to a parameter's value too.
// CHECK: tdx.buffer @alias : tensor<16xf32> tied_to @bn.running_var
tdx.buffer @alias : tensor<16xf32> tied_to @"bn.running_var"

// CHECK-LABEL: func.func @forward
// CHECK: tdx.param_ref @lm_head.weight : tensor<100x16xf32>
// CHECK: tdx.param_ref @bn.running_var : tensor<16xf32>
func.func @forward() -> (tensor<100x16xf32>, tensor<16xf32>) {
  %w = tdx.param_ref @"lm_head.weight" : tensor<100x16xf32>
  %b = tdx.param_ref @"bn.running_var" : tensor<16xf32>
  return %w, %b : tensor<100x16xf32>, tensor<16xf32>
}

// -----

// A training step writes its state back.
tdx.parameter @w : tensor<4xf32> init {
  %0 = tdx.full 1.0 : tensor<4xf32>
  tdx.yield %0 : tensor<4xf32>
}
// CHECK-LABEL: func.func @train_step
// CHECK: %[[W:.*]] = tdx.param_ref @w : tensor<4xf32>
// CHECK: %[[N:.*]] = tdx.sub %[[W]], %arg0
// CHECK: tdx.assign @w, %[[N]] : tensor<4xf32>
func.func @train_step(%g: tensor<4xf32>) -> tensor<4xf32> {
  %w = tdx.param_ref @w : tensor<4xf32>
  %n = tdx.sub %w, %g : (tensor<4xf32>, tensor<4xf32>) -> tensor<4xf32>
  tdx.assign @w, %n : tensor<4xf32>
  return %w : tensor<4xf32>
}
