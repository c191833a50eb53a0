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
