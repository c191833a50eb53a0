// RUN: tdx-opt %s -verify-diagnostics --tdx-propagate-sharding=explain -o /dev/null

// x wants its rows split (priority 0, from a distance) and w its columns;
// the linear can only shard one of its factors over "tp": the cost model
// picks the cheaper and says why.
tdx.mesh @mesh shape = [2] axes = ["tp"]
func.func @contested(%x: tensor<64x16xf32>, %w: tensor<4096x16xf32>) -> tensor<64x4096xf32> {
  %xs = tdx.annotate %x <@mesh, [Shard(0)]> : tensor<64x16xf32>
  %x2 = tdx.exp %xs : tensor<64x16xf32>
  %ws = tdx.annotate %w <@mesh, [Shard(0)]> : tensor<4096x16xf32>
  %w2 = tdx.exp %ws : tensor<4096x16xf32>
  // expected-remark @+2 {{tdx-propagate-sharding: on mesh axis "tp" chose factor #1 (size 4096, parallel) by cost among factor #0 (size 64, parallel) = }}
  // expected-remark @+1 {{tdx-propagate-sharding: computes with factor #1 (size 4096, parallel) sharded on mesh axis "tp"; candidates: no factor (replicated) = }}
  %y = tdx.linear %x2, %w2 : (tensor<64x16xf32>, tensor<4096x16xf32>) -> tensor<64x4096xf32>
  return %y : tensor<64x4096xf32>
}
