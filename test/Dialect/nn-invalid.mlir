// RUN: tdx-opt %s -split-input-file -verify-diagnostics

func.func @matmul_k(%a: tensor<8x16xf32>, %b: tensor<8x4xf32>) {
  // expected-error @+2 {{'tdx.matmul' op contracting dims differ: lhs [8x16] has 16 columns but rhs [8x4] has 8 rows}}
  // expected-error @+1 {{'tdx.matmul' op failed to infer returned types}}
  %0 = tdx.matmul %a, %b : (tensor<8x16xf32>, tensor<8x4xf32>) -> tensor<8x4xf32>
  return
}

// -----

func.func @matmul_batch(%a: tensor<2x8x16xf32>, %b: tensor<3x16x4xf32>) {
  // expected-error @+2 {{'tdx.matmul' op batch dims [2] and [3] do not broadcast}}
  // expected-error @+1 {{'tdx.matmul' op failed to infer returned types}}
  %0 = tdx.matmul %a, %b : (tensor<2x8x16xf32>, tensor<3x16x4xf32>) -> tensor<2x8x4xf32>
  return
}

// -----

func.func @matmul_scalar(%a: tensor<f32>, %b: tensor<4xf32>) {
  // expected-error @+2 {{'tdx.matmul' op needs operands of rank >= 1 (torch.matmul); use 'tdx.mul' to scale by a 0-D tensor}}
  // expected-error @+1 {{'tdx.matmul' op failed to infer returned types}}
  %0 = tdx.matmul %a, %b : (tensor<f32>, tensor<4xf32>) -> tensor<4xf32>
  return
}

// -----

func.func @matmul_dtype(%a: tensor<4x4xf32>, %b: tensor<4x4xbf16>) {
  // expected-error @+2 {{'tdx.matmul' op operands have element types 'f32' and 'bf16'; insert a 'tdx.cast' so both have one dtype}}
  // expected-error @+1 {{'tdx.matmul' op failed to infer returned types}}
  %0 = tdx.matmul %a, %b : (tensor<4x4xf32>, tensor<4x4xbf16>) -> tensor<4x4xf32>
  return
}

// -----

func.func @matmul_result(%a: tensor<2x1x8x16xf32>, %b: tensor<3x16x4xf32>) {
  // expected-error @+2 {{'tdx.matmul' op inferred type(s) 'tensor<2x3x8x4xf32>' are incompatible with return type(s) of operation 'tensor<2x8x4xf32>'}}
  // expected-error @+1 {{'tdx.matmul' op failed to infer returned types}}
  %0 = tdx.matmul %a, %b : (tensor<2x1x8x16xf32>, tensor<3x16x4xf32>) -> tensor<2x8x4xf32>
  return
}

// -----

func.func @linear_features(%x: tensor<2x8xf32>, %w: tensor<32x16xf32>) {
  // expected-error @+2 {{'tdx.linear' op input [2x8] has 8 features but weight [32x16] expects 16}}
  // expected-error @+1 {{'tdx.linear' op failed to infer returned types}}
  %0 = tdx.linear %x, %w : (tensor<2x8xf32>, tensor<32x16xf32>) -> tensor<2x32xf32>
  return
}

// -----

func.func @linear_bias(%x: tensor<2x16xf32>, %w: tensor<32x16xf32>, %b: tensor<16xf32>) {
  // expected-error @+2 {{'tdx.linear' op bias [16] does not broadcast to the output [2x32]}}
  // expected-error @+1 {{'tdx.linear' op failed to infer returned types}}
  %0 = tdx.linear %x, %w, %b : (tensor<2x16xf32>, tensor<32x16xf32>, tensor<16xf32>) -> tensor<2x32xf32>
  return
}

// -----

