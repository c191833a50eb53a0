// RUN: tdx-opt %s -split-input-file --tdx-widen-reductions | FileCheck %s
// RUN: tdx-opt %s -split-input-file --tdx-widen-reductions=reduce-type=f64 | FileCheck %s --check-prefix=F64
// RUN: tdx-opt %s -split-input-file --tdx-widen-reductions --tdx-comm-report -o /dev/null | FileCheck %s --check-prefix=REPORT
// RUN: not tdx-opt %s -split-input-file --tdx-widen-reductions=reduce-type=bf16 -o /dev/null 2>&1 | FileCheck %s --check-prefix=BAD

// Mixed precision's reduce dtype: the module's tdx.reduce_type makes every
// summing collective on a narrower float sum in it, between two casts; its
// payload doubles. Gathers move the narrow bytes; f32 reductions stay.
// CHECK-LABEL: func.func @step
// CHECK:      %[[UP:.*]] = tdx.cast %arg0 : tensor<8x16xbf16> to tensor<8x16xf32>
// CHECK-NEXT: %[[R:.*]] = tdx.all_reduce %[[UP]] on @mesh axes = ["tp"] reduce = sum {tdx.payload_bytes = 512 : i64} : tensor<8x16xf32> -> tensor<8x16xf32>
// CHECK-NEXT: %[[DOWN:.*]] = tdx.cast %[[R]] : tensor<8x16xf32> to tensor<8x16xbf16>
// CHECK-NEXT: %[[UP2:.*]] = tdx.cast %arg1 : tensor<8x16xf16> to tensor<8x16xf32>
// CHECK-NEXT: %[[S:.*]] = tdx.reduce_scatter %[[UP2]] {{.*}}: tensor<8x16xf32> -> tensor<4x16xf32>
// CHECK-NEXT: tdx.cast %[[S]] : tensor<4x16xf32> to tensor<4x16xf16>
// CHECK-NEXT: tdx.all_gather %arg0 {{.*}}: tensor<8x16xbf16> -> tensor<16x16xbf16>
// CHECK-NEXT: tdx.all_reduce %arg2 {{.*}}: tensor<8xf32> -> tensor<8xf32>
// CHECK-NEXT: tdx.exp %[[DOWN]]
// F64-LABEL: func.func @step
// F64: tdx.cast %arg0 : tensor<8x16xbf16> to tensor<8x16xf64>
// F64: tdx.all_reduce %{{.*}} {tdx.payload_bytes = 1024 : i64} : tensor<8x16xf64>
// F64: tdx.cast %arg2 : tensor<8xf32> to tensor<8xf64>
// REPORT:      all_reduce      tp            2      512             f32
// REPORT-NEXT: reduce_scatter  tp            2      512             f32
// REPORT-NEXT: all_gather      tp            2      256             bf16
// REPORT-NEXT: all_reduce      tp            2      32              f32
// BAD: error: tdx-widen-reductions: reduce-type 'bf16' is not a float type of 32 bits or more; give f32 or f64
module attributes {tdx.partitioned, tdx.reduce_type = f32} {
  tdx.mesh @mesh shape = [2] axes = ["tp"]
  func.func @step(%x: tensor<8x16xbf16>, %h: tensor<8x16xf16>, %f: tensor<8xf32>) -> (tensor<8x16xbf16>, tensor<4x16xf16>, tensor<16x16xbf16>, tensor<8xf32>) {
    %r = tdx.all_reduce %x on @mesh axes = ["tp"] reduce = sum {tdx.payload_bytes = 256 : i64} : tensor<8x16xbf16> -> tensor<8x16xbf16>
    %s = tdx.reduce_scatter %h on @mesh axes = ["tp"] reduce = sum dim = 0 {tdx.payload_bytes = 256 : i64} : tensor<8x16xf16> -> tensor<4x16xf16>
    %g = tdx.all_gather %x on @mesh axes = ["tp"] dim = 0 {tdx.payload_bytes = 256 : i64} : tensor<8x16xbf16> -> tensor<16x16xbf16>
    %a = tdx.all_reduce %f on @mesh axes = ["tp"] reduce = sum {tdx.payload_bytes = 32 : i64} : tensor<8xf32> -> tensor<8xf32>
    %e = tdx.exp %r : tensor<8x16xbf16>
    return %e, %s, %g, %a : tensor<8x16xbf16>, tensor<4x16xf16>, tensor<16x16xbf16>, tensor<8xf32>
  }
}

// -----

// Without a reduce type the pass does nothing.
// CHECK-LABEL: func.func @plain
// CHECK-NEXT: tdx.all_reduce %arg0 {{.*}}: tensor<8xbf16> -> tensor<8xbf16>
module attributes {tdx.partitioned} {
  tdx.mesh @mesh shape = [2] axes = ["tp"]
  func.func @plain(%x: tensor<8xbf16>) -> tensor<8xbf16> {
    %r = tdx.all_reduce %x on @mesh axes = ["tp"] reduce = sum : tensor<8xbf16> -> tensor<8xbf16>
    return %r : tensor<8xbf16>
  }
}
