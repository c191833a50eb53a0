// Fused attention with heads split over "tp" (q, k, v column-parallel with
// grouped-query heads: 4 query heads, 2 kv heads): the kv heads' factor
// splits both, so the attention runs on each rank's heads with no
// collective; the output projection is row-parallel, so its result is a
// Partial sum over "tp" (which the next layer's reader reduces). The batch
// split over "dp" needs no collective either.
// RUN: tdx-opt %s --tdx-propagate-sharding --tdx-insert-collectives --tdx-partition | FileCheck %s --implicit-check-not=tdx.all_gather --implicit-check-not=tdx.reduce_scatter --implicit-check-not=tdx.all_to_all --implicit-check-not=tdx.all_reduce

tdx.mesh @mesh shape = [2, 2] axes = ["dp", "tp"]
// CHECK-LABEL: func.func @attention
// CHECK: tdx.sdpa %{{.*}}, %{{.*}}, %{{.*}} causal {{.*}}: (tensor<1x2x8x8xf32>, tensor<1x1x8x8xf32>, tensor<1x1x8x8xf32>) -> (tensor<1x2x8x8xf32>, tensor<1x2x8xf32>)
// CHECK: tdx.linear {{.*}}[Shard(0), Partial(sum)]{{.*}} -> tensor<1x8x32xf32>
func.func @attention(%x: tensor<2x8x32xf32>, %wq: tensor<32x32xf32>, %wk: tensor<16x32xf32>,
                     %wv: tensor<16x32xf32>, %wo: tensor<32x32xf32>) -> tensor<2x8x32xf32> {
  %xs = tdx.annotate %x <@mesh, [Shard(0), Replicate]> : tensor<2x8x32xf32>
  %wq_s = tdx.annotate %wq <@mesh, [Replicate, Shard(0)]> : tensor<32x32xf32>
  %wk_s = tdx.annotate %wk <@mesh, [Replicate, Shard(0)]> : tensor<16x32xf32>
  %wv_s = tdx.annotate %wv <@mesh, [Replicate, Shard(0)]> : tensor<16x32xf32>
  %wo_s = tdx.annotate %wo <@mesh, [Replicate, Shard(1)]> : tensor<32x32xf32>
  %q = tdx.linear %xs, %wq_s : (tensor<2x8x32xf32>, tensor<32x32xf32>) -> tensor<2x8x32xf32>
  %k = tdx.linear %xs, %wk_s : (tensor<2x8x32xf32>, tensor<16x32xf32>) -> tensor<2x8x16xf32>
  %v = tdx.linear %xs, %wv_s : (tensor<2x8x32xf32>, tensor<16x32xf32>) -> tensor<2x8x16xf32>
  %q4 = tdx.reshape %q [2, 8, 4, 8] : tensor<2x8x32xf32> -> tensor<2x8x4x8xf32>
  %k4 = tdx.reshape %k [2, 8, 2, 8] : tensor<2x8x16xf32> -> tensor<2x8x2x8xf32>
  %v4 = tdx.reshape %v [2, 8, 2, 8] : tensor<2x8x16xf32> -> tensor<2x8x2x8xf32>
  %qh = tdx.transpose %q4 1, 2 : tensor<2x8x4x8xf32> -> tensor<2x4x8x8xf32>
  %kh = tdx.transpose %k4 1, 2 : tensor<2x8x2x8xf32> -> tensor<2x2x8x8xf32>
  %vh = tdx.transpose %v4 1, 2 : tensor<2x8x2x8xf32> -> tensor<2x2x8x8xf32>
  %o, %lse = tdx.sdpa %qh, %kh, %vh causal : (tensor<2x4x8x8xf32>, tensor<2x2x8x8xf32>, tensor<2x2x8x8xf32>) -> (tensor<2x4x8x8xf32>, tensor<2x4x8xf32>)
  %ot = tdx.transpose %o 1, 2 : tensor<2x4x8x8xf32> -> tensor<2x8x4x8xf32>
  %o3 = tdx.reshape %ot [2, 8, 32] : tensor<2x8x4x8xf32> -> tensor<2x8x32xf32>
  %y = tdx.linear %o3, %wo_s : (tensor<2x8x32xf32>, tensor<32x32xf32>) -> tensor<2x8x32xf32>
  return %y : tensor<2x8x32xf32>
}
