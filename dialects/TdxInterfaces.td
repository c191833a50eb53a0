//===- TdxInterfaces.td - interfaces of tdx ops ------------*- tablegen -*-===//

#ifndef TDX_DIALECT_TDXINTERFACES_TD
#define TDX_DIALECT_TDXINTERFACES_TD

include "mlir/IR/OpBase.td"

def Tdx_ShardingRuleOpInterface : OpInterface<"ShardingRuleOpInterface"> {
  let description = [{
    How an op's tensor dims relate, as a Shardy-style factor mapping: every
    dim of every tensor operand and result is mapped to factors (for matmul
    `([i, k], [k, j]) -> ([i, j])` with `k` a reduction factor). Sharding a
    factor over a mesh axis shards every dim it maps to; sharding a reduction
    factor leaves the results `Partial`; a factor of kind `replicated` cannot
    be sharded. One propagation algorithm serves every op through this
    interface (`tdx-propagate-sharding`).

    `partition` is the op's own part of `tdx-partition`: called after the op
    has been retyped to per-rank types, it rewrites the op where its local
    computation is not the global one on local operands (a vocabulary-split
    embedding or cross-entropy, a reshape whose sizes name global dims). The
    default leaves the op as it is.
  }];
  let cppNamespace = "::mlir::tdx";
  let methods = [
    InterfaceMethod<"The factor mapping of this op's tensor operands and results.",
      "::mlir::tdx::ShardingRule", "getShardingRule">,
    InterfaceMethod<[{
        Rewrites this op, already retyped to per-rank types, into its per-rank
        computation; an op it replaces is erased here and the replacement
        carries the op's `tdx.shardings`.
      }],
      "::mlir::LogicalResult", "partition",
      (ins "::mlir::tdx::PartitionContext &":$context), [{}],
      [{ return ::mlir::success(); }]>
  ];
}

def Tdx_StateOpInterface : OpInterface<"StateOpInterface"> {
  let description = [{
    Program state: a `tdx.parameter` or `tdx.buffer`, with its global type,
    its placement (the storage layout) and, when tied, the name of the state
    whose value it shares.
  }];
  let cppNamespace = "::mlir::tdx";
  let methods = [
    InterfaceMethod<"The state's global tensor type.", "::mlir::RankedTensorType",
      "getStateType", (ins), [{}], [{ return $_op.getTensorType(); }]>,
    InterfaceMethod<"The state's placement (null: replicated, or not placed yet).",
      "::mlir::tdx::ShardingAttr", "getStateSharding", (ins), [{}],
      [{ return $_op.getShardingAttr(); }]>,
    InterfaceMethod<"Places the state (its storage layout).", "void", "setStateSharding",
      (ins "::mlir::tdx::ShardingAttr":$sharding), [{}],
      [{ $_op.setShardingAttr(sharding); }]>,
    InterfaceMethod<"The state this one is tied to (null: none).", "::mlir::FlatSymbolRefAttr",
      "getTiedState", (ins), [{}], [{ return $_op.getTiedToAttr(); }]>
  ];
}

def Tdx_StateAccessOpInterface : OpInterface<"StateAccessOpInterface"> {
  let description = [{
    An op of a function that reads or writes program state by name
    (`tdx.param_ref`, `tdx.assign`). The one place a tied name resolves: a
    tied name reads and writes the state it shares.
  }];
  let cppNamespace = "::mlir::tdx";
  let methods = [
    InterfaceMethod<"The name the op writes.", "::mlir::FlatSymbolRefAttr", "getStateRef",
      (ins), [{}], [{ return $_op.getNameAttr(); }]>,
    InterfaceMethod<[{
        The tdx.parameter or tdx.buffer that holds the value: the one named,
        or the one a tied name shares; null when the name is no state.
        `symbols` caches lookups when given.
      }], "::mlir::tdx::StateOpInterface", "getStateOwner",
      (ins "::mlir::SymbolTableCollection *":$symbols), [{}],
      [{
        return ::llvm::dyn_cast_or_null<::mlir::tdx::StateOpInterface>(
            ::mlir::tdx::detail::lookupStateOwner($_op, $_op.getNameAttr(), symbols));
      }]>,
    InterfaceMethod<"The name of the state that holds the value (ties resolved).",
      "::mlir::StringAttr", "getStateName", (ins), [{}], [{
        ::mlir::Operation *owner = ::mlir::tdx::detail::lookupStateOwner(
            $_op, $_op.getNameAttr(), nullptr);
        return owner ? ::mlir::SymbolTable::getSymbolName(owner) : $_op.getNameAttr().getAttr();
      }]>
  ];
}

#endif // TDX_DIALECT_TDXINTERFACES_TD
