// RUN: tdx-opt %s | tdx-opt | FileCheck %s
// RUN: tdx-opt %s -mlir-print-op-generic | tdx-opt | FileCheck %s

tdx.mesh @mesh shape = [2, 4] axes = ["dp", "tp"]

// Global view: annotations and redistribution keep the logical type.
// CHECK-LABEL: func.func @global_view
func.func @global_view(%x: tensor<8x16xf32>) -> tensor<8x16xf32> {
  // CHECK: %[[A:.*]] = tdx.annotate %{{.*}} <@mesh, [Shard(0), Replicate]> : tensor<8x16xf32>
  %0 = tdx.annotate %x <@mesh, [Shard(0), Replicate]> : tensor<8x16xf32>
  // CHECK: tdx.annotate %[[A]] <@mesh, [Shard(0), Shard(1)]> priority 1 : tensor<8x16xf32>
  %1 = tdx.annotate %0 <@mesh, [Shard(0), Shard(1)]> priority 1 : tensor<8x16xf32>
  // CHECK: tdx.redistribute %{{.*}} <@mesh, [Shard(0), Shard(1)]> to <@mesh, [Replicate, Partial(sum)]> : tensor<8x16xf32>
  %2 = tdx.redistribute %1 <@mesh, [Shard(0), Shard(1)]> to <@mesh, [Replicate, Partial(sum)]> : tensor<8x16xf32>
  return %2 : tensor<8x16xf32>
}

// Local view: collectives change per-rank shapes by the group size.
// CHECK-LABEL: func.func @collectives
func.func @collectives(%x: tensor<2x16xf32>, %y: tensor<8x16xf32>, %u: tensor<5x16xf32>) {
  // CHECK: tdx.all_gather %{{.*}} on @mesh axes = ["tp"] dim = 0 : tensor<2x16xf32> -> tensor<8x16xf32>
  %0 = tdx.all_gather %x on @mesh axes = ["tp"] dim = 0 : tensor<2x16xf32> -> tensor<8x16xf32>
  // CHECK: tdx.all_gather %{{.*}} on @mesh axes = ["dp", "tp"] dim = 1 : tensor<2x16xf32> -> tensor<2x128xf32>
  %1 = tdx.all_gather %x on @mesh axes = ["dp", "tp"] dim = 1 : tensor<2x16xf32> -> tensor<2x128xf32>
  // CHECK: tdx.all_reduce %{{.*}} on @mesh axes = ["tp"] reduce = sum : tensor<8x16xf32> -> tensor<8x16xf32>
  %2 = tdx.all_reduce %y on @mesh axes = ["tp"] reduce = sum : tensor<8x16xf32> -> tensor<8x16xf32>
  // CHECK: tdx.all_reduce %{{.*}} on @mesh axes = ["dp"] reduce = avg
  %3 = tdx.all_reduce %y on @mesh axes = ["dp"] reduce = avg : tensor<8x16xf32> -> tensor<8x16xf32>
  // CHECK: tdx.all_reduce %{{.*}} on @mesh axes = ["dp", "tp"] reduce = max
  %4 = tdx.all_reduce %y on @mesh axes = ["dp", "tp"] reduce = max : tensor<8x16xf32> -> tensor<8x16xf32>
  // CHECK: tdx.all_reduce %{{.*}} on @mesh axes = ["tp"] reduce = min
  %5 = tdx.all_reduce %y on @mesh axes = ["tp"] reduce = min : tensor<8x16xf32> -> tensor<8x16xf32>
  // CHECK: tdx.reduce_scatter %{{.*}} on @mesh axes = ["tp"] reduce = sum dim = 0 : tensor<8x16xf32> -> tensor<2x16xf32>
  %6 = tdx.reduce_scatter %y on @mesh axes = ["tp"] reduce = sum dim = 0 : tensor<8x16xf32> -> tensor<2x16xf32>
  // An uneven torch.chunk split (5 rows on 4 ranks: 2, 2, 1, 0) has a rank-dependent size.
  // CHECK: tdx.reduce_scatter %{{.*}} on @mesh axes = ["tp"] reduce = sum dim = 0 : tensor<5x16xf32> -> tensor<?x16xf32>
  %7 = tdx.reduce_scatter %u on @mesh axes = ["tp"] reduce = sum dim = 0 : tensor<5x16xf32> -> tensor<?x16xf32>
  // CHECK: tdx.all_to_all %{{.*}} on @mesh axes = ["tp"] split = 1 concat = 0 : tensor<2x16xf32> -> tensor<8x4xf32>
  %8 = tdx.all_to_all %x on @mesh axes = ["tp"] split = 1 concat = 0 : tensor<2x16xf32> -> tensor<8x4xf32>
  // CHECK: tdx.broadcast %{{.*}} on @mesh axes = ["dp"] root = [1] : tensor<8x16xf32> -> tensor<8x16xf32>
  %9 = tdx.broadcast %y on @mesh axes = ["dp"] root = [1] : tensor<8x16xf32> -> tensor<8x16xf32>
  // CHECK: tdx.broadcast %{{.*}} on @mesh axes = ["dp", "tp"] root = [0, 3]
  %10 = tdx.broadcast %y on @mesh axes = ["dp", "tp"] root = [0, 3] : tensor<8x16xf32> -> tensor<8x16xf32>
  // CHECK: tdx.collective_permute %{{.*}} on @mesh axes = ["tp"] pairs = [0, 1, 1, 2, 2, 3, 3, 0] : tensor<8x16xf32> -> tensor<8x16xf32>
  %11 = tdx.collective_permute %y on @mesh axes = ["tp"] pairs = [0, 1, 1, 2, 2, 3, 3, 0] : tensor<8x16xf32> -> tensor<8x16xf32>
  // CHECK: tdx.collective_permute %{{.*}} on @mesh axes = ["dp"] pairs = [0, 1] :
  %12 = tdx.collective_permute %y on @mesh axes = ["dp"] pairs = [0, 1] : tensor<8x16xf32> -> tensor<8x16xf32>
  return
}

