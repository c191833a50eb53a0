// Attention with heads sharded over "tp" (q, k, v column-parallel, the output
// projection row-parallel): the reshape to heads carries the split to the
// head dim, softmax runs per head, and the forward has exactly one
// collective, the all_reduce after the output projection.
// RUN: tdx-opt %s --tdx-propagate-sharding --tdx-insert-collectives --tdx-partition | FileCheck %s --implicit-check-not=tdx.all_gather --implicit-check-not=tdx.reduce_scatter --implicit-check-not=tdx.all_to_all --implicit-check-not=tdx.chunk --implicit-check-not=tdx.all_reduce

tdx.mesh @mesh shape = [2] axes = ["tp"]
// CHECK-LABEL: func.func @attention
// CHECK-SAME: %arg1: tensor<16x32xf32>
// CHECK: tdx.reshape %{{.*}} [2, 8, 2, 8] {{.*}} : tensor<2x8x16xf32> -> tensor<2x8x2x8xf32>
// CHECK: tdx.matmul {{.*}} : (tensor<2x2x8x8xf32>, tensor<2x2x8x8xf32>) -> tensor<2x2x8x8xf32>
// CHECK: tdx.softmax %{{.*}} dim = -1 {tdx.shardings = [#tdx.sharding<@mesh, [Shard(1)]>]} : tensor<2x2x8x8xf32>
// CHECK: tdx.reshape %{{.*}} [2, 8, 16] {{.*}} : tensor<2x8x2x8xf32> -> tensor<2x8x16xf32>
// CHECK: %[[P:.*]] = tdx.linear {{.*}} {tdx.shardings = [#tdx.sharding<@mesh, [Partial(sum)]>]} : (tensor<2x8x16xf32>, tensor<32x16xf32>) -> tensor<2x8x32xf32>
// CHECK: tdx.all_reduce %[[P]] on @mesh axes = ["tp"] reduce = sum
func.func @attention(%x: tensor<2x8x32xf32>, %wq: tensor<32x32xf32>, %wk: tensor<32x32xf32>,
                     %wv: tensor<32x32xf32>, %wo: tensor<32x32xf32>, %mask: tensor<8x8xf32>) -> tensor<2x8x32xf32> {
  %wq_s = tdx.annotate %wq <@mesh, [Shard(0)]> : tensor<32x32xf32>
  %wk_s = tdx.annotate %wk <@mesh, [Shard(0)]> : tensor<32x32xf32>
  %wv_s = tdx.annotate %wv <@mesh, [Shard(0)]> : tensor<32x32xf32>
  %wo_s = tdx.annotate %wo <@mesh, [Shard(1)]> : tensor<32x32xf32>
  %q = tdx.linear %x, %wq_s : (tensor<2x8x32xf32>, tensor<32x32xf32>) -> tensor<2x8x32xf32>
  %k = tdx.linear %x, %wk_s : (tensor<2x8x32xf32>, tensor<32x32xf32>) -> tensor<2x8x32xf32>
  %v = tdx.linear %x, %wv_s : (tensor<2x8x32xf32>, tensor<32x32xf32>) -> tensor<2x8x32xf32>
  %q4 = tdx.reshape %q [2, 8, 4, 8] : tensor<2x8x32xf32> -> tensor<2x8x4x8xf32>
  %k4 = tdx.reshape %k [2, 8, 4, 8] : tensor<2x8x32xf32> -> tensor<2x8x4x8xf32>
  %v4 = tdx.reshape %v [2, 8, 4, 8] : tensor<2x8x32xf32> -> tensor<2x8x4x8xf32>
  %qh = tdx.permute %q4 [0, 2, 1, 3] : tensor<2x8x4x8xf32> -> tensor<2x4x8x8xf32>
  %kh = tdx.permute %k4 [0, 2, 1, 3] : tensor<2x8x4x8xf32> -> tensor<2x4x8x8xf32>
  %vh = tdx.permute %v4 [0, 2, 1, 3] : tensor<2x8x4x8xf32> -> tensor<2x4x8x8xf32>
  %kt = tdx.transpose %kh -2, -1 : tensor<2x4x8x8xf32> -> tensor<2x4x8x8xf32>
  %s = tdx.matmul %qh, %kt : (tensor<2x4x8x8xf32>, tensor<2x4x8x8xf32>) -> tensor<2x4x8x8xf32>
  %scale = tdx.full 0.35355339 : tensor<f32>
  %s2 = tdx.mul %s, %scale : (tensor<2x4x8x8xf32>, tensor<f32>) -> tensor<2x4x8x8xf32>
  %s3 = tdx.add %s2, %mask : (tensor<2x4x8x8xf32>, tensor<8x8xf32>) -> tensor<2x4x8x8xf32>
  %p = tdx.softmax %s3 dim = -1 : tensor<2x4x8x8xf32>
  %o = tdx.matmul %p, %vh : (tensor<2x4x8x8xf32>, tensor<2x4x8x8xf32>) -> tensor<2x4x8x8xf32>
  %ot = tdx.permute %o [0, 2, 1, 3] : tensor<2x4x8x8xf32> -> tensor<2x8x4x8xf32>
  %o3 = tdx.reshape %ot [2, 8, 32] : tensor<2x8x4x8xf32> -> tensor<2x8x32xf32>
  %y = tdx.linear %o3, %wo_s : (tensor<2x8x32xf32>, tensor<32x32xf32>) -> tensor<2x8x32xf32>
  %r = tdx.annotate %y <@mesh, [Replicate]> : tensor<2x8x32xf32>
  return %r : tensor<2x8x32xf32>
}
