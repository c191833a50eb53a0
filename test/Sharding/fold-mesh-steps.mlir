// RUN: tdx-opt %s --tdx-fold-mesh | FileCheck %s

// Over a folded axis, tdx-fold-mesh computes each of the planner's
// elementary steps (axisSteps) locally. Shard(0) -> Partial(sum) is an
// all_gather and a local zero: the two shards are concatenated, coordinate
// 0 keeps the whole value and coordinate 1 holds zeros; Partial(sum) ->
// Replicate then adds them in coordinate order.
// CHECK-LABEL: func.func @forward
// CHECK-SAME:    (%[[A:.*]]: tensor<4x2xf32>
// CHECK-DAG:     %[[S0:.*]] = tdx.slice %[[A]] dim 0 [0 : 2 : 1]
// CHECK-DAG:     %[[S1:.*]] = tdx.slice %[[A]] dim 0 [2 : 4 : 1]
// CHECK:         %[[ALL:.*]] = tdx.concat %[[S0]], %[[S1]] dim 0
// CHECK:         %[[Z:.*]] = tdx.full 0.000000e+00
// CHECK:         %[[SUM:.*]] = tdx.add %[[ALL]], %[[Z]]
// CHECK:         return %[[SUM]]
tdx.mesh @mesh shape = [2] axes = ["x"] ranks = [1]
func.func @forward(%a: tensor<4x2xf32> {tdx.sharding = #tdx.sharding<@mesh, [Shard(0)]>}) -> tensor<4x2xf32> {
  %p = tdx.redistribute %a <@mesh, [Shard(0)]> to <@mesh, [Partial(sum)]> {tdx.shardings = [#tdx.sharding<@mesh, [Partial(sum)]>]} : tensor<4x2xf32>
  %r = tdx.redistribute %p <@mesh, [Partial(sum)]> to <@mesh, [Replicate]> {tdx.shardings = [#tdx.sharding<@mesh, [Replicate]>]} : tensor<4x2xf32>
  return %r : tensor<4x2xf32>
}
