// RUN: tdx-translate --tdx-to-cpp %s -split-input-file | FileCheck %s

// The step's memory plan: every tensor the step makes and drops within the
// step has an offset in one arena, and tensors alive at once have disjoint
// ranges of whole 64-byte lines. Before each op that makes one, the step
// tells the runtime the slot of each result (offset -1: a result the plan
// leaves out) and forgets what the op did not take after it.

// A chain: a dies where c is made, so c takes a's slot.
// CHECK-LABEL: forward(
// CHECK:       ctx.place({{[{][{]}}0, 128{{[}][}]}});
// CHECK-NEXT:  T::Tensor [[A:v[0-9]+]] = T::matmul(
// CHECK-NEXT:  ctx.placed();
// CHECK-NEXT:  ctx.place({{[{][{]}}128, 128{{[}][}]}});
// CHECK-NEXT:  T::Tensor [[B:v[0-9]+]] = T::matmul([[A]],
// CHECK-NEXT:  ctx.placed();
// CHECK-NEXT:  [[A]] = T::Tensor();
// CHECK-NEXT:  ctx.place({{[{][{]}}0, 128{{[}][}]}});
// CHECK-NEXT:  T::Tensor [[C:v[0-9]+]] = T::matmul([[B]],
// CHECK-NEXT:  ctx.placed();
// CHECK-NEXT:  [[B]] = T::Tensor();
// The returned value is not planned: no slot.
// CHECK-NEXT:  T::Tensor [[D:v[0-9]+]] = T::matmul([[C]],
// CHECK-NEXT:  [[C]] = T::Tensor();
// CHECK-NEXT:  return {[[D]]};
// CHECK-LABEL: int main(
// CHECK:       p.arenaBytes = 256;
module attributes {tdx.partitioned} {
  func.func @forward(%x: tensor<4x8xf32>, %w: tensor<8x8xf32>) -> tensor<4x8xf32> {
    %a = tdx.matmul %x, %w : (tensor<4x8xf32>, tensor<8x8xf32>) -> tensor<4x8xf32>
    %b = tdx.matmul %a, %w : (tensor<4x8xf32>, tensor<8x8xf32>) -> tensor<4x8xf32>
    %c = tdx.matmul %b, %w : (tensor<4x8xf32>, tensor<8x8xf32>) -> tensor<4x8xf32>
    %d = tdx.matmul %c, %w : (tensor<4x8xf32>, tensor<8x8xf32>) -> tensor<4x8xf32>
    return %d : tensor<4x8xf32>
  }
}

// -----

// Largest first: the 1024-byte product goes at 0 though the 16-byte sum is
// made before it and lives across it; the sum goes above it. A 4-byte
// tensor takes a whole line.
// CHECK-LABEL: forward(
// CHECK:       ctx.place({{[{][{]}}1024, 16{{[}][}]}});
// CHECK-NEXT:  T::Tensor [[S:v[0-9]+]] = T::sum(
// CHECK-NEXT:  ctx.placed();
// CHECK-NEXT:  ctx.place({{[{][{]}}0, 1024{{[}][}]}});
// CHECK-NEXT:  T::Tensor [[P:v[0-9]+]] = T::matmul(
// CHECK-NEXT:  ctx.placed();
// CHECK-NEXT:  ctx.place({{[{][{]}}1088, 4{{[}][}]}});
// CHECK-NEXT:  T::Tensor [[T:v[0-9]+]] = T::sum([[P]],
// CHECK-LABEL: int main(
// CHECK:       p.arenaBytes = 1152;
module attributes {tdx.partitioned} {
  func.func @forward(%x: tensor<4x8xf32>, %w: tensor<8x64xf32>) -> tensor<4xf32> {
    %s = tdx.sum %x dims = [1] : tensor<4x8xf32> -> tensor<4xf32>
    %p = tdx.matmul %x, %w : (tensor<4x8xf32>, tensor<8x64xf32>) -> tensor<4x64xf32>
    %t = tdx.sum %p dims = [0, 1] : tensor<4x64xf32> -> tensor<f32>
    %r = tdx.mul %s, %t : (tensor<4xf32>, tensor<f32>) -> tensor<4xf32>
    return %r : tensor<4xf32>
  }
}

// -----

// A result the plan leaves out (here returned) keeps its place in the
// list, with offset -1, so the runtime gives each allocation of the op the
// slot of its result.
// CHECK-LABEL: forward(
// CHECK:       ctx.place({{[{][{]}}-1, 128}, {0, 16}, {64, 16{{[}][}]}});
// CHECK-NEXT:  std::vector<T::Tensor> {{r[0-9]+}} = callAten("aten::native_layer_norm"
// CHECK-LABEL: int main(
// CHECK:       p.arenaBytes = 128;
module attributes {tdx.partitioned} {
  func.func @forward(%x: tensor<4x8xf32>, %w: tensor<8xf32>) -> tensor<4x8xf32> {
    %ln:3 = tdx.aten "aten::native_layer_norm"(%x, %w) {args = {normalized_shape = array<i64: 8>, bias = unit, eps = 1.0e-05 : f64}} : (tensor<4x8xf32>, tensor<8xf32>) -> (tensor<4x8xf32>, tensor<4x1xf32>, tensor<4x1xf32>)
    return %ln#0 : tensor<4x8xf32>
  }
}
