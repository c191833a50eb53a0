// RUN: tdx-opt %s --split-input-file --tdx-check-replication --tdx-propagate-sharding --tdx-insert-collectives --tdx-partition | FileCheck %s
// RUN: tdx-opt %s --split-input-file --tdx-check-replication --tdx-propagate-sharding --tdx-insert-collectives --tdx-partition -mlir-print-debuginfo | FileCheck %s --check-prefix=LOC

// A manual region inside a placed dp x tp program (tdx.local_map): its
// inputs get the layouts it reads them in, its body runs on each rank's
// pieces as written, its all_gather is the user's, and the program around
// it is placed by propagation from the region's output layout.
// CHECK-LABEL: func.func @forward(
// CHECK-SAME: %arg0: tensor<4x4xf32> {{.*}}#tdx.sharding<@mesh, [Shard(0), Replicate]>
// CHECK-SAME: %arg1: tensor<4x3xf32> {{.*}}#tdx.sharding<@mesh, [Replicate, Shard(1)]>
// CHECK-NOT: tdx.to_local
// CHECK: %[[M:.*]] = tdx.matmul %arg0, %arg1 {{.*}}: (tensor<4x4xf32>, tensor<4x3xf32>) -> tensor<4x3xf32>
// CHECK: %[[G:.*]] = tdx.all_gather %[[M]] on @mesh axes = ["tp"] dim = 1 : tensor<4x3xf32> -> tensor<4x6xf32>
// CHECK-NOT: tdx.from_local
// CHECK: %[[E:.*]] = tdx.exp %[[G]] {{.*}}: tensor<4x6xf32>
// CHECK: return %[[E]]
// LOC: tdx.all_gather {{.*}} loc(#[[SITE:loc[0-9]*]])
// LOC: #[[SITE]] = loc("model.py":7:0)
module {
  tdx.mesh @mesh shape = [2, 2] axes = ["dp", "tp"]
  func.func @forward(%x: tensor<8x4xf32> {tdx.sharding = #tdx.sharding<@mesh, [Shard(0), Replicate]>},
                     %w: tensor<4x6xf32>) -> tensor<8x6xf32> {
    %xl = tdx.to_local %x <@mesh, [Shard(0), Replicate]> : tensor<8x4xf32> -> tensor<4x4xf32>
    %wl = tdx.to_local %w <@mesh, [Replicate, Shard(1)]> : tensor<4x6xf32> -> tensor<4x3xf32>
    %y = tdx.matmul %xl, %wl : (tensor<4x4xf32>, tensor<4x3xf32>) -> tensor<4x3xf32>
    %g = tdx.aten "tdx::all_gather"(%y) {args = {dim = 1 : i64, axes = "tp", group = 2 : i64, site = "model.py:7"}} : (tensor<4x3xf32>) -> tensor<4x6xf32>
    %out = tdx.from_local %g <@mesh, [Shard(0), Replicate]> : tensor<4x6xf32> -> tensor<8x6xf32>
    %z = tdx.exp %out : tensor<8x6xf32>
    return %z : tensor<8x6xf32>
  }
}

