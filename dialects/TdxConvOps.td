//===- TdxConvOps.td - convolution and pooling --------------*- tablegen -*-===//
//
// Channels-first (NCL / NCHW) convolution and pooling, as torch.nn.Conv1d/2d
// and the pooling layers compute them. Spatial dims are never sharded (a
// shard would need a halo); batch and channels are.
//
//===----------------------------------------------------------------------===//

#ifndef TDX_DIALECT_TDXCONVOPS_TD
#define TDX_DIALECT_TDXCONVOPS_TD

include "TdxOpBase.td"

def Tdx_ConvOp : Tdx_InferredOp<"conv"> {
  let runtimeCall = "T::convolution($input, $weight, $bias, $stride, $padding, $dilation, false, {0}, $groups)";
  let torchReference = "(F.conv1d if $input.dim() == 3 else F.conv2d)($input, $weight, $bias, $stride, $padding, $dilation, $groups)";
  let summary = "1-D and 2-D convolution (aten::convolution, not transposed)";
  let description = [{
    `input` is `[N, C, L]` or `[N, C, H, W]`, `weight` `[O, C / groups, k...]`,
    the optional `bias` `[O]`; `stride`, `padding` and `dilation` have one
    entry per spatial dim. The result is `[N, O, out...]` with
    `out = (in + 2 padding - dilation (k - 1) - 1) / stride + 1`.

    Sharding rule: the batch dim and the output channels are parallel; with
    `groups = 1` the input channels are a reduction (the result is a
    partial sum); a depthwise convolution (`groups = C = O`) shards its
    channels like an elementwise op. Spatial dims stay replicated.

    ```mlir
    %y = tdx.conv %x, %w, %b stride = [2, 2] padding = [1, 1] dilation = [1, 1] groups = 1
        : (tensor<2x3x8x8xf32>, tensor<4x3x3x3xf32>, tensor<4xf32>) -> tensor<2x4x4x4xf32>
    ```
  }];
  let arguments = (ins Tdx_FloatTensor:$input, Tdx_FloatTensor:$weight,
                       Optional<Tdx_FloatTensor>:$bias, DenseI64ArrayAttr:$stride,
                       DenseI64ArrayAttr:$padding, DenseI64ArrayAttr:$dilation,
                       I64Attr:$groups);
  let results = (outs Tdx_FloatTensor:$result);
  let assemblyFormat = [{
    $input `,` $weight (`,` $bias^)? `stride` `=` $stride `padding` `=` $padding
    `dilation` `=` $dilation `groups` `=` $groups attr-dict `:` functional-type(operands, results)
  }];
}

class Tdx_PoolOp<string mnemonic, bit isMax> : Tdx_InferredOp<mnemonic> {
  let extraClassDefinition = [{
    ::mlir::LogicalResult $cppClass::inferReturnTypes(
        ::mlir::MLIRContext *, ::std::optional<::mlir::Location> loc, Adaptor adaptor,
        ::llvm::SmallVectorImpl<::mlir::Type> &inferred) {
      ::mlir::ValueRange operands = adaptor.getOperands();
      return inferPoolResult(loc, getOperationName(), operands[0].getType(),
          adaptor.getKernel(), adaptor.getStride(), adaptor.getPadding(),
          adaptor.getDilation(), adaptor.getCeilMode(), adaptor.getCountIncludePad(),
          /*isMax=*/}] # !if(isMax, "true", "false") # [{, inferred);
    }
  }];
  let arguments = (ins Tdx_FloatTensor:$input, DenseI64ArrayAttr:$kernel,
                       DenseI64ArrayAttr:$stride, DenseI64ArrayAttr:$padding,
                       DenseI64ArrayAttr:$dilation, UnitAttr:$ceil_mode,
                       UnitAttr:$count_include_pad);
  let results = (outs Tdx_FloatTensor:$result);
  let assemblyFormat = [{
    $input `kernel` `=` $kernel `stride` `=` $stride `padding` `=` $padding
    `dilation` `=` $dilation (`ceil_mode` $ceil_mode^)?
    (`count_include_pad` $count_include_pad^)? attr-dict `:` type($input) `->` type($result)
  }];
}

def Tdx_MaxPoolOp : Tdx_PoolOp<"max_pool", 1> {
  let runtimeCall = "T::max_pool2d($input, $kernel, $stride, $padding, $dilation, $ceil_mode)";
  let torchReference = "F.max_pool2d($input, $kernel, $stride, $padding, $dilation, ceil_mode=$ceil_mode)";
  let summary = "2-D max pooling (aten::max_pool2d)";
  let description = [{
    `input` is `[N, C, H, W]`; each output element is the maximum of its
    window (NaN wins, as in ATen). Padding is -inf. `count_include_pad`
    must be absent. Batch and channels shard; spatial dims stay replicated.

    ```mlir
    %y = tdx.max_pool %x kernel = [3, 3] stride = [2, 2] padding = [1, 1] dilation = [1, 1]
        : tensor<2x4x8x8xf32> -> tensor<2x4x4x4xf32>
    ```
  }];
}

def Tdx_AvgPoolOp : Tdx_PoolOp<"avg_pool", 0> {
  let runtimeCall = "T::avg_pool2d($input, $kernel, $stride, $padding, $ceil_mode, $count_include_pad)";
  let torchReference = "F.avg_pool2d($input, $kernel, $stride, $padding, ceil_mode=$ceil_mode, count_include_pad=$count_include_pad)";
  let summary = "2-D average pooling (aten::avg_pool2d)";
  let description = [{
    `input` is `[N, C, H, W]`; each output element is the mean of its window,
    divided by the window size clipped to the padded input when
    `count_include_pad` is set, else by the number of input elements in it.
    `dilation` must be all ones. Batch and channels shard.

    ```mlir
    %y = tdx.avg_pool %x kernel = [2, 2] stride = [2, 2] padding = [0, 0] dilation = [1, 1]
        count_include_pad : tensor<2x4x8x8xf32> -> tensor<2x4x4x4xf32>
    ```
  }];
}

#endif // TDX_DIALECT_TDXCONVOPS_TD
