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

#endif // TDX_DIALECT_TDXINTERFACES_TD
