// RUN: tdx-opt %s -split-input-file --tdx-hoist-collectives | FileCheck %s

// A data-parallel step's gradient all_reduce starts where the gradient is
// made, not where the update reads it; the update's other reads stay.
// CHECK-LABEL: func.func @gradient
// CHECK:      %[[G:.*]] = tdx.matmul
// CHECK-NEXT: %[[R:.*]] = tdx.all_reduce %[[G]]
// CHECK-NEXT: %[[B:.*]] = tdx.exp
// CHECK-NEXT: tdx.mul %[[B]], %[[B]]
// CHECK-NEXT: tdx.sub %{{.*}}, %[[R]]
module attributes {tdx.partitioned} {
  tdx.mesh @mesh shape = [2] axes = ["dp"]
  func.func @gradient(%x: tensor<8x4xf32>, %dy: tensor<4x8xf32>, %w: tensor<8x8xf32>) -> tensor<8x8xf32> {
    %g = tdx.matmul %x, %dy : (tensor<8x4xf32>, tensor<4x8xf32>) -> tensor<8x8xf32>
    %b = tdx.exp %w : tensor<8x8xf32>
    %c = tdx.mul %b, %b : (tensor<8x8xf32>, tensor<8x8xf32>) -> tensor<8x8xf32>
    %r = tdx.all_reduce %g on @mesh axes = ["dp"] reduce = sum : tensor<8x8xf32> -> tensor<8x8xf32>
    %u = tdx.sub %c, %r : (tensor<8x8xf32>, tensor<8x8xf32>) -> tensor<8x8xf32>
    return %u : tensor<8x8xf32>
  }
}

// -----

// Reductions of arguments start at the top, in their order; two of one
// input keep theirs; a reduce_scatter moves like an all_reduce.
// CHECK-LABEL: func.func @order
// CHECK-NEXT: tdx.all_reduce %arg0 {{.*}}reduce = sum
// CHECK-NEXT: tdx.all_reduce %arg1
// CHECK-NEXT: tdx.all_reduce %arg0 {{.*}}reduce = max
// CHECK-NEXT: %[[E:.*]] = tdx.exp %arg0
// CHECK-NEXT: tdx.reduce_scatter %[[E]] {{.*}}reduce = sum
// CHECK-NEXT: tdx.all_reduce %[[E]] {{.*}}reduce = max
// CHECK-NEXT: tdx.add
module attributes {tdx.partitioned} {
  tdx.mesh @mesh shape = [2] axes = ["dp"]
  func.func @order(%a: tensor<8xf32>, %b: tensor<8xf32>) -> (tensor<8xf32>, tensor<8xf32>, tensor<4xf32>, tensor<8xf32>, tensor<8xf32>) {
    %e = tdx.exp %a : tensor<8xf32>
    %0 = tdx.add %e, %e : (tensor<8xf32>, tensor<8xf32>) -> tensor<8xf32>
    %1 = tdx.all_reduce %a on @mesh axes = ["dp"] reduce = sum : tensor<8xf32> -> tensor<8xf32>
    %2 = tdx.reduce_scatter %e on @mesh axes = ["dp"] reduce = sum dim = 0 : tensor<8xf32> -> tensor<4xf32>
    %3 = tdx.all_reduce %b on @mesh axes = ["dp"] reduce = sum : tensor<8xf32> -> tensor<8xf32>
    %4 = tdx.all_reduce %e on @mesh axes = ["dp"] reduce = max : tensor<8xf32> -> tensor<8xf32>
    %5 = tdx.all_reduce %a on @mesh axes = ["dp"] reduce = max : tensor<8xf32> -> tensor<8xf32>
    return %0, %1, %2, %3, %4 : tensor<8xf32>, tensor<8xf32>, tensor<4xf32>, tensor<8xf32>, tensor<8xf32>
  }
}

// -----

// The reshape that only shapes a bias gradient for its all_reduce moves up
// with it; a reshape something else reads stays.
// CHECK-LABEL: func.func @views
// CHECK-NEXT: %[[S:.*]] = tdx.sum
// CHECK-NEXT: %[[V:.*]] = tdx.reshape %[[S]]
// CHECK-NEXT: tdx.all_reduce %[[V]]
// CHECK-NEXT: tdx.exp
// CHECK-NEXT: %[[K:.*]] = tdx.reshape %[[S]]
// CHECK-NEXT: tdx.all_reduce %[[K]]
module attributes {tdx.partitioned} {
  tdx.mesh @mesh shape = [2] axes = ["dp"]
  func.func @views(%dy: tensor<4x8xf32>) -> (tensor<8xf32>, tensor<8xf32>, tensor<8xf32>, tensor<8xf32>) {
    %s = tdx.sum %dy dims = [0] keepdim : tensor<4x8xf32> -> tensor<1x8xf32>
    %e = tdx.exp %dy : tensor<4x8xf32>
    %v = tdx.reshape %s [8] : tensor<1x8xf32> -> tensor<8xf32>
    %r = tdx.all_reduce %v on @mesh axes = ["dp"] reduce = sum : tensor<8xf32> -> tensor<8xf32>
    %k = tdx.reshape %s [8] : tensor<1x8xf32> -> tensor<8xf32>
    %q = tdx.all_reduce %k on @mesh axes = ["dp"] reduce = max : tensor<8xf32> -> tensor<8xf32>
    return %r, %k, %q, %r : tensor<8xf32>, tensor<8xf32>, tensor<8xf32>, tensor<8xf32>
  }
}
