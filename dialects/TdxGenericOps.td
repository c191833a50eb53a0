//===- TdxGenericOps.td - any other aten op ---------------*- tablegen -*-===//

#ifndef TDX_DIALECT_TDXGENERICOPS_TD
#define TDX_DIALECT_TDXGENERICOPS_TD

include "TdxOpBase.td"

def Tdx_AtenOp : Tdx_Op<"aten", [Pure]> {
  let summary = "any aten op without a first-class tdx op, by schema name";
  let description = [{
    Keeps an op that tdx has no dedicated op for, so that capture never loses
    one. `schema` is the operator's schema name `namespace::name` or
    `namespace::name.overload`; tensor arguments are operands in schema
    order; constant (non-tensor) arguments are in the dictionary `args`,
    keyed by their schema names. The sharding passes treat it as needing
    replicated operands; the CPU runtime runs it through ATen.

    ```mlir
    %r = tdx.aten "aten::index_select"(%x, %i) {args = {dim = 1 : i64}}
        : (tensor<4x8xf32>, tensor<3xi64>) -> tensor<4x3xf32>
    ```
  }];
  let arguments = (ins StrAttr:$schema, Variadic<AnyType>:$operands,
                       OptionalAttr<DictionaryAttr>:$args);
  let results = (outs Variadic<AnyType>:$results);
  let assemblyFormat =
    "$schema `(` $operands `)` attr-dict `:` functional-type($operands, $results)";
  let hasVerifier = 1;
}

#endif // TDX_DIALECT_TDXGENERICOPS_TD
