// RUN: tdx-opt %s | tdx-opt | FileCheck %s
// RUN: tdx-opt %s -mlir-print-op-generic | tdx-opt | FileCheck %s

// CHECK-LABEL: func.func @creation
func.func @creation() {
  // CHECK: tdx.empty : tensor<4x?xbf16>
  %0 = tdx.empty : tensor<4x?xbf16>
  // CHECK: tdx.full 0.000000e+00 : tensor<4x4xf32>
  %1 = tdx.full 0.0 : tensor<4x4xf32>
  // CHECK: tdx.full 1.000000e+00 : tensor<8xi64>
  %2 = tdx.full 1.0 : tensor<8xi64>
  // CHECK: tdx.full 1.000000e+00 : tensor<2x2xi1>
  %3 = tdx.full 1.0 : tensor<2x2xi1>
  // CHECK: tdx.full -1.000000e+09 : tensor<f32>
  %4 = tdx.full -1.0e9 : tensor<f32>
  return
}

// torch.arange(start, end, step) has ceil((end - start) / step) elements.
// CHECK-LABEL: func.func @arange
func.func @arange() {
  // CHECK: tdx.arange start 0.000000e+00 end 8.000000e+00 step 1.000000e+00 : tensor<8xi64>
  %0 = tdx.arange start 0.0 end 8.0 step 1.0 : tensor<8xi64>
  // CHECK: tdx.arange start 0.000000e+00 end 1.000000e+00 step 3.000000e-01 : tensor<4xf32>
  %1 = tdx.arange start 0.0 end 1.0 step 0.3 : tensor<4xf32>
  // CHECK: tdx.arange start 1.000000e+01 end 0.000000e+00 step -3.000000e+00 : tensor<4xi32>
  %2 = tdx.arange start 10.0 end 0.0 step -3.0 : tensor<4xi32>
  // CHECK: tdx.arange start 0.000000e+00 end 0.000000e+00 step 1.000000e+00 : tensor<0xi64>
  %3 = tdx.arange start 0.0 end 0.0 step 1.0 : tensor<0xi64>
  return
}

// CHECK-LABEL: func.func @random
func.func @random() {
  // CHECK: tdx.uniform(-2.500000e-01, 2.500000e-01) seed(0, 1) : tensor<16x16xf32>
  %0 = tdx.uniform(-0.25, 0.25) seed(0, 1) : tensor<16x16xf32>
  // CHECK: tdx.normal(0.000000e+00, 2.000000e-02) seed(42, 2) : tensor<100x16xbf16>
  %1 = tdx.normal(0.0, 0.02) seed(42, 2) : tensor<100x16xbf16>
  // CHECK: tdx.trunc_normal(0.000000e+00, 2.000000e-02, -4.000000e-02, 4.000000e-02) seed(-1, 3) : tensor<16xf64>
  %2 = tdx.trunc_normal(0.0, 0.02, -0.04, 0.04) seed(-1, 3) : tensor<16xf64>
  // A zero std is a constant, as in torch.
  // CHECK: tdx.normal(1.000000e+00, 0.000000e+00) seed(0, 4) : tensor<2xf32>
  %3 = tdx.normal(1.0, 0.0) seed(0, 4) : tensor<2xf32>
  // CHECK: tdx.bernoulli(9.000000e-01) seed(0, 5) : tensor<4x8xf32>
  %4 = tdx.bernoulli(0.9) seed(0, 5) : tensor<4x8xf32>
  // A partitioned draw keeps its global shape.
  // CHECK: tdx.bernoulli(5.000000e-01) seed(0, 6) {global_shape = array<i64: 7, 8>} : tensor<?x8xf32>
  %5 = tdx.bernoulli(0.5) seed(0, 6) {global_shape = array<i64: 7, 8>} : tensor<?x8xf32>
  return
}
