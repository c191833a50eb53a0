// RUN: tdx-opt %s | tdx-opt | FileCheck %s
// RUN: tdx-opt %s -mlir-print-op-generic | tdx-opt | FileCheck %s

// Binary ops broadcast like PyTorch; the result type is checked against the
// inferred one (elementwise-invalid.mlir shows the mismatches).
// CHECK-LABEL: func.func @binary
func.func @binary(%a: tensor<4x1xf32>, %b: tensor<8xf32>, %s: tensor<f32>,
                  %c: tensor<2x1x8xf32>, %d: tensor<3x1xf32>, %i: tensor<4xi64>) {
  // CHECK: tdx.add %{{.*}}, %{{.*}} : (tensor<4x1xf32>, tensor<8xf32>) -> tensor<4x8xf32>
  %0 = tdx.add %a, %b : (tensor<4x1xf32>, tensor<8xf32>) -> tensor<4x8xf32>
  // CHECK: tdx.sub %{{.*}}, %{{.*}} : (tensor<4x1xf32>, tensor<f32>) -> tensor<4x1xf32>
  %1 = tdx.sub %a, %s : (tensor<4x1xf32>, tensor<f32>) -> tensor<4x1xf32>
  // CHECK: tdx.mul %{{.*}}, %{{.*}} : (tensor<2x1x8xf32>, tensor<3x1xf32>) -> tensor<2x3x8xf32>
  %2 = tdx.mul %c, %d : (tensor<2x1x8xf32>, tensor<3x1xf32>) -> tensor<2x3x8xf32>
  // CHECK: tdx.div %{{.*}}, %{{.*}} : (tensor<f32>, tensor<f32>) -> tensor<f32>
  %3 = tdx.div %s, %s : (tensor<f32>, tensor<f32>) -> tensor<f32>
  // CHECK: tdx.pow %{{.*}}, %{{.*}} : (tensor<8xf32>, tensor<f32>) -> tensor<8xf32>
  %4 = tdx.pow %b, %s : (tensor<8xf32>, tensor<f32>) -> tensor<8xf32>
  // CHECK: tdx.maximum %{{.*}}, %{{.*}} : (tensor<4xi64>, tensor<4xi64>) -> tensor<4xi64>
  %5 = tdx.maximum %i, %i : (tensor<4xi64>, tensor<4xi64>) -> tensor<4xi64>
  // CHECK: tdx.minimum %{{.*}}, %{{.*}} : (tensor<8xf32>, tensor<4x1xf32>) -> tensor<4x8xf32>
  %6 = tdx.minimum %b, %a : (tensor<8xf32>, tensor<4x1xf32>) -> tensor<4x8xf32>
  return
}

// Dynamic dims broadcast against static ones.
// CHECK-LABEL: func.func @dynamic
func.func @dynamic(%a: tensor<?x8xf32>, %b: tensor<4x1xf32>) {
  // CHECK: tdx.add %{{.*}}, %{{.*}} : (tensor<?x8xf32>, tensor<4x1xf32>) -> tensor<4x8xf32>
  %0 = tdx.add %a, %b : (tensor<?x8xf32>, tensor<4x1xf32>) -> tensor<4x8xf32>
  return
}

