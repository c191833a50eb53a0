// A GPT-style decoder (2 layers, d_model 32, 4 heads, vocab 128) placed on a
// 2x2 mesh: the batch over "dp", Megatron tensor parallelism over "tp"
// (q, k, v and the MLP's first linear split by output features, the attention
// output and the MLP's second linear by input features). Only the token ids
// and the parameters carry placements; tdx-propagate-sharding places the rest.
//
//   tdx-opt examples/gpt-2x2.mlir --tdx-propagate-sharding \
//       --tdx-insert-collectives --tdx-partition --tdx-comm-report
tdx.mesh @mesh shape = [2, 2] axes = ["dp", "tp"]
tdx.parameter @"wte" : tensor<128x32xf32> sharding <@mesh, [Replicate, Replicate]> init {
  %0 = tdx.normal(0.0, 0.02) seed(0, 0) : tensor<128x32xf32>
  tdx.yield %0 : tensor<128x32xf32>
}
tdx.parameter @"h.0.ln1.w" : tensor<32xf32> sharding <@mesh, [Replicate, Replicate]> init {
  %0 = tdx.full 1.0 : tensor<32xf32>
  tdx.yield %0 : tensor<32xf32>
}
tdx.parameter @"h.0.ln1.b" : tensor<32xf32> sharding <@mesh, [Replicate, Replicate]> init {
  %0 = tdx.full 0.0 : tensor<32xf32>
  tdx.yield %0 : tensor<32xf32>
}
tdx.parameter @"h.0.attn.wq" : tensor<32x32xf32> sharding <@mesh, [Replicate, Shard(0)]> init {
  %0 = tdx.normal(0.0, 0.02) seed(0, 1) : tensor<32x32xf32>
  tdx.yield %0 : tensor<32x32xf32>
}
tdx.parameter @"h.0.attn.wk" : tensor<32x32xf32> sharding <@mesh, [Replicate, Shard(0)]> init {
  %0 = tdx.normal(0.0, 0.02) seed(0, 2) : tensor<32x32xf32>
  tdx.yield %0 : tensor<32x32xf32>
}
tdx.parameter @"h.0.attn.wv" : tensor<32x32xf32> sharding <@mesh, [Replicate, Shard(0)]> init {
  %0 = tdx.normal(0.0, 0.02) seed(0, 3) : tensor<32x32xf32>
  tdx.yield %0 : tensor<32x32xf32>
}
tdx.parameter @"h.0.attn.wo" : tensor<32x32xf32> sharding <@mesh, [Replicate, Shard(1)]> init {
  %0 = tdx.normal(0.0, 0.02) seed(0, 4) : tensor<32x32xf32>
  tdx.yield %0 : tensor<32x32xf32>
}
tdx.parameter @"h.0.ln2.w" : tensor<32xf32> sharding <@mesh, [Replicate, Replicate]> init {
  %0 = tdx.full 1.0 : tensor<32xf32>
  tdx.yield %0 : tensor<32xf32>
}
tdx.parameter @"h.0.ln2.b" : tensor<32xf32> sharding <@mesh, [Replicate, Replicate]> init {
  %0 = tdx.full 0.0 : tensor<32xf32>
  tdx.yield %0 : tensor<32xf32>
}
tdx.parameter @"h.0.mlp.fc" : tensor<128x32xf32> sharding <@mesh, [Replicate, Shard(0)]> init {
  %0 = tdx.normal(0.0, 0.02) seed(0, 5) : tensor<128x32xf32>
  tdx.yield %0 : tensor<128x32xf32>
}
tdx.parameter @"h.0.mlp.proj" : tensor<32x128xf32> sharding <@mesh, [Replicate, Shard(1)]> init {
  %0 = tdx.normal(0.0, 0.02) seed(0, 6) : tensor<32x128xf32>
  tdx.yield %0 : tensor<32x128xf32>
}
tdx.parameter @"h.1.ln1.w" : tensor<32xf32> sharding <@mesh, [Replicate, Replicate]> init {
  %0 = tdx.full 1.0 : tensor<32xf32>
  tdx.yield %0 : tensor<32xf32>
}
tdx.parameter @"h.1.ln1.b" : tensor<32xf32> sharding <@mesh, [Replicate, Replicate]> init {
  %0 = tdx.full 0.0 : tensor<32xf32>
  tdx.yield %0 : tensor<32xf32>
}
tdx.parameter @"h.1.attn.wq" : tensor<32x32xf32> sharding <@mesh, [Replicate, Shard(0)]> init {
  %0 = tdx.normal(0.0, 0.02) seed(0, 7) : tensor<32x32xf32>
  tdx.yield %0 : tensor<32x32xf32>
}
tdx.parameter @"h.1.attn.wk" : tensor<32x32xf32> sharding <@mesh, [Replicate, Shard(0)]> init {
  %0 = tdx.normal(0.0, 0.02) seed(0, 8) : tensor<32x32xf32>
  tdx.yield %0 : tensor<32x32xf32>
}
tdx.parameter @"h.1.attn.wv" : tensor<32x32xf32> sharding <@mesh, [Replicate, Shard(0)]> init {
  %0 = tdx.normal(0.0, 0.02) seed(0, 9) : tensor<32x32xf32>
  tdx.yield %0 : tensor<32x32xf32>
}
tdx.parameter @"h.1.attn.wo" : tensor<32x32xf32> sharding <@mesh, [Replicate, Shard(1)]> init {
  %0 = tdx.normal(0.0, 0.02) seed(0, 10) : tensor<32x32xf32>
  tdx.yield %0 : tensor<32x32xf32>
}
tdx.parameter @"h.1.ln2.w" : tensor<32xf32> sharding <@mesh, [Replicate, Replicate]> init {
  %0 = tdx.full 1.0 : tensor<32xf32>
  tdx.yield %0 : tensor<32xf32>
}
tdx.parameter @"h.1.ln2.b" : tensor<32xf32> sharding <@mesh, [Replicate, Replicate]> init {
  %0 = tdx.full 0.0 : tensor<32xf32>
  tdx.yield %0 : tensor<32xf32>
}
tdx.parameter @"h.1.mlp.fc" : tensor<128x32xf32> sharding <@mesh, [Replicate, Shard(0)]> init {
  %0 = tdx.normal(0.0, 0.02) seed(0, 11) : tensor<128x32xf32>
  tdx.yield %0 : tensor<128x32xf32>
}
tdx.parameter @"h.1.mlp.proj" : tensor<32x128xf32> sharding <@mesh, [Replicate, Shard(1)]> init {
  %0 = tdx.normal(0.0, 0.02) seed(0, 12) : tensor<32x128xf32>
  tdx.yield %0 : tensor<32x128xf32>
}
func.func @forward(%ids: tensor<4x8xi64>) -> tensor<4x8x128xf32> {
  %v1 = tdx.annotate %ids <@mesh, [Shard(0), Replicate]> : tensor<4x8xi64>
  %v2 = tdx.param_ref @"wte" : tensor<128x32xf32>
  %v3 = tdx.embedding %v2, %v1 : (tensor<128x32xf32>, tensor<4x8xi64>) -> tensor<4x8x32xf32>
  %v4 = tdx.param_ref @"h.0.ln1.w" : tensor<32xf32>
  %v5 = tdx.param_ref @"h.0.ln1.b" : tensor<32xf32>
  %v6 = tdx.layer_norm %v3 weight %v4 bias %v5 normalized_shape = [32] eps = 1.0e-5 : (tensor<4x8x32xf32>, tensor<32xf32>, tensor<32xf32>) -> tensor<4x8x32xf32>
  %v7 = tdx.param_ref @"h.0.attn.wq" : tensor<32x32xf32>
  %v8 = tdx.linear %v6, %v7 : (tensor<4x8x32xf32>, tensor<32x32xf32>) -> tensor<4x8x32xf32>
  %v9 = tdx.reshape %v8 [4, 8, 4, 8] : tensor<4x8x32xf32> -> tensor<4x8x4x8xf32>
  %v10 = tdx.permute %v9 [0, 2, 1, 3] : tensor<4x8x4x8xf32> -> tensor<4x4x8x8xf32>
  %v11 = tdx.param_ref @"h.0.attn.wk" : tensor<32x32xf32>
  %v12 = tdx.linear %v6, %v11 : (tensor<4x8x32xf32>, tensor<32x32xf32>) -> tensor<4x8x32xf32>
  %v13 = tdx.reshape %v12 [4, 8, 4, 8] : tensor<4x8x32xf32> -> tensor<4x8x4x8xf32>
  %v14 = tdx.permute %v13 [0, 2, 1, 3] : tensor<4x8x4x8xf32> -> tensor<4x4x8x8xf32>
  %v15 = tdx.param_ref @"h.0.attn.wv" : tensor<32x32xf32>
  %v16 = tdx.linear %v6, %v15 : (tensor<4x8x32xf32>, tensor<32x32xf32>) -> tensor<4x8x32xf32>
  %v17 = tdx.reshape %v16 [4, 8, 4, 8] : tensor<4x8x32xf32> -> tensor<4x8x4x8xf32>
  %v18 = tdx.permute %v17 [0, 2, 1, 3] : tensor<4x8x4x8xf32> -> tensor<4x4x8x8xf32>
  %v19 = tdx.transpose %v14 -2, -1 : tensor<4x4x8x8xf32> -> tensor<4x4x8x8xf32>
  %v20 = tdx.matmul %v10, %v19 : (tensor<4x4x8x8xf32>, tensor<4x4x8x8xf32>) -> tensor<4x4x8x8xf32>
  %v21 = tdx.softmax %v20 dim = -1 : tensor<4x4x8x8xf32>
  %v22 = tdx.matmul %v21, %v18 : (tensor<4x4x8x8xf32>, tensor<4x4x8x8xf32>) -> tensor<4x4x8x8xf32>
  %v23 = tdx.permute %v22 [0, 2, 1, 3] : tensor<4x4x8x8xf32> -> tensor<4x8x4x8xf32>
  %v24 = tdx.reshape %v23 [4, 8, 32] : tensor<4x8x4x8xf32> -> tensor<4x8x32xf32>
  %v25 = tdx.param_ref @"h.0.attn.wo" : tensor<32x32xf32>
  %v26 = tdx.linear %v24, %v25 : (tensor<4x8x32xf32>, tensor<32x32xf32>) -> tensor<4x8x32xf32>
  %v27 = tdx.add %v3, %v26 : (tensor<4x8x32xf32>, tensor<4x8x32xf32>) -> tensor<4x8x32xf32>
  %v28 = tdx.param_ref @"h.0.ln2.w" : tensor<32xf32>
  %v29 = tdx.param_ref @"h.0.ln2.b" : tensor<32xf32>
  %v30 = tdx.layer_norm %v27 weight %v28 bias %v29 normalized_shape = [32] eps = 1.0e-5 : (tensor<4x8x32xf32>, tensor<32xf32>, tensor<32xf32>) -> tensor<4x8x32xf32>
  %v31 = tdx.param_ref @"h.0.mlp.fc" : tensor<128x32xf32>
  %v32 = tdx.linear %v30, %v31 : (tensor<4x8x32xf32>, tensor<128x32xf32>) -> tensor<4x8x128xf32>
  %v33 = tdx.gelu %v32 approximate = tanh : tensor<4x8x128xf32>
  %v34 = tdx.param_ref @"h.0.mlp.proj" : tensor<32x128xf32>
  %v35 = tdx.linear %v33, %v34 : (tensor<4x8x128xf32>, tensor<32x128xf32>) -> tensor<4x8x32xf32>
  %v36 = tdx.add %v27, %v35 : (tensor<4x8x32xf32>, tensor<4x8x32xf32>) -> tensor<4x8x32xf32>
  %v37 = tdx.param_ref @"h.1.ln1.w" : tensor<32xf32>
  %v38 = tdx.param_ref @"h.1.ln1.b" : tensor<32xf32>
  %v39 = tdx.layer_norm %v36 weight %v37 bias %v38 normalized_shape = [32] eps = 1.0e-5 : (tensor<4x8x32xf32>, tensor<32xf32>, tensor<32xf32>) -> tensor<4x8x32xf32>
  %v40 = tdx.param_ref @"h.1.attn.wq" : tensor<32x32xf32>
  %v41 = tdx.linear %v39, %v40 : (tensor<4x8x32xf32>, tensor<32x32xf32>) -> tensor<4x8x32xf32>
  %v42 = tdx.reshape %v41 [4, 8, 4, 8] : tensor<4x8x32xf32> -> tensor<4x8x4x8xf32>
  %v43 = tdx.permute %v42 [0, 2, 1, 3] : tensor<4x8x4x8xf32> -> tensor<4x4x8x8xf32>
  %v44 = tdx.param_ref @"h.1.attn.wk" : tensor<32x32xf32>
  %v45 = tdx.linear %v39, %v44 : (tensor<4x8x32xf32>, tensor<32x32xf32>) -> tensor<4x8x32xf32>
  %v46 = tdx.reshape %v45 [4, 8, 4, 8] : tensor<4x8x32xf32> -> tensor<4x8x4x8xf32>
  %v47 = tdx.permute %v46 [0, 2, 1, 3] : tensor<4x8x4x8xf32> -> tensor<4x4x8x8xf32>
  %v48 = tdx.param_ref @"h.1.attn.wv" : tensor<32x32xf32>
  %v49 = tdx.linear %v39, %v48 : (tensor<4x8x32xf32>, tensor<32x32xf32>) -> tensor<4x8x32xf32>
  %v50 = tdx.reshape %v49 [4, 8, 4, 8] : tensor<4x8x32xf32> -> tensor<4x8x4x8xf32>
  %v51 = tdx.permute %v50 [0, 2, 1, 3] : tensor<4x8x4x8xf32> -> tensor<4x4x8x8xf32>
  %v52 = tdx.transpose %v47 -2, -1 : tensor<4x4x8x8xf32> -> tensor<4x4x8x8xf32>
  %v53 = tdx.matmul %v43, %v52 : (tensor<4x4x8x8xf32>, tensor<4x4x8x8xf32>) -> tensor<4x4x8x8xf32>
  %v54 = tdx.softmax %v53 dim = -1 : tensor<4x4x8x8xf32>
  %v55 = tdx.matmul %v54, %v51 : (tensor<4x4x8x8xf32>, tensor<4x4x8x8xf32>) -> tensor<4x4x8x8xf32>
  %v56 = tdx.permute %v55 [0, 2, 1, 3] : tensor<4x4x8x8xf32> -> tensor<4x8x4x8xf32>
  %v57 = tdx.reshape %v56 [4, 8, 32] : tensor<4x8x4x8xf32> -> tensor<4x8x32xf32>
  %v58 = tdx.param_ref @"h.1.attn.wo" : tensor<32x32xf32>
  %v59 = tdx.linear %v57, %v58 : (tensor<4x8x32xf32>, tensor<32x32xf32>) -> tensor<4x8x32xf32>
  %v60 = tdx.add %v36, %v59 : (tensor<4x8x32xf32>, tensor<4x8x32xf32>) -> tensor<4x8x32xf32>
  %v61 = tdx.param_ref @"h.1.ln2.w" : tensor<32xf32>
  %v62 = tdx.param_ref @"h.1.ln2.b" : tensor<32xf32>
  %v63 = tdx.layer_norm %v60 weight %v61 bias %v62 normalized_shape = [32] eps = 1.0e-5 : (tensor<4x8x32xf32>, tensor<32xf32>, tensor<32xf32>) -> tensor<4x8x32xf32>
  %v64 = tdx.param_ref @"h.1.mlp.fc" : tensor<128x32xf32>
  %v65 = tdx.linear %v63, %v64 : (tensor<4x8x32xf32>, tensor<128x32xf32>) -> tensor<4x8x128xf32>
  %v66 = tdx.gelu %v65 approximate = tanh : tensor<4x8x128xf32>
  %v67 = tdx.param_ref @"h.1.mlp.proj" : tensor<32x128xf32>
  %v68 = tdx.linear %v66, %v67 : (tensor<4x8x128xf32>, tensor<32x128xf32>) -> tensor<4x8x32xf32>
  %v69 = tdx.add %v60, %v68 : (tensor<4x8x32xf32>, tensor<4x8x32xf32>) -> tensor<4x8x32xf32>
  %v70 = tdx.param_ref @"wte" : tensor<128x32xf32>
  %v71 = tdx.linear %v69, %v70 : (tensor<4x8x32xf32>, tensor<128x32xf32>) -> tensor<4x8x128xf32>
  return %v71 : tensor<4x8x128xf32>
}
