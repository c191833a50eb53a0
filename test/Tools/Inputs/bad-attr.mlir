tdx.mesh @mesh shape = [2] axes = ["tp"]
func.func @f(%x: tensor<8xf32>) -> tensor<8xf32> {
  %0 = tdx.annotate %x <@mesh, [Shard(0]> : tensor<8xf32>
  return %0 : tensor<8xf32>
}
