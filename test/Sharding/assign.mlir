// A written state keeps its placement: an update placed otherwise (here by
// an annotation) is brought back to the state's layout before it is
// written, and the partitioned write has the local type. Here that is this
// rank's chunk of the gathered update, which is the update's own piece: the
// chunk folds and the gather, read by nothing else, goes.
// RUN: tdx-opt %s -split-input-file --tdx-propagate-sharding --tdx-insert-collectives --tdx-partition | FileCheck %s

tdx.mesh @mesh shape = [2] axes = ["dp"]
tdx.parameter @w : tensor<4x8xf32> sharding <@mesh, [Shard(0)]> init {
  %0 = tdx.full 1.0 : tensor<4x8xf32>
  tdx.yield %0 : tensor<4x8xf32>
}
// CHECK-LABEL: func.func @sgd
// CHECK-SAME: tensor<4x8xf32> {tdx.global_type = tensor<4x8xf32>, tdx.sharding = #tdx.sharding<@mesh, [Replicate]>}
// CHECK: %[[W:.*]] = tdx.param_ref @w {{.*}} : tensor<2x8xf32>
// CHECK-NEXT: %[[N:.*]] = tdx.sub %[[W]], {{.*}} : (tensor<2x8xf32>, tensor<2x8xf32>) -> tensor<2x8xf32>
// CHECK-NEXT: tdx.assign @w, %[[N]] : tensor<2x8xf32>
func.func @sgd(%g: tensor<4x8xf32>) {
  %gr = tdx.annotate %g <@mesh, [Replicate]> : tensor<4x8xf32>
  %w = tdx.param_ref @w : tensor<4x8xf32>
  %n = tdx.sub %w, %gr : (tensor<4x8xf32>, tensor<4x8xf32>) -> tensor<4x8xf32>
  %nr = tdx.annotate %n <@mesh, [Replicate]> : tensor<4x8xf32>
  tdx.assign @w, %nr : tensor<4x8xf32>
  return
}

// -----

// The state is read replicated; the update comes out split by the batch
// and is gathered before the write.
tdx.mesh @mesh shape = [2] axes = ["dp"]
tdx.buffer @count : tensor<8xf32> init {
  %0 = tdx.full 0.0 : tensor<8xf32>
  tdx.yield %0 : tensor<8xf32>
}
// CHECK-LABEL: func.func @accumulate
// CHECK: %[[S:.*]] = tdx.sum
// CHECK: %[[R:.*]] = tdx.all_reduce %[[S]]
// CHECK: %[[N:.*]] = tdx.add {{.*}}, %[[R]]
// CHECK: tdx.assign @count, %[[N]] : tensor<8xf32>
func.func @accumulate(%x: tensor<6x8xf32>) {
  %xs = tdx.annotate %x <@mesh, [Shard(0)]> : tensor<6x8xf32>
  %c = tdx.param_ref @count : tensor<8xf32>
  %s = tdx.sum %xs dims = [0] : tensor<6x8xf32> -> tensor<8xf32>
  %n = tdx.add %c, %s : (tensor<8xf32>, tensor<8xf32>) -> tensor<8xf32>
  tdx.assign @count, %n : tensor<8xf32>
  return
}
