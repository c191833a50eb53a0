// RUN: tdx-opt %s | tdx-opt | FileCheck %s
// RUN: tdx-opt %s -mlir-print-op-generic | tdx-opt | FileCheck %s

// torch.matmul shapes: 1-D promotion, batched, broadcast batch dims.
// CHECK-LABEL: func.func @matmul
func.func @matmul(%v: tensor<16xf32>, %m: tensor<8x16xf32>, %n: tensor<16x4xf32>,
                  %a: tensor<2x1x8x16xf32>, %b: tensor<3x16x4xf32>, %c: tensor<5x16xf32>) {
  // CHECK: tdx.matmul %{{.*}}, %{{.*}} : (tensor<16xf32>, tensor<16xf32>) -> tensor<f32>
  %0 = tdx.matmul %v, %v : (tensor<16xf32>, tensor<16xf32>) -> tensor<f32>
  // CHECK: tdx.matmul %{{.*}}, %{{.*}} : (tensor<8x16xf32>, tensor<16xf32>) -> tensor<8xf32>
  %1 = tdx.matmul %m, %v : (tensor<8x16xf32>, tensor<16xf32>) -> tensor<8xf32>
  // CHECK: tdx.matmul %{{.*}}, %{{.*}} : (tensor<16xf32>, tensor<16x4xf32>) -> tensor<4xf32>
  %2 = tdx.matmul %v, %n : (tensor<16xf32>, tensor<16x4xf32>) -> tensor<4xf32>
  // CHECK: tdx.matmul %{{.*}}, %{{.*}} : (tensor<8x16xf32>, tensor<16x4xf32>) -> tensor<8x4xf32>
  %3 = tdx.matmul %m, %n : (tensor<8x16xf32>, tensor<16x4xf32>) -> tensor<8x4xf32>
  // CHECK: tdx.matmul %{{.*}}, %{{.*}} : (tensor<2x1x8x16xf32>, tensor<3x16x4xf32>) -> tensor<2x3x8x4xf32>
  %4 = tdx.matmul %a, %b : (tensor<2x1x8x16xf32>, tensor<3x16x4xf32>) -> tensor<2x3x8x4xf32>
  // CHECK: tdx.matmul %{{.*}}, %{{.*}} : (tensor<3x16x4xf32>, tensor<4xf32>) -> tensor<3x16xf32>
  %w = tdx.full 1.0 : tensor<4xf32>
  %5 = tdx.matmul %b, %w : (tensor<3x16x4xf32>, tensor<4xf32>) -> tensor<3x16xf32>
  // CHECK: tdx.matmul %{{.*}}, %{{.*}} : (tensor<16xf32>, tensor<3x16x4xf32>) -> tensor<3x4xf32>
  %6 = tdx.matmul %v, %b : (tensor<16xf32>, tensor<3x16x4xf32>) -> tensor<3x4xf32>
  return
}

// CHECK-LABEL: func.func @linear
func.func @linear(%x: tensor<2x8x16xf32>, %w: tensor<32x16xf32>, %b: tensor<32xf32>,
                  %v: tensor<16xf32>, %s: tensor<f32>) {
  // CHECK: tdx.linear %{{.*}}, %{{.*}}, %{{.*}} : (tensor<2x8x16xf32>, tensor<32x16xf32>, tensor<32xf32>) -> tensor<2x8x32xf32>
  %0 = tdx.linear %x, %w, %b : (tensor<2x8x16xf32>, tensor<32x16xf32>, tensor<32xf32>) -> tensor<2x8x32xf32>
  // CHECK: tdx.linear %{{.*}}, %{{.*}} : (tensor<2x8x16xf32>, tensor<32x16xf32>) -> tensor<2x8x32xf32>
  %1 = tdx.linear %x, %w : (tensor<2x8x16xf32>, tensor<32x16xf32>) -> tensor<2x8x32xf32>
  // CHECK: tdx.linear %{{.*}}, %{{.*}} : (tensor<16xf32>, tensor<32x16xf32>) -> tensor<32xf32>
  %2 = tdx.linear %v, %w : (tensor<16xf32>, tensor<32x16xf32>) -> tensor<32xf32>
  // A 1-D weight gives one output feature that is then dropped, as in torch.
  // CHECK: tdx.linear %{{.*}}, %{{.*}}, %{{.*}} : (tensor<2x8x16xf32>, tensor<16xf32>, tensor<f32>) -> tensor<2x8xf32>
  %3 = tdx.linear %x, %v, %s : (tensor<2x8x16xf32>, tensor<16xf32>, tensor<f32>) -> tensor<2x8xf32>
  return
}