// CHECK-LABEL: func.func @compare_where
func.func @compare_where(%a: tensor<4x4xi64>, %b: tensor<4xi64>, %x: tensor<4x4xf32>,
                         %y: tensor<f32>) {
  // CHECK: %[[M:.*]] = tdx.cmp lt, %{{.*}}, %{{.*}} : (tensor<4x4xi64>, tensor<4xi64>) -> tensor<4x4xi1>
  %m = tdx.cmp lt, %a, %b : (tensor<4x4xi64>, tensor<4xi64>) -> tensor<4x4xi1>
  // CHECK: tdx.cmp eq,
  %0 = tdx.cmp eq, %a, %a : (tensor<4x4xi64>, tensor<4x4xi64>) -> tensor<4x4xi1>
  // CHECK: tdx.cmp ne,
  %1 = tdx.cmp ne, %a, %a : (tensor<4x4xi64>, tensor<4x4xi64>) -> tensor<4x4xi1>
  // CHECK: tdx.cmp le,
  %2 = tdx.cmp le, %a, %a : (tensor<4x4xi64>, tensor<4x4xi64>) -> tensor<4x4xi1>
  // CHECK: tdx.cmp gt,
  %3 = tdx.cmp gt, %a, %a : (tensor<4x4xi64>, tensor<4x4xi64>) -> tensor<4x4xi1>
  // CHECK: tdx.cmp ge,
  %4 = tdx.cmp ge, %a, %a : (tensor<4x4xi64>, tensor<4x4xi64>) -> tensor<4x4xi1>
  // CHECK: tdx.where %[[M]], %{{.*}}, %{{.*}} : (tensor<4x4xi1>, tensor<4x4xf32>, tensor<f32>) -> tensor<4x4xf32>
  %5 = tdx.where %m, %x, %y : (tensor<4x4xi1>, tensor<4x4xf32>, tensor<f32>) -> tensor<4x4xf32>
  return
}

// CHECK-LABEL: func.func @unary
func.func @unary(%x: tensor<4x8xf32>, %i: tensor<3xi32>) {
  // CHECK: tdx.neg %{{.*}} : tensor<4x8xf32>
  %0 = tdx.neg %x : tensor<4x8xf32>
  // CHECK: tdx.neg %{{.*}} : tensor<3xi32>
  %1 = tdx.neg %i : tensor<3xi32>
  // CHECK: tdx.abs %{{.*}} : tensor<3xi32>
  %2 = tdx.abs %i : tensor<3xi32>
  // CHECK: tdx.relu %{{.*}} : tensor<4x8xf32>
  %3 = tdx.relu %x : tensor<4x8xf32>
  // CHECK: tdx.exp %{{.*}} : tensor<4x8xf32>
  %4 = tdx.exp %x : tensor<4x8xf32>
  // CHECK: tdx.log %{{.*}} : tensor<4x8xf32>
  %5 = tdx.log %x : tensor<4x8xf32>
  // CHECK: tdx.sqrt %{{.*}} : tensor<4x8xf32>
  %6 = tdx.sqrt %x : tensor<4x8xf32>
  // CHECK: tdx.rsqrt %{{.*}} : tensor<4x8xf32>
  %7 = tdx.rsqrt %x : tensor<4x8xf32>
  // CHECK: tdx.tanh %{{.*}} : tensor<4x8xf32>
  %8 = tdx.tanh %x : tensor<4x8xf32>
  // CHECK: tdx.sigmoid %{{.*}} : tensor<4x8xf32>
  %9 = tdx.sigmoid %x : tensor<4x8xf32>
  // CHECK: tdx.silu %{{.*}} : tensor<4x8xf32>
  %10 = tdx.silu %x : tensor<4x8xf32>
  // CHECK: tdx.sin %{{.*}} : tensor<4x8xf32>
  %11 = tdx.sin %x : tensor<4x8xf32>
  // CHECK: tdx.cos %{{.*}} : tensor<4x8xf32>
  %12 = tdx.cos %x : tensor<4x8xf32>
  // The default approximation is not printed.
  // CHECK: tdx.gelu %{{.*}} : tensor<4x8xf32>
  %13 = tdx.gelu %x : tensor<4x8xf32>
  // CHECK: tdx.gelu %{{.*}} approximate = tanh : tensor<4x8xf32>
  %14 = tdx.gelu %x approximate = tanh : tensor<4x8xf32>
  return
}

// CHECK-LABEL: func.func @cast
func.func @cast(%x: tensor<4x8xf32>) {
  // CHECK: tdx.cast %{{.*}} : tensor<4x8xf32> to tensor<4x8xbf16>
  %0 = tdx.cast %x : tensor<4x8xf32> to tensor<4x8xbf16>
  // CHECK: tdx.cast %{{.*}} : tensor<4x8xf32> to tensor<4x8xi64>
  %1 = tdx.cast %x : tensor<4x8xf32> to tensor<4x8xi64>
  return
}
