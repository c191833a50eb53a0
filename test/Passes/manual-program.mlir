// RUN: tdx-opt %s --split-input-file --tdx-manual-program="mesh=world shape=4 axes=world" | FileCheck %s
// RUN: tdx-opt %s --split-input-file --tdx-manual-program="mesh=world shape=4 axes=world" -mlir-print-debuginfo | FileCheck %s --check-prefix=LOC

// A step tdx.mpi's calls recorded: state Replicate, inputs this rank's rows,
// each tdx:: call the dialect's collective at the user's line.
// CHECK: module attributes {tdx.partitioned}
// CHECK: tdx.mesh @world shape = [4] axes = ["world"]
// CHECK: tdx.parameter @w : tensor<3xf64> sharding <@world, [Replicate]>
// CHECK-LABEL: func.func @train_step(
// CHECK-SAME: %arg0: tensor<2x3xf64> {tdx.global_type = tensor<8x3xf64>, tdx.sharding = #tdx.sharding<@world, [Shard(0)]>}
// CHECK-SAME: %arg1: tensor<f64> {tdx.global_type = tensor<f64>, tdx.sharding = #tdx.sharding<@world, [Replicate]>}
// CHECK-SAME: -> (tensor<f64> {tdx.global_type = tensor<f64>})
// CHECK: tdx.all_reduce %{{.*}} on @world axes = ["world"] reduce = sum : tensor<2x3xf64> -> tensor<2x3xf64>
// CHECK: tdx.all_reduce %{{.*}} on @world axes = ["world"] reduce = max
// CHECK: tdx.all_gather %{{.*}} on @world axes = ["world"] dim = 0 : tensor<2x3xf64> -> tensor<8x3xf64>
// CHECK: tdx.reduce_scatter %{{.*}} on @world axes = ["world"] reduce = sum dim = 0 : tensor<8x3xf64> -> tensor<2x3xf64>
// CHECK: tdx.all_to_all %{{.*}} on @world axes = ["world"] split = 1 concat = 0 : tensor<2x4xf64> -> tensor<8x1xf64>
// CHECK: tdx.broadcast %{{.*}} on @world axes = ["world"] root = [3] : tensor<2x3xf64> -> tensor<2x3xf64>
// CHECK: tdx.collective_permute %{{.*}} on @world axes = ["world"] pairs = [0, 1, 1, 2, 2, 3, 3, 0]
// CHECK: tdx.mesh_coord @world axis = "world" : tensor<i64>
// CHECK: tdx.ragged_all_to_all %{{.*}}, %{{.*}}, %{{.*}}, %{{.*}}, %{{.*}} on @world axes = ["world"] : tensor<2x3xf64>, tensor<4xi64> -> tensor<8x3xf64>
// CHECK-NOT: tdx::
// LOC: tdx.all_reduce {{.*}} loc(#[[SUM:loc[0-9]*]])
// LOC: #[[SUM]] = loc("train.py":12:0)
module {
  tdx.parameter @w : tensor<3xf64> init {
    %0 = tdx.full 0.0 : tensor<3xf64>
    tdx.yield %0 : tensor<3xf64>
  }
  func.func @train_step(%x: tensor<2x3xf64>, %lr: tensor<f64>) -> tensor<f64> {
    %0 = tdx.aten "tdx::all_reduce"(%x) {args = {reduce = "sum", axes = "world", group = 4 : i64, site = "train.py:12"}} : (tensor<2x3xf64>) -> tensor<2x3xf64>
    %1 = tdx.aten "tdx::all_reduce"(%0) {args = {reduce = "max", axes = "world", group = 4 : i64, site = "train.py:13"}} : (tensor<2x3xf64>) -> tensor<2x3xf64>
    %2 = tdx.aten "tdx::all_gather"(%1) {args = {dim = 0 : i64, axes = "world", group = 4 : i64, site = "train.py:14"}} : (tensor<2x3xf64>) -> tensor<8x3xf64>
    %3 = tdx.aten "tdx::reduce_scatter"(%2) {args = {reduce = "sum", dim = 0 : i64, axes = "world", group = 4 : i64, site = "train.py:15"}} : (tensor<8x3xf64>) -> tensor<2x3xf64>
    %y = tdx.full 1.0 : tensor<2x4xf64>
    %4 = tdx.aten "tdx::all_to_all"(%y) {args = {split_dim = 1 : i64, concat_dim = 0 : i64, axes = "world", group = 4 : i64, site = "train.py:16"}} : (tensor<2x4xf64>) -> tensor<8x1xf64>
    %5 = tdx.aten "tdx::broadcast"(%3) {args = {root = 3 : i64, axes = "world", group = 4 : i64, site = "train.py:17"}} : (tensor<2x3xf64>) -> tensor<2x3xf64>
    %6 = tdx.aten "tdx::permute"(%5) {args = {pairs = array<i64: 0, 1, 1, 2, 2, 3, 3, 0>, axes = "world", group = 4 : i64, site = "train.py:18"}} : (tensor<2x3xf64>) -> tensor<2x3xf64>
    %7 = tdx.aten "tdx::rank"(%6) {args = {axes = "world", group = 4 : i64, site = "train.py:19"}} : (tensor<2x3xf64>) -> tensor<i64>
    %sizes = tdx.full 1.0 : tensor<4xi64>
    %9 = tdx.aten "tdx::ragged_all_to_all"(%6, %sizes, %sizes, %sizes, %sizes) {args = {rows = 8 : i64, axes = "world", group = 4 : i64, site = "train.py:20"}} : (tensor<2x3xf64>, tensor<4xi64>, tensor<4xi64>, tensor<4xi64>, tensor<4xi64>) -> tensor<8x3xf64>
    %10 = tdx.sum %9 : tensor<8x3xf64> -> tensor<f64>
    return %10 : tensor<f64>
  }
}

// -----

// The module's mesh, when the trace declared it (no options needed there).
// CHECK-LABEL: func.func @declared
// CHECK: tdx.all_reduce %{{.*}} on @world axes = ["world"] reduce = avg
module {
  tdx.mesh @world shape = [4] axes = ["world"]
  func.func @declared(%x: tensor<2xf32>) -> tensor<2xf32> {
    %0 = tdx.aten "tdx::all_reduce"(%x) {args = {reduce = "avg", axes = "world", group = 4 : i64, site = "a.py:1"}} : (tensor<2xf32>) -> tensor<2xf32>
    return %0 : tensor<2xf32>
  }
}
