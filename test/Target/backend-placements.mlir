// RUN: tdx-translate --tdx-to-cpp %s | FileCheck %s

// A result's placement is where it was decided: a kernel's result has its
// body's (the where placed Partial(sum), which the runtime adds up), a
// started collective's result the collective's (a reduce_scatter's
// Shard(0), which the runtime concatenates).
// CHECK-LABEL: static Program describe(
// CHECK:       p.outputs.push_back({{[{][{]}}4}, T::kFloat, "[Partial(sum)]"});
// CHECK-NEXT:  p.outputs.push_back({{[{][{]}}4}, T::kFloat, "[Shard(0)]"});
module attributes {tdx.partitioned} {
  tdx.mesh @mesh shape = [2] axes = ["dp"]
  func.func @forward(%x: tensor<4xf32>, %g: tensor<4xf32>) -> (tensor<4xf32> {tdx.global_type = tensor<4xf32>}, tensor<2xf32> {tdx.global_type = tensor<4xf32>}) {
    %e = tdx.exp %x {tdx.shardings = [#tdx.sharding<@mesh, [Partial(sum)]>]} : tensor<4xf32>
    %r = tdx.reduce_scatter %g on @mesh axes = ["dp"] reduce = sum dim = 0 {tdx.shardings = [#tdx.sharding<@mesh, [Shard(0)]>]} : tensor<4xf32> -> tensor<2xf32>
    return %e, %r : tensor<4xf32>, tensor<2xf32>
  }
}
