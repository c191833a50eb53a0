//===- TdxNNOps.td - matmul, reductions, norms, losses ------*- tablegen -*-===//

#ifndef TDX_DIALECT_TDXNNOPS_TD
#define TDX_DIALECT_TDXNNOPS_TD

include "TdxOpBase.td"

def Tdx_MatmulOp : Tdx_InferredOp<"matmul"> {
  let runtimeCall = "T::matmul($lhs, $rhs)";
  let torchReference = "torch.matmul($lhs, $rhs)";
  let summary = "torch.matmul: 1-D, 2-D and batched with broadcast batch dims";
  let description = [{
    Follows `torch.matmul`: 1-D operands are promoted to a matrix (and the
    added dim removed afterwards); batch dims broadcast.

    ```mlir
    %r = tdx.matmul %a, %b : (tensor<2x1x8x16xf32>, tensor<3x16x4xf32>) -> tensor<2x3x8x4xf32>
    ```
  }];
  let arguments = (ins Tdx_Tensor:$lhs, Tdx_Tensor:$rhs);
  let results = (outs Tdx_Tensor:$result);
  let assemblyFormat =
    "$lhs `,` $rhs attr-dict `:` functional-type(operands, results)";
  // Folds reshape(merge batch dims) -> matmul -> reshape(split) back into one
  // batched matmul: the form PyTorch's decomposition of torch.matmul takes,
  // which would otherwise hide the batch dims from sharding.
  let hasCanonicalizer = 1;
}

def Tdx_LinearOp : Tdx_InferredOp<"linear"> {
  let runtimeCall = "T::linear($input, $weight, $bias)";
  let torchReference = "F.linear($input, $weight, $bias)";
  let summary = "torch.nn.functional.linear: x @ W^T + b";
  let description = [{
    `input` is `[..., in]`, `weight` is `[out, in]` (or `[in]`), the optional
    `bias` broadcasts to `[out]`; the result is `[..., out]`.

    ```mlir
    %y = tdx.linear %x, %w, %b : (tensor<2x8x16xf32>, tensor<32x16xf32>, tensor<32xf32>) -> tensor<2x8x32xf32>
    ```
  }];
  let arguments = (ins Tdx_Tensor:$input, Tdx_Tensor:$weight,
                       Optional<Tdx_Tensor>:$bias);
  let results = (outs Tdx_Tensor:$result);
  let assemblyFormat =
    "$input `,` $weight (`,` $bias^)? attr-dict `:` functional-type(operands, results)";
}

class Tdx_ReduceOp<string mnemonic, string aten, Type operandType>
    : Tdx_InferredOp<mnemonic> {
  let summary = "reduction " # aten # " over dims (all dims if none given)";
  let description = [{
    `aten::}] # aten # [{`. `dims` may be negative (counted from the end);
    without `dims` every dim is reduced. With `keepdim` the reduced dims stay
    with size 1.

    ```mlir
    %r = tdx.}] # mnemonic # [{ %x dims = [-1] keepdim : tensor<4x8xf32> -> tensor<4x1xf32>
    %t = tdx.}] # mnemonic # [{ %x : tensor<4x8xf32> -> tensor<f32>
    ```
  }];
  let arguments = (ins operandType:$input, OptionalAttr<DenseI64ArrayAttr>:$dims,
                       UnitAttr:$keepdim);
  let results = (outs Tdx_Tensor:$result);
  let assemblyFormat = [{
    $input (`dims` `=` $dims^)? (`keepdim` $keepdim^)? attr-dict `:`
    type($input) `->` type($result)
  }];
  let extraClassDefinition = [{
    ::mlir::LogicalResult $cppClass::inferReturnTypes(
        ::mlir::MLIRContext *, ::std::optional<::mlir::Location> loc, Adaptor adaptor,
        ::llvm::SmallVectorImpl<::mlir::Type> &inferred) {
      ::mlir::ValueRange operands = adaptor.getOperands();
      return inferReduceResult(loc, getOperationName(), operands[0].getType(),
          adaptor.getDims(), adaptor.getKeepdim(), inferred);
    }
  }];
}

