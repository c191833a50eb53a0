// RUN: tdx-opt %s -split-input-file --tdx-propagate-sharding --tdx-insert-collectives --tdx-partition | FileCheck %s

// Uneven splits, empty shards included (torch.chunk of 1 row over 2 ranks:
// rank 1 holds none). A padded batch: the filled blocks have a
// rank-dependent size, so they keep their global shape and each rank fills
// its own box of it (the runtimes' Mesh::localShape).
tdx.mesh @mesh shape = [2] axes = ["dp"]
// CHECK-LABEL: func.func @pad_of_one_row
// CHECK-SAME: tensor<?x3x3xf32>
// CHECK: %[[Z:.*]] = tdx.full 0.000000e+00 {global_shape = array<i64: 1, 3, 2>, {{.*}}} : tensor<?x3x2xf32>
// CHECK: tdx.concat %[[Z]], %arg0, %[[Z]] dim 2 {{.*}} -> tensor<?x3x7xf32>
func.func @pad_of_one_row(%x: tensor<1x3x3xf32> {tdx.sharding = #tdx.sharding<@mesh, [Shard(0)]>}) -> tensor<1x3x7xf32> {
  %z = tdx.full 0.0 : tensor<1x3x2xf32>
  %p = tdx.concat %z, %x, %z dim 2 : (tensor<1x3x2xf32>, tensor<1x3x3xf32>, tensor<1x3x2xf32>) -> tensor<1x3x7xf32>
  return %p : tensor<1x3x7xf32>
}

// -----

// An even split keeps the static local shape and no global_shape.
tdx.mesh @mesh shape = [2] axes = ["dp"]
// CHECK-LABEL: func.func @even
// CHECK: tdx.full 1.000000e+00 {tdx.shardings = {{.*}}} : tensor<2x3xf32>
func.func @even(%x: tensor<4x3xf32> {tdx.sharding = #tdx.sharding<@mesh, [Shard(0)]>}) -> tensor<4x3xf32> {
  %o = tdx.full 1.0 : tensor<4x3xf32>
  %y = tdx.add %x, %o : (tensor<4x3xf32>, tensor<4x3xf32>) -> tensor<4x3xf32>
  return %y : tensor<4x3xf32>
}

// -----

// Rows of a table split unevenly (x[[1, 2]] of a (5, 25) input split over 2
// ranks: 3 and 2 rows): the lookup is vocabulary-parallel with the global
// row count known from the split value itself: rank 0 holds rows [0, 3),
// rank 1 rows [3, min(3 + 3, 5)).
tdx.mesh @mesh shape = [2] axes = ["dp"]
// CHECK-LABEL: func.func @rows_of_uneven_table
// CHECK-DAG: tdx.full 3.000000e+00 : tensor<i64>
// CHECK-DAG: tdx.full 5.000000e+00 : tensor<i64>
// CHECK: tdx.minimum
// CHECK: tdx.embedding %arg0, %{{.*}} : (tensor<?x25xf32>, tensor<2xi64>) -> tensor<2x25xf32>
// CHECK: tdx.where {{.*}} {tdx.shardings = [#tdx.sharding<@mesh, [Partial(sum)]>]}
func.func @rows_of_uneven_table(%t: tensor<5x25xf32> {tdx.sharding = #tdx.sharding<@mesh, [Shard(0)]>}, %i: tensor<2xi64>) -> tensor<2x25xf32> {
  %r = tdx.embedding %t, %i : (tensor<5x25xf32>, tensor<2xi64>) -> tensor<2x25xf32>
  %n = tdx.neg %r : tensor<2x25xf32>
  return %n : tensor<2x25xf32>
}

// -----

// A table with an empty shard (2 rows over 3 ranks): every rank's table
// gets a zero row, so that the masked lookups of a rank with no rows read
// a row that exists.
tdx.mesh @mesh shape = [3] axes = ["dp"]
// CHECK-LABEL: func.func @rows_of_table_with_empty_shard
// CHECK: %[[Z:.*]] = tdx.full 0.000000e+00 : tensor<1x4xf32>
// CHECK: %[[T:.*]] = tdx.concat %arg0, %[[Z]] dim 0 : (tensor<?x4xf32>, tensor<1x4xf32>) -> tensor<?x4xf32>
// CHECK: tdx.embedding %[[T]]
func.func @rows_of_table_with_empty_shard(%t: tensor<2x4xf32> {tdx.sharding = #tdx.sharding<@mesh, [Shard(0)]>}, %i: tensor<3xi64>) -> tensor<3x4xf32> {
  %r = tdx.embedding %t, %i : (tensor<2x4xf32>, tensor<3xi64>) -> tensor<3x4xf32>
  %n = tdx.neg %r : tensor<3x4xf32>
  return %n : tensor<3x4xf32>
}

// -----

// A broadcast into a dim split unevenly (a scalar expanded to (5, 10) next
// to a (5, 10) input split 3 + 2 rows): the new leading dim has no input
// size that `-1` could keep, so the expand makes the global rows and each
// rank takes its chunk (the OpInfo backward of cat on dp2 made an invalid
// expand here before).
tdx.mesh @mesh shape = [2] axes = ["dp"]
// CHECK-LABEL: func.func @broadcast_into_uneven_rows
// CHECK: %[[E:.*]] = tdx.expand %{{.*}} [5, 10] : tensor<f32> -> tensor<5x10xf32>
// CHECK: %[[C:.*]] = tdx.mesh_coord @mesh axis = "dp"
// CHECK: tdx.chunk %[[E]][%[[C]]] chunks = 2 dim = 0 {{.*}} -> tensor<?x10xf32>
func.func @broadcast_into_uneven_rows(%s: tensor<f32>, %x: tensor<5x10xf32> {tdx.sharding = #tdx.sharding<@mesh, [Shard(0)]>}) -> tensor<5x10xf32> {
  %e = tdx.expand %s [5, 10] : tensor<f32> -> tensor<5x10xf32>
  %y = tdx.mul %e, %x : (tensor<5x10xf32>, tensor<5x10xf32>) -> tensor<5x10xf32>
  return %y : tensor<5x10xf32>
}

// -----

// Broadcast from a dim of size 1 (a (1, 10) row to (5, 10)): the same.
tdx.mesh @mesh shape = [2] axes = ["dp"]
// CHECK-LABEL: func.func @broadcast_of_a_row_into_uneven_rows
// CHECK: %[[E:.*]] = tdx.expand %{{.*}} [5, 10] : tensor<1x10xf32> -> tensor<5x10xf32>
// CHECK: tdx.chunk %[[E]][%{{.*}}] chunks = 2 dim = 0 {{.*}} -> tensor<?x10xf32>
func.func @broadcast_of_a_row_into_uneven_rows(%s: tensor<1x10xf32>, %x: tensor<5x10xf32> {tdx.sharding = #tdx.sharding<@mesh, [Shard(0)]>}) -> tensor<5x10xf32> {
  %e = tdx.expand %s [5, 10] : tensor<1x10xf32> -> tensor<5x10xf32>
  %y = tdx.mul %e, %x : (tensor<5x10xf32>, tensor<5x10xf32>) -> tensor<5x10xf32>
  return %y : tensor<5x10xf32>
}