// Reductions with and without keepdim; negative dims; all dims.
// CHECK-LABEL: func.func @reductions
func.func @reductions(%x: tensor<2x8x16xf32>, %i: tensor<4x4xi64>) {
  // CHECK: tdx.sum %{{.*}} dims = [-1] : tensor<2x8x16xf32> -> tensor<2x8xf32>
  %0 = tdx.sum %x dims = [-1] : tensor<2x8x16xf32> -> tensor<2x8xf32>
  // CHECK: tdx.sum %{{.*}} dims = [-1] keepdim : tensor<2x8x16xf32> -> tensor<2x8x1xf32>
  %1 = tdx.sum %x dims = [-1] keepdim : tensor<2x8x16xf32> -> tensor<2x8x1xf32>
  // CHECK: tdx.mean %{{.*}} dims = [0, 2] : tensor<2x8x16xf32> -> tensor<8xf32>
  %2 = tdx.mean %x dims = [0, 2] : tensor<2x8x16xf32> -> tensor<8xf32>
  // CHECK: tdx.mean %{{.*}} dims = [0, 2] keepdim : tensor<2x8x16xf32> -> tensor<1x8x1xf32>
  %3 = tdx.mean %x dims = [0, 2] keepdim : tensor<2x8x16xf32> -> tensor<1x8x1xf32>
  // CHECK: tdx.max %{{.*}} : tensor<2x8x16xf32> -> tensor<f32>
  %4 = tdx.max %x : tensor<2x8x16xf32> -> tensor<f32>
  // CHECK: tdx.max %{{.*}} keepdim : tensor<2x8x16xf32> -> tensor<1x1x1xf32>
  %5 = tdx.max %x keepdim : tensor<2x8x16xf32> -> tensor<1x1x1xf32>
  // CHECK: tdx.sum %{{.*}} dims = [1] : tensor<4x4xi64> -> tensor<4xi64>
  %6 = tdx.sum %i dims = [1] : tensor<4x4xi64> -> tensor<4xi64>
  return
}

// CHECK-LABEL: func.func @softmax
func.func @softmax(%x: tensor<4x8xf32>) {
  // CHECK: tdx.softmax %{{.*}} dim = -1 : tensor<4x8xf32>
  %0 = tdx.softmax %x dim = -1 : tensor<4x8xf32>
  // CHECK: tdx.log_softmax %{{.*}} dim = 0 : tensor<4x8xf32>
  %1 = tdx.log_softmax %x dim = 0 : tensor<4x8xf32>
  return
}

// CHECK-LABEL: func.func @norms
func.func @norms(%x: tensor<2x8x16xf32>, %w: tensor<16xf32>, %b: tensor<16xf32>,
                 %w2: tensor<8x16xf32>) {
  // CHECK: tdx.layer_norm %{{.*}} weight %{{.*}} bias %{{.*}} normalized_shape = [16] eps = 1.000000e-05 : (tensor<2x8x16xf32>, tensor<16xf32>, tensor<16xf32>) -> tensor<2x8x16xf32>
  %0 = tdx.layer_norm %x weight %w bias %b normalized_shape = [16] eps = 1.0e-5
      : (tensor<2x8x16xf32>, tensor<16xf32>, tensor<16xf32>) -> tensor<2x8x16xf32>
  // CHECK: tdx.layer_norm %{{.*}} normalized_shape = [8, 16] eps = 1.000000e-05 : (tensor<2x8x16xf32>) -> tensor<2x8x16xf32>
  %1 = tdx.layer_norm %x normalized_shape = [8, 16] eps = 1.0e-5
      : (tensor<2x8x16xf32>) -> tensor<2x8x16xf32>
  // CHECK: tdx.layer_norm %{{.*}} weight %{{.*}} normalized_shape = [8, 16]
  %2 = tdx.layer_norm %x weight %w2 normalized_shape = [8, 16] eps = 1.0e-5
      : (tensor<2x8x16xf32>, tensor<8x16xf32>) -> tensor<2x8x16xf32>
  // CHECK: tdx.rms_norm %{{.*}} weight %{{.*}} normalized_shape = [16] eps = 9.9999999999999995E-7 : (tensor<2x8x16xf32>, tensor<16xf32>) -> tensor<2x8x16xf32>
  %3 = tdx.rms_norm %x weight %w normalized_shape = [16] eps = 1.0e-6
      : (tensor<2x8x16xf32>, tensor<16xf32>) -> tensor<2x8x16xf32>
  // CHECK: tdx.rms_norm %{{.*}} normalized_shape = [16]
  %4 = tdx.rms_norm %x normalized_shape = [16] eps = 1.0e-6
      : (tensor<2x8x16xf32>) -> tensor<2x8x16xf32>
  return
}

