tdx.parameter @w : tensor<8x8xf32> init {
  %0 = tdx.normal(0.0, 0.02) seed(0, 0) : tensor<8x