//===- TdxGenericOps.td - any other aten op ---------------*- tablegen -*-===//

#ifndef TDX_DIALECT_TDXGENERICOPS_TD
#define TDX_DIALECT_TDXGENERICOPS_TD

include "TdxOpBase.td"

def Tdx_AtenOp : Tdx_Op<"aten", [AlwaysSpeculatable,
    DeclareOpInterfaceMethods<MemoryEffectsOpInterface>, Tdx_HasPartitionRule]> {
  let summary = "any aten op without a first-class tdx op, by schema name";
  let description = [{
    Keeps an op that tdx has no dedicated op for, so that capture never loses
    one. `schema` is the operator's schema name `namespace::name` or
    `namespace::name.overload`. Every argument of the schema call is kept:

    - a `Tensor` (or `Tensor?` that is given) is the next operand, in schema
      order;
    - a `Tensor[]` or `Tensor?[]` argument is an array in `args` of operand
      numbers (`index` integers) and `unit` for a None element;
    - any other argument is in `args` by its schema name: `unit` for None,
      `true`/`false`, i64 (ints, dtypes, layouts, memory formats), f64,
      strings (and devices by name), `array<i64: ...>` for int lists and
      arrays of bools or f64 for bool and float lists.

    The sharding passes treat it as needing replicated operands, except for
    the schemas with a rule in `AtenShardingRules.cpp` (the backward ops
    libtorch's autograd dispatches: pointwise and softmax backwards, layer
    norm, embedding and NLL loss backward), which a training step shards
    like the forward ops they differentiate. The CPU runtime runs it
    through ATen, which checks the values against the schema
    and names the operator and argument when one does not fit.

    It has no effect but its results, except an op with none, which is
    there for its effect and is kept: `torch._assert_async(cond, msg)` is
    `aten::_assert_async.msg`, a check at run time that stops the step with
    `msg` where `cond` is false, as eager raises it.

    ```mlir
    %r = tdx.aten "aten::index_select"(%x, %i) {args = {dim = 1 : i64}}
        : (tensor<4x8xf32>, tensor<3xi64>) -> tensor<4x3xf32>
    %y = tdx.aten "aten::index.Tensor"(%x, %i) {args = {indices = [unit, 1 : index]}}
        : (tensor<4x8xf32>, tensor<3xi64>) -> tensor<4x3xf32>
    %c = tdx.aten "aten::convolution"(%x, %w) {args = {bias = unit,
        stride = array<i64: 1, 1>, padding = array<i64: 0, 0>,
        dilation = array<i64: 1, 1>, transposed = false,
        output_padding = array<i64: 0, 0>, groups = 1 : i64}}
        : (tensor<1x3x8x8xf32>, tensor<4x3x3x3xf32>) -> tensor<1x4x6x6xf32>
    ```
  }];
  let extraClassDeclaration = [{
    /// Whether it draws from torch's global generator (rand, dropout,
    /// bernoulli, ...): running it again or in another order gives other
    /// numbers.
    bool isRandom();
    /// The operand numbers of a Tensor[] / Tensor?[] argument (nullopt for a
    /// None element), or nullopt when `arg` is not a tensor list.
    static std::optional<::llvm::SmallVector<std::optional<unsigned>>>
    tensorListRefs(::mlir::Attribute arg);
    /// The operands of plain Tensor arguments (those no tensor list holds),
    /// in schema order.
    ::llvm::SmallVector<::mlir::Value> getPlainOperands();
  }];
  let arguments = (ins StrAttr:$schema, Variadic<AnyType>:$operands,
                       OptionalAttr<DictionaryAttr>:$args);
  let results = (outs Variadic<AnyType>:$results);
  let assemblyFormat =
    "$schema `(` $operands `)` attr-dict `:` functional-type($operands, $results)";
  let hasVerifier = 1;
}

#endif // TDX_DIALECT_TDXGENERICOPS_TD
