// RUN: tdx-opt %s -split-input-file -verify-diagnostics --tdx-propagate-sharding \
// RUN:   --tdx-insert-collectives --tdx-partition | FileCheck %s

// A generic op whose argument spells its result's shape gets the local
// shape (slice_backward's input_sizes).
tdx.mesh @mesh shape = [2] axes = ["dp"]
// CHECK-LABEL: func.func @slice_backward
// CHECK: tdx.aten "aten::slice_backward"(%{{.*}}) {args = {dim = -1 : i64, end = 9223372036854775807 : i64, input_sizes = array<i64: 2, 8, 32>, start = 1 : i64, step = 2 : i64}
// CHECK-SAME: (tensor<2x8x16xf32>) -> tensor<2x8x32xf32>
func.func @slice_backward(%g: tensor<4x8x16xf32>) -> tensor<4x8x32xf32> {
  %gs = tdx.annotate %g <@mesh, [Shard(0)]> : tensor<4x8x16xf32>
  %0 = tdx.aten "aten::slice_backward"(%gs) {args = {dim = -1 : i64, input_sizes = array<i64: 4, 8, 32>, start = 1 : i64, end = 9223372036854775807 : i64, step = 2 : i64}} : (tensor<4x8x16xf32>) -> tensor<4x8x32xf32>
  %1 = tdx.annotate %0 <@mesh, [Shard(0)]> : tensor<4x8x32xf32>
  return %1 : tensor<4x8x32xf32>
}

// -----

tdx.mesh @mesh shape = [2] axes = ["dp"]
func.func @slice_backward_uneven(%g: tensor<5x16xf32>) -> tensor<5x32xf32> {
  %gs = tdx.annotate %g <@mesh, [Shard(0)]> : tensor<5x16xf32>
  // expected-error @+1 {{'tdx.aten' op (aten::slice_backward) is split unevenly, so its 'input_sizes' differs between ranks; split the value it makes evenly}}
  %0 = tdx.aten "aten::slice_backward"(%gs) {args = {dim = 1 : i64, input_sizes = array<i64: 5, 32>, start = 0 : i64, end = 9223372036854775807 : i64, step = 2 : i64}} : (tensor<5x16xf32>) -> tensor<5x32xf32>
  %1 = tdx.annotate %0 <@mesh, [Shard(0)]> : tensor<5x32xf32>
  return %1 : tensor<5x32xf32>
}

// -----

// Group norm's sample count `N` is the local batch's.
tdx.mesh @mesh shape = [2] axes = ["dp"]
// CHECK-LABEL: func.func @group_norm
// CHECK: tdx.aten "aten::native_group_norm"(%{{.*}}) {args = {C = 8 : i64, HxW = 4 : i64, N = 2 : i64, bias, eps = 1.000000e-05 : f64, group = 4 : i64, weight}
// CHECK-SAME: (tensor<2x8x2x2xf32>) -> (tensor<2x8x2x2xf32>, tensor<2x4xf32>, tensor<2x4xf32>)
func.func @group_norm(%x: tensor<4x8x2x2xf32>) -> tensor<4x8x2x2xf32> {
  %xs = tdx.annotate %x <@mesh, [Shard(0)]> : tensor<4x8x2x2xf32>
  %0:3 = tdx.aten "aten::native_group_norm"(%xs) {args = {weight = unit, bias = unit, N = 4 : i64, C = 8 : i64, HxW = 4 : i64, group = 4 : i64, eps = 1.000000e-05 : f64}} : (tensor<4x8x2x2xf32>) -> (tensor<4x8x2x2xf32>, tensor<4x4xf32>, tensor<4x4xf32>)
  %1 = tdx.annotate %0#0 <@mesh, [Shard(0)]> : tensor<4x8x2x2xf32>
  return %1 : tensor<4x8x2x2xf32>
}

// -----

tdx.mesh @mesh shape = [2] axes = ["dp"]
func.func @group_norm_uneven(%x: tensor<5x8xf32>) -> tensor<5x8xf32> {
  %xs = tdx.annotate %x <@mesh, [Shard(0)]> : tensor<5x8xf32>
  // expected-error @+1 {{'tdx.aten' op (aten::native_group_norm) is split unevenly, so its 'N' differs between ranks; split the batch evenly}}
  %0:3 = tdx.aten "aten::native_group_norm"(%xs) {args = {weight = unit, bias = unit, N = 5 : i64, C = 8 : i64, HxW = 1 : i64, group = 4 : i64, eps = 1.000000e-05 : f64}} : (tensor<5x8xf32>) -> (tensor<5x8xf32>, tensor<5x4xf32>, tensor<5x4xf32>)
  %1 = tdx.annotate %0#0 <@mesh, [Shard(0)]> : tensor<5x8xf32>
  return %1 : tensor<5x8xf32>
}
