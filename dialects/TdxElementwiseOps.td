//===- TdxElementwiseOps.td - unary, binary, compare, where, cast -*- tablegen -*-===//
//
// Binary and ternary ops broadcast like PyTorch (numpy rules: align trailing
// dims; a dim of 1 stretches). Operands of arithmetic ops must share one
// element type: tdx records the casts that PyTorch's type promotion inserts
// as explicit `tdx.cast` ops.
//
//===----------------------------------------------------------------------===//

#ifndef TDX_DIALECT_TDXELEMENTWISEOPS_TD
#define TDX_DIALECT_TDXELEMENTWISEOPS_TD

include "TdxOpBase.td"

/// An op of the elementwise table (include/tdx/Runtime/ElementwiseOps.def):
/// its rule, kernel body, init-program kind and raising come from the row.
def Tdx_TableElementwise : NativeOpTrait<"TdxTableElementwise">;

class Tdx_BinaryOp<string mnemonic, string aten, Type operandType = Tdx_Tensor>
    : Tdx_InferredOp<mnemonic, [Tdx_TableElementwise]> {
  let summary = "elementwise " # aten # " with broadcasting";
  let description = [{
    `aten::}] # aten # [{`: elementwise over the broadcast shape of the
    operands, which must share one element type.

    ```mlir
    %r = tdx.}] # mnemonic # [{ %a, %b : (tensor<4x1xf32>, tensor<8xf32>) -> tensor<4x8xf32>
    ```
  }];
  let arguments = (ins operandType:$lhs, operandType:$rhs);
  let results = (outs Tdx_Tensor:$result);
  let assemblyFormat =
    "$lhs `,` $rhs attr-dict `:` functional-type(operands, results)";
  let extraClassDefinition = [{
    ::mlir::LogicalResult $cppClass::inferReturnTypes(
        ::mlir::MLIRContext *, ::std::optional<::mlir::Location> loc, Adaptor adaptor,
        ::llvm::SmallVectorImpl<::mlir::Type> &inferred) {
      ::mlir::ValueRange operands = adaptor.getOperands();
      return inferBroadcastResult(loc, getOperationName(),
          operands.getTypes(), /*resultElementType=*/nullptr, inferred);
    }
  }];
}

def Tdx_AddOp : Tdx_BinaryOp<"add", "add.Tensor">;
def Tdx_SubOp : Tdx_BinaryOp<"sub", "sub.Tensor">;
def Tdx_MulOp : Tdx_BinaryOp<"mul", "mul.Tensor">;
def Tdx_DivOp : Tdx_BinaryOp<"div", "div.Tensor">;
def Tdx_PowOp : Tdx_BinaryOp<"pow", "pow.Tensor_Tensor">;
def Tdx_MaximumOp : Tdx_BinaryOp<"maximum", "maximum">;
def Tdx_MinimumOp : Tdx_BinaryOp<"minimum", "minimum">;

def Tdx_CmpOp : Tdx_InferredOp<"cmp"> {
  let summary = "elementwise comparison with broadcasting (aten eq/ne/lt/le/gt/ge)";
  let description = [{
    ```mlir
    %m = tdx.cmp lt, %a, %b : (tensor<4x4xi64>, tensor<4xi64>) -> tensor<4x4xi1>
    ```
  }];
  let arguments = (ins Tdx_CmpPredicate:$predicate, Tdx_Tensor:$lhs,
                       Tdx_Tensor:$rhs);
  let results = (outs Tdx_BoolTensor:$result);
  let assemblyFormat =
    "$predicate `,` $lhs `,` $rhs attr-dict `:` functional-type(operands, results)";
}

def Tdx_WhereOp : Tdx_InferredOp<"where"> {
  let summary = "select by a boolean condition with broadcasting (aten::where.self)";
  let description = [{
    ```mlir
    %r = tdx.where %mask, %a, %b : (tensor<4x4xi1>, tensor<4x4xf32>, tensor<f32>) -> tensor<4x4xf32>
    ```
  }];
  let arguments = (ins Tdx_BoolTensor:$condition, Tdx_Tensor:$lhs,
                       Tdx_Tensor:$rhs);
  let results = (outs Tdx_Tensor:$result);
  let assemblyFormat =
    "$condition `,` $lhs `,` $rhs attr-dict `:` functional-type(operands, results)";
}

