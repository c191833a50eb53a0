// RUN: tdx-opt --tdx-async-collectives --tdx-overlap-dispatch -split-input-file %s | FileCheck %s

// The combine's rows are in flight while the work that does not need them
// runs (a shared expert reading the block's input): it moves before the
// wait, in its order; what reads the rows (and what reads that) stays
// after it. The scan stops at the next collective: the op after it stays.
// CHECK-LABEL: func.func @shared_expert
// CHECK:         %[[T:.*]] = tdx.start {
// CHECK-NEXT:      tdx.ragged_all_to_all
// CHECK:         }
// CHECK-NEXT:    %[[H:.*]] = tdx.matmul %arg1, %arg2
// CHECK-NEXT:    %[[G:.*]] = tdx.exp %[[H]]
// CHECK-NEXT:    %[[R:.*]] = tdx.wait %[[T]] : tensor<8x4xf32>
// CHECK-NEXT:    %[[S:.*]] = tdx.exp %[[R]]
// CHECK-NEXT:    %[[A:.*]] = tdx.add %[[S]], %[[G]]
// CHECK-NEXT:    %[[T2:.*]] = tdx.start {
// CHECK-NEXT:      tdx.all_reduce %[[A]]
// CHECK:         }
// CHECK-NEXT:    %[[L:.*]] = tdx.exp %arg1
// CHECK-NEXT:    %[[W:.*]] = tdx.wait %[[T2]]
module attributes {tdx.partitioned} {
  tdx.mesh @mesh shape = [2] axes = ["ep"]
  func.func @shared_expert(%x: tensor<8x4xf32>, %h: tensor<8x4xf32>, %w: tensor<4x4xf32>,
                           %off: tensor<2xi64>, %n: tensor<2xi64>) -> (tensor<8x4xf32>, tensor<8x4xf32>) {
    %r = tdx.ragged_all_to_all %x, %off, %n, %off, %n on @mesh axes = ["ep"] : tensor<8x4xf32>, tensor<2xi64> -> tensor<8x4xf32>
    %s = tdx.exp %r : tensor<8x4xf32>
    %m = tdx.matmul %h, %w : (tensor<8x4xf32>, tensor<4x4xf32>) -> tensor<8x4xf32>
    %g = tdx.exp %m : tensor<8x4xf32>
    %a = tdx.add %s, %g : (tensor<8x4xf32>, tensor<8x4xf32>) -> tensor<8x4xf32>
    %sum = tdx.all_reduce %a on @mesh axes = ["ep"] reduce = sum : tensor<8x4xf32> -> tensor<8x4xf32>
    %late = tdx.exp %h : tensor<8x4xf32>
    return %sum, %late : tensor<8x4xf32>, tensor<8x4xf32>
  }
}

// -----

// A random generic op stays in its place (torch's generator draws in
// program order), and so does what follows it.
// CHECK-LABEL: func.func @others
// CHECK:         %[[R:.*]] = tdx.wait
// CHECK-NEXT:    tdx.exp %[[R]]
// CHECK-NEXT:    tdx.aten "aten::rand_like"
// CHECK-NEXT:    tdx.exp %arg0
module attributes {tdx.partitioned} {
  tdx.mesh @mesh shape = [2] axes = ["ep"]
  func.func @others(%x: tensor<8x4xf32>, %off: tensor<2xi64>, %n: tensor<2xi64>) -> (tensor<8x4xf32>, tensor<8x4xf32>, tensor<8x4xf32>) {
    %r = tdx.ragged_all_to_all %x, %off, %n, %off, %n on @mesh axes = ["ep"] : tensor<8x4xf32>, tensor<2xi64> -> tensor<8x4xf32>
    %s = tdx.exp %r : tensor<8x4xf32>
    %u = tdx.aten "aten::rand_like"(%x) : (tensor<8x4xf32>) -> tensor<8x4xf32>
    %e = tdx.exp %x : tensor<8x4xf32>
    return %s, %u, %e : tensor<8x4xf32>, tensor<8x4xf32>, tensor<8x4xf32>
  }
}
