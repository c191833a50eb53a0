// RUN: tdx-translate --tdx-to-cpp -split-input-file %s | FileCheck %s

// Two open chains over one shape that one op reads merge into one kernel
// that runs where that op stands. An AdamW update (the shape a captured
// torch.optim.AdamW step has) is then one pass over p, g, m, v: the
// moments and the step size come out of one launch, the 0-d bias
// correction is a kernel of its own that the big one reads.
module attributes {tdx.partitioned} {
  tdx.mesh @mesh shape = [1] axes = ["x"]
  func.func @forward(%p: tensor<4x8xf32>, %g: tensor<4x8xf32>, %m: tensor<4x8xf32>, %v: tensor<4x8xf32>, %step: tensor<f32>) -> (tensor<4x8xf32>, tensor<4x8xf32>, tensor<4x8xf32>) {
    %b1 = tdx.full 9.000000e-01 : tensor<f32>
    %c1 = tdx.full 1.000000e-01 : tensor<f32>
    %b2 = tdx.full 9.990000e-01 : tensor<f32>
    %c2 = tdx.full 1.000000e-03 : tensor<f32>
    %one = tdx.full 1.000000e+00 : tensor<f32>
    %eps = tdx.full 1.000000e-08 : tensor<f32>
    %0 = tdx.mul %m, %b1 : (tensor<4x8xf32>, tensor<f32>) -> tensor<4x8xf32>
    %1 = tdx.mul %g, %c1 : (tensor<4x8xf32>, tensor<f32>) -> tensor<4x8xf32>
    %m2 = tdx.add %0, %1 : (tensor<4x8xf32>, tensor<4x8xf32>) -> tensor<4x8xf32>
    %2 = tdx.mul %v, %b2 : (tensor<4x8xf32>, tensor<f32>) -> tensor<4x8xf32>
    %3 = tdx.mul %c2, %g : (tensor<f32>, tensor<4x8xf32>) -> tensor<4x8xf32>
    %4 = tdx.mul %3, %g : (tensor<4x8xf32>, tensor<4x8xf32>) -> tensor<4x8xf32>
    %v2 = tdx.add %2, %4 : (tensor<4x8xf32>, tensor<4x8xf32>) -> tensor<4x8xf32>
    %5 = tdx.pow %b1, %step : (tensor<f32>, tensor<f32>) -> tensor<f32>
    %6 = tdx.sub %one, %5 : (tensor<f32>, tensor<f32>) -> tensor<f32>
    %7 = tdx.sqrt %v2 : tensor<4x8xf32>
    %8 = tdx.add %7, %eps : (tensor<4x8xf32>, tensor<f32>) -> tensor<4x8xf32>
    %9 = tdx.div %m2, %8 : (tensor<4x8xf32>, tensor<4x8xf32>) -> tensor<4x8xf32>
    %10 = tdx.div %9, %6 : (tensor<4x8xf32>, tensor<f32>) -> tensor<4x8xf32>
    %p2 = tdx.sub %p, %10 : (tensor<4x8xf32>, tensor<4x8xf32>) -> tensor<4x8xf32>
    return %p2, %m2, %v2 : tensor<4x8xf32>, tensor<4x8xf32>, tensor<4x8xf32>
  }
}

// CHECK:       TDX_HD inline void [[BIG:k[0-9]+]](V a0, V a1, V a2, V a3, V a4, V &y0, V &y1, V &y2) {
// CHECK-NEXT:   V t0 = ::tdx::kern::mul(a0, V(9.00000000000000022e-01)); // tdx.mul
// CHECK-NEXT:   V t1 = ::tdx::kern::mul(a1, V(1.00000000000000006e-01)); // tdx.mul
// CHECK-NEXT:   V t2 = ::tdx::kern::add(t0, t1); // tdx.add
// CHECK-NEXT:   V t3 = ::tdx::kern::mul(a2, V(9.98999999999999999e-01)); // tdx.mul
// CHECK-NEXT:   V t4 = ::tdx::kern::mul(V(1.00000000000000002e-03), a1); // tdx.mul
// CHECK-NEXT:   V t5 = ::tdx::kern::mul(t4, a1); // tdx.mul
// CHECK-NEXT:   V t6 = ::tdx::kern::add(t3, t5); // tdx.add
// CHECK-NEXT:   V t7 = ::tdx::kern::sqrt(t6); // tdx.sqrt
// CHECK-NEXT:   V t8 = ::tdx::kern::add(t7, V(1.00000000000000002e-08)); // tdx.add
// CHECK-NEXT:   V t9 = ::tdx::kern::div(t2, t8); // tdx.div
// CHECK-NEXT:   V t10 = ::tdx::kern::div(t9, a3); // tdx.div
// CHECK-NEXT:   V t11 = ::tdx::kern::sub(a4, t10); // tdx.sub
// CHECK-NEXT:   y0 = t2;
// CHECK-NEXT:   y1 = t6;
// CHECK-NEXT:   y2 = t11;
// CHECK-NEXT: }
// CHECK-LABEL: forward(
// CHECK:       elementwise({}, {[[STEP:v[0-9]+]]}, {T::kFloat}, [[SCALAR:k[0-9]+]]_row);
// CHECK-NOT:   elementwise(
// CHECK:       elementwise({4, 8}, {[[M:v[0-9]+]], [[G:v[0-9]+]], [[V:v[0-9]+]], {{v[0-9]+}}, [[P:v[0-9]+]]}, {T::kFloat, T::kFloat, T::kFloat}, [[BIG]]_row);
// CHECK-NOT:   elementwise(
// CHECK:       return

