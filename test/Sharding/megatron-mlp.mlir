// A Megatron MLP: column-parallel then row-parallel over "tp". The forward
// has exactly one collective, the all_reduce of the row-parallel output.
// RUN: tdx-opt %s --tdx-propagate-sharding --tdx-insert-collectives --tdx-partition | FileCheck %s --implicit-check-not=tdx.all_gather --implicit-check-not=tdx.reduce_scatter --implicit-check-not=tdx.all_to_all --implicit-check-not=tdx.chunk
// RUN: tdx-opt %s --tdx-propagate-sharding --tdx-insert-collectives --tdx-partition --tdx-comm-report -o /dev/null | FileCheck %s --check-prefix=REPORT
// The registered pipelines (what tdx-compile and Python run) give the same program.
// RUN: tdx-opt %s --tdx-place --tdx-spmd | FileCheck %s --implicit-check-not=tdx.all_gather --implicit-check-not=tdx.reduce_scatter --implicit-check-not=tdx.all_to_all --implicit-check-not=tdx.chunk

tdx.mesh @mesh shape = [4] axes = ["tp"]
tdx.parameter @fc1.weight : tensor<64x16xf32> sharding <@mesh, [Shard(0)]> init {
  %0 = tdx.normal(0.0, 0.02) seed(0, 0) : tensor<64x16xf32>
  tdx.yield %0 : tensor<64x16xf32>
}
tdx.parameter @fc1.bias : tensor<64xf32> init {
  %0 = tdx.full 0.0 : tensor<64xf32>
  tdx.yield %0 : tensor<64xf32>
}
tdx.parameter @fc2.weight : tensor<16x64xf32> sharding <@mesh, [Shard(1)]> init {
  %0 = tdx.normal(0.0, 0.02) seed(0, 1) : tensor<16x64xf32>
  tdx.yield %0 : tensor<16x64xf32>
}
tdx.parameter @fc2.bias : tensor<16xf32> init {
  %0 = tdx.full 0.0 : tensor<16xf32>
  tdx.yield %0 : tensor<16xf32>
}

// Propagation gives the unannotated bias of fc1 the column split.
// CHECK: tdx.parameter @fc1.bias : tensor<64xf32> sharding <@mesh, [Shard(0)]>
// CHECK: tdx.parameter @fc2.bias : tensor<16xf32> sharding <@mesh, [Replicate]>
// CHECK-LABEL: func.func @forward
// CHECK-SAME: (%[[X:.*]]: tensor<8x16xf32> {tdx.global_type = {{[^,]*}}, tdx.sharding = #tdx.sharding<@mesh, [Replicate]>}) -> (tensor<8x16xf32> {tdx.global_type = {{.*}}})
// CHECK: %[[W1:.*]] = tdx.param_ref @fc1.weight {{.*}} : tensor<16x16xf32>
// CHECK: %[[B1:.*]] = tdx.param_ref @fc1.bias {{.*}} : tensor<16xf32>
// CHECK: %[[H:.*]] = tdx.linear %[[X]], %[[W1]], %[[B1]] {tdx.shardings = [#tdx.sharding<@mesh, [Shard(1)]>]} : (tensor<8x16xf32>, tensor<16x16xf32>, tensor<16xf32>) -> tensor<8x16xf32>
// CHECK: %[[G:.*]] = tdx.gelu %[[H]] {{.*}} : tensor<8x16xf32>
// CHECK: %[[W2:.*]] = tdx.param_ref @fc2.weight {{.*}} : tensor<16x16xf32>
// CHECK: %[[B2:.*]] = tdx.param_ref @fc2.bias {{.*}} : tensor<16xf32>
// The replicated bias is added once: kept on coordinate 0, zero elsewhere.
// CHECK: %[[C:.*]] = tdx.mesh_coord @mesh axis = "tp" : tensor<i64>
// CHECK: %[[FIRST:.*]] = tdx.cmp eq, %[[C]], %{{.*}}
// CHECK: %[[B2P:.*]] = tdx.where %[[FIRST]], %[[B2]], %{{.*}} : (tensor<i1>, tensor<16xf32>, tensor<f32>) -> tensor<16xf32>
// CHECK: %[[P:.*]] = tdx.linear %[[G]], %[[W2]], %[[B2P]] {tdx.shardings = [#tdx.sharding<@mesh, [Partial(sum)]>]}
// CHECK: %[[Y:.*]] = tdx.all_reduce %[[P]] on @mesh axes = ["tp"] reduce = sum {tdx.payload_bytes = 512 : i64{{.*}}} : tensor<8x16xf32> -> tensor<8x16xf32>
// CHECK: return %[[Y]]
func.func @forward(%x: tensor<8x16xf32>) -> tensor<8x16xf32> {
  %w1 = tdx.param_ref @fc1.weight : tensor<64x16xf32>
  %b1 = tdx.param_ref @fc1.bias : tensor<64xf32>
  %h = tdx.linear %x, %w1, %b1 : (tensor<8x16xf32>, tensor<64x16xf32>, tensor<64xf32>) -> tensor<8x64xf32>
  %g = tdx.gelu %h : tensor<8x64xf32>
  %w2 = tdx.param_ref @fc2.weight : tensor<16x64xf32>
  %b2 = tdx.param_ref @fc2.bias : tensor<16xf32>
  %y = tdx.linear %g, %w2, %b2 : (tensor<8x64xf32>, tensor<16x64xf32>, tensor<16xf32>) -> tensor<8x16xf32>
  %r = tdx.annotate %y <@mesh, [Replicate]> : tensor<8x16xf32>
  return %r : tensor<8x16xf32>
}

// REPORT:      collective      mesh axes     group  bytes per rank
// REPORT-NEXT: all_reduce      tp            4      512
// REPORT-NEXT: total: 1 collective(s), 512 bytes per rank per forward step
