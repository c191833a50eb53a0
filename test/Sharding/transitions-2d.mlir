// Transitions on a 2-D mesh: several axes change at once and
// tdx-insert-collectives picks the cheapest valid order of single-axis steps.
// RUN: tdx-opt %s -split-input-file --tdx-insert-collectives | FileCheck %s
// RUN: tdx-opt %s -split-input-file --tdx-insert-collectives --tdx-partition | FileCheck %s --check-prefix=LOCAL

tdx.mesh @mesh shape = [2, 4] axes = ["dp", "tp"]
// Reduce first, on the sharded (smaller) tensor, then gather.
// CHECK-LABEL: func.func @reduce_then_gather
// CHECK: %[[A:.*]] = tdx.redistribute %arg0 <@mesh, [Partial(sum), Shard(0)]> to <@mesh, [Replicate, Shard(0)]>
// CHECK: tdx.redistribute %[[A]] <@mesh, [Replicate, Shard(0)]> to <@mesh, [Replicate, Replicate]>
// LOCAL-LABEL: func.func @reduce_then_gather
// LOCAL: %[[A:.*]] = tdx.all_reduce %arg0 on @mesh axes = ["dp"] reduce = sum {tdx.payload_bytes = 128 : i64{{.*}}} : tensor<2x16xf32> -> tensor<2x16xf32>
// LOCAL: tdx.all_gather %[[A]] on @mesh axes = ["tp"] dim = 0 {tdx.payload_bytes = 128 : i64{{.*}}} : tensor<2x16xf32> -> tensor<8x16xf32>
func.func @reduce_then_gather(%x: tensor<8x16xf32> {tdx.sharding = #tdx.sharding<@mesh, [Partial(sum), Shard(0)]>}) -> tensor<8x16xf32> {
  %0 = tdx.redistribute %x <@mesh, [Partial(sum), Shard(0)]> to <@mesh, [Replicate, Replicate]> {tdx.shardings = [#tdx.sharding<@mesh, [Replicate, Replicate]>]} : tensor<8x16xf32>
  return %0 : tensor<8x16xf32>
}

// -----

tdx.mesh @mesh shape = [2, 4] axes = ["dp", "tp"]
// A dim sharded over both axes is nested in mesh order: gather the inner
// axis first, then the outer.
// CHECK-LABEL: func.func @nested_gather
// CHECK: tdx.redistribute %arg0 <@mesh, [Shard(0), Shard(0)]> to <@mesh, [Shard(0), Replicate]>
// CHECK: tdx.redistribute %{{.*}} <@mesh, [Shard(0), Replicate]> to <@mesh, [Replicate, Replicate]>
// LOCAL-LABEL: func.func @nested_gather
// LOCAL: tdx.all_gather %arg0 on @mesh axes = ["tp"] dim = 0 {{.*}} : tensor<2x16xf32> -> tensor<8x16xf32>
// LOCAL: tdx.all_gather %{{.*}} on @mesh axes = ["dp"] dim = 0 {{.*}} : tensor<8x16xf32> -> tensor<16x16xf32>
func.func @nested_gather(%x: tensor<16x16xf32> {tdx.sharding = #tdx.sharding<@mesh, [Shard(0), Shard(0)]>}) -> tensor<16x16xf32> {
  %0 = tdx.redistribute %x <@mesh, [Shard(0), Shard(0)]> to <@mesh, [Replicate, Replicate]> {tdx.shardings = [#tdx.sharding<@mesh, [Replicate, Replicate]>]} : tensor<16x16xf32>
  return %0 : tensor<16x16xf32>
}

// -----

tdx.mesh @mesh shape = [2, 4] axes = ["dp", "tp"]
// Splitting goes the other way: outer axis first.
// CHECK-LABEL: func.func @nested_split
// CHECK: tdx.redistribute %arg0 <@mesh, [Replicate, Replicate]> to <@mesh, [Shard(0), Replicate]>
// CHECK: tdx.redistribute %{{.*}} <@mesh, [Shard(0), Replicate]> to <@mesh, [Shard(0), Shard(0)]>
// LOCAL-LABEL: func.func @nested_split
// LOCAL: %[[D:.*]] = tdx.mesh_coord @mesh axis = "dp"
// LOCAL: %[[A:.*]] = tdx.chunk %arg0[%[[D]]] chunks = 2 dim = 0 {{.*}}: tensor<16x16xf32>, tensor<i64> -> tensor<8x16xf32>
// LOCAL: %[[T:.*]] = tdx.mesh_coord @mesh axis = "tp"
// LOCAL: tdx.chunk %[[A]][%[[T]]] chunks = 4 dim = 0 {{.*}}: tensor<8x16xf32>, tensor<i64> -> tensor<2x16xf32>
func.func @nested_split(%x: tensor<16x16xf32>) -> tensor<16x16xf32> {
  %0 = tdx.redistribute %x <@mesh, [Replicate, Replicate]> to <@mesh, [Shard(0), Shard(0)]> {tdx.shardings = [#tdx.sharding<@mesh, [Shard(0), Shard(0)]>]} : tensor<16x16xf32>
  return %0 : tensor<16x16xf32>
}

// -----

tdx.mesh @mesh shape = [2, 4] axes = ["dp", "tp"]
// The outer axis moves from dim 0 to dim 1 while the inner axis keeps
// Shard(0): the inner chunks are cut from another piece, so the inner axis
// is gathered and re-split around the all_to_all.
// CHECK-LABEL: func.func @nesting_changes
// CHECK: <@mesh, [Shard(0), Shard(0)]> to <@mesh, [Shard(0), Replicate]>
// CHECK: <@mesh, [Shard(0), Replicate]> to <@mesh, [Shard(1), Replicate]>
// CHECK: <@mesh, [Shard(1), Replicate]> to <@mesh, [Shard(1), Shard(0)]>
// LOCAL-LABEL: func.func @nesting_changes
// LOCAL: tdx.all_gather %arg0 on @mesh axes = ["tp"] dim = 0 {{.*}} : tensor<2x16xf32> -> tensor<8x16xf32>
// LOCAL: tdx.all_to_all %{{.*}} on @mesh axes = ["dp"] split = 1 concat = 0 {{.*}} : tensor<8x16xf32> -> tensor<16x8xf32>
// LOCAL: tdx.chunk %{{.*}} chunks = 4 dim = 0 {{.*}}: tensor<16x8xf32>, tensor<i64> -> tensor<4x8xf32>
func.func @nesting_changes(%x: tensor<16x16xf32> {tdx.sharding = #tdx.sharding<@mesh, [Shard(0), Shard(0)]>}) -> tensor<16x16xf32> {
  %0 = tdx.redistribute %x <@mesh, [Shard(0), Shard(0)]> to <@mesh, [Shard(1), Shard(0)]> {tdx.shardings = [#tdx.sharding<@mesh, [Shard(1), Shard(0)]>]} : tensor<16x16xf32>
  return %0 : tensor<16x16xf32>
}

// -----

tdx.mesh @mesh shape = [2, 4] axes = ["dp", "tp"]
// Partial over dp into Shard(1) over dp, while tp stops sharding dim 0: the
// cheapest order reduce-scatters first, so the gather moves half the bytes.
// CHECK-LABEL: func.func @partial_to_other_axis
// LOCAL-LABEL: func.func @partial_to_other_axis
// LOCAL: %[[S:.*]] = tdx.reduce_scatter %arg0 on @mesh axes = ["dp"] reduce = sum dim = 1 {tdx.payload_bytes = 256 : i64{{.*}}} : tensor<4x16xf32> -> tensor<4x8xf32>
// LOCAL: tdx.all_gather %[[S]] on @mesh axes = ["tp"] dim = 0 {tdx.payload_bytes = 128 : i64{{.*}}} : tensor<4x8xf32> -> tensor<16x8xf32>
func.func @partial_to_other_axis(%x: tensor<16x16xf32> {tdx.sharding = #tdx.sharding<@mesh, [Partial(sum), Shard(0)]>}) -> tensor<16x16xf32> {
  %0 = tdx.redistribute %x <@mesh, [Partial(sum), Shard(0)]> to <@mesh, [Shard(1), Replicate]> {tdx.shardings = [#tdx.sharding<@mesh, [Shard(1), Replicate]>]} : tensor<16x16xf32>
  return %0 : tensor<16x16xf32>
}
