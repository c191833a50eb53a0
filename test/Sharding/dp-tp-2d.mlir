// 2-D: batch over "dp", Megatron MLP over "tp". Only the tp all_reduce
// remains, on the dp-local batch.
// RUN: tdx-opt %s --tdx-propagate-sharding --tdx-insert-collectives --tdx-partition | FileCheck %s --implicit-check-not=tdx.all_gather --implicit-check-not=tdx.reduce_scatter --implicit-check-not=tdx.all_to_all --implicit-check-not=tdx.chunk

tdx.mesh @mesh shape = [2, 2] axes = ["dp", "tp"]
tdx.parameter @w1 : tensor<64x16xf32> sharding <@mesh, [Replicate, Shard(0)]> init {
  %0 = tdx.normal(0.0, 0.02) seed(0, 0) : tensor<64x16xf32>
  tdx.yield %0 : tensor<64x16xf32>
}
tdx.parameter @w2 : tensor<16x64xf32> sharding <@mesh, [Replicate, Shard(1)]> init {
  %0 = tdx.normal(0.0, 0.02) seed(0, 1) : tensor<16x64xf32>
  tdx.yield %0 : tensor<16x64xf32>
}
// CHECK-LABEL: func.func @forward
// CHECK-SAME: (%[[X:.*]]: tensor<4x16xf32> {tdx.global_type = tensor<8x16xf32>, tdx.sharding = #tdx.sharding<@mesh, [Shard(0), Replicate]>}) -> (tensor<4x16xf32> {tdx.global_type = {{.*}}})
// CHECK: tdx.linear %[[X]], %{{.*}} : (tensor<4x16xf32>, tensor<32x16xf32>) -> tensor<4x32xf32>
// CHECK: %[[P:.*]] = tdx.linear {{.*}} {tdx.shardings = [#tdx.sharding<@mesh, [Shard(0), Partial(sum)]>]} : (tensor<4x32xf32>, tensor<16x32xf32>) -> tensor<4x16xf32>
// CHECK: %[[Y:.*]] = tdx.all_reduce %[[P]] on @mesh axes = ["tp"] reduce = sum {{.*}} : tensor<4x16xf32> -> tensor<4x16xf32>
// CHECK-NOT: tdx.all_reduce
// CHECK: return %[[Y]] : tensor<4x16xf32>
func.func @forward(%x: tensor<8x16xf32>) -> tensor<8x16xf32> {
  %xs = tdx.annotate %x <@mesh, [Shard(0), Replicate]> : tensor<8x16xf32>
  %w1 = tdx.param_ref @w1 : tensor<64x16xf32>
  %h = tdx.linear %xs, %w1 : (tensor<8x16xf32>, tensor<64x16xf32>) -> tensor<8x64xf32>
  %g = tdx.relu %h : tensor<8x64xf32>
  %w2 = tdx.param_ref @w2 : tensor<16x64xf32>
  %y = tdx.linear %g, %w2 : (tensor<8x64xf32>, tensor<16x64xf32>) -> tensor<8x16xf32>
  %r = tdx.annotate %y <@mesh, [Shard(0), Replicate]> : tensor<8x16xf32>
  return %r : tensor<8x16xf32>
}
