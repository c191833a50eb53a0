// RUN: tdx-opt %s -verify-diagnostics --tdx-propagate-sharding="bandwidth=1e9,2e9,3e9"

// expected-error @+1 {{the 'bandwidth' option has 3 values but mesh @mesh has 2 axes; give one per axis or one for all}}
tdx.mesh @mesh shape = [2, 2] axes = ["dp", "tp"]
func.func @f(%x: tensor<8xf32>) -> tensor<8xf32> {
  %xs = tdx.annotate %x <@mesh, [Shard(0), Replicate]> : tensor<8xf32>
  return %xs : tensor<8xf32>
}
