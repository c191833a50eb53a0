// RUN: tdx-opt %s --tdx-propagate-sharding --tdx-insert-collectives --tdx-partition \
// RUN:   | tdx-translate --tdx-to-cpp | FileCheck %s

// A state write waits until the last param_ref of its state has read it,
// so every param_ref of the step reads the value it had on entry; then it
// replaces the state, and the old tensor is freed when its last reader is
// done (one copy of the state, not two, as an update in place).
tdx.mesh @mesh shape = [2] axes = ["dp"]
tdx.parameter @w : tensor<4x8xf32> init {
  %0 = tdx.normal(0.0, 0.02) seed(0, 1) : tensor<4x8xf32>
  tdx.yield %0 : tensor<4x8xf32>
}
tdx.parameter @b : tensor<8xf32> init {
  %0 = tdx.normal(0.0, 0.02) seed(0, 2) : tensor<8xf32>
  tdx.yield %0 : tensor<8xf32>
}
func.func @train_step(%x: tensor<6x8xf32>) -> tensor<f32> {
  %xs = tdx.annotate %x <@mesh, [Shard(0)]> : tensor<6x8xf32>
  %w = tdx.param_ref @w : tensor<4x8xf32>
  %s = tdx.sum %xs dims = [0] : tensor<6x8xf32> -> tensor<8xf32>
  %n = tdx.sub %w, %s : (tensor<4x8xf32>, tensor<8xf32>) -> tensor<4x8xf32>
  tdx.assign @w, %n : tensor<4x8xf32>
  %b = tdx.param_ref @b : tensor<8xf32>
  %nb = tdx.add %b, %s : (tensor<8xf32>, tensor<8xf32>) -> tensor<8xf32>
  tdx.assign @b, %nb : tensor<8xf32>
  %w2 = tdx.param_ref @w : tensor<4x8xf32>
  %l = tdx.sum %w2 dims = [0, 1] : tensor<4x8xf32> -> tensor<f32>
  return %l : tensor<f32>
}

// CHECK-LABEL: static std::vector<T::Tensor> forward(
// CHECK:      [[W:v[0-9]+]] = s.at("w");
// CHECK:      ctx.startAllReduce(
// CHECK:      T::Tensor [[N:v[0-9]+]] = std::move(
// CHECK:      [[B:v[0-9]+]] = s.at("b");
// CHECK:      T::Tensor [[NB:v[0-9]+]] = std::move(
// CHECK:      [[B]] = T::Tensor();
// CHECK-NEXT: s["b"] = [[NB]];
// CHECK-NEXT: [[W2:v[0-9]+]] = s.at("w");
// CHECK-NEXT: s["w"] = [[N]];
// CHECK-NEXT: T::sum([[W2]]
// CHECK:      return {