class Tdx_UnaryOp<string mnemonic, string aten, Type operandType,
                  list<Trait> traits = []>
    : Tdx_Op<mnemonic, !listconcat(traits, [Pure, SameOperandsAndResultType,
                                            Tdx_HasShardingRule, Tdx_TableElementwise])> {
  let summary = "elementwise " # aten;
  let description = [{
    `aten::}] # aten # [{`, elementwise; the result has the operand's type.

    ```mlir
    %r = tdx.}] # mnemonic # [{ %x : tensor<4x8xf32>
    ```
  }];
  let arguments = (ins operandType:$input);
  let results = (outs operandType:$result);
  let assemblyFormat = "$input attr-dict `:` type($input)";
}

def Tdx_NegOp : Tdx_UnaryOp<"neg", "neg", Tdx_NumericTensor>;
def Tdx_AbsOp : Tdx_UnaryOp<"abs", "abs", Tdx_NumericTensor>;
def Tdx_ReluOp : Tdx_UnaryOp<"relu", "relu", Tdx_NumericTensor>;
def Tdx_ExpOp : Tdx_UnaryOp<"exp", "exp", Tdx_FloatTensor>;
def Tdx_LogOp : Tdx_UnaryOp<"log", "log", Tdx_FloatTensor>;
def Tdx_SqrtOp : Tdx_UnaryOp<"sqrt", "sqrt", Tdx_FloatTensor>;
def Tdx_RsqrtOp : Tdx_UnaryOp<"rsqrt", "rsqrt", Tdx_FloatTensor>;
def Tdx_TanhOp : Tdx_UnaryOp<"tanh", "tanh", Tdx_FloatTensor>;
def Tdx_SigmoidOp : Tdx_UnaryOp<"sigmoid", "sigmoid", Tdx_FloatTensor>;
def Tdx_SiluOp : Tdx_UnaryOp<"silu", "silu", Tdx_FloatTensor>;
def Tdx_SinOp : Tdx_UnaryOp<"sin", "sin", Tdx_FloatTensor>;
def Tdx_CosOp : Tdx_UnaryOp<"cos", "cos", Tdx_FloatTensor>;
def Tdx_ErfOp : Tdx_UnaryOp<"erf", "erf", Tdx_FloatTensor>;
def Tdx_HardswishOp : Tdx_UnaryOp<"hardswish", "hardswish", Tdx_FloatTensor>;
def Tdx_HardsigmoidOp : Tdx_UnaryOp<"hardsigmoid", "hardsigmoid", Tdx_FloatTensor>;

def Tdx_GeluOp : Tdx_Op<"gelu", [Pure, SameOperandsAndResultType,
                                 Tdx_HasShardingRule]> {
  let summary = "elementwise gelu";
  let results = (outs Tdx_FloatTensor:$result);
  let arguments = (ins Tdx_FloatTensor:$input,
      DefaultValuedAttr<Tdx_GeluApproximation,
                        "GeluApproximation::none">:$approximate);
  let assemblyFormat =
    "$input (`approximate` `=` $approximate^)? attr-dict `:` type($input)";
  let description = [{
    `aten::gelu(input, approximate="none"|"tanh")`.

    ```mlir
    %r = tdx.gelu %x approximate = tanh : tensor<4x8xf32>
    ```
  }];
}

def Tdx_CastOp : Tdx_Op<"cast", [Pure, Tdx_HasShardingRule]> {
  let summary = "dtype conversion (Tensor.to(dtype), aten::_to_copy)";
  let description = [{
    Converts the element type; the shape must not change.

    ```mlir
    %h = tdx.cast %x : tensor<4x8xf32> to tensor<4x8xbf16>
    ```
  }];
  let arguments = (ins Tdx_Tensor:$input);
  let results = (outs Tdx_Tensor:$result);
  let assemblyFormat = "$input attr-dict `:` type($input) `to` type($result)";
  let hasVerifier = 1;
}

#endif // TDX_DIALECT_TDXELEMENTWISEOPS_TD