// -----

// Chains merge only while the launch's operands (inputs and outputs) fit
// tdx::kern::kMaxOperands (16): two chains of 8 inputs each cannot merge,
// so the add that reads both joins the first and the second runs before it.
module attributes {tdx.partitioned} {
  tdx.mesh @mesh shape = [1] axes = ["x"]
  func.func @forward(%a0: tensor<8xf32>, %a1: tensor<8xf32>, %a2: tensor<8xf32>, %a3: tensor<8xf32>, %a4: tensor<8xf32>, %a5: tensor<8xf32>, %a6: tensor<8xf32>, %a7: tensor<8xf32>, %b0: tensor<8xf32>, %b1: tensor<8xf32>, %b2: tensor<8xf32>, %b3: tensor<8xf32>, %b4: tensor<8xf32>, %b5: tensor<8xf32>, %b6: tensor<8xf32>, %b7: tensor<8xf32>) -> tensor<8xf32> {
    %x1 = tdx.add %a0, %a1 : (tensor<8xf32>, tensor<8xf32>) -> tensor<8xf32>
    %x2 = tdx.add %x1, %a2 : (tensor<8xf32>, tensor<8xf32>) -> tensor<8xf32>
    %x3 = tdx.add %x2, %a3 : (tensor<8xf32>, tensor<8xf32>) -> tensor<8xf32>
    %x4 = tdx.add %x3, %a4 : (tensor<8xf32>, tensor<8xf32>) -> tensor<8xf32>
    %x5 = tdx.add %x4, %a5 : (tensor<8xf32>, tensor<8xf32>) -> tensor<8xf32>
    %x6 = tdx.add %x5, %a6 : (tensor<8xf32>, tensor<8xf32>) -> tensor<8xf32>
    %x7 = tdx.add %x6, %a7 : (tensor<8xf32>, tensor<8xf32>) -> tensor<8xf32>
    %y1 = tdx.mul %b0, %b1 : (tensor<8xf32>, tensor<8xf32>) -> tensor<8xf32>
    %y2 = tdx.mul %y1, %b2 : (tensor<8xf32>, tensor<8xf32>) -> tensor<8xf32>
    %y3 = tdx.mul %y2, %b3 : (tensor<8xf32>, tensor<8xf32>) -> tensor<8xf32>
    %y4 = tdx.mul %y3, %b4 : (tensor<8xf32>, tensor<8xf32>) -> tensor<8xf32>
    %y5 = tdx.mul %y4, %b5 : (tensor<8xf32>, tensor<8xf32>) -> tensor<8xf32>
    %y6 = tdx.mul %y5, %b6 : (tensor<8xf32>, tensor<8xf32>) -> tensor<8xf32>
    %y7 = tdx.mul %y6, %b7 : (tensor<8xf32>, tensor<8xf32>) -> tensor<8xf32>
    %z = tdx.sub %x7, %y7 : (tensor<8xf32>, tensor<8xf32>) -> tensor<8xf32>
    return %z : tensor<8xf32>
  }
}

// CHECK-LABEL: forward(
// CHECK:       elementwise({8}, {v8, v9, v10, v11, v12, v13, v14, v15}, {T::kFloat}, [[Y:k[0-9]+]]_row);
// CHECK:       elementwise({8}, {v0, v1, v2, v3, v4, v5, v6, v7, {{v[0-9]+}}}, {T::kFloat}, [[X:k[0-9]+]]_row);
