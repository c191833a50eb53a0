// RUN: tdx-opt --tdx-plan-memory -split-input-file %s | FileCheck %s

// The step's memory plan: every tensor the step makes and drops within the
// step has an offset in one arena, and tensors alive at once have disjoint
// ranges of whole 64-byte lines: tdx.arena, one offset per result (-1: a
// result the plan leaves out), which the emitters hand the runtime before
// the op (ctx.place). The function gets the arena's size and the most bytes
// alive at once.

// A chain: a dies where c is made, so c takes a's slot.
// CHECK-LABEL: func.func @forward
// CHECK-SAME:    tdx.arena_bytes = 256 : i64, tdx.step_bytes = 256 : i64
// CHECK-NEXT:  %[[A:.*]] = tdx.matmul %{{.*}} {tdx.arena = array<i64: 0>}
// CHECK-NEXT:  %[[B:.*]] = tdx.matmul %[[A]], %{{.*}} {tdx.arena = array<i64: 128>}
// CHECK-NEXT:  %[[C:.*]] = tdx.matmul %[[B]], %{{.*}} {tdx.arena = array<i64: 0>}
// The returned value is not planned.
// CHECK-NEXT:  tdx.matmul %[[C]], %{{.*}} : (
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
// CHECK-LABEL: func.func @forward
// CHECK-SAME:    tdx.arena_bytes = 1152 : i64, tdx.step_bytes = 1044 : i64
// CHECK-NEXT:  tdx.sum %{{.*}} dims = [1] {tdx.arena = array<i64: 1024>}
// CHECK-NEXT:  tdx.matmul %{{.*}} {tdx.arena = array<i64: 0>}
// CHECK-NEXT:  tdx.sum %{{.*}} dims = [0, 1] {tdx.arena = array<i64: 1088>}
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
// CHECK-LABEL: func.func @forward
// CHECK-SAME:    tdx.arena_bytes = 128 : i64
// CHECK:       tdx.aten "aten::native_layer_norm"{{.*}}tdx.arena = array<i64: -1, 0, 64>
module attributes {tdx.partitioned} {
  func.func @forward(%x: tensor<4x8xf32>, %w: tensor<8xf32>) -> tensor<4x8xf32> {
    %ln:3 = tdx.aten "aten::native_layer_norm"(%x, %w) {args = {normalized_shape = array<i64: 8>, bias = unit, eps = 1.0e-05 : f64}} : (tensor<4x8xf32>, tensor<8xf32>) -> (tensor<4x8xf32>, tensor<4x1xf32>, tensor<4x1xf32>)
    return %ln#0 : tensor<4x8xf32>
  }
}

// -----

// A state written once is written right after both the op that makes its
// value and the state's last param_ref; the old tensor goes with its last
// reader. A write of a value a collective gives goes before the return.
// CHECK-LABEL: func.func @train_step
// CHECK:       %[[W:.*]] = tdx.param_ref @w
// CHECK-NEXT:  %[[N:.*]] = tdx.sub %[[W]], %[[W]]
// CHECK-NEXT:  %[[W2:.*]] = tdx.param_ref @w
// CHECK-NEXT:  tdx.assign @w, %[[N]]
// CHECK-NEXT:  %[[T:.*]] = tdx.start {
// CHECK:       %[[G:.*]] = tdx.wait %[[T]]
// CHECK-NEXT:  %[[L:.*]] = tdx.sum %[[W2]]
// CHECK-NEXT:  tdx.assign @b, %[[G]]
// CHECK-NEXT:  return %[[L]]
module attributes {tdx.partitioned} {
  tdx.mesh @mesh shape = [2] axes = ["dp"]
  tdx.parameter @w : tensor<4x8xf32> init {
    %0 = tdx.normal(0.0, 0.02) seed(0, 1) : tensor<4x8xf32>
    tdx.yield %0 : tensor<4x8xf32>
  }
  tdx.parameter @b : tensor<8xf32> init {
    %0 = tdx.normal(0.0, 0.02) seed(0, 2) : tensor<8xf32>
    tdx.yield %0 : tensor<8xf32>
  }
  func.func @train_step(%g: tensor<8xf32>) -> tensor<f32> {
    %w = tdx.param_ref @w : tensor<4x8xf32>
    %n = tdx.sub %w, %w : (tensor<4x8xf32>, tensor<4x8xf32>) -> tensor<4x8xf32>
    %w2 = tdx.param_ref @w : tensor<4x8xf32>
    %t = tdx.start {
      %r = tdx.all_reduce %g on @mesh axes = ["dp"] reduce = sum : tensor<8xf32> -> tensor<8xf32>
      tdx.yield %r : tensor<8xf32>
    }
    %gr = tdx.wait %t : tensor<8xf32>
    tdx.assign @b, %gr : tensor<8xf32>
    %l = tdx.sum %w2 dims = [0, 1] : tensor<4x8xf32> -> tensor<f32>
    tdx.assign @w, %n : tensor<4x8xf32>
    return %l : tensor<f32>
  }
}

// -----

// A started collective's result is made by its tdx.start, and a started
// reduce_scatter's input lives until the wait: the sum after the start may
// not take the input's slot.
// CHECK-LABEL: func.func @forward
// CHECK:       tdx.matmul {{.*}}{tdx.arena = array<i64: 0>}
// CHECK-NEXT:  tdx.start {
// CHECK:       } {tdx.arena = array<i64: 128>}
// CHECK-NEXT:  tdx.sum {{.*}}{tdx.arena = array<i64: 192>}
// CHECK-NEXT:  tdx.wait
module attributes {tdx.partitioned} {
  tdx.mesh @mesh shape = [2] axes = ["dp"]
  func.func @forward(%x: tensor<4x8xf32>, %w: tensor<8x8xf32>) -> tensor<f32> {
    %a = tdx.matmul %x, %w : (tensor<4x8xf32>, tensor<8x8xf32>) -> tensor<4x8xf32>
    %t = tdx.start {
      %r = tdx.reduce_scatter %a on @mesh axes = ["dp"] reduce = sum dim = 0 : tensor<4x8xf32> -> tensor<2x8xf32>
      tdx.yield %r : tensor<2x8xf32>
    }
    %s = tdx.sum %x dims = [0] : tensor<4x8xf32> -> tensor<8xf32>
    %r = tdx.wait %t : tensor<2x8xf32>
    %m = tdx.mul %r, %s : (tensor<2x8xf32>, tensor<8xf32>) -> tensor<2x8xf32>
    %l = tdx.sum %m dims = [0, 1] : tensor<2x8xf32> -> tensor<f32>
    return %l : tensor<f32>
  }
}
