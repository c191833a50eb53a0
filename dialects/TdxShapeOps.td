//===- TdxShapeOps.td - reshape, transpose, slice, concat --*- tablegen -*-===//
//
// Views are value-semantic: a recorded view becomes one of these ops and a
// write through a view becomes a new value (see docs/ir.md).
//
//===----------------------------------------------------------------------===//

#ifndef TDX_DIALECT_TDXSHAPEOPS_TD
#define TDX_DIALECT_TDXSHAPEOPS_TD

include "TdxOpBase.td"

def Tdx_ReshapeOp : Tdx_InferredOp<"reshape", [], /*ownPartition=*/1> {
  let runtimeCall = "$input.reshape($shape)";
  let torchReference = "$input.reshape($shape)";
  let summary = "Tensor.reshape / view with at most one -1";
  let description = [{
    `shape` may hold one `-1`, which is inferred from the element count. The
    element count must not change.

    ```mlir
    %r = tdx.reshape %x [-1, 4] : tensor<2x8xf32> -> tensor<4x4xf32>
    ```
  }];
  let arguments = (ins Tdx_Tensor:$input, DenseI64ArrayAttr:$shape);
  let results = (outs Tdx_Tensor:$result);
  let assemblyFormat = "$input $shape attr-dict `:` type($input) `->` type($result)";
  let hasFolder = 1;
}

def Tdx_TransposeOp : Tdx_InferredOp<"transpose"> {
  let runtimeCall = "$input.transpose($dim0, $dim1)";
  let torchReference = "$input.transpose($dim0, $dim1)";
  let summary = "swap two dims (Tensor.transpose)";
  let description = [{
    ```mlir
    %t = tdx.transpose %x 0, -1 : tensor<4x8xf32> -> tensor<8x4xf32>
    ```
  }];
  let arguments = (ins Tdx_Tensor:$input, I64Attr:$dim0, I64Attr:$dim1);
  let results = (outs Tdx_Tensor:$result);
  let assemblyFormat =
    "$input $dim0 `,` $dim1 attr-dict `:` type($input) `->` type($result)";
  let hasFolder = 1;
}

def Tdx_PermuteOp : Tdx_InferredOp<"permute"> {
  let runtimeCall = "$input.permute($permutation)";
  let torchReference = "$input.permute($permutation)";
  let summary = "reorder dims (Tensor.permute)";
  let description = [{
    Result dim `i` is input dim `permutation[i]`.

    ```mlir
    %p = tdx.permute %x [0, 2, 1, 3] : tensor<2x8x4x16xf32> -> tensor<2x4x8x16xf32>
    ```
  }];
  let arguments = (ins Tdx_Tensor:$input, DenseI64ArrayAttr:$permutation);
  let results = (outs Tdx_Tensor:$result);
  let assemblyFormat =
    "$input $permutation attr-dict `:` type($input) `->` type($result)";
}

def Tdx_SliceOp : Tdx_InferredOp<"slice"> {
  let runtimeCall = "$input.slice($dim, $start, $end, $step)";
  let torchReference = "aten.slice.Tensor($input, $dim, $start, $end, $step)";
  let summary = "a strided slice along one dim (aten::slice.Tensor)";
  let description = [{
    `x[..., start:end:step, ...]` on dim `dim`, with Python semantics for
    negative and out-of-range `start`/`end` (clamped). `step` must be
    positive.

    ```mlir
    %s = tdx.slice %x dim 1 [0 : 8 : 2] : tensor<4x16xf32> -> tensor<4x4xf32>
    ```
  }];
  let arguments = (ins Tdx_Tensor:$input, I64Attr:$dim, I64Attr:$start,
                       I64Attr:$end, DefaultValuedAttr<I64Attr, "1">:$step);
  let results = (outs Tdx_Tensor:$result);
  let assemblyFormat = [{
    $input `dim` $dim ` ` `[` $start `:` $end `:` $step `]` attr-dict `:`
    type($input) `->` type($result)
  }];
}

def Tdx_ConcatOp : Tdx_InferredOp<"concat"> {
  let runtimeCall = "concat($inputs, $dim)";
  let torchReference = "torch.cat($inputs, $dim)";
  let summary = "torch.cat along one dim";
  let description = [{
    ```mlir
    %c = tdx.concat %a, %b dim 0 : (tensor<2x4xf32>, tensor<3x4xf32>) -> tensor<5x4xf32>
    ```
  }];
  let arguments = (ins Variadic<Tdx_Tensor>:$inputs, I64Attr:$dim);
  let results = (outs Tdx_Tensor:$result);
  let assemblyFormat =
    "$inputs `dim` $dim attr-dict `:` functional-type($inputs, results)";
}

def Tdx_ExpandOp : Tdx_InferredOp<"expand", [], /*ownPartition=*/1> {
  let runtimeCall = "$input.expand($sizes)";
  let torchReference = "$input.expand($sizes)";
  let summary = "broadcast to a larger shape (Tensor.expand)";
  let description = [{
    `sizes` has at least the input's rank; `-1` keeps a dim; a dim of size 1
    may grow; new leading dims are added.

    ```mlir
    %e = tdx.expand %x [4, -1, 8] : tensor<3x1xf32> -> tensor<4x3x8xf32>
    ```
  }];
  let arguments = (ins Tdx_Tensor:$input, DenseI64ArrayAttr:$sizes);
  let results = (outs Tdx_Tensor:$result);
  let assemblyFormat = "$input $sizes attr-dict `:` type($input) `->` type($result)";
  let hasFolder = 1;
}

#endif // TDX_DIALECT_TDXSHAPEOPS_TD
