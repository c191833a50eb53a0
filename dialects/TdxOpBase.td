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

class Tdx_Op<string mnemonic, list<Trait> traits = []>
    : Op<Tdx_Dialect, mnemonic, traits>;

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
