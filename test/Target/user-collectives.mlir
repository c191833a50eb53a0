// RUN: tdx-opt %s --tdx-manual-program="mesh=world shape=4 axes=world" | tdx-translate --tdx-to-cpp | FileCheck %s
// RUN: tdx-opt %s --tdx-manual-program="mesh=world shape=4 axes=world" | tdx-translate --tdx-to-cuda | FileCheck %s

// The collectives of a program written per rank, in the emitted step: the
// broadcast and the permutation run on the runtime's own calls, the rank
// is this process's coordinate; the permutation is started where it stands
// and waited for where its result is first read (here: returned), so what
// runs in between overlaps it.
// CHECK: ctx.broadcast({{.*}}, {"world"}, {2})
// CHECK: [[PERMUTE:c[0-9]+]] = ctx.startPermute({{.*}}, {"world"}, {0, 1, 1, 2, 2, 3, 3, 0})
// CHECK: ctx.coord("world")
// CHECK: ctx.wait([[PERMUTE]])
module {
  func.func @forward(%x: tensor<2x3xf32>) -> (tensor<2x3xf32>, tensor<i64>) {
    %0 = tdx.aten "tdx::broadcast"(%x) {args = {root = 2 : i64, axes = "world", group = 4 : i64, site = "a.py:1"}} : (tensor<2x3xf32>) -> tensor<2x3xf32>
    %1 = tdx.aten "tdx::permute"(%0) {args = {pairs = array<i64: 0, 1, 1, 2, 2, 3, 3, 0>, axes = "world", group = 4 : i64, site = "a.py:2"}} : (tensor<2x3xf32>) -> tensor<2x3xf32>
    %2 = tdx.aten "tdx::rank"(%1) {args = {axes = "world", group = 4 : i64, site = "a.py:3"}} : (tensor<2x3xf32>) -> tensor<i64>
    return %1, %2 : tensor<2x3xf32>, tensor<i64>
  }
}
