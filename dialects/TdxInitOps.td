//===- TdxInitOps.td - tensor creation and random init -----*- tablegen -*-===//
//
// Creation ops have no operands: the result type is the logical (global)
// tensor. Random ops are counter-based: element i of the global tensor is a
// pure function of (seed, stream, i), so any rank can compute any slice.
//
//===----------------------------------------------------------------------===//

#ifndef TDX_DIALECT_TDXINITOPS_TD
#define TDX_DIALECT_TDXINITOPS_TD

include "TdxOpBase.td"

def Tdx_EmptyOp : Tdx_Op<"empty", [Pure, Tdx_HasPartitionRule]> {
  let summary = "a tensor with unspecified contents (torch.empty)";
  let description = [{
    After `tdx-partition`, a result split unevenly (a rank-dependent size,
    `?`) keeps its global shape in `global_shape`; each rank makes its own
    box of it, which may have no rows.
  }];
  let arguments = (ins OptionalAttr<DenseI64ArrayAttr>:$global_shape);
  let results = (outs Tdx_Tensor:$result);
  let assemblyFormat = "attr-dict `:` type($result)";
  let builders = [OpBuilder<(ins "::mlir::Type":$type), [{
    build($_builder, $_state, type, ::mlir::DenseI64ArrayAttr());
  }]>];
  let hasVerifier = 1;
}

def Tdx_FullOp : Tdx_Op<"full", [Pure, Tdx_HasPartitionRule]> {
  let summary = "a tensor filled with one value (torch.full, zeros, ones)";
  let description = [{
    ```mlir
    %z = tdx.full 0.000000e+00 : tensor<4x4xf32>
    %m = tdx.full 1.000000e+00 : tensor<8xi64>
    %p = tdx.full 0.000000e+00 {global_shape = array<i64: 1, 3>} : tensor<?x3xf32>
    ```
    On integer and boolean tensors the value must be integral (and 0 or 1
    for `i1`). After `tdx-partition`, a result split unevenly (a
    rank-dependent size, `?`) keeps its global shape in `global_shape`;
    each rank fills its own box of it, which may have no rows.
  }];
  let arguments = (ins F64Attr:$value, OptionalAttr<DenseI64ArrayAttr>:$global_shape);
  let builders = [OpBuilder<(ins "::mlir::Type":$type, "::mlir::FloatAttr":$value), [{
    build($_builder, $_state, type, value, ::mlir::DenseI64ArrayAttr());
  }]>];
  let results = (outs Tdx_Tensor:$result);
  let assemblyFormat = "$value attr-dict `:` type($result)";
  let hasVerifier = 1;
}

def Tdx_ArangeOp : Tdx_Op<"arange", [Pure, Tdx_HasShardingRule]> {
  let runtimeCall = "T::arange($start, $end, $step, $dtype)";
  let torchReference = "torch.arange($start, $end, $step, dtype=$dtype)";
  let summary = "evenly spaced values in [start, end) (torch.arange)";
  let description = [{
    The result is 1-D with `ceil((end - start) / step)` elements, exactly as
    `torch.arange(start, end, step)`.

    ```mlir
    %p = tdx.arange start 0.000000e+00 end 8.000000e+00 step 1.000000e+00 : tensor<8xi64>
    ```
  }];
  let arguments = (ins F64Attr:$start, F64Attr:$end, F64Attr:$step);
  let results = (outs RankedTensorOf<[AnyFloat, AnySignlessInteger]>:$result);
  let assemblyFormat =
    "`start` $start `end` $end `step` $step attr-dict `:` type($result)";
  let hasVerifier = 1;
}

/// In a parameter's init program a random op makes the global tensor. In a
/// function it draws anew at every call of the function: call `c` (from 0,
/// one per training step or forward) reads stream `stream + (c + 1) * 2^32`
/// (tdx/Runtime/Philox.h). tdx-partition keeps the global shape in
/// `global_shape`, and each rank draws its own box of the global tensor, so
/// the values are the same on every mesh and layout.
class Tdx_RandomOp<string mnemonic, string what, dag params, string paramFmt>
    : Tdx_Op<mnemonic, [Pure, Tdx_HasPartitionRule]> {
  let summary = what # " random values from (seed, stream), layout-independent";
  let arguments = !con(params, (ins I64Attr:$seed, I64Attr:$stream,
                                    OptionalAttr<DenseI64ArrayAttr>:$global_shape));
  let results = (outs Tdx_FloatTensor:$result);
  let assemblyFormat = "`(` " # paramFmt #
      " `)` `seed` `(` $seed `,` $stream `)` attr-dict `:` type($result)";
  let hasVerifier = 1;
}

def Tdx_UniformOp : Tdx_RandomOp<"uniform", "uniform",
    (ins F64Attr:$low, F64Attr:$high), "$low `,` $high"> {
  let description = [{
    Values uniform in `[low, high)`, like `torch.nn.init.uniform_`.
    `kaiming_uniform_`, `xavier_uniform_` and nn.Linear's default init are
    this op with the bound computed from the fan, as capture records them.

    ```mlir
    %w = tdx.uniform(-2.500000e-01, 2.500000e-01) seed(0, 1) : tensor<16x16xf32>
    ```
  }];
}

def Tdx_NormalOp : Tdx_RandomOp<"normal", "normally distributed",
    (ins F64Attr:$mean, F64Attr:$std), "$mean `,` $std"> {
  let description = [{
    Values from N(mean, std^2), like `torch.nn.init.normal_`;
    `kaiming_normal_` and `xavier_normal_` compute `std` from the fan.

    ```mlir
    %w = tdx.normal(0.000000e+00, 2.000000e-02) seed(0, 2) : tensor<100x16xf32>
    ```
  }];
}

def Tdx_TruncNormalOp : Tdx_RandomOp<"trunc_normal", "truncated normal",
    (ins F64Attr:$mean, F64Attr:$std, F64Attr:$a, F64Attr:$b),
    "$mean `,` $std `,` $a `,` $b"> {
  let description = [{
    Values from N(mean, std^2) restricted to `[a, b]`, like
    `torch.nn.init.trunc_normal_(t, mean, std, a, b)` (bounds are absolute).

    ```mlir
    %w = tdx.trunc_normal(0.000000e+00, 2.000000e-02, -4.000000e-02, 4.000000e-02) seed(0, 3) : tensor<16x16xf32>
    ```
  }];
}

def Tdx_BernoulliOp : Tdx_RandomOp<"bernoulli", "Bernoulli (0 or 1)",
    (ins F64Attr:$p), "$p"> {
  let description = [{
    Ones with probability `p` and zeros otherwise, like
    `torch.empty(...).bernoulli_(p)`: element `i` is 1 when the uniform of
    `(seed, stream, i)` is below `p`. Training-mode dropout is recorded as
    this mask (keep probability `1 - p`), divided by `1 - p` and multiplied
    with the input; the backward reads the same mask.

    ```mlir
    %keep = tdx.bernoulli(9.000000e-01) seed(0, 7) : tensor<4x8xf32>
    ```
  }];
}

#endif // TDX_DIALECT_TDXINITOPS_TD