def Tdx_SumOp : Tdx_ReduceOp<"sum", "sum.dim_IntList", Tdx_NumericTensor> {
  let runtimeCall = "T::sum($input[, $dims, $keepdim])";
  let torchReference = "torch.sum($input, $dims or list(range($input.dim())), keepdim=$keepdim)";
}
def Tdx_MeanOp : Tdx_ReduceOp<"mean", "mean.dim", Tdx_FloatTensor> {
  let runtimeCall = "T::mean($input[, $dims, $keepdim])";
  let torchReference = "torch.mean($input, $dims or list(range($input.dim())), keepdim=$keepdim)";
}
def Tdx_MaxOp : Tdx_ReduceOp<"max", "amax", Tdx_NumericTensor> {
  let runtimeCall = "T::amax($input[, $dims, $keepdim])";
  let torchReference = "torch.amax($input, $dims or list(range($input.dim())), keepdim=$keepdim)";
}

class Tdx_SoftmaxBase<string mnemonic, string aten>
    : Tdx_Op<mnemonic, [Pure, SameOperandsAndResultType, Tdx_HasShardingRule]> {
  let runtimeCall = "T::" # mnemonic # "($input, $dim)";
  let torchReference = "torch." # mnemonic # "($input, $dim)";
  let summary = aten # " along one dim";
  let description = [{
    `aten::}] # aten # [{(input, dim)`; `dim` may be negative.

    ```mlir
    %p = tdx.}] # mnemonic # [{ %x dim = -1 : tensor<4x8xf32>
    ```
  }];
  let arguments = (ins Tdx_FloatTensor:$input, I64Attr:$dim);
  let results = (outs Tdx_FloatTensor:$result);
  let assemblyFormat = "$input `dim` `=` $dim attr-dict `:` type($input)";
  let hasVerifier = 1;
}

def Tdx_SoftmaxOp : Tdx_SoftmaxBase<"softmax", "_softmax">;
def Tdx_LogSoftmaxOp : Tdx_SoftmaxBase<"log_softmax", "_log_softmax">;

def Tdx_LayerNormOp : Tdx_InferredOp<"layer_norm", [AttrSizedOperandSegments]> {
  let runtimeCall = "T::layer_norm($input, $normalized_shape, $weight, $bias, $eps)";
  let torchReference = "F.layer_norm($input, $normalized_shape, $weight, $bias, $eps)";
  let summary = "torch.nn.functional.layer_norm over the trailing dims";
  let description = [{
    Normalizes over the trailing `normalized_shape` dims; `weight` and `bias`,
    when present, have shape `normalized_shape`.

    ```mlir
    %y = tdx.layer_norm %x weight %w bias %b normalized_shape = [16] eps = 1.000000e-05
        : (tensor<2x8x16xf32>, tensor<16xf32>, tensor<16xf32>) -> tensor<2x8x16xf32>
    ```
  }];
  let arguments = (ins Tdx_FloatTensor:$input, Optional<Tdx_FloatTensor>:$weight,
                       Optional<Tdx_FloatTensor>:$bias,
                       DenseI64ArrayAttr:$normalized_shape, F64Attr:$eps);
  let results = (outs Tdx_FloatTensor:$result);
  let assemblyFormat = [{
    $input (`weight` $weight^)? (`bias` $bias^)?
    `normalized_shape` `=` $normalized_shape `eps` `=` $eps attr-dict `:`
    functional-type(operands, results)
  }];
}

