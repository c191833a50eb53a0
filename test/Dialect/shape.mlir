// RUN: tdx-opt %s | tdx-opt | FileCheck %s
// RUN: tdx-opt %s -mlir-print-op-generic | tdx-opt | FileCheck %s

// CHECK-LABEL: func.func @reshape
func.func @reshape(%x: tensor<2x8xf32>, %d: tensor<?x8xf32>) {
  // A -1 is inferred from the element count.
  // CHECK: tdx.reshape %{{.*}} [-1, 4] : tensor<2x8xf32> -> tensor<4x4xf32>
  %0 = tdx.reshape %x [-1, 4] : tensor<2x8xf32> -> tensor<4x4xf32>
  // CHECK: tdx.reshape %{{.*}} [2, -1, 2] : tensor<2x8xf32> -> tensor<2x4x2xf32>
  %1 = tdx.reshape %x [2, -1, 2] : tensor<2x8xf32> -> tensor<2x4x2xf32>
  // CHECK: tdx.reshape %{{.*}} [16] : tensor<2x8xf32> -> tensor<16xf32>
  %2 = tdx.reshape %x [16] : tensor<2x8xf32> -> tensor<16xf32>
  // With a dynamic input the -1 stays dynamic.
  // CHECK: tdx.reshape %{{.*}} [-1, 2, 4] : tensor<?x8xf32> -> tensor<?x2x4xf32>
  %3 = tdx.reshape %d [-1, 2, 4] : tensor<?x8xf32> -> tensor<?x2x4xf32>
  // CHECK: tdx.reshape %{{.*}} [] : tensor<1x1xf32> -> tensor<f32>
  %s = tdx.full 1.0 : tensor<1x1xf32>
  %4 = tdx.reshape %s [] : tensor<1x1xf32> -> tensor<f32>
  return
}

// CHECK-LABEL: func.func @transpose_permute
func.func @transpose_permute(%x: tensor<2x8x4x16xf32>) {
  // CHECK: tdx.transpose %{{.*}} 1, 2 : tensor<2x8x4x16xf32> -> tensor<2x4x8x16xf32>
  %0 = tdx.transpose %x 1, 2 : tensor<2x8x4x16xf32> -> tensor<2x4x8x16xf32>
  // CHECK: tdx.transpose %{{.*}} -2, -1 : tensor<2x8x4x16xf32> -> tensor<2x8x16x4xf32>
  %1 = tdx.transpose %x -2, -1 : tensor<2x8x4x16xf32> -> tensor<2x8x16x4xf32>
  // CHECK: tdx.permute %{{.*}} [0, 2, 1, 3] : tensor<2x8x4x16xf32> -> tensor<2x4x8x16xf32>
  %2 = tdx.permute %x [0, 2, 1, 3] : tensor<2x8x4x16xf32> -> tensor<2x4x8x16xf32>
  // CHECK: tdx.permute %{{.*}} [-1, 0, 1, 2] : tensor<2x8x4x16xf32> -> tensor<16x2x8x4xf32>
  %3 = tdx.permute %x [-1, 0, 1, 2] : tensor<2x8x4x16xf32> -> tensor<16x2x8x4xf32>
  return
}

// Python slice semantics: negative and out-of-range bounds clamp.
// CHECK-LABEL: func.func @slice
func.func @slice(%x: tensor<4x16xf32>) {
  // CHECK: tdx.slice %{{.*}} dim 1 [0 : 8 : 2] : tensor<4x16xf32> -> tensor<4x4xf32>
  %0 = tdx.slice %x dim 1 [0 : 8 : 2] : tensor<4x16xf32> -> tensor<4x4xf32>
  // CHECK: tdx.slice %{{.*}} dim -1 [-4 : 9223372036854775807 : 1] : tensor<4x16xf32> -> tensor<4x4xf32>
  %1 = tdx.slice %x dim -1 [-4 : 9223372036854775807 : 1] : tensor<4x16xf32> -> tensor<4x4xf32>
  // CHECK: tdx.slice %{{.*}} dim 0 [1 : 4 : 2] : tensor<4x16xf32> -> tensor<2x16xf32>
  %2 = tdx.slice %x dim 0 [1 : 4 : 2] : tensor<4x16xf32> -> tensor<2x16xf32>
  // CHECK: tdx.slice %{{.*}} dim 0 [3 : 1 : 1] : tensor<4x16xf32> -> tensor<0x16xf32>
  %3 = tdx.slice %x dim 0 [3 : 1 : 1] : tensor<4x16xf32> -> tensor<0x16xf32>
  return
}

// CHECK-LABEL: func.func @concat
func.func @concat(%a: tensor<2x4xf32>, %b: tensor<3x4xf32>, %c: tensor<?x4xf32>) {
  // CHECK: tdx.concat %{{.*}}, %{{.*}} dim 0 : (tensor<2x4xf32>, tensor<3x4xf32>) -> tensor<5x4xf32>
  %0 = tdx.concat %a, %b dim 0 : (tensor<2x4xf32>, tensor<3x4xf32>) -> tensor<5x4xf32>
  // CHECK: tdx.concat %{{.*}}, %{{.*}} dim -1 : (tensor<2x4xf32>, tensor<2x4xf32>) -> tensor<2x8xf32>
  %1 = tdx.concat %a, %a dim -1 : (tensor<2x4xf32>, tensor<2x4xf32>) -> tensor<2x8xf32>
  // CHECK: tdx.concat %{{.*}}, %{{.*}} dim 0 : (tensor<2x4xf32>, tensor<?x4xf32>) -> tensor<?x4xf32>
  %2 = tdx.concat %a, %c dim 0 : (tensor<2x4xf32>, tensor<?x4xf32>) -> tensor<?x4xf32>
  return
}

// CHECK-LABEL: func.func @expand
func.func @expand(%x: tensor<3x1xf32>) {
  // CHECK: tdx.expand %{{.*}} [4, -1, 8] : tensor<3x1xf32> -> tensor<4x3x8xf32>
  %0 = tdx.expand %x [4, -1, 8] : tensor<3x1xf32> -> tensor<4x3x8xf32>
  // CHECK: tdx.expand %{{.*}} [3, 1] : tensor<3x1xf32> -> tensor<3x1xf32>
  %1 = tdx.expand %x [3, 1] : tensor<3x1xf32> -> tensor<3x1xf32>
  return
}

// A huge step takes one element without overflowing.
// CHECK-LABEL: func.func @slice_huge_step
func.func @slice_huge_step(%x: tensor<4x16xf32>) {
  // CHECK: tdx.slice %{{.*}} dim 1 [2 : 16 : 9223372036854775807] : tensor<4x16xf32> -> tensor<4x1xf32>
  %0 = tdx.slice %x dim 1 [2 : 16 : 9223372036854775807] : tensor<4x16xf32> -> tensor<4x1xf32>
  return
}
