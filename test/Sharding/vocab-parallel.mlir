// Vocabulary-parallel embedding and cross-entropy, with the LM head tied to
// the embedding: the only collectives are the reductions the math needs.
//  - the embedding's masked lookup leaves a Partial sum: one all_reduce;
//  - the LM head is column-parallel over the vocabulary: no collective;
//  - the loss needs the global max and the global sum of exponentials
//    (two small all_reduces) and sums its Partial result once.
// RUN: tdx-opt %s --tdx-propagate-sharding --tdx-insert-collectives --tdx-partition --tdx-comm-report -o %t.mlir | FileCheck %s --check-prefix=REPORT
// RUN: FileCheck %s --input-file=%t.mlir --implicit-check-not=tdx.all_gather --implicit-check-not=tdx.all_to_all --implicit-check-not=tdx.reduce_scatter

// REPORT:      all_reduce      tp            4      1024
// REPORT-NEXT: all_reduce      tp            4      64
// REPORT-NEXT: all_reduce      tp            4      64
// REPORT-NEXT: all_reduce      tp            4      4
// REPORT-NEXT: total: 4 collective(s), 1156 bytes per rank per forward step

// The masked lookup: ids this rank owns are [coord * 25, coord * 25 + 25).
// CHECK-LABEL: func.func @forward
// CHECK: %[[W:.*]] = tdx.param_ref @wte {{.*}} : tensor<25x16xf32>
// CHECK: tdx.mesh_coord @mesh axis = "tp"
// CHECK: tdx.full 2.500000e+01 : tensor<i64>
// CHECK: %[[OWNED:.*]] = tdx.where %{{.*}}, %{{.*}}, %{{.*}} : (tensor<2x8xi1>, tensor<2x8xi1>, tensor<i1>) -> tensor<2x8xi1>
// CHECK: %[[SAFE:.*]] = tdx.where %[[OWNED]], %{{.*}}, %{{.*}} : (tensor<2x8xi1>, tensor<2x8xi64>, tensor<i64>) -> tensor<2x8xi64>
// CHECK: tdx.embedding %[[W]], %[[SAFE]] : (tensor<25x16xf32>, tensor<2x8xi64>) -> tensor<2x8x16xf32>
// CHECK: tdx.all_reduce %{{.*}} on @mesh axes = ["tp"] reduce = sum {{.*}} : tensor<2x8x16xf32> -> tensor<2x8x16xf32>
// The LM head computes this rank's 25 classes.
// CHECK: tdx.linear %{{.*}}, %[[W]] {{.*}} : (tensor<2x8x16xf32>, tensor<25x16xf32>) -> tensor<2x8x25xf32>
// CHECK: tdx.max %{{.*}} dims = [1] keepdim : tensor<16x25xf32> -> tensor<16x1xf32>
// CHECK: tdx.all_reduce %{{.*}} reduce = max {{.*}} : tensor<16x1xf32> -> tensor<16x1xf32>
// CHECK: tdx.all_reduce %{{.*}} reduce = sum {{.*}} : tensor<16x1xf32> -> tensor<16x1xf32>
// CHECK: tdx.all_reduce %{{.*}} reduce = sum {{.*}} : tensor<f32> -> tensor<f32>
tdx.mesh @mesh shape = [4] axes = ["tp"]
tdx.parameter @wte : tensor<100x16xf32> sharding <@mesh, [Shard(0)]> init {
  %0 = tdx.normal(0.0, 0.02) seed(0, 0) : tensor<100x16xf32>
  tdx.yield %0 : tensor<100x16xf32>
}
func.func @forward(%ids: tensor<2x8xi64>, %labels: tensor<2x8xi64>) -> tensor<f32> {
  %w = tdx.param_ref @wte : tensor<100x16xf32>
  %e = tdx.embedding %w, %ids : (tensor<100x16xf32>, tensor<2x8xi64>) -> tensor<2x8x16xf32>
  %er = tdx.annotate %e <@mesh, [Replicate]> : tensor<2x8x16xf32>
  %logits = tdx.linear %er, %w : (tensor<2x8x16xf32>, tensor<100x16xf32>) -> tensor<2x8x100xf32>
  %l2 = tdx.reshape %logits [16, 100] : tensor<2x8x100xf32> -> tensor<16x100xf32>
  %t2 = tdx.reshape %labels [16] : tensor<2x8xi64> -> tensor<16xi64>
  %loss = tdx.cross_entropy %l2, %t2 reduction = mean : (tensor<16x100xf32>, tensor<16xi64>) -> tensor<f32>
  %r = tdx.annotate %loss <@mesh, [Replicate]> : tensor<f32>
  return %r : tensor<f32>
}