def Tdx_RmsNormOp : Tdx_InferredOp<"rms_norm"> {
  let runtimeCall = "rms_norm($input, $normalized_shape, $weight, $eps)";
  let torchReference = "$input * torch.rsqrt($input.pow(2).mean(list(range(-len($normalized_shape), 0)), keepdim=True) + $eps) * (1 if $weight is None else $weight)";
  let summary = "RMSNorm (LLaMA) over the trailing dims";
  let description = [{
    `x * rsqrt(mean(x^2 over normalized_shape) + eps) * weight`.

    ```mlir
    %y = tdx.rms_norm %x weight %w normalized_shape = [16] eps = 1.000000e-06
        : (tensor<2x8x16xf32>, tensor<16xf32>) -> tensor<2x8x16xf32>
    ```
  }];
  let arguments = (ins Tdx_FloatTensor:$input, Optional<Tdx_FloatTensor>:$weight,
                       DenseI64ArrayAttr:$normalized_shape, F64Attr:$eps);
  let results = (outs Tdx_FloatTensor:$result);
  let assemblyFormat = [{
    $input (`weight` $weight^)? `normalized_shape` `=` $normalized_shape
    `eps` `=` $eps attr-dict `:` functional-type(operands, results)
  }];
}

def Tdx_SdpaOp : Tdx_InferredOp<"sdpa"> {
  let torchReference = "aten._scaled_dot_product_flash_attention_for_cpu($query, $key, $value, 0.0, $is_causal, attn_mask=$attn_mask, scale=$scale)";
  let summary = "torch.nn.functional.scaled_dot_product_attention, fused";
  let description = [{
    `softmax(query @ key^T * scale + mask) @ value` over `[batch, heads,
    seq, dim]` tensors, with a causal mask (`causal`, top-left aligned as
    torch's `is_causal`), an additive or boolean `attn_mask`, and `scale`
    (default `1 / sqrt(dim)`). Grouped-query attention: `key` and `value`
    may have fewer heads than `query` (a divisor; query head `h` reads key
    head `h / (heads / kv_heads)`), as `enable_gqa=True`. The second result
    is the log-sum-exp of each query row, `[batch, heads, seq]`, which the
    backward reads, in the accumulate type (f32 for bf16 and f16 queries,
    as torch's kernel keeps it). Dropout is not part of it: with `dropout_p > 0` torch
    takes its math path, whose ops stay generic (the mask a counter-based
    `tdx.bernoulli`).

    ```mlir
    %o, %lse = tdx.sdpa %q, %k, %v causal : (tensor<2x4x8x16xf32>, tensor<2x2x8x16xf32>,
        tensor<2x2x8x16xf32>) -> (tensor<2x4x8x16xf32>, tensor<2x4x8xf32>)
    ```
  }];
  let arguments = (ins Tdx_FloatTensor:$query, Tdx_FloatTensor:$key, Tdx_FloatTensor:$value,
                       Optional<Tdx_Tensor>:$attn_mask, UnitAttr:$is_causal,
                       OptionalAttr<F64Attr>:$scale);
  let results = (outs Tdx_FloatTensor:$output, Tdx_FloatTensor:$logsumexp);
  let assemblyFormat = [{
    $query `,` $key `,` $value (`mask` $attn_mask^)? (`causal` $is_causal^)?
    (`scale` `=` $scale^)? attr-dict `:` functional-type(operands, results)
  }];
}

def Tdx_SdpaBackwardOp : Tdx_InferredOp<"sdpa_backward"> {
  let torchReference = "aten._scaled_dot_product_flash_attention_for_cpu_backward($grad, $query, $key, $value, $output, $logsumexp, 0.0, $is_causal, attn_mask=$attn_mask, scale=$scale)";
  let summary = "the gradients of tdx.sdpa's query, key and value";
  let description = [{
    From the gradient of the attention's output and what the forward kept
    (its output and log-sum-exp), torch's fused backward: the results are
    the gradients of `query`, `key` and `value`, each of its operand's type.

    ```mlir
    %dq, %dk, %dv = tdx.sdpa_backward %g, %q, %k, %v, %o, %lse causal
        : (tensor<2x4x8x16xf32>, tensor<2x4x8x16xf32>, tensor<2x2x8x16xf32>,
           tensor<2x2x8x16xf32>, tensor<2x4x8x16xf32>, tensor<2x4x8xf32>)
        -> (tensor<2x4x8x16xf32>, tensor<2x2x8x16xf32>, tensor<2x2x8x16xf32>)
    ```
  }];
  let arguments = (ins Tdx_FloatTensor:$grad, Tdx_FloatTensor:$query, Tdx_FloatTensor:$key,
                       Tdx_FloatTensor:$value, Tdx_FloatTensor:$output,
                       Tdx_FloatTensor:$logsumexp, Optional<Tdx_Tensor>:$attn_mask,
                       UnitAttr:$is_causal, OptionalAttr<F64Attr>:$scale);
  let results = (outs Tdx_FloatTensor:$grad_query, Tdx_FloatTensor:$grad_key,
                      Tdx_FloatTensor:$grad_value);
  let assemblyFormat = [{
    $grad `,` $query `,` $key `,` $value `,` $output `,` $logsumexp (`mask` $attn_mask^)?
    (`causal` $is_causal^)? (`scale` `=` $scale^)? attr-dict `:`
    functional-type(operands, results)
  }];
}

def Tdx_EmbeddingOp : Tdx_InferredOp<"embedding", [], /*ownPartition=*/1> {
  let runtimeCall = "T::embedding($weight, $indices)";
  let torchReference = "F.embedding($indices, $weight)";
  let summary = "torch.nn.functional.embedding: rows of weight by index";
  let description = [{
    `weight` is `[num_embeddings, dim]`, `indices` an integer tensor of any
    shape `S`; the result is `[S..., dim]`.

    ```mlir
    %e = tdx.embedding %wte, %ids : (tensor<100x16xf32>, tensor<2x8xi64>) -> tensor<2x8x16xf32>
    ```
  }];
  let arguments = (ins Tdx_Tensor:$weight, Tdx_IntTensor:$indices,
                       OptionalAttr<I64Attr>:$padding_idx);
  let results = (outs Tdx_Tensor:$result);
  let assemblyFormat = [{
    $weight `,` $indices (`padding_idx` `=` $padding_idx^)? attr-dict `:`
    functional-type(operands, results)
  }];
}

def Tdx_CrossEntropyOp : Tdx_InferredOp<"cross_entropy", [], /*ownPartition=*/1> {
  let runtimeCall = "T::cross_entropy_loss($input, $target, {}, $reduction, $ignore_index, $label_smoothing)";
  let torchReference = "F.cross_entropy($input, $target, reduction=$reduction, ignore_index=$ignore_index, label_smoothing=$label_smoothing)";
  let hasVerifier = 1;
  let summary = "torch.nn.functional.cross_entropy on logits";
  let description = [{
    `input` holds logits `[N, C, d...]` (or `[C]`); `target` holds class
    indices `[N, d...]` (integer) or class probabilities shaped like `input`
    (float). With `reduction = none` the result is `[N, d...]`, otherwise a
    0-D tensor.

    ```mlir
    %l = tdx.cross_entropy %logits, %labels reduction = mean
        : (tensor<16x100xf32>, tensor<16xi64>) -> tensor<f32>
    ```
  }];
  let arguments = (ins Tdx_FloatTensor:$input, Tdx_Tensor:$target,
      DefaultValuedAttr<Tdx_LossReduction, "LossReduction::mean">:$reduction,
      DefaultValuedAttr<I64Attr, "-100">:$ignore_index,
      DefaultValuedAttr<F64Attr, "0.0">:$label_smoothing);
  let results = (outs Tdx_FloatTensor:$result);
  let assemblyFormat = [{
    $input `,` $target `reduction` `=` $reduction attr-dict `:`
    functional-type(operands, results)
  }];
}

#endif // TDX_DIALECT_TDXNNOPS_TD
