// A GPT-2-style decoder (2 layers, d_model 32, 4 heads, vocab 128, context 8) in the
// tdx dialect, global view: every parameter and buffer with its init program, and
// the forward pass over token ids [batch 2, seq 8]. lm_head is tied to wte as in GPT-2.
// The weights follow GPT-2's _init_weights: normal(0, 0.02) for linear and embedding
// weights, zeros for biases, ones/zeros for LayerNorm. Every random op has its own
// (seed, stream).

tdx.mesh @mesh shape = [2, 2] axes = ["dp", "tp"]

tdx.parameter @"wte.weight" : tensor<128x32xf32> init {
  %0 = tdx.normal(0.0, 0.02) seed(0, 0) : tensor<128x32xf32>
  tdx.yield %0 : tensor<128x32xf32>
}
tdx.parameter @"wpe.weight" : tensor<8x32xf32> init {
  %0 = tdx.normal(0.0, 0.01) seed(0, 1) : tensor<8x32xf32>
  tdx.yield %0 : tensor<8x32xf32>
}
tdx.parameter @"h.0.ln_1.weight" : tensor<32xf32> init {
  %0 = tdx.full 1.0 : tensor<32xf32>
  tdx.yield %0 : tensor<32xf32>
}
tdx.parameter @"h.0.ln_1.bias" : tensor<32xf32> init {
  %0 = tdx.full 0.0 : tensor<32xf32>
  tdx.yield %0 : tensor<32xf32>
}
tdx.parameter @"h.0.attn.c_attn.weight" : tensor<96x32xf32> init {
  %0 = tdx.normal(0.0, 0.02) seed(0, 2) : tensor<96x32xf32>
  tdx.yield %0 : tensor<96x32xf32>
}
tdx.parameter @"h.0.attn.c_attn.bias" : tensor<96xf32> init {
  %0 = tdx.full 0.0 : tensor<96xf32>
  tdx.yield %0 : tensor<96xf32>
}
tdx.parameter @"h.0.attn.c_proj.weight" : tensor<32x32xf32> init {
  %0 = tdx.normal(0.0, 0.01) seed(0, 3) : tensor<32x32xf32>
  tdx.yield %0 : tensor<32x32xf32>
}
tdx.parameter @"h.0.attn.c_proj.bias" : tensor<32xf32> init {
  %0 = tdx.full 0.0 : tensor<32xf32>
  tdx.yield %0 : tensor<32xf32>
}
tdx.parameter @"h.0.ln_2.weight" : tensor<32xf32> init {
  %0 = tdx.full 1.0 : tensor<32xf32>
  tdx.yield %0 : tensor<32xf32>
}
tdx.parameter @"h.0.ln_2.bias" : tensor<32xf32> init {
  %0 = tdx.full 0.0 : tensor<32xf32>
  tdx.yield %0 : tensor<32xf32>
}
tdx.parameter @"h.0.mlp.c_fc.weight" : tensor<128x32xf32> init {
  %0 = tdx.normal(0.0, 0.02) seed(0, 4) : tensor<128x32xf32>
  tdx.yield %0 : tensor<128x32xf32>
}
tdx.parameter @"h.0.mlp.c_fc.bias" : tensor<128xf32> init {
  %0 = tdx.full 0.0 : tensor<128xf32>
  tdx.yield %0 : tensor<128xf32>
}
tdx.parameter @"h.0.mlp.c_proj.weight" : tensor<32x128xf32> init {
  %0 = tdx.normal(0.0, 0.01) seed(0, 5) : tensor<32x128xf32>
  tdx.yield %0 : tensor<32x128xf32>
}
tdx.parameter @"h.0.mlp.c_proj.bias" : tensor<32xf32> init {
  %0 = tdx.full 0.0 : tensor<32xf32>
  tdx.yield %0 : tensor<32xf32>
}
tdx.parameter @"h.1.ln_1.weight" : tensor<32xf32> init {
  %0 = tdx.full 1.0 : tensor<32xf32>
  tdx.yield %0 : tensor<32xf32>
}
tdx.parameter @"h.1.ln_1.bias" : tensor<32xf32> init {
  %0 = tdx.full 0.0 : tensor<32xf32>
  tdx.yield %0 : tensor<32xf32>
}
tdx.parameter @"h.1.attn.c_attn.weight" : tensor<96x32xf32> init {
  %0 = tdx.normal(0.0, 0.02) seed(0, 6) : tensor<96x32xf32>
  tdx.yield %0 : tensor<96x32xf32>
}
tdx.parameter @"h.1.attn.c_attn.bias" : tensor<96xf32> init {
  %0 = tdx.full 0.0 : tensor<96xf32>
  tdx.yield %0 : tensor<96xf32>
}
tdx.parameter @"h.1.attn.c_proj.weight" : tensor<32x32xf32> init {
  %0 = tdx.normal(0.0, 0.01) seed(0, 7) : tensor<32x32xf32>
  tdx.yield %0 : tensor<32x32xf32>
}
tdx.parameter @"h.1.attn.c_proj.bias" : tensor<32xf32> init {
  %0 = tdx.full 0.0 : tensor<32xf32>
  tdx.yield %0 : tensor<32xf32>
}
tdx.parameter @"h.1.ln_2.weight" : tensor<32xf32> init {
  %0 = tdx.full 1.0 : tensor<32xf32>
  tdx.yield %0 : tensor<32xf32>
}
tdx.parameter @"h.1.ln_2.bias" : tensor<32xf32> init {
  %0 = tdx.full 0.0 : tensor<32xf32>
  tdx.yield %0 : tensor<32xf32>
}
tdx.parameter @"h.1.mlp.c_fc.weight" : tensor<128x32xf32> init {
  %0 = tdx.normal(0.0, 0.02) seed(0, 8) : tensor<128x32xf32>
  tdx.yield %0 : tensor<128x32xf32>
}
tdx.parameter @"h.1.mlp.c_fc.bias" : tensor<128xf32> init {
  %0 = tdx.full 0.0 : tensor<128xf32>
  tdx.yield %0 : tensor<128xf32>
}
tdx.parameter @"h.1.mlp.c_proj.weight" : tensor<32x128xf32> init {
  %0 = tdx.normal(0.0, 0.01) seed(0, 9) : tensor<32x128xf32>
  tdx.yield %0 : tensor<32x128xf32>
}
tdx.parameter @"h.1.mlp.c_proj.bias" : tensor<32xf32> init {
  %0 = tdx.full 0.0 : tensor<32xf32>
  tdx.yield %0 : tensor<32xf32>
}
tdx.parameter @"ln_f.weight" : tensor<32xf32> init {
  %0 = tdx.full 1.0 : tensor<32xf32>
  tdx.yield %0 : tensor<32xf32>
}
tdx.parameter @"ln_f.bias" : tensor<32xf32> init {
  %0 = tdx.full 0.0 : tensor<32xf32>
  tdx.yield %0 : tensor<32xf32>
}
tdx.parameter @"lm_head.weight" : tensor<128x32xf32> tied_to @"wte.weight"

