// RUN: tdx-opt %s -split-input-file --canonicalize | FileCheck %s

// torch.matmul's decomposition of a batched matmul: merge the leading dims,
// bmm, split them again. One matmul over the leading dims.
// CHECK-LABEL: func.func @batch_reshapes
// CHECK-SAME: (%[[A:.*]]: tensor<4x4x8x8xf32>, %[[B:.*]]: tensor<4x4x8x2xf32>)
// CHECK-NEXT: %[[M:.*]] = tdx.matmul %[[A]], %[[B]] : (tensor<4x4x8x8xf32>, tensor<4x4x8x2xf32>) -> tensor<4x4x8x2xf32>
// CHECK-NEXT: return %[[M]]
func.func @batch_reshapes(%a: tensor<4x4x8x8xf32>, %b: tensor<4x4x8x2xf32>) -> tensor<4x4x8x2xf32> {
  %0 = tdx.reshape %a [16, 8, 8] : tensor<4x4x8x8xf32> -> tensor<16x8x8xf32>
  %1 = tdx.reshape %b [16, 8, 2] : tensor<4x4x8x2xf32> -> tensor<16x8x2xf32>
  %2 = tdx.matmul %0, %1 : (tensor<16x8x8xf32>, tensor<16x8x2xf32>) -> tensor<16x8x2xf32>
  %3 = tdx.reshape %2 [4, 4, 8, 2] : tensor<16x8x2xf32> -> tensor<4x4x8x2xf32>
  return %3 : tensor<4x4x8x2xf32>
}

// -----

// The backward of that matmul transposes the operand it saved merged: the
// transpose moves above the merge, and the backward's matmul folds too.
// CHECK-LABEL: func.func @backward_transposed_operand
// CHECK-SAME: (%[[A:.*]]: tensor<4x4x8x8xf32>, %[[G:.*]]: tensor<4x4x8x2xf32>)
// CHECK-NEXT: %[[T:.*]] = tdx.transpose %[[A]] 2, 3 : tensor<4x4x8x8xf32> -> tensor<4x4x8x8xf32>
// CHECK-NEXT: %[[M:.*]] = tdx.matmul %[[T]], %[[G]] : (tensor<4x4x8x8xf32>, tensor<4x4x8x2xf32>) -> tensor<4x4x8x2xf32>
// CHECK-NEXT: return %[[M]]
func.func @backward_transposed_operand(%a: tensor<4x4x8x8xf32>, %g: tensor<4x4x8x2xf32>) -> tensor<4x4x8x2xf32> {
  %0 = tdx.reshape %a [16, 8, 8] : tensor<4x4x8x8xf32> -> tensor<16x8x8xf32>
  %1 = tdx.transpose %0 1, 2 : tensor<16x8x8xf32> -> tensor<16x8x8xf32>
  %2 = tdx.reshape %g [16, 8, 2] : tensor<4x4x8x2xf32> -> tensor<16x8x2xf32>
  %3 = tdx.matmul %1, %2 : (tensor<16x8x8xf32>, tensor<16x8x2xf32>) -> tensor<16x8x2xf32>
  %4 = tdx.reshape %3 [4, 4, 8, 2] : tensor<16x8x2xf32> -> tensor<4x4x8x2xf32>
  return %4 : tensor<4x4x8x2xf32>
}

// -----

// A transpose of other dims, or of a reshape that is not a merge of the
// leading dims, stays.
// CHECK-LABEL: func.func @other_transposes_stay
// CHECK: tdx.reshape %{{.*}} [16, 8, 8]
// CHECK-NEXT: tdx.transpose %{{.*}} 0, 1
// CHECK: tdx.reshape %{{.*}} [8, 16, 8]
// CHECK-NEXT: tdx.transpose %{{.*}} 1, 2
func.func @other_transposes_stay(%a: tensor<4x4x8x8xf32>) -> (tensor<8x16x8xf32>, tensor<8x8x16xf32>) {
  %0 = tdx.reshape %a [16, 8, 8] : tensor<4x4x8x8xf32> -> tensor<16x8x8xf32>
  %1 = tdx.transpose %0 0, 1 : tensor<16x8x8xf32> -> tensor<8x16x8xf32>
  %2 = tdx.reshape %a [8, 16, 8] : tensor<4x4x8x8xf32> -> tensor<8x16x8xf32>
  %3 = tdx.transpose %2 1, 2 : tensor<8x16x8xf32> -> tensor<8x8x16xf32>
  return %1, %3 : tensor<8x16x8xf32>, tensor<8x8x16xf32>
}

// -----

// addmm's decomposition, x @ W^T + b, is a linear; so is one with leading
// dims merged around it.
// CHECK-LABEL: func.func @linear
// CHECK-SAME: (%[[X:.*]]: tensor<4x8x16xf32>, %[[W:.*]]: tensor<32x16xf32>, %[[B:.*]]: tensor<32xf32>)
// CHECK-NEXT: %[[L:.*]] = tdx.linear %[[X]], %[[W]], %[[B]] : (tensor<4x8x16xf32>, tensor<32x16xf32>, tensor<32xf32>) -> tensor<4x8x32xf32>
// CHECK-NEXT: return %[[L]]
func.func @linear(%x: tensor<4x8x16xf32>, %w: tensor<32x16xf32>, %b: tensor<32xf32>) -> tensor<4x8x32xf32> {
  %0 = tdx.reshape %x [32, 16] : tensor<4x8x16xf32> -> tensor<32x16xf32>
  %1 = tdx.transpose %w 0, 1 : tensor<32x16xf32> -> tensor<16x32xf32>
  %2 = tdx.matmul %0, %1 : (tensor<32x16xf32>, tensor<16x32xf32>) -> tensor<32x32xf32>
  %3 = tdx.add %2, %b : (tensor<32x32xf32>, tensor<32xf32>) -> tensor<32x32xf32>
  %4 = tdx.reshape %3 [4, 8, 32] : tensor<32x32xf32> -> tensor<4x8x32xf32>
  return %4 : tensor<4x8x32xf32>
}

