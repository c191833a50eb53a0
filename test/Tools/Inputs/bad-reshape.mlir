func.func @f(%x: tensor<4x6xf32>) -> tensor<5x5xf32> {
  %0 = tdx.reshape %x [5, 5] : tensor<4x6xf32> -> tensor<5x5xf32>
  return %0 : tensor<5x5xf32>
}
