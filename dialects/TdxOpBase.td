//===- TdxOpBase.td - base classes shared by tdx ops -------*- tablegen -*-===//

#ifndef TDX_DIALECT_TDXOPBASE_TD
#define TDX_DIALECT_TDXOPBASE_TD

include "TdxAttrs.td"
include "TdxInterfaces.td"
include "mlir/IR/SymbolInterfaces.td"
include "mlir/IR/BuiltinAttributes.td"
include "mlir/Interfaces/SideEffectInterfaces.td"
include "mlir/Interfaces/InferTypeOpInterface.td"
include "mlir/Interfaces/ControlFlowInterfaces.td"

/// A tdx op. Besides ODS's own fields, an op declares here, once, what the
/// rest of the compiler reads from generated tables
/// (dialects/gen_op_registry.py writes them; docs/ir.md explains the form):
class Tdx_Op<string mnemonic, list<Trait> traits = []>
    : Op<Tdx_Dialect, mnemonic, traits> {
  /// How both backends run the op: an expression in the runtimes' tensor
  /// API (`T::` is ATen on CPU and tdx::cu on CUDA). `$name` is the
  /// operand or attribute of that name, `$dtype` the result's element
  /// type; `[...]` is printed only when its optional operands and
  /// attributes are present. An async collective's call is started (its
  /// result is a handle). Empty: the emitter prints the op itself
  /// (structure, fused kernels, ops whose call depends on the mesh).
  string runtimeCall = "";
  /// The op in PyTorch eager, the reference executor's oracle: a Python
  /// expression over `torch`, `F` (torch.nn.functional) and `aten`
  /// (torch.ops.aten), with `$name` and `$dtype` as above. Every op with a
  /// sharding rule has one, except state access, tdx.aten (its schema is
  /// its reference) and ops filling a global shape (the executor makes
  /// this rank's box); the generator fails the build naming an op
  /// without.
  string torchReference = "";
}

/// The op has a factor mapping for sharding propagation (ShardingRules.cpp).
def Tdx_HasShardingRule
    : DeclareOpInterfaceMethods<Tdx_ShardingRuleOpInterface>;
/// ... and a per-rank rewrite of its own in tdx-partition (PartitionRules.cpp).
def Tdx_HasPartitionRule
    : DeclareOpInterfaceMethods<Tdx_ShardingRuleOpInterface, ["partition"]>;

def Tdx_Tensor : RankedTensorOf<[AnyType]>;
def Tdx_FloatTensor : RankedTensorOf<[AnyFloat]>;
def Tdx_IntTensor : RankedTensorOf<[AnySignlessInteger]>;
def Tdx_BoolTensor : RankedTensorOf<[I1]>;
/// Numbers that arithmetic applies to: floats and non-boolean integers.
def Tdx_NumericTensor
    : RankedTensorOf<[AnyFloat, SignlessIntOfWidths<[8, 16, 32, 64]>]>;

/// A result type computed from the operands and attributes by
/// InferTypeOpInterface (the op defines the static `inferReturnTypes` of
/// InferTypeOpAdaptor). The printed form keeps the result type; the
/// interface's verifier checks it against the inferred one, and a failed
/// inference reports its reason at the op.
class Tdx_InferredOp<string mnemonic, list<Trait> traits = [],
                     bit ownPartition = 0>
    : Tdx_Op<mnemonic, !listconcat(traits, [Pure, InferTypeOpAdaptor,
                                            !if(ownPartition, Tdx_HasPartitionRule,
                                                Tdx_HasShardingRule)])>;

#endif // TDX_DIALECT_TDXOPBASE_TD
