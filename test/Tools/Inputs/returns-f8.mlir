func.func @forward(%x: tensor<3xf32>) -> tensor<3xf8E5M2> {
  %y = tdx.cast %x : tensor<3xf32> to tensor<3xf8E5M2>
  return %y : tensor<3xf8E5M2>
}
