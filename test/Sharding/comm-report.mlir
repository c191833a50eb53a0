// RUN: tdx-opt %s --tdx-comm-report -o /dev/null | FileCheck %s
// RUN: tdx-opt %s --tdx-comm-report=format=json -o /dev/null | FileCheck %s --check-prefix=JSON
// RUN: not tdx-opt %s --tdx-comm-report=format=xml -o /dev/null 2>&1 | FileCheck %s --check-prefix=FORMAT

// CHECK:      collective      mesh axes     group  bytes per rank  dtype
// CHECK-NEXT: all_gather      tp            4      128
// CHECK-NEXT: all_reduce      dp,tp         8      2048
// CHECK-NEXT: reduce_scatter  dp            2      512
// CHECK-NEXT: all_to_all      tp            4      128
// CHECK-NEXT: broadcast       dp            2      64
// CHECK-NEXT: total: 5 collective(s), 2880 bytes per rank per forward step

// Seconds by the cost model: the gather over 4 ranks 25 us (its call) +
// 3 x 10 us (steps) + 3 x 128 B / 10 GB/s; the all_reduce over 8 ranks
// 25 + 2 x 7 x 10 us + 2 x 7/8 x 2048 B / 10 GB/s.
// JSON: [{"bytes":128,"dtype":"f32","group_size":4,"kind":"all_gather","location":"{{.*}}comm-report.mlir:22:8","mesh_axes":["tp"],"seconds":5.50384{{[0-9]*}}e-05},{"bytes":2048,"dtype":"f32","group_size":8,"kind":"all_reduce",{{.*}}"mesh_axes":["dp","tp"],"seconds":0.0001653584{{[0-9]*}}},{{.*}}"kind":"broadcast"{{.*}}}]

// FORMAT: error: tdx-comm-report: unknown format 'xml'; use 'table' or 'json'

tdx.mesh @mesh shape = [2, 4] axes = ["dp", "tp"]
func.func @f(%x: tensor<2x16xf32>, %y: tensor<8x16xf32>, %z: tensor<16xf32>) {
  %0 = tdx.all_gather %x on @mesh axes = ["tp"] dim = 0 : tensor<2x16xf32> -> tensor<8x16xf32>
  %1 = tdx.all_reduce %0 on @mesh axes = ["dp", "tp"] reduce = sum {tdx.payload_bytes = 2048 : i64} : tensor<8x16xf32> -> tensor<8x16xf32>
  %2 = tdx.reduce_scatter %y on @mesh axes = ["dp"] reduce = sum dim = 0 : tensor<8x16xf32> -> tensor<4x16xf32>
  %3 = tdx.all_to_all %x on @mesh axes = ["tp"] split = 1 concat = 0 : tensor<2x16xf32> -> tensor<8x4xf32>
  %4 = tdx.broadcast %z on @mesh axes = ["dp"] root = [0] : tensor<16xf32> -> tensor<16xf32>
  return
}
