// RUN: tdx-translate --tdx-to-cpp %s | FileCheck %s

// Overlap: an all_reduce or reduce_scatter starts where it stands (after
// its input) and is waited for right before its result's first reader;
// every op in between is followed by ctx.progress(), which drives MPI's
// nonblocking collectives. Collectives nobody reads before the step ends
// are waited for before it returns; all_gather and all_to_all stay
// synchronous.
module attributes {tdx.partitioned} {
  tdx.mesh @mesh shape = [2] axes = ["dp"]
  func.func @forward(%g1: tensor<4x8xf32>, %g2: tensor<4x8xf32>, %x: tensor<4x8xf32>) -> (tensor<4x8xf32>, tensor<2x8xf32>) {
    %r1 = tdx.all_reduce %g1 on @mesh axes = ["dp"] reduce = sum : tensor<4x8xf32> -> tensor<4x8xf32>
    %r2 = tdx.reduce_scatter %g2 on @mesh axes = ["dp"] reduce = sum dim = 0 : tensor<4x8xf32> -> tensor<2x8xf32>
    %e = tdx.exp %x : tensor<4x8xf32>
    %s = tdx.sum %e dims = [0] keepdim : tensor<4x8xf32> -> tensor<1x8xf32>
    %y = tdx.add %r1, %s : (tensor<4x8xf32>, tensor<1x8xf32>) -> tensor<4x8xf32>
    return %y, %r2 : tensor<4x8xf32>, tensor<2x8xf32>
  }
}

// CHECK-LABEL: forward(
// CHECK:       const int64_t [[C1:c[0-9]+]] = ctx.startAllReduce([[G1:v[0-9]+]], {"dp"}, 0);
// CHECK-NEXT:  ctx.placed();
// CHECK-NEXT:  ctx.progress();
// CHECK-NEXT:  const int64_t [[C2:c[0-9]+]] = ctx.startReduceScatter([[G2:v[0-9]+]], {"dp"}, 0, 0);
// CHECK-NEXT:  ctx.progress();
// CHECK-NEXT:  ctx.place(
// CHECK-NEXT:  std::vector<T::Tensor> {{r[0-9]+}} = elementwise({4, 8}
// CHECK:       ctx.progress();
// CHECK-NEXT:  ctx.place(
// CHECK-NEXT:  T::Tensor [[S:v[0-9]+]] = T::sum(
// CHECK:       ctx.progress();
// CHECK-NEXT:  T::Tensor [[R1:v[0-9]+]] = ctx.wait([[C1]]);
// CHECK-NEXT:  std::vector<T::Tensor> {{r[0-9]+}} = elementwise({4, 8}, {[[R1]], [[S]]}
// CHECK:       T::Tensor [[R2:v[0-9]+]] = ctx.wait([[C2]]);
// CHECK-NEXT:  return {{[{]}}{{v[0-9]+}}, [[R2]]};