// A ragged all-to-all: static buffers, the offsets and sizes values.
// CHECK-LABEL: func.func @ragged
func.func @ragged(%x: tensor<6x16xf32>, %o: tensor<4xi64>, %s: tensor<4xi64>, %p: tensor<4xi64>, %r: tensor<4xi64>, %ids: tensor<6xi64>) {
  // CHECK: tdx.ragged_all_to_all %{{.*}}, %{{.*}}, %{{.*}}, %{{.*}}, %{{.*}} on @mesh axes = ["tp"] : tensor<6x16xf32>, tensor<4xi64> -> tensor<24x16xf32>
  %0 = tdx.ragged_all_to_all %x, %o, %s, %p, %r on @mesh axes = ["tp"] : tensor<6x16xf32>, tensor<4xi64> -> tensor<24x16xf32>
  // CHECK: tdx.ragged_all_to_all {{.*}} : tensor<24x16xf32>, tensor<4xi64> -> tensor<6x16xf32>
  %1 = tdx.ragged_all_to_all %0, %p, %r, %o, %s on @mesh axes = ["tp"] : tensor<24x16xf32>, tensor<4xi64> -> tensor<6x16xf32>
  // CHECK: tdx.ragged_all_to_all {{.*}} : tensor<6xi64>, tensor<4xi64> -> tensor<24xi64>
  %2 = tdx.ragged_all_to_all %ids, %o, %s, %p, %r on @mesh axes = ["tp"] : tensor<6xi64>, tensor<4xi64> -> tensor<24xi64>
  return
}

// Pipeline messages: along one axis, to or from a coordinate on it; a recv
// may leave one dim to the message.
// CHECK-LABEL: func.func @point_to_point
func.func @point_to_point(%x: tensor<2x16xf32>) -> tensor<?x16xf32> {
  // CHECK: tdx.send %{{.*}} on @mesh axes = ["dp"] to 1 tag 7 : tensor<2x16xf32>
  tdx.send %x on @mesh axes = ["dp"] to 1 tag 7 : tensor<2x16xf32>
  // CHECK: tdx.recv on @mesh axes = ["tp"] from 3 tag 0 : tensor<?x16xf32>
  %0 = tdx.recv on @mesh axes = ["tp"] from 3 tag 0 : tensor<?x16xf32>
  return %0 : tensor<?x16xf32>
}

// A manual region's edges: this rank's piece of a global value, and back.
// CHECK-LABEL: func.func @manual_region_edges
func.func @manual_region_edges(%x: tensor<8x16xf32>) -> (tensor<8x16xf32>, tensor<4x16xf32>) {
  // CHECK: tdx.to_local %{{.*}} <@mesh, [Shard(0), Shard(1)]> : tensor<8x16xf32> -> tensor<4x4xf32>
  %l = tdx.to_local %x <@mesh, [Shard(0), Shard(1)]> : tensor<8x16xf32> -> tensor<4x4xf32>
  // CHECK: tdx.from_local %{{.*}} <@mesh, [Shard(0), Shard(1)]> : tensor<4x4xf32> -> tensor<8x16xf32>
  %g = tdx.from_local %l <@mesh, [Shard(0), Shard(1)]> : tensor<4x4xf32> -> tensor<8x16xf32>
  %r = tdx.to_local %x <@mesh, [Shard(0), Replicate]> : tensor<8x16xf32> -> tensor<4x16xf32>
  // CHECK: tdx.from_local %{{.*}} <@mesh, [Replicate, Partial(sum)]> unchecked : tensor<4x16xf32> -> tensor<4x16xf32>
  %p = tdx.from_local %r <@mesh, [Replicate, Partial(sum)]> unchecked : tensor<4x16xf32> -> tensor<4x16xf32>
  return %g, %p : tensor<8x16xf32>, tensor<4x16xf32>
}