func.func @linear_weight_rank(%x: tensor<2x16xf32>, %w: tensor<2x32x16xf32>) {
  // expected-error @+2 {{'tdx.linear' op weight must be [out, in] or [in], got [2x32x16]}}
  // expected-error @+1 {{'tdx.linear' op failed to infer returned types}}
  %0 = tdx.linear %x, %w : (tensor<2x16xf32>, tensor<2x32x16xf32>) -> tensor<2x32xf32>
  return
}

// -----

func.func @linear_dtype(%x: tensor<2x16xf32>, %w: tensor<32x16xf16>) {
  // expected-error @+2 {{'tdx.linear' op weight and bias must have the input's element type 'f32'; insert a 'tdx.cast'}}
  // expected-error @+1 {{'tdx.linear' op failed to infer returned types}}
  %0 = tdx.linear %x, %w : (tensor<2x16xf32>, tensor<32x16xf16>) -> tensor<2x32xf32>
  return
}

// -----

func.func @sum_dim(%x: tensor<2x8xf32>) {
  // expected-error @+2 {{'tdx.sum' op reduction dim 2 is out of range for a tensor of rank 2; valid dims are -2 to 1}}
  // expected-error @+1 {{'tdx.sum' op failed to infer returned types}}
  %0 = tdx.sum %x dims = [2] : tensor<2x8xf32> -> tensor<2xf32>
  return
}

// -----

func.func @mean_duplicate(%x: tensor<2x8xf32>) {
  // expected-error @+2 {{'tdx.mean' op reduction dim -1 appears more than once in dims}}
  // expected-error @+1 {{'tdx.mean' op failed to infer returned types}}
  %0 = tdx.mean %x dims = [1, -1] : tensor<2x8xf32> -> tensor<2xf32>
  return
}

// -----

func.func @mean_int(%x: tensor<2x8xi64>) {
  // expected-error @+1 {{'tdx.mean' op operand #0 must be ranked tensor of floating-point values, but got 'tensor<2x8xi64>'}}
  %0 = tdx.mean %x dims = [1] : tensor<2x8xi64> -> tensor<2xi64>
  return
}

// -----

func.func @max_keepdim(%x: tensor<2x8xf32>) {
  // expected-error @+2 {{'tdx.max' op inferred type(s) 'tensor<2x1xf32>' are incompatible with return type(s) of operation 'tensor<2xf32>'}}
  // expected-error @+1 {{'tdx.max' op failed to infer returned types}}
  %0 = tdx.max %x dims = [1] keepdim : tensor<2x8xf32> -> tensor<2xf32>
  return
}

// -----

func.func @softmax_dim(%x: tensor<2x8xf32>) {
  // expected-error @+1 {{'tdx.softmax' op dim 2 is out of range for a tensor of rank 2; valid dims are -2 to 1}}
  %0 = tdx.softmax %x dim = 2 : tensor<2x8xf32>
  return
}

// -----

func.func @log_softmax_dim(%x: tensor<2x8xf32>) {
  // expected-error @+1 {{'tdx.log_softmax' op dim -3 is out of range}}
  %0 = tdx.log_softmax %x dim = -3 : tensor<2x8xf32>
  return
}

// -----

func.func @layer_norm_shape(%x: tensor<2x8x16xf32>) {
  // expected-error @+2 {{'tdx.layer_norm' op normalized_shape [8] must equal the trailing dims of the input [2x8x16]}}
  // expected-error @+1 {{'tdx.layer_norm' op failed to infer returned types}}
  %0 = tdx.layer_norm %x normalized_shape = [8] eps = 1.0e-5 : (tensor<2x8x16xf32>) -> tensor<2x8x16xf32>
  return
}

// -----

func.func @layer_norm_weight(%x: tensor<2x16xf32>, %w: tensor<8xf32>) {
  // expected-error @+2 {{'tdx.layer_norm' op weight and bias must be 'tensor<16xf32>', got 'tensor<8xf32>'}}
  // expected-error @+1 {{'tdx.layer_norm' op failed to infer returned types}}
  %0 = tdx.layer_norm %x weight %w normalized_shape = [16] eps = 1.0e-5 : (tensor<2x16xf32>, tensor<8xf32>) -> tensor<2x16xf32>
  return
}