// CHECK-LABEL: func.func @embedding
func.func @embedding(%w: tensor<100x16xf32>, %ids: tensor<2x8xi64>, %one: tensor<i32>) {
  // CHECK: tdx.embedding %{{.*}}, %{{.*}} : (tensor<100x16xf32>, tensor<2x8xi64>) -> tensor<2x8x16xf32>
  %0 = tdx.embedding %w, %ids : (tensor<100x16xf32>, tensor<2x8xi64>) -> tensor<2x8x16xf32>
  // CHECK: tdx.embedding %{{.*}}, %{{.*}} padding_idx = 0 : (tensor<100x16xf32>, tensor<i32>) -> tensor<16xf32>
  %1 = tdx.embedding %w, %one padding_idx = 0 : (tensor<100x16xf32>, tensor<i32>) -> tensor<16xf32>
  return
}

// CHECK-LABEL: func.func @cross_entropy
func.func @cross_entropy(%logits: tensor<16x100xf32>, %labels: tensor<16xi64>,
                         %l3: tensor<2x100x8xf32>, %t3: tensor<2x8xi64>,
                         %probs: tensor<16x100xf32>) {
  // CHECK: tdx.cross_entropy %{{.*}}, %{{.*}} reduction = mean : (tensor<16x100xf32>, tensor<16xi64>) -> tensor<f32>
  %0 = tdx.cross_entropy %logits, %labels reduction = mean : (tensor<16x100xf32>, tensor<16xi64>) -> tensor<f32>
  // CHECK: tdx.cross_entropy %{{.*}}, %{{.*}} reduction = none {ignore_index = 0 : i64, label_smoothing = 1.000000e-01 : f64} : (tensor<2x100x8xf32>, tensor<2x8xi64>) -> tensor<2x8xf32>
  %1 = tdx.cross_entropy %l3, %t3 reduction = none {ignore_index = 0 : i64, label_smoothing = 0.1 : f64}
      : (tensor<2x100x8xf32>, tensor<2x8xi64>) -> tensor<2x8xf32>
  // CHECK: tdx.cross_entropy %{{.*}}, %{{.*}} reduction = sum : (tensor<16x100xf32>, tensor<16x100xf32>) -> tensor<f32>
  %2 = tdx.cross_entropy %logits, %probs reduction = sum : (tensor<16x100xf32>, tensor<16x100xf32>) -> tensor<f32>
  return
}

// Fused attention: grouped-query heads (2 kv heads for 4 query heads), a
// causal mask, an additive mask that broadcasts, a scale; its backward.
// CHECK-LABEL: func.func @sdpa
func.func @sdpa(%q: tensor<2x4x8x16xf32>, %k: tensor<2x2x8x16xf32>, %v: tensor<2x2x8x32xf32>, %m: tensor<8x8xf32>) {
  // CHECK: %{{.*}}, %{{.*}} = tdx.sdpa %{{.*}}, %{{.*}}, %{{.*}} causal : (tensor<2x4x8x16xf32>, tensor<2x2x8x16xf32>, tensor<2x2x8x32xf32>) -> (tensor<2x4x8x32xf32>, tensor<2x4x8xf32>)
  %o, %lse = tdx.sdpa %q, %k, %v causal : (tensor<2x4x8x16xf32>, tensor<2x2x8x16xf32>, tensor<2x2x8x32xf32>) -> (tensor<2x4x8x32xf32>, tensor<2x4x8xf32>)
  // CHECK: tdx.sdpa %{{.*}}, %{{.*}}, %{{.*}} mask %{{.*}} scale = 1.250000e-01
  %o2, %lse2 = tdx.sdpa %q, %k, %v mask %m scale = 0.125 : (tensor<2x4x8x16xf32>, tensor<2x2x8x16xf32>, tensor<2x2x8x32xf32>, tensor<8x8xf32>) -> (tensor<2x4x8x32xf32>, tensor<2x4x8xf32>)
  // CHECK: tdx.sdpa_backward {{.*}} causal : {{.*}} -> (tensor<2x4x8x16xf32>, tensor<2x2x8x16xf32>, tensor<2x2x8x32xf32>)
  %dq, %dk, %dv = tdx.sdpa_backward %o, %q, %k, %v, %o, %lse causal : (tensor<2x4x8x32xf32>, tensor<2x4x8x16xf32>, tensor<2x2x8x16xf32>, tensor<2x2x8x32xf32>, tensor<2x4x8x32xf32>, tensor<2x4x8xf32>) -> (tensor<2x4x8x16xf32>, tensor<2x2x8x16xf32>, tensor<2x2x8x32xf32>)
  return
}

// bf16 queries: the log-sum-exp stays f32, as torch's kernel keeps it.
// CHECK-LABEL: func.func @sdpa_bf16
func.func @sdpa_bf16(%q: tensor<2x4x8x16xbf16>) {
  // CHECK: tdx.sdpa {{.*}} -> (tensor<2x4x8x16xbf16>, tensor<2x4x8xf32>)
  %o, %lse = tdx.sdpa %q, %q, %q causal : (tensor<2x4x8x16xbf16>, tensor<2x4x8x16xbf16>, tensor<2x4x8x16xbf16>) -> (tensor<2x4x8x16xbf16>, tensor<2x4x8xf32>)
  return
}