// -----

// This rank's chunk of an all_gather over one axis, along the gathered dim,
// is the all_gather's input (ZeRO-3's update reads the parameter its
// forward gathers).
tdx.mesh @mesh shape = [2, 2] axes = ["dp", "tp"]
// CHECK-LABEL: func.func @chunk_of_gather
// CHECK-SAME: (%[[X:.*]]: tensor<2x8xf32>)
// CHECK-NEXT: %[[G:.*]] = tdx.all_gather %[[X]]
// CHECK-NEXT: return %[[X]], %[[G]]
func.func @chunk_of_gather(%x: tensor<2x8xf32>) -> (tensor<2x8xf32>, tensor<4x8xf32>) {
  %g = tdx.all_gather %x on @mesh axes = ["dp"] dim = 0 : tensor<2x8xf32> -> tensor<4x8xf32>
  %c = tdx.mesh_coord @mesh axis = "dp" : tensor<i64>
  %y = tdx.chunk %g[%c] chunks = 2 dim = 0 : tensor<4x8xf32>, tensor<i64> -> tensor<2x8xf32>
  return %y, %g : tensor<2x8xf32>, tensor<4x8xf32>
}

// -----

// Not the same piece: another axis's coordinate, another dim, another
// count of chunks.
tdx.mesh @mesh shape = [2, 2] axes = ["dp", "tp"]
// CHECK-LABEL: func.func @chunk_of_gather_elsewhere
// CHECK-COUNT-3: tdx.chunk
func.func @chunk_of_gather_elsewhere(%x: tensor<2x8xf32>) -> (tensor<2x8xf32>, tensor<4x4xf32>, tensor<1x8xf32>) {
  %g = tdx.all_gather %x on @mesh axes = ["dp"] dim = 0 : tensor<2x8xf32> -> tensor<4x8xf32>
  %dp = tdx.mesh_coord @mesh axis = "dp" : tensor<i64>
  %tp = tdx.mesh_coord @mesh axis = "tp" : tensor<i64>
  %a = tdx.chunk %g[%tp] chunks = 2 dim = 0 : tensor<4x8xf32>, tensor<i64> -> tensor<2x8xf32>
  %b = tdx.chunk %g[%dp] chunks = 2 dim = 1 : tensor<4x8xf32>, tensor<i64> -> tensor<4x4xf32>
  %c = tdx.chunk %g[%dp] chunks = 4 dim = 0 : tensor<4x8xf32>, tensor<i64> -> tensor<1x8xf32>
  return %a, %b, %c : tensor<2x8xf32>, tensor<4x4xf32>, tensor<1x8xf32>
}

// -----

// A transpose swapped back is its input (autograd's weight gradient of a
// linear, mm(...).t().t()), whichever way its dims are written; a transpose
// of other dims is kept.
// CHECK-LABEL: func.func @transpose_back
// CHECK-SAME: (%[[A:.*]]: tensor<4x8xf32>, %[[B:.*]]: tensor<2x4x8xf32>)
// CHECK-NEXT: %[[T:.*]] = tdx.transpose %[[B]] 0, 1
// CHECK-NEXT: %[[U:.*]] = tdx.transpose %[[T]] 1, 2
// CHECK-NEXT: return %[[A]], %[[A]], %[[U]]
func.func @transpose_back(%a: tensor<4x8xf32>, %b: tensor<2x4x8xf32>) -> (tensor<4x8xf32>, tensor<4x8xf32>, tensor<4x8x2xf32>) {
  %0 = tdx.transpose %a 0, -1 : tensor<4x8xf32> -> tensor<8x4xf32>
  %1 = tdx.transpose %0 0, -1 : tensor<8x4xf32> -> tensor<4x8xf32>
  %2 = tdx.transpose %0 1, 0 : tensor<8x4xf32> -> tensor<4x8xf32>
  %3 = tdx.transpose %b 0, 1 : tensor<2x4x8xf32> -> tensor<4x2x8xf32>
  %4 = tdx.transpose %3 1, 2 : tensor<4x2x8xf32> -> tensor<4x8x2xf32>
  return %1, %2, %4 : tensor<4x8xf32>, tensor<4x8xf32>, tensor<4x8x2xf32>
}

// -----

// An aten op of no result is there for its effect (torch._assert_async's
// run-time check): canonicalization keeps it; a pure one nobody reads goes.
// CHECK-LABEL: func.func @assert_kept
func.func @assert_kept(%x: tensor<4xf32>) -> tensor<4xf32> {
  // CHECK: %[[ALL:.*]] = tdx.aten "aten::all"
  // CHECK-NEXT: tdx.aten "aten::_assert_async.msg"(%[[ALL]]) {args = {assert_msg = "too big"}}
  // CHECK-NOT: aten::sort
  // CHECK: return
  %0 = tdx.aten "aten::isfinite"(%x) : (tensor<4xf32>) -> tensor<4xi1>
  %1 = tdx.aten "aten::all"(%0) : (tensor<4xi1>) -> tensor<i1>
  tdx.aten "aten::_assert_async.msg"(%1) {args = {assert_msg = "too big"}} : (tensor<i1>) -> ()
  %2:2 = tdx.aten "aten::sort"(%x) : (tensor<4xf32>) -> (tensor<4xf32>, tensor<4xi64>)
  return %x : tensor<4xf32>
}
