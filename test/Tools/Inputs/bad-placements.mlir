tdx.mesh @mesh shape = [2] axes = ["tp"]
tdx.parameter @w : tensor<8x8xf32> sharding <@mesh, [Shard(0), Replicate, Replicate]> init {
  %0 = tdx.full 0.0 : tensor<8x8xf32>
  tdx.yield %0 : tensor<8x8xf32>
}
