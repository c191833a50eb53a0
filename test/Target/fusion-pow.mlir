// RUN: tdx-translate --tdx-to-cpp %s | FileCheck %s

// x ** c for a constant c is written as ATen computes torch.pow(Tensor,
// Scalar) on floats: the same numbers as eager, and no exp/log per element
// for the squares autograd writes. Other exponents call pow.
// CHECK-LABEL: TDX_HD inline void k0(
// CHECK-NEXT:   V t0 = a0 * a0; // tdx.pow
// CHECK-NEXT:   V t1 = t0; // tdx.pow
// CHECK-NEXT:   V t2 = ::tdx::kern::sqrt(t1); // tdx.pow
// CHECK-NEXT:   V t3 = ::tdx::kern::rsqrt(t2); // tdx.pow
// CHECK-NEXT:   V t4 = V(1) / t3; // tdx.pow
// CHECK-NEXT:   V t5 = V(1) / (t4 * t4); // tdx.pow
// CHECK-NEXT:   V t6 = t5 * t5 * t5; // tdx.pow
// CHECK-NEXT:   V t7 = V(1); // tdx.pow
// CHECK-NEXT:   V t8 = ::tdx::kern::pow(t6, V(2.50000000000000000e+00)); // tdx.pow
// CHECK-NEXT:   V t9 = ::tdx::kern::add(t7, t8); // tdx.add
module attributes {tdx.partitioned} {
  func.func @forward(%x: tensor<4x8xf32>) -> tensor<4x8xf32> {
    %c2 = tdx.full 2.0 : tensor<f32>
    %c1 = tdx.full 1.0 : tensor<f32>
    %ch = tdx.full 0.5 : tensor<f32>
    %cmh = tdx.full -0.5 : tensor<f32>
    %cm1 = tdx.full -1.0 : tensor<f32>
    %cm2 = tdx.full -2.0 : tensor<f32>
    %c3 = tdx.full 3.0 : tensor<f32>
    %c0 = tdx.full 0.0 : tensor<f32>
    %c25 = tdx.full 2.5 : tensor<f32>
    %a = tdx.pow %x, %c2 : (tensor<4x8xf32>, tensor<f32>) -> tensor<4x8xf32>
    %b = tdx.pow %a, %c1 : (tensor<4x8xf32>, tensor<f32>) -> tensor<4x8xf32>
    %c = tdx.pow %b, %ch : (tensor<4x8xf32>, tensor<f32>) -> tensor<4x8xf32>
    %d = tdx.pow %c, %cmh : (tensor<4x8xf32>, tensor<f32>) -> tensor<4x8xf32>
    %e = tdx.pow %d, %cm1 : (tensor<4x8xf32>, tensor<f32>) -> tensor<4x8xf32>
    %f = tdx.pow %e, %cm2 : (tensor<4x8xf32>, tensor<f32>) -> tensor<4x8xf32>
    %g = tdx.pow %f, %c3 : (tensor<4x8xf32>, tensor<f32>) -> tensor<4x8xf32>
    %h = tdx.pow %g, %c0 : (tensor<4x8xf32>, tensor<f32>) -> tensor<4x8xf32>
    %i = tdx.pow %g, %c25 : (tensor<4x8xf32>, tensor<f32>) -> tensor<4x8xf32>
    %r = tdx.add %h, %i : (tensor<4x8xf32>, tensor<4x8xf32>) -> tensor<4x8xf32>
    return %r : tensor<4x8xf32>
  }
}
