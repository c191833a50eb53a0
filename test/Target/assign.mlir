// RUN: tdx-opt %s --tdx-propagate-sharding --tdx-insert-collectives --tdx-partition \
// RUN:   | tdx-translate --tdx-to-cpp | FileCheck %s

// A training step's state writes happen when the step ends, after every
// read of the state it was entered with.
tdx.mesh @mesh shape = [2] axes = ["dp"]
tdx.parameter @w : tensor<4x8xf32> init {
  %0 = tdx.normal(0.0, 0.02) seed(0, 1) : tensor<4x8xf32>
  tdx.yield %0 : tensor<4x8xf32>
}
func.func @train_step(%x: tensor<6x8xf32>) -> tensor<f32> {
  %xs = tdx.annotate %x <@mesh, [Shard(0)]> : tensor<6x8xf32>
  %w = tdx.param_ref @w : tensor<4x8xf32>
  %s = tdx.sum %xs dims = [0] : tensor<6x8xf32> -> tensor<8xf32>
  %n = tdx.sub %w, %s : (tensor<4x8xf32>, tensor<8xf32>) -> tensor<4x8xf32>
  tdx.assign @w, %n : tensor<4x8xf32>
  %w2 = tdx.param_ref @w : tensor<4x8xf32>
  %l = tdx.sum %w2 dims = [0, 1] : tensor<4x8xf32> -> tensor<f32>
  return %l : tensor<f32>
}

// CHECK-LABEL: static std::vector<T::Tensor> forward(
// CHECK: [[W:v[0-9]+]] = s.at("w");
// CHECK: ctx.startAllReduce(
// CHECK: [[W2:v[0-9]+]] = s.at("w");
// CHECK: s["w"] = {{[a-z]+[0-9]+}};
// CHECK-NEXT: return {
