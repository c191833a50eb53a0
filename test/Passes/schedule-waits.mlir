// RUN: tdx-opt %s -split-input-file --tdx-schedule-waits | FileCheck %s

// Two parameters' updates after the backward: the one whose gradient's
// all_reduce started first runs first, with the state it reads, though
// the program wrote it second.
// CHECK-LABEL: func.func @updates
// CHECK:      %[[RB:.*]] = tdx.all_reduce %arg1
// CHECK-NEXT: %[[RA:.*]] = tdx.all_reduce %arg0
// CHECK-NEXT: %[[B:.*]] = tdx.param_ref @b
// CHECK-NEXT: %[[NB:.*]] = tdx.sub %[[B]], %[[RB]]
// CHECK-NEXT: tdx.assign @b, %[[NB]]
// CHECK-NEXT: %[[A:.*]] = tdx.param_ref @a
// CHECK-NEXT: %[[NA:.*]] = tdx.sub %[[A]], %[[RA]]
// CHECK-NEXT: tdx.assign @a, %[[NA]]
// CHECK-NEXT: return
module attributes {tdx.partitioned} {
  tdx.mesh @mesh shape = [2] axes = ["dp"]
  tdx.parameter @a : tensor<8xf32> init {
    %z = tdx.full 0.0 : tensor<8xf32>
    tdx.yield %z : tensor<8xf32>
  }
  tdx.parameter @b : tensor<8xf32> init {
    %z = tdx.full 0.0 : tensor<8xf32>
    tdx.yield %z : tensor<8xf32>
  }
  func.func @updates(%ga: tensor<8xf32>, %gb: tensor<8xf32>) {
    %rb = tdx.all_reduce %gb on @mesh axes = ["dp"] reduce = sum : tensor<8xf32> -> tensor<8xf32>
    %ra = tdx.all_reduce %ga on @mesh axes = ["dp"] reduce = sum : tensor<8xf32> -> tensor<8xf32>
    %a = tdx.param_ref @a : tensor<8xf32>
    %na = tdx.sub %a, %ra : (tensor<8xf32>, tensor<8xf32>) -> tensor<8xf32>
    tdx.assign @a, %na : tensor<8xf32>
    %b = tdx.param_ref @b : tensor<8xf32>
    %nb = tdx.sub %b, %rb : (tensor<8xf32>, tensor<8xf32>) -> tensor<8xf32>
    tdx.assign @b, %nb : tensor<8xf32>
    return
  }
}

// -----

// Reads and writes of one state keep their order, and generic ops theirs:
// the second read of @a (and the add waiting for the first reduction) stays
// after the write, the cumsum of the first reduction after the other.
// CHECK-LABEL: func.func @kept
// CHECK:      tdx.param_ref @a
// CHECK-NEXT: tdx.sub
// CHECK-NEXT: tdx.assign @a
// CHECK-NEXT: tdx.aten "aten::cumsum"(%{{.*}}) {args = {dim = 0 : i64}}
// CHECK-NEXT: tdx.param_ref @a
// CHECK-NEXT: tdx.add
// CHECK-NEXT: tdx.aten "aten::cumsum"(%{{.*}}) {args = {dim = -1 : i64}}
module attributes {tdx.partitioned} {
  tdx.mesh @mesh shape = [2] axes = ["dp"]
  tdx.parameter @a : tensor<8xf32> init {
    %z = tdx.full 0.0 : tensor<8xf32>
    tdx.yield %z : tensor<8xf32>
  }
  func.func @kept(%ga: tensor<8xf32>, %gb: tensor<8xf32>) -> (tensor<8xf32>, tensor<8xf32>, tensor<8xf32>) {
    %rb = tdx.all_reduce %gb on @mesh axes = ["dp"] reduce = sum : tensor<8xf32> -> tensor<8xf32>
    %ra = tdx.all_reduce %ga on @mesh axes = ["dp"] reduce = sum : tensor<8xf32> -> tensor<8xf32>
    %a = tdx.param_ref @a : tensor<8xf32>
    %na = tdx.sub %a, %ra : (tensor<8xf32>, tensor<8xf32>) -> tensor<8xf32>
    tdx.assign @a, %na : tensor<8xf32>
    %c0 = tdx.aten "aten::cumsum"(%ra) {args = {dim = 0 : i64}} : (tensor<8xf32>) -> tensor<8xf32>
    %a2 = tdx.param_ref @a : tensor<8xf32>
    %s = tdx.add %a2, %rb : (tensor<8xf32>, tensor<8xf32>) -> tensor<8xf32>
    %c1 = tdx.aten "aten::cumsum"(%rb) {args = {dim = -1 : i64}} : (tensor<8xf32>) -> tensor<8xf32>
    return %s, %c0, %c1 : tensor<8xf32>, tensor<8xf32>, tensor<8xf32>
  }
}

// -----

// Without a started collective nothing moves.
// CHECK-LABEL: func.func @none
// CHECK-NEXT: tdx.exp
// CHECK-NEXT: tdx.neg
func.func @none(%x: tensor<8xf32>) -> (tensor<8xf32>, tensor<8xf32>) {
  %0 = tdx.exp %x : tensor<8xf32>
  %1 = tdx.neg %x : tensor<8xf32>
  return %0, %1 : tensor<8xf32>, tensor<8xf32>
}
