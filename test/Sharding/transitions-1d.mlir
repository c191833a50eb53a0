// Every transition between placements on one mesh axis, through
// tdx-insert-collectives and tdx-partition, becomes its collective.
// RUN: tdx-opt %s -split-input-file --tdx-insert-collectives --tdx-partition | FileCheck %s

tdx.mesh @mesh shape = [4] axes = ["tp"]
// CHECK-LABEL: func.func @shard_to_replicate
// CHECK-SAME: (%[[X:.*]]: tensor<2x16xf32>
// CHECK: tdx.all_gather %[[X]] on @mesh axes = ["tp"] dim = 0 {tdx.payload_bytes = 128 : i64{{.*}}} : tensor<2x16xf32> -> tensor<8x16xf32>
func.func @shard_to_replicate(%x: tensor<8x16xf32> {tdx.sharding = #tdx.sharding<@mesh, [Shard(0)]>}) -> tensor<8x16xf32> {
  %0 = tdx.redistribute %x <@mesh, [Shard(0)]> to <@mesh, [Replicate]> {tdx.shardings = [#tdx.sharding<@mesh, [Replicate]>]} : tensor<8x16xf32>
  return %0 : tensor<8x16xf32>
}

// -----

tdx.mesh @mesh shape = [4] axes = ["tp"]
// CHECK-LABEL: func.func @partial_to_replicate
// CHECK: tdx.all_reduce %{{.*}} on @mesh axes = ["tp"] reduce = max {{.*}} : tensor<8x16xf32> -> tensor<8x16xf32>
func.func @partial_to_replicate(%x: tensor<8x16xf32> {tdx.sharding = #tdx.sharding<@mesh, [Partial(max)]>}) -> tensor<8x16xf32> {
  %0 = tdx.redistribute %x <@mesh, [Partial(max)]> to <@mesh, [Replicate]> {tdx.shardings = [#tdx.sharding<@mesh, [Replicate]>]} : tensor<8x16xf32>
  return %0 : tensor<8x16xf32>
}

// -----

tdx.mesh @mesh shape = [4] axes = ["tp"]
// CHECK-LABEL: func.func @partial_to_shard
// CHECK: tdx.reduce_scatter %{{.*}} on @mesh axes = ["tp"] reduce = sum dim = 1 {{.*}} : tensor<8x16xf32> -> tensor<8x4xf32>
func.func @partial_to_shard(%x: tensor<8x16xf32> {tdx.sharding = #tdx.sharding<@mesh, [Partial(sum)]>}) -> tensor<8x16xf32> {
  %0 = tdx.redistribute %x <@mesh, [Partial(sum)]> to <@mesh, [Shard(1)]> {tdx.shardings = [#tdx.sharding<@mesh, [Shard(1)]>]} : tensor<8x16xf32>
  return %0 : tensor<8x16xf32>
}

// -----

tdx.mesh @mesh shape = [4] axes = ["tp"]
// CHECK-LABEL: func.func @shard_to_shard
// CHECK: tdx.all_to_all %{{.*}} on @mesh axes = ["tp"] split = 1 concat = 0 {{.*}} : tensor<2x16xf32> -> tensor<8x4xf32>
func.func @shard_to_shard(%x: tensor<8x16xf32> {tdx.sharding = #tdx.sharding<@mesh, [Shard(0)]>}) -> tensor<8x16xf32> {
  %0 = tdx.redistribute %x <@mesh, [Shard(0)]> to <@mesh, [Shard(1)]> {tdx.shardings = [#tdx.sharding<@mesh, [Shard(1)]>]} : tensor<8x16xf32>
  return %0 : tensor<8x16xf32>
}

// -----

tdx.mesh @mesh shape = [4] axes = ["tp"]
// Replicate to Shard is a local slice: this rank's chunk, by its coordinate.
// CHECK-LABEL: func.func @replicate_to_shard
// CHECK: %[[C:.*]] = tdx.mesh_coord @mesh axis = "tp" : tensor<i64>
// CHECK: tdx.chunk %{{.*}}[%[[C]]] chunks = 4 dim = 1 {{.*}}: tensor<8x16xf32>, tensor<i64> -> tensor<8x4xf32>
// CHECK-NOT: tdx.all_
func.func @replicate_to_shard(%x: tensor<8x16xf32>) -> tensor<8x16xf32> {
  %0 = tdx.redistribute %x <@mesh, [Replicate]> to <@mesh, [Shard(1)]> {tdx.shardings = [#tdx.sharding<@mesh, [Shard(1)]>]} : tensor<8x16xf32>
  return %0 : tensor<8x16xf32>
}

// -----

tdx.mesh @mesh shape = [4] axes = ["tp"]
// Replicate to Partial(sum) keeps the value on coordinate 0 and zeroes it elsewhere;
// to Partial(max) it is the value itself.
// CHECK-LABEL: func.func @replicate_to_partial
// CHECK: %[[C:.*]] = tdx.mesh_coord @mesh axis = "tp"
// CHECK: %[[Z:.*]] = tdx.cmp eq, %[[C]], %{{.*}} : (tensor<i64>, tensor<i64>) -> tensor<i1>
// CHECK: %[[S:.*]] = tdx.where %[[Z]], %arg0, %{{.*}} : (tensor<i1>, tensor<8x16xf32>, tensor<f32>) -> tensor<8x16xf32>
// CHECK: return %[[S]], %arg0
func.func @replicate_to_partial(%x: tensor<8x16xf32>) -> (tensor<8x16xf32>, tensor<8x16xf32>) {
  %0 = tdx.redistribute %x <@mesh, [Replicate]> to <@mesh, [Partial(sum)]> {tdx.shardings = [#tdx.sharding<@mesh, [Partial(sum)]>]} : tensor<8x16xf32>
  %1 = tdx.redistribute %x <@mesh, [Replicate]> to <@mesh, [Partial(max)]> {tdx.shardings = [#tdx.sharding<@mesh, [Partial(max)]>]} : tensor<8x16xf32>
  return %0, %1 : tensor<8x16xf32>, tensor<8x16xf32>
}

// -----

tdx.mesh @mesh shape = [4] axes = ["tp"]
// Shard to Partial and Partial to another Partial go through Replicate.
// CHECK-LABEL: func.func @through_replicate
// CHECK: tdx.all_gather %arg0 on @mesh axes = ["tp"] dim = 0
// CHECK: tdx.where
// CHECK: %[[R:.*]] = tdx.all_reduce %arg1 on @mesh axes = ["tp"] reduce = sum
// CHECK-NOT: tdx.where
// CHECK: return %{{.*}}, %[[R]]
func.func @through_replicate(%x: tensor<8x16xf32> {tdx.sharding = #tdx.sharding<@mesh, [Shard(0)]>},
                             %y: tensor<8x16xf32> {tdx.sharding = #tdx.sharding<@mesh, [Partial(sum)]>})
    -> (tensor<8x16xf32>, tensor<8x16xf32>) {
  %0 = tdx.redistribute %x <@mesh, [Shard(0)]> to <@mesh, [Partial(sum)]> {tdx.shardings = [#tdx.sharding<@mesh, [Partial(sum)]>]} : tensor<8x16xf32>
  %1 = tdx.redistribute %y <@mesh, [Partial(sum)]> to <@mesh, [Partial(max)]> {tdx.shardings = [#tdx.sharding<@mesh, [Partial(max)]>]} : tensor<8x16xf32>
  return %0, %1 : tensor<8x16xf32>, tensor<8x16xf32>
}

// -----

// Uneven shards follow torch.chunk: 5 rows on 4 ranks are 2, 2, 1, 0, so
// the local dim is '?' and gathering gives back all 5.
tdx.mesh @mesh shape = [4] axes = ["tp"]
// CHECK-LABEL: func.func @uneven
// CHECK-SAME: (%[[X:.*]]: tensor<?x16xf32> {{.*}}) -> (tensor<5x16xf32> {tdx.global_type = {{.*}}})
// CHECK: tdx.all_gather %[[X]] on @mesh axes = ["tp"] dim = 0 {tdx.payload_bytes = 128 : i64{{.*}}} : tensor<?x16xf32> -> tensor<5x16xf32>
func.func @uneven(%x: tensor<5x16xf32> {tdx.sharding = #tdx.sharding<@mesh, [Shard(0)]>}) -> tensor<5x16xf32> {
  %0 = tdx.redistribute %x <@mesh, [Shard(0)]> to <@mesh, [Replicate]> {tdx.shardings = [#tdx.sharding<@mesh, [Replicate]>]} : tensor<5x16xf32>
  return %0 : tensor<5x16xf32>
}
