// RUN: tdx-translate --tdx-to-cpp %s | FileCheck %s

// Every tensor the step makes is dropped where its last reader stands, so
// its buffer is free for what comes next instead of living until the step
// returns: a view keeps its base's storage alive through ATen's reference
// count, an unread result is dropped where it is made, a fused kernel
// reads where its last member stands. Arguments, state writes and returned
// values live on.
module attributes {tdx.partitioned} {
  tdx.mesh @mesh shape = [1] axes = ["x"]
  tdx.parameter @w : tensor<8x8xf32> init {
    %0 = tdx.normal(0.0, 0.02) seed(0, 1) : tensor<8x8xf32>
    tdx.yield %0 : tensor<8x8xf32>
  }
  func.func @train_step(%x: tensor<4x8xf32>) -> (tensor<4x8xf32>, tensor<f32>) {
    %w = tdx.param_ref @w : tensor<8x8xf32>
    %y = tdx.matmul %x, %w : (tensor<4x8xf32>, tensor<8x8xf32>) -> tensor<4x8xf32>
    %r = tdx.reshape %y [32] : tensor<4x8xf32> -> tensor<32xf32>
    %s = tdx.sum %r dims = [0] : tensor<32xf32> -> tensor<f32>
    %ln:3 = tdx.aten "aten::native_layer_norm"(%y, %w) {args = {normalized_shape = array<i64: 8>, bias = unit, eps = 1.0e-05 : f64}} : (tensor<4x8xf32>, tensor<8x8xf32>) -> (tensor<4x8xf32>, tensor<4x1xf32>, tensor<4x1xf32>)
    %e = tdx.exp %ln#0 : tensor<4x8xf32>
    %z = tdx.add %e, %x : (tensor<4x8xf32>, tensor<4x8xf32>) -> tensor<4x8xf32>
    %n = tdx.sub %w, %w : (tensor<8x8xf32>, tensor<8x8xf32>) -> tensor<8x8xf32>
    tdx.assign @w, %n : tensor<8x8xf32>
    return %z, %s : tensor<4x8xf32>, tensor<f32>
  }
}

// CHECK-LABEL: forward(
// CHECK:       const T::Tensor &[[X:v[0-9]+]] = in[0];
// CHECK-NEXT:  T::Tensor [[W:v[0-9]+]] = s.at("w");
// CHECK-NEXT:  ctx.place({{[{][{]}}0, 128{{[}][}]}});
// CHECK-NEXT:  T::Tensor [[Y:v[0-9]+]] = T::matmul([[X]], [[W]]);
// CHECK-NEXT:  ctx.placed();
// CHECK-NEXT:  T::Tensor [[R:v[0-9]+]] = [[Y]].reshape({32});
// CHECK-NEXT:  T::Tensor [[S:v[0-9]+]] = T::sum([[R]], std::vector<int64_t>{0}, false);
// CHECK-NEXT:  [[R]] = T::Tensor();
// CHECK-NEXT:  ctx.place({{[{][{]}}128, 128}, {256, 16}, {320, 16{{[}][}]}});
// CHECK-NEXT:  std::vector<T::Tensor> [[LN:r[0-9]+]] = callAten("aten::native_layer_norm", {[[Y]], [[W]]}
// CHECK-NEXT:  T::Tensor [[N0:v[0-9]+]] = std::move([[LN]].at(0));
// CHECK-NEXT:  T::Tensor [[N1:v[0-9]+]] = std::move([[LN]].at(1));
// CHECK-NEXT:  T::Tensor [[N2:v[0-9]+]] = std::move([[LN]].at(2));
// CHECK-NEXT:  ctx.placed();
// CHECK-NEXT:  [[Y]] = T::Tensor();
// CHECK-NEXT:  [[N1]] = T::Tensor();
// CHECK-NEXT:  [[N2]] = T::Tensor();
// CHECK-NEXT:  std::vector<T::Tensor> [[K:r[0-9]+]] = elementwise({4, 8}, {[[N0]], [[X]]}
// CHECK-NEXT:  T::Tensor [[Z:v[0-9]+]] = std::move([[K]][0]);
// CHECK-NEXT:  [[N0]] = T::Tensor();
// CHECK-NEXT:  std::vector<T::Tensor> [[K2:r[0-9]+]] = elementwise({8, 8}, {[[W]]}
// CHECK-NEXT:  T::Tensor [[NW:v[0-9]+]] = std::move([[K2]][0]);
// CHECK-NEXT:  [[W]] = T::Tensor();
// CHECK-NEXT:  s["w"] = [[NW]];
// CHECK-NEXT:  return {[[Z]], [[S]]};

// The plan's figure: the most bytes of these tensors alive at once: at the
// layer norm y (128) + s (4) + its three results (128 + 16 + 16) = 292; at
// the last kernel s, z (128) and the new w (256) = 388, before the old w,
// which its write frees, goes.
// The memory plan (its offsets: test/Passes/plan-memory.mlir): y, which a
// view of it keeps until the layer norm, and the layer norm's results are
// the step's own; the sum, the last kernel's result (both returned) and the
// new w (written) outlive the step and are not in the arena. Slots are
// whole 64-byte lines: 128 + 128 + 64 + 64.
// CHECK-LABEL: static Program describe(
// CHECK:       p.plannedStepBytes = 388;
// CHECK-NEXT:  p.arenaBytes = 384;