// The causal mask: 0 where a position may attend, -inf above the diagonal.
tdx.buffer @"attn.mask" : tensor<8x8xf32> init {
  %i = tdx.arange start 0.0 end 8.0 step 1.0 : tensor<8xi64>
  %row = tdx.reshape %i [8, 1] : tensor<8xi64> -> tensor<8x1xi64>
  %col = tdx.reshape %i [1, 8] : tensor<8xi64> -> tensor<1x8xi64>
  %above = tdx.cmp gt, %col, %row : (tensor<1x8xi64>, tensor<8x1xi64>) -> tensor<8x8xi1>
  %ninf = tdx.full 0xFFF0000000000000 : tensor<f32>
  %zero = tdx.full 0.0 : tensor<f32>
  %mask = tdx.where %above, %ninf, %zero : (tensor<8x8xi1>, tensor<f32>, tensor<f32>) -> tensor<8x8xf32>
  tdx.yield %mask : tensor<8x8xf32>
}

func.func @forward(%ids: tensor<2x8xi64>) -> tensor<2x8x128xf32> {
  %1 = tdx.param_ref @"wte.weight" : tensor<128x32xf32>
  %2 = tdx.embedding %1, %ids : (tensor<128x32xf32>, tensor<2x8xi64>) -> tensor<2x8x32xf32>
  %3 = tdx.param_ref @"wpe.weight" : tensor<8x32xf32>
  %4 = tdx.add %2, %3 : (tensor<2x8x32xf32>, tensor<8x32xf32>) -> tensor<2x8x32xf32>
  %5 = tdx.param_ref @"attn.mask" : tensor<8x8xf32>
  %6 = tdx.full 0.3535533905932738 : tensor<f32>
  // block 0: attention
  %7 = tdx.param_ref @"h.0.ln_1.weight" : tensor<32xf32>
  %8 = tdx.param_ref @"h.0.ln_1.bias" : tensor<32xf32>
  %9 = tdx.layer_norm %4 weight %7 bias %8 normalized_shape = [32] eps = 1.0e-5 : (tensor<2x8x32xf32>, tensor<32xf32>, tensor<32xf32>) -> tensor<2x8x32xf32>
  %10 = tdx.param_ref @"h.0.attn.c_attn.weight" : tensor<96x32xf32>
  %11 = tdx.param_ref @"h.0.attn.c_attn.bias" : tensor<96xf32>
  %12 = tdx.linear %9, %10, %11 : (tensor<2x8x32xf32>, tensor<96x32xf32>, tensor<96xf32>) -> tensor<2x8x96xf32>
  %13 = tdx.slice %12 dim 2 [0 : 32 : 1] : tensor<2x8x96xf32> -> tensor<2x8x32xf32>
  %14 = tdx.reshape %13 [2, 8, 4, 8] : tensor<2x8x32xf32> -> tensor<2x8x4x8xf32>
  %15 = tdx.permute %14 [0, 2, 1, 3] : tensor<2x8x4x8xf32> -> tensor<2x4x8x8xf32>
  %16 = tdx.slice %12 dim 2 [32 : 64 : 1] : tensor<2x8x96xf32> -> tensor<2x8x32xf32>
  %17 = tdx.reshape %16 [2, 8, 4, 8] : tensor<2x8x32xf32> -> tensor<2x8x4x8xf32>
  %18 = tdx.permute %17 [0, 2, 1, 3] : tensor<2x8x4x8xf32> -> tensor<2x4x8x8xf32>
  %19 = tdx.slice %12 dim 2 [64 : 96 : 1] : tensor<2x8x96xf32> -> tensor<2x8x32xf32>
  %20 = tdx.reshape %19 [2, 8, 4, 8] : tensor<2x8x32xf32> -> tensor<2x8x4x8xf32>
  %21 = tdx.permute %20 [0, 2, 1, 3] : tensor<2x8x4x8xf32> -> tensor<2x4x8x8xf32>
  %22 = tdx.transpose %18 -2, -1 : tensor<2x4x8x8xf32> -> tensor<2x4x8x8xf32>
  %23 = tdx.matmul %15, %22 : (tensor<2x4x8x8xf32>, tensor<2x4x8x8xf32>) -> tensor<2x4x8x8xf32>
  %24 = tdx.mul %23, %6 : (tensor<2x4x8x8xf32>, tensor<f32>) -> tensor<2x4x8x8xf32>
  %25 = tdx.add %24, %5 : (tensor<2x4x8x8xf32>, tensor<8x8xf32>) -> tensor<2x4x8x8xf32>
  %26 = tdx.softmax %25 dim = -1 : tensor<2x4x8x8xf32>
  %27 = tdx.matmul %26, %21 : (tensor<2x4x8x8xf32>, tensor<2x4x8x8xf32>) -> tensor<2x4x8x8xf32>
  %28 = tdx.permute %27 [0, 2, 1, 3] : tensor<2x4x8x8xf32> -> tensor<2x8x4x8xf32>
  %29 = tdx.reshape %28 [2, 8, 32] : tensor<2x8x4x8xf32> -> tensor<2x8x32xf32>
  %30 = tdx.param_ref @"h.0.attn.c_proj.weight" : tensor<32x32xf32>
  %31 = tdx.param_ref @"h.0.attn.c_proj.bias" : tensor<32xf32>
  %32 = tdx.linear %29, %30, %31 : (tensor<2x8x32xf32>, tensor<32x32xf32>, tensor<32xf32>) -> tensor<2x8x32xf32>
  %33 = tdx.add %4, %32 : (tensor<2x8x32xf32>, tensor<2x8x32xf32>) -> tensor<2x8x32xf32>
  // block 0: MLP
  %34 = tdx.param_ref @"h.0.ln_2.weight" : tensor<32xf32>
  %35 = tdx.param_ref @"h.0.ln_2.bias" : tensor<32xf32>
  %36 = tdx.layer_norm %33 weight %34 bias %35 normalized_shape = [32] eps = 1.0e-5 : (tensor<2x8x32xf32>, tensor<32xf32>, tensor<32xf32>) -> tensor<2x8x32xf32>
  %37 = tdx.param_ref @"h.0.mlp.c_fc.weight" : tensor<128x32xf32>
  %38 = tdx.param_ref @"h.0.mlp.c_fc.bias" : tensor<128xf32>
  %39 = tdx.linear %36, %37, %38 : (tensor<2x8x32xf32>, tensor<128x32xf32>, tensor<128xf32>) -> tensor<2x8x128xf32>
  %40 = tdx.gelu %39 approximate = tanh : tensor<2x8x128xf32>
  %41 = tdx.param_ref @"h.0.mlp.c_proj.weight" : tensor<32x128xf32>
  %42 = tdx.param_ref @"h.0.mlp.c_proj.bias" : tensor<32xf32>
  %43 = tdx.linear %40, %41, %42 : (tensor<2x8x128xf32>, tensor<32x128xf32>, tensor<32xf32>) -> tensor<2x8x32xf32>
  %44 = tdx.add %33, %43 : (tensor<2x8x32xf32>, tensor<2x8x32xf32>) -> tensor<2x8x32xf32>
  // block 1: attention
  %45 = tdx.param_ref @"h.1.ln_1.weight" : tensor<32xf32>
  %46 = tdx.param_ref @"h.1.ln_1.bias" : tensor<32xf32>
  %47 = tdx.layer_norm %44 weight %45 bias %46 normalized_shape = [32] eps = 1.0e-5 : (tensor<2x8x32xf32>, tensor<32xf32>, tensor<32xf32>) -> tensor<2x8x32xf32>
  %48 = tdx.param_ref @"h.1.attn.c_attn.weight" : tensor<96x32xf32>
  %49 = tdx.param_ref @"h.1.attn.c_attn.bias" : tensor<96xf32>
  %50 = tdx.linear %47, %48, %49 : (tensor<2x8x32xf32>, tensor<96x32xf32>, tensor<96xf32>) -> tensor<2x8x96xf32>
  %51 = tdx.slice %50 dim 2 [0 : 32 : 1] : tensor<2x8x96xf32> -> tensor<2x8x32xf32>
  %52 = tdx.reshape %51 [2, 8, 4, 8] : tensor<2x8x32xf32> -> tensor<2x8x4x8xf32>
  %53 = tdx.permute %52 [0, 2, 1, 3] : tensor<2x8x4x8xf32> -> tensor<2x4x8x8xf32>
  %54 = tdx.slice %50 dim 2 [32 : 64 : 1] : tensor<2x8x96xf32> -> tensor<2x8x32xf32>
  %55 = tdx.reshape %54 [2, 8, 4, 8] : tensor<2x8x32xf32> -> tensor<2x8x4x8xf32>
  %56 = tdx.permute %55 [0, 2, 1, 3] : tensor<2x8x4x8xf32> -> tensor<2x4x8x8xf32>
  %57 = tdx.slice %50 dim 2 [64 : 96 : 1] : tensor<2x8x96xf32> -> tensor<2x8x32xf32>
  %58 = tdx.reshape %57 [2, 8, 4, 8] : tensor<2x8x32xf32> -> tensor<2x8x4x8xf32>
  %59 = tdx.permute %58 [0, 2, 1, 3] : tensor<2x8x4x8xf32> -> tensor<2x4x8x8xf32>
  %60 = tdx.transpose %56 -2, -1 : tensor<2x4x8x8xf32> -> tensor<2x4x8x8xf32>
  %61 = tdx.matmul %53, %60 : (tensor<2x4x8x8xf32>, tensor<2x4x8x8xf32>) -> tensor<2x4x8x8xf32>
  %62 = tdx.mul %61, %6 : (tensor<2x4x8x8xf32>, tensor<f32>) -> tensor<2x4x8x8xf32>
  %63 = tdx.add %62, %5 : (tensor<2x4x8x8xf32>, tensor<8x8xf32>) -> tensor<2x4x8x8xf32>
  %64 = tdx.softmax %63 dim = -1 : tensor<2x4x8x8xf32>
  %65 = tdx.matmul %64, %59 : (tensor<2x4x8x8xf32>, tensor<2x4x8x8xf32>) -> tensor<2x4x8x8xf32>
  %66 = tdx.permute %65 [0, 2, 1, 3] : tensor<2x4x8x8xf32> -> tensor<2x8x4x8xf32>
  %67 = tdx.reshape %66 [2, 8, 32] : tensor<2x8x4x8xf32> -> tensor<2x8x32xf32>
  %68 = tdx.param_ref @"h.1.attn.c_proj.weight" : tensor<32x32xf32>
  %69 = tdx.param_ref @"h.1.attn.c_proj.bias" : tensor<32xf32>
  %70 = tdx.linear %67, %68, %69 : (tensor<2x8x32xf32>, tensor<32x32xf32>, tensor<32xf32>) -> tensor<2x8x32xf32>
  %71 = tdx.add %44, %70 : (tensor<2x8x32xf32>, tensor<2x8x32xf32>) -> tensor<2x8x32xf32>
  // block 1: MLP
  %72 = tdx.param_ref @"h.1.ln_2.weight" : tensor<32xf32>
  %73 = tdx.param_ref @"h.1.ln_2.bias" : tensor<32xf32>
  %74 = tdx.layer_norm %71 weight %72 bias %73 normalized_shape = [32] eps = 1.0e-5 : (tensor<2x8x32xf32>, tensor<32xf32>, tensor<32xf32>) -> tensor<2x8x32xf32>
  %75 = tdx.param_ref @"h.1.mlp.c_fc.weight" : tensor<128x32xf32>
  %76 = tdx.param_ref @"h.1.mlp.c_fc.bias" : tensor<128xf32>
  %77 = tdx.linear %74, %75, %76 : (tensor<2x8x32xf32>, tensor<128x32xf32>, tensor<128xf32>) -> tensor<2x8x128xf32>
  %78 = tdx.gelu %77 approximate = tanh : tensor<2x8x128xf32>
  %79 = tdx.param_ref @"h.1.mlp.c_proj.weight" : tensor<32x128xf32>
  %80 = tdx.param_ref @"h.1.mlp.c_proj.bias" : tensor<32xf32>
  %81 = tdx.linear %78, %79, %80 : (tensor<2x8x128xf32>, tensor<32x128xf32>, tensor<32xf32>) -> tensor<2x8x32xf32>
  %82 = tdx.add %71, %81 : (tensor<2x8x32xf32>, tensor<2x8x32xf32>) -> tensor<2x8x32xf32>
  %83 = tdx.param_ref @"ln_f.weight" : tensor<32xf32>
  %84 = tdx.param_ref @"ln_f.bias" : tensor<32xf32>
  %85 = tdx.layer_norm %82 weight %83 bias %84 normalized_shape = [32] eps = 1.0e-5 : (tensor<2x8x32xf32>, tensor<32xf32>, tensor<32xf32>) -> tensor<2x8x32xf32>
  %86 = tdx.param_ref @"lm_head.weight" : tensor<128x32xf32>
  %87 = tdx.linear %85, %86 : (tensor<2x8x32xf32>, tensor<128x32xf32>) -> tensor<2x8x128xf32>
  return %87 : tensor<2x8x128xf32>
}