// -----

func.func @layer_norm_eps(%x: tensor<2x16xf32>) {
  // expected-error @+2 {{'tdx.layer_norm' op eps must be >= 0, got -1}}
  // expected-error @+1 {{'tdx.layer_norm' op failed to infer returned types}}
  %0 = tdx.layer_norm %x normalized_shape = [16] eps = -1.0 : (tensor<2x16xf32>) -> tensor<2x16xf32>
  return
}

// -----

func.func @rms_norm_rank(%x: tensor<16xf32>) {
  // expected-error @+2 {{'tdx.rms_norm' op normalized_shape [4x16] has more dims than the input [16]}}
  // expected-error @+1 {{'tdx.rms_norm' op failed to infer returned types}}
  %0 = tdx.rms_norm %x normalized_shape = [4, 16] eps = 1.0e-6 : (tensor<16xf32>) -> tensor<16xf32>
  return
}

// -----

func.func @rms_norm_empty(%x: tensor<16xf32>) {
  // expected-error @+2 {{'tdx.rms_norm' op normalized_shape must name at least one dim}}
  // expected-error @+1 {{'tdx.rms_norm' op failed to infer returned types}}
  %0 = tdx.rms_norm %x normalized_shape = [] eps = 1.0e-6 : (tensor<16xf32>) -> tensor<16xf32>
  return
}

// -----

func.func @embedding_weight(%w: tensor<100xf32>, %i: tensor<4xi64>) {
  // expected-error @+2 {{'tdx.embedding' op weight must be [num_embeddings, dim], got [100]}}
  // expected-error @+1 {{'tdx.embedding' op failed to infer returned types}}
  %0 = tdx.embedding %w, %i : (tensor<100xf32>, tensor<4xi64>) -> tensor<4xf32>
  return
}

// -----

func.func @embedding_float_index(%w: tensor<100x16xf32>, %i: tensor<4xf32>) {
  // expected-error @+1 {{'tdx.embedding' op operand #1 must be ranked tensor of signless integer values, but got 'tensor<4xf32>'}}
  %0 = tdx.embedding %w, %i : (tensor<100x16xf32>, tensor<4xf32>) -> tensor<4x16xf32>
  return
}

// -----

func.func @embedding_padding(%w: tensor<100x16xf32>, %i: tensor<4xi64>) {
  // expected-error @+2 {{'tdx.embedding' op padding_idx 100 is out of range for 100 embeddings}}
  // expected-error @+1 {{'tdx.embedding' op failed to infer returned types}}
  %0 = tdx.embedding %w, %i padding_idx = 100 : (tensor<100x16xf32>, tensor<4xi64>) -> tensor<4x16xf32>
  return
}

// -----

func.func @cross_entropy_target(%x: tensor<16x100xf32>, %t: tensor<8xi64>) {
  // expected-error @+2 {{'tdx.cross_entropy' op class-index target [8] must be [16] for input [16x100]}}
  // expected-error @+1 {{'tdx.cross_entropy' op failed to infer returned types}}
  %0 = tdx.cross_entropy %x, %t reduction = mean : (tensor<16x100xf32>, tensor<8xi64>) -> tensor<f32>
  return
}

// -----

func.func @cross_entropy_probs(%x: tensor<16x100xf32>, %t: tensor<16x10xf32>) {
  // expected-error @+2 {{'tdx.cross_entropy' op probability targets must have the input's type 'tensor<16x100xf32>', got 'tensor<16x10xf32>'}}
  // expected-error @+1 {{'tdx.cross_entropy' op failed to infer returned types}}
  %0 = tdx.cross_entropy %x, %t reduction = mean : (tensor<16x100xf32>, tensor<16x10xf32>) -> tensor<f32>
  return
}

// -----

