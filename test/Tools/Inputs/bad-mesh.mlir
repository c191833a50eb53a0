func.func @f(%x: tensor<8xf32>) -> tensor<8xf32> {
  %0 = tdx.all_reduce %x on @missing axes = ["tp"] reduce = sum : tensor<8xf32> -> tensor<8xf32>
  return %0 : tensor<8xf32>
}
