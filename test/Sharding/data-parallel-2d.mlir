// Data parallelism on a 2-D mesh: the batch is split over both axes and the
// weights are replicated, so the forward needs no collective at all.
// RUN: tdx-opt %s --tdx-propagate-sharding --tdx-insert-collectives --tdx-partition | FileCheck %s --implicit-check-not=tdx.all_gather --implicit-check-not=tdx.reduce_scatter --implicit-check-not=tdx.all_to_all --implicit-check-not=tdx.all_reduce --implicit-check-not=tdx.chunk --implicit-check-not=tdx.redistribute

tdx.mesh @mesh shape = [2, 2] axes = ["dp", "fsdp"]
tdx.parameter @w : tensor<32x16xf32> sharding <@mesh, [Replicate, Replicate]> init {
  %0 = tdx.normal(0.0, 0.02) seed(0, 0) : tensor<32x16xf32>
  tdx.yield %0 : tensor<32x16xf32>
}
// CHECK-LABEL: func.func @forward
// CHECK-SAME: tensor<2x8x16xf32> {tdx.global_type = {{[^,]*}}, tdx.sharding = #tdx.sharding<@mesh, [Shard(0), Shard(0)]>}
// CHECK: tdx.linear {{.*}} : (tensor<2x8x16xf32>, tensor<32x16xf32>) -> tensor<2x8x32xf32>
// CHECK: tdx.relu {{.*}} : tensor<2x8x32xf32>
// CHECK: tdx.sum {{.*}} {tdx.shardings = [#tdx.sharding<@mesh, [Shard(0), Shard(0)]>]} : tensor<2x8x32xf32> -> tensor<2x8xf32>
func.func @forward(%x: tensor<8x8x16xf32>) -> tensor<8x8xf32> {
  %xs = tdx.annotate %x <@mesh, [Shard(0), Shard(0)]> : tensor<8x8x16xf32>
  %w = tdx.param_ref @w : tensor<32x16xf32>
  %h = tdx.linear %xs, %w : (tensor<8x8x16xf32>, tensor<32x16xf32>) -> tensor<8x8x32xf32>
  %r = tdx.relu %h : tensor<8x8x32xf32>
  %s = tdx.sum %r dims = [-1] : tensor<8x8x32xf32> -> tensor<8x8xf32>
  return %s : tensor<8x8xf32>
}
