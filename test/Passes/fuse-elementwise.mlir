// RUN: tdx-opt --tdx-fuse-elementwise -split-input-file %s | FileCheck %s

// A chain over one shape becomes one tdx.fused where its last op stood;
// the splat constant only the kernel reads becomes a literal inside it, the
// sum between the chain's ops stays before the kernel, and an elementwise
// op nothing reads is erased.
// CHECK-LABEL: func.func @chain
// CHECK-NEXT:    %[[S:.*]] = tdx.sum
// CHECK-NEXT:    %[[K:.*]] = tdx.fused(%arg0, %arg1) : (tensor<4x8xf32>, tensor<4x8xf32>) -> tensor<4x8xf32> {
// CHECK-NEXT:    ^bb0(%[[X:.*]]: tensor<4x8xf32>, %[[Y:.*]]: tensor<4x8xf32>):
// CHECK-NEXT:      %[[TWO:.*]] = tdx.full 2.000000e+00 : tensor<f32>
// CHECK-NEXT:      %[[A:.*]] = tdx.mul %[[X]], %[[TWO]]
// CHECK-NEXT:      %[[B:.*]] = tdx.add %[[A]], %[[Y]]
// CHECK-NEXT:      %[[C:.*]] = tdx.relu %[[B]]
// CHECK-NEXT:      tdx.yield %[[C]] : tensor<4x8xf32>
// CHECK-NEXT:    }
// CHECK-NEXT:    return %[[K]], %[[S]]
module attributes {tdx.partitioned} {
  func.func @chain(%x: tensor<4x8xf32>, %y: tensor<4x8xf32>) -> (tensor<4x8xf32>, tensor<8xf32>) {
    %two = tdx.full 2.0 : tensor<f32>
    %a = tdx.mul %x, %two : (tensor<4x8xf32>, tensor<f32>) -> tensor<4x8xf32>
    %b = tdx.add %a, %y : (tensor<4x8xf32>, tensor<4x8xf32>) -> tensor<4x8xf32>
    %s = tdx.sum %x dims = [0] : tensor<4x8xf32> -> tensor<8xf32>
    %c = tdx.relu %b : tensor<4x8xf32>
    %dead = tdx.exp %x : tensor<4x8xf32>
    return %c, %s : tensor<4x8xf32>, tensor<8xf32>
  }
}

// -----

// A kernel closes where something else reads its value: the matmul reads
// the first kernel's result, which it yields, and the exp after it starts
// a second kernel.
// CHECK-LABEL: func.func @closed
// CHECK:         %[[K1:.*]] = tdx.fused(%arg0) {{.*}} {
// CHECK:           tdx.neg
// CHECK:         }
// CHECK-NEXT:    %[[M:.*]] = tdx.matmul %[[K1]], %arg1
// CHECK-NEXT:    %[[K2:.*]]:2 = tdx.fused(%[[K1]], %[[M]]) {{.*}} {
// CHECK:           tdx.exp
// CHECK:           tdx.add
// CHECK:           tdx.yield
// CHECK:         }
// CHECK-NEXT:    return %[[K2]]#1, %[[K2]]#0
module attributes {tdx.partitioned} {
  func.func @closed(%x: tensor<4x4xf32>, %w: tensor<4x4xf32>) -> (tensor<4x4xf32>, tensor<4x4xf32>) {
    %n = tdx.neg %x : tensor<4x4xf32>
    %m = tdx.matmul %n, %w : (tensor<4x4xf32>, tensor<4x4xf32>) -> tensor<4x4xf32>
    %e = tdx.exp %n : tensor<4x4xf32>
    %s = tdx.add %e, %m : (tensor<4x4xf32>, tensor<4x4xf32>) -> tensor<4x4xf32>
    return %s, %e : tensor<4x4xf32>, tensor<4x4xf32>
  }
}

// -----

// Bias and activation: a linear read by kernels only leaves its bias to
// them; each adds it first. A row op over the last dim ends the kernel
// that makes its input (the residual add before a layer norm).
// CHECK-LABEL: func.func @epilogue
// CHECK-NEXT:    %[[Y:.*]] = tdx.linear %arg0, %arg1 : (tensor<4x8xf32>, tensor<16x8xf32>) -> tensor<4x16xf32>
// CHECK-NEXT:    %[[K:.*]] = tdx.fused(%[[Y]], %arg2, %arg3, %arg4, %arg5) {{.*}} {
// CHECK-NEXT:    ^bb0(%[[A:.*]]: tensor<4x16xf32>, %[[B:.*]]: tensor<16xf32>, %[[R:.*]]: tensor<4x16xf32>, %[[W:.*]]: tensor<16xf32>, %[[NB:.*]]: tensor<16xf32>):
// CHECK-NEXT:      %[[YB:.*]] = tdx.add %[[A]], %[[B]] : (tensor<4x16xf32>, tensor<16xf32>) -> tensor<4x16xf32>
// CHECK-NEXT:      %[[G:.*]] = tdx.gelu %[[YB]]
// CHECK-NEXT:      %[[S:.*]] = tdx.add %[[G]], %[[R]]
// CHECK-NEXT:      %[[N:.*]] = tdx.layer_norm %[[S]] weight %[[W]] bias %[[NB]]
// CHECK-NEXT:      tdx.yield %[[N]]
module attributes {tdx.partitioned} {
  func.func @epilogue(%x: tensor<4x8xf32>, %w: tensor<16x8xf32>, %b: tensor<16xf32>, %res: tensor<4x16xf32>, %lw: tensor<16xf32>, %lb: tensor<16xf32>) -> tensor<4x16xf32> {
    %y = tdx.linear %x, %w, %b : (tensor<4x8xf32>, tensor<16x8xf32>, tensor<16xf32>) -> tensor<4x16xf32>
    %g = tdx.gelu %y approximate = tanh : tensor<4x16xf32>
    %s = tdx.add %g, %res : (tensor<4x16xf32>, tensor<4x16xf32>) -> tensor<4x16xf32>
    %n = tdx.layer_norm %s weight %lw bias %lb normalized_shape = [16] eps = 1.0e-05 : (tensor<4x16xf32>, tensor<16xf32>, tensor<16xf32>) -> tensor<4x16xf32>
    return %n : tensor<4x16xf32>
  }
}

// -----

// Integer division follows torch's type promotion, not C's: it stays an op
// of its own, and so does an elementwise op on a type without a C type.
// CHECK-LABEL: func.func @unfusable
// CHECK-NOT:     tdx.fused
// CHECK:         tdx.div
// CHECK:         tdx.add
// CHECK-NOT:     tdx.fused
module attributes {tdx.partitioned} {
  func.func @unfusable(%x: tensor<4xi64>, %y: tensor<4xi64>, %h: tensor<4xf16>) -> (tensor<4xi64>, tensor<4xf16>) {
    %d = tdx.div %x, %y : (tensor<4xi64>, tensor<4xi64>) -> tensor<4xi64>
    %a = tdx.add %h, %h : (tensor<4xf16>, tensor<4xf16>) -> tensor<4xf16>
    return %d, %a : tensor<4xi64>, tensor<4xf16>
  }
}
