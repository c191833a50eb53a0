func.func @forward(%x: tensor<3xf32>) -> tensor<3xi8> {
  %y = tdx.cast %x : tensor<3xf32> to tensor<3xi8>
  return %y : tensor<3xi8>
}
