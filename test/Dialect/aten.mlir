// RUN: tdx-opt %s | tdx-opt | FileCheck %s
// RUN: tdx-opt %s -mlir-print-op-generic | tdx-opt | FileCheck %s

// Any aten op without a first-class tdx op is kept by schema name, with its
// constant arguments by schema argument name.
// CHECK-LABEL: func.func @generic
func.func @generic(%x: tensor<4x8xf32>, %i: tensor<3xi64>) -> tensor<4x3xf32> {
  // CHECK: tdx.aten "aten::index_select"(%{{.*}}, %{{.*}}) {args = {dim = 1 : i64}} : (tensor<4x8xf32>, tensor<3xi64>) -> tensor<4x3xf32>
  %0 = tdx.aten "aten::index_select"(%x, %i) {args = {dim = 1 : i64}} : (tensor<4x8xf32>, tensor<3xi64>) -> tensor<4x3xf32>
  // Several results, no constant arguments.
  // CHECK: tdx.aten "aten::sort"(%{{.*}}) : (tensor<4x8xf32>) -> (tensor<4x8xf32>, tensor<4x8xi64>)
  %1:2 = tdx.aten "aten::sort"(%x) : (tensor<4x8xf32>) -> (tensor<4x8xf32>, tensor<4x8xi64>)
  // An overload name, list and string constants.
  // CHECK: tdx.aten "aten::_foreach_mul.Scalar"(%{{.*}}) {args = {dims = [0, 1], mode = "x", scalar = 2.000000e+00 : f64}}
  %2 = tdx.aten "aten::_foreach_mul.Scalar"(%x) {args = {scalar = 2.0 : f64, dims = [0, 1], mode = "x"}} : (tensor<4x8xf32>) -> tensor<4x8xf32>
  // No results (an op kept for its effect on nothing but the record).
  // CHECK: tdx.aten "mylib::custom"(%{{.*}}) : (tensor<4x8xf32>) -> ()
  tdx.aten "mylib::custom"(%x) : (tensor<4x8xf32>) -> ()
  return %0 : tensor<4x3xf32>
}

// Every argument kind of a schema: None is `unit`, a Tensor?[] is operand
// numbers (`index`) with `unit` holes, float and bool lists are arrays.
// CHECK-LABEL: func.func @argument_kinds
func.func @argument_kinds(%x: tensor<4x8xf32>, %i: tensor<3xi64>, %w: tensor<2x4x3xf32>) -> tensor<4x3xf32> {
  // CHECK: tdx.aten "aten::index.Tensor"(%{{.*}}, %{{.*}}) {args = {indices = [unit, 1 : index]}}
  %0 = tdx.aten "aten::index.Tensor"(%x, %i) {args = {indices = [unit, 1 : index]}} : (tensor<4x8xf32>, tensor<3xi64>) -> tensor<4x3xf32>
  // CHECK: tdx.aten "aten::convolution"(%{{.*}}, %{{.*}}) {args = {bias, dilation = array<i64: 1>, groups = 1 : i64, output_padding = array<i64: 0>, padding = array<i64: 0>, stride = array<i64: 1>, transposed = false}}
  %1 = tdx.aten "aten::convolution"(%x, %w) {args = {bias = unit, stride = array<i64: 1>, padding = array<i64: 0>, dilation = array<i64: 1>, transposed = false, output_padding = array<i64: 0>, groups = 1 : i64}} : (tensor<4x8xf32>, tensor<2x4x3xf32>) -> tensor<4x2x6xf32>
  // CHECK: tdx.aten "aten::upsample_bilinear2d.vec"(%{{.*}}) {args = {align_corners = false, output_size, scale_factors = [2.000000e+00, 2.000000e+00]}}
  %2 = tdx.aten "aten::upsample_bilinear2d.vec"(%x) {args = {output_size = unit, align_corners = false, scale_factors = [2.0, 2.0]}} : (tensor<4x8xf32>) -> tensor<8x16xf32>
  // CHECK: tdx.aten "aten::cat"(%{{.*}}, %{{.*}}) {args = {dim = 0 : i64, tensors = [0 : index, 1 : index]}}
  %3 = tdx.aten "aten::cat"(%x, %x) {args = {tensors = [0 : index, 1 : index], dim = 0 : i64}} : (tensor<4x8xf32>, tensor<4x8xf32>) -> tensor<8x8xf32>
  return %0 : tensor<4x3xf32>
}
