func.func @f(%w: tensor<100xf32>, %i: tensor<4xi64>) -> tensor<4xf32> {
  %0 = tdx.embedding %w, %i : (tensor<100xf32>, tensor<4xi64>) -> tensor<4xf32>
  return %0 : tensor<4xf32>
}