func.func @cross_entropy_reduction(%x: tensor<16x100xf32>, %t: tensor<16xi64>) {
  // expected-error @+2 {{'tdx.cross_entropy' op inferred type(s) 'tensor<f32>' are incompatible with return type(s) of operation 'tensor<16xf32>'}}
  // expected-error @+1 {{'tdx.cross_entropy' op failed to infer returned types}}
  %0 = tdx.cross_entropy %x, %t reduction = mean : (tensor<16x100xf32>, tensor<16xi64>) -> tensor<16xf32>
  return
}

// -----

func.func @cross_entropy_smoothing(%x: tensor<16x100xf32>, %t: tensor<16xi64>) {
  // expected-error @+1 {{'tdx.cross_entropy' op label_smoothing 2 must be in [0, 1]}}
  %0 = tdx.cross_entropy %x, %t reduction = mean {label_smoothing = 2.0 : f64} : (tensor<16x100xf32>, tensor<16xi64>) -> tensor<f32>
  return
}

// -----

func.func @cross_entropy_bad_reduction(%x: tensor<16x100xf32>, %t: tensor<16xi64>) {
  // expected-error @+1 {{expected string or keyword containing one of the following enum values for attribute 'reduction' [none, mean, sum]}}
  %0 = tdx.cross_entropy %x, %t reduction = avg : (tensor<16x100xf32>, tensor<16xi64>) -> tensor<f32>
  return
}

// -----

func.func @sdpa_rank(%q: tensor<4x8x16xf32>) {
  // expected-error @+2 {{'tdx.sdpa' op query, key and value must be [batch, heads, seq, dim], got [4x8x16], [4x8x16], [4x8x16]}}
  // expected-error @+1 {{'tdx.sdpa' op failed to infer returned types}}
  %o, %l = tdx.sdpa %q, %q, %q : (tensor<4x8x16xf32>, tensor<4x8x16xf32>, tensor<4x8x16xf32>) -> (tensor<4x8x16xf32>, tensor<4x8xf32>)
  return
}

// -----

func.func @sdpa_heads(%q: tensor<2x4x8x16xf32>, %k: tensor<2x3x8x16xf32>) {
  // expected-error @+2 {{'tdx.sdpa' op key's 3 heads must divide query's 4 (grouped-query attention)}}
  // expected-error @+1 {{'tdx.sdpa' op failed to infer returned types}}
  %o, %l = tdx.sdpa %q, %k, %k : (tensor<2x4x8x16xf32>, tensor<2x3x8x16xf32>, tensor<2x3x8x16xf32>) -> (tensor<2x4x8x16xf32>, tensor<2x4x8xf32>)
  return
}

// -----

func.func @sdpa_key(%q: tensor<2x4x8x16xf32>, %k: tensor<2x4x8x8xf32>) {
  // expected-error @+2 {{'tdx.sdpa' op key [2x4x8x8] and value [2x4x8x8] do not fit query [2x4x8x16]}}
  // expected-error @+1 {{'tdx.sdpa' op failed to infer returned types}}
  %o, %l = tdx.sdpa %q, %k, %k : (tensor<2x4x8x16xf32>, tensor<2x4x8x8xf32>, tensor<2x4x8x8xf32>) -> (tensor<2x4x8x16xf32>, tensor<2x4x8xf32>)
  return
}

// -----

func.func @sdpa_mask(%q: tensor<2x4x8x16xf32>, %m: tensor<8x5xf32>) {
  // expected-error @+2 {{'tdx.sdpa' op attn_mask [8x5] does not broadcast to [2x4x8x8]}}
  // expected-error @+1 {{'tdx.sdpa' op failed to infer returned types}}
  %o, %l = tdx.sdpa %q, %q, %q mask %m : (tensor<2x4x8x16xf32>, tensor<2x4x8x16xf32>, tensor<2x4x8x16xf32>, tensor<8x5xf32>) -> (tensor<2x4x8x16xf32>, tensor<2x4x8xf32>)
  return
}
