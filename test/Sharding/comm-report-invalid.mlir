// RUN: tdx-opt %s -verify-diagnostics --tdx-comm-report -o /dev/null

tdx.mesh @mesh shape = [2] axes = ["tp"]
func.func @global_view(%x: tensor<8xf32>) -> tensor<8xf32> {
  // expected-error @+1 {{tdx-comm-report counts the collectives of a partitioned program; run tdx-insert-collectives and tdx-partition first}}
  %0 = tdx.redistribute %x <@mesh, [Shard(0)]> to <@mesh, [Replicate]> : tensor<8xf32>
  return %0 : tensor<8xf32>
}
