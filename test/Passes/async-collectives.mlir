// RUN: tdx-opt --tdx-async-collectives -split-input-file %s | FileCheck %s

// Each all_reduce, reduce_scatter and all_gather starts where it stands
// (tdx.start) and is waited for (tdx.wait on its token) right before the
// first op that reads its result; work in between overlaps it. An
// all_to_all runs where it stands. A collective nothing reads is waited for
// before the return.
// CHECK-LABEL: func.func @overlap
// CHECK-NEXT:    %[[T1:.*]] = tdx.start {
// CHECK-NEXT:      %[[R:.*]] = tdx.all_reduce %arg0
// CHECK-NEXT:      tdx.yield %[[R]] : tensor<8x4xf32>
// CHECK-NEXT:    }
// CHECK-NEXT:    %[[T2:.*]] = tdx.start {
// CHECK-NEXT:      tdx.reduce_scatter %arg1
// CHECK:         }
// CHECK-NEXT:    %[[A2A:.*]] = tdx.all_to_all %arg0
// CHECK-NEXT:    %[[E:.*]] = tdx.exp %[[A2A]]
// CHECK-NEXT:    %[[V:.*]] = tdx.reshape %[[E]]
// CHECK-NEXT:    %[[W1:.*]] = tdx.wait %[[T1]] : tensor<8x4xf32>
// CHECK-NEXT:    %[[S:.*]] = tdx.add %[[W1]], %[[V]]
// CHECK-NEXT:    %[[W2:.*]] = tdx.wait %[[T2]] : tensor<4x4xf32>
// CHECK-NEXT:    return %[[S]]
module attributes {tdx.partitioned} {
  tdx.mesh @mesh shape = [2] axes = ["dp"]
  func.func @overlap(%x: tensor<8x4xf32>, %g: tensor<8x4xf32>) -> tensor<8x4xf32> {
    %r = tdx.all_reduce %x on @mesh axes = ["dp"] reduce = sum : tensor<8x4xf32> -> tensor<8x4xf32>
    %rs = tdx.reduce_scatter %g on @mesh axes = ["dp"] reduce = sum dim = 0 : tensor<8x4xf32> -> tensor<4x4xf32>
    %a = tdx.all_to_all %x on @mesh axes = ["dp"] split = 0 concat = 1 : tensor<8x4xf32> -> tensor<4x8xf32>
    %e = tdx.exp %a : tensor<4x8xf32>
    %t = tdx.reshape %e [8, 4] : tensor<4x8xf32> -> tensor<8x4xf32>
    %s = tdx.add %r, %t : (tensor<8x4xf32>, tensor<8x4xf32>) -> tensor<8x4xf32>
    return %s : tensor<8x4xf32>
  }
}

// -----

// A kernel waits where it runs: the wait goes before the tdx.fused that
// reads the gathered value.
// CHECK-LABEL: func.func @kernel
// CHECK:         %[[T:.*]] = tdx.start {
// CHECK:           tdx.all_gather
// CHECK:         }
// CHECK-NEXT:    %[[G:.*]] = tdx.wait %[[T]] : tensor<8xf32>
// CHECK-NEXT:    tdx.fused(%[[G]])
module attributes {tdx.partitioned} {
  tdx.mesh @mesh shape = [2] axes = ["dp"]
  func.func @kernel(%x: tensor<4xf32>) -> tensor<8xf32> {
    %g = tdx.all_gather %x on @mesh axes = ["dp"] dim = 0 : tensor<4xf32> -> tensor<8xf32>
    %k = tdx.fused(%g) : (tensor<8xf32>) -> tensor<8xf32> {
    ^bb0(%a: tensor<8xf32>):
      %n = tdx.neg %a : tensor<8xf32>
      tdx.yield %n : tensor<8xf32>
    }
    return %k : tensor<8xf32>
  }
}
