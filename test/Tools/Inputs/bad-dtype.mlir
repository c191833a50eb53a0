func.func @f(%a: tensor<8xf32>, %b: tensor<8xbf16>) -> tensor<8xf32> {
  %0 = tdx.add %a, %b : (tensor<8xf32>, tensor<8xbf16>) -> tensor<8xf32>
  return %0 : tensor<8xf32>
}
