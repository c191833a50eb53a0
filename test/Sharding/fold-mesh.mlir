// tdx-fold-mesh: a Megatron MLP and a weight gradient on a 2x2 (dp, tp) mesh.
// A folded axis runs inside each rank: each op is cloned per shard with the
// shard's shapes (the op that rank of the whole mesh runs), and what the
// axis would all-reduce is added in coordinate order.
//
// dp folded (ranks = [1, 2]): two batch halves, each all-reduced over tp.
// RUN: tdx-opt %s --tdx-place --tdx-insert-collectives --tdx-fold-mesh | FileCheck %s --check-prefix=DP
// Both folded (ranks = [1, 1]): four shards, no collective left.
// RUN: sed 's/ranks = \[1, 2\]/ranks = [1, 1]/' %s | tdx-opt --tdx-place --tdx-spmd | FileCheck %s --check-prefix=BOTH --implicit-check-not=tdx.all_reduce --implicit-check-not=tdx.redistribute
// The per-rank program of the dp-folded mesh: all-reduces over tp per batch half.
// RUN: tdx-opt %s --tdx-place --tdx-spmd | FileCheck %s --check-prefix=SPMD --implicit-check-not=tdx.all_gather --implicit-check-not=tdx.reduce_scatter
// Without ranks the pass changes nothing.
// RUN: sed 's/ ranks = \[1, 2\]//' %s | tdx-opt --tdx-place --tdx-insert-collectives > %t.plain
// RUN: tdx-opt %t.plain --tdx-fold-mesh | diff - %t.plain

tdx.mesh @mesh shape = [2, 2] axes = ["dp", "tp"] ranks = [1, 2]
tdx.parameter @fc1.weight : tensor<32x16xf32> sharding <@mesh, [Replicate, Shard(0)]> init {
  %0 = tdx.normal(0.0, 0.02) seed(0, 0) : tensor<32x16xf32>
  tdx.yield %0 : tensor<32x16xf32>
}
tdx.parameter @fc2.weight : tensor<16x32xf32> sharding <@mesh, [Replicate, Shard(1)]> init {
  %0 = tdx.normal(0.0, 0.02) seed(0, 1) : tensor<16x32xf32>
  tdx.yield %0 : tensor<16x32xf32>
}

// DP: tdx.mesh @mesh shape = [1, 2] axes = ["dp", "tp"]
// DP-NOT: ranks
// DP: tdx.parameter @fc1.weight : tensor<32x16xf32> sharding <@mesh, [Replicate, Shard(0)]>
// DP-LABEL: func.func @forward
// DP-SAME: tdx.sharding = #tdx.sharding<@mesh, [Replicate, Replicate]>
// DP-DAG: %[[X1:.*]] = tdx.slice %arg0 dim 0 [4 : 8 : 1] {{.*}} -> tensor<4x16xf32>
// DP-DAG: %[[X0:.*]] = tdx.slice %arg0 dim 0 [0 : 4 : 1] {{.*}} -> tensor<4x16xf32>
// DP: %[[W1:.*]] = tdx.param_ref @fc1.weight
// DP: %[[H0:.*]] = tdx.linear %[[X0]], %[[W1]] {tdx.shardings = [#tdx.sharding<@mesh, [Replicate, Shard(1)]>]} : (tensor<4x16xf32>, tensor<32x16xf32>) -> tensor<4x32xf32>
// DP: %[[H1:.*]] = tdx.linear %[[X1]], %[[W1]]
// DP: %[[G0:.*]] = tdx.gelu %[[H0]]
// DP: %[[G1:.*]] = tdx.gelu %[[H1]]
// DP: %[[W2:.*]] = tdx.param_ref @fc2.weight
// DP: %[[P0:.*]] = tdx.linear %[[G0]], %[[W2]] {tdx.shardings = [#tdx.sharding<@mesh, [Replicate, Partial(sum)]>]}
// DP: %[[P1:.*]] = tdx.linear %[[G1]], %[[W2]]
// DP: %[[Y0:.*]] = tdx.redistribute %[[P0]] <@mesh, [Replicate, Partial(sum)]> to <@mesh, [Replicate, Replicate]> {{.*}} : tensor<4x16xf32>
// DP: %[[Y1:.*]] = tdx.redistribute %[[P1]] <@mesh, [Replicate, Partial(sum)]> to <@mesh, [Replicate, Replicate]>
// The batch halves are joined where the whole value is returned.
// DP: %[[Y:.*]] = tdx.concat %[[Y0]], %[[Y1]] dim 0 {{.*}} -> tensor<8x16xf32>
// The weight gradient: one matmul per batch half, added in dp order.
// DP: %[[T0:.*]] = tdx.transpose %[[X0]] 0, 1
// DP: %[[T1:.*]] = tdx.transpose %[[X1]] 0, 1
// DP: %[[M0:.*]] = tdx.matmul %[[T0]], %{{.*}} : (tensor<16x4xf32>, tensor<4x16xf32>) -> tensor<16x16xf32>
// DP: %[[M1:.*]] = tdx.matmul %[[T1]], %{{.*}} : (tensor<16x4xf32>, tensor<4x16xf32>) -> tensor<16x16xf32>
// DP: %[[GW:.*]] = tdx.add %[[M0]], %[[M1]]
// DP: return %[[Y]], %[[GW]]

// BOTH: tdx.mesh @mesh shape = [1, 1] axes = ["dp", "tp"]
// The tp shards of a weight are slices of the whole weight each rank holds.
// BOTH: %[[W1:.*]] = tdx.param_ref @fc1.weight {{.*}} : tensor<32x16xf32>
// BOTH-DAG: tdx.slice %[[W1]] dim 0 [16 : 32 : 1]
// BOTH-DAG: tdx.slice %[[W1]] dim 0 [0 : 16 : 1]
// BOTH-COUNT-4: tdx.linear {{.*}} : (tensor<4x16xf32>, tensor<16x16xf32>) -> tensor<4x16xf32>
// BOTH-COUNT-4: tdx.gelu
// BOTH-COUNT-4: tdx.linear {{.*}} : (tensor<4x16xf32>, tensor<16x16xf32>) -> tensor<4x16xf32>
// The row-parallel partials of each batch half are added (tp), the halves joined (dp).
// BOTH-COUNT-2: tdx.add {{.*}} : (tensor<4x16xf32>, tensor<4x16xf32>) -> tensor<4x16xf32>
// BOTH: tdx.concat {{.*}} dim 0
// BOTH: tdx.add {{.*}} : (tensor<16x16xf32>, tensor<16x16xf32>) -> tensor<16x16xf32>

// SPMD: tdx.mesh @mesh shape = [1, 2] axes = ["dp", "tp"]
// SPMD-COUNT-3: tdx.linear {{.*}} : (tensor<4x16xf32>, tensor<16x16xf32>) -> tensor<4x16xf32>
// (The program reads %y twice, so each half is all-reduced twice, as on 2x2.)
// SPMD-COUNT-2: tdx.all_reduce {{.*}} axes = ["tp"] reduce = sum {tdx.payload_bytes = 256 : i64{{.*}} : tensor<4x16xf32> -> tensor<4x16xf32>
// SPMD: tdx.linear {{.*}} : (tensor<4x16xf32>, tensor<16x16xf32>) -> tensor<4x16xf32>
// SPMD-COUNT-2: tdx.all_reduce {{.*}} axes = ["tp"] reduce = sum {tdx.payload_bytes = 256 : i64{{.*}} : tensor<4x16xf32> -> tensor<4x16xf32>
func.func @forward(%x: tensor<8x16xf32> {tdx.sharding = #tdx.sharding<@mesh, [Shard(0), Replicate]>}) -> (tensor<8x16xf32>, tensor<16x16xf32>) {
  %w1 = tdx.param_ref @fc1.weight : tensor<32x16xf32>
  %h = tdx.linear %x, %w1 : (tensor<8x16xf32>, tensor<32x16xf32>) -> tensor<8x32xf32>
  %g = tdx.gelu %h : tensor<8x32xf32>
  %w2 = tdx.param_ref @fc2.weight : tensor<16x32xf32>
  %y = tdx.linear %g, %w2 : (tensor<8x32xf32>, tensor<16x32xf32>) -> tensor<8x16xf32>
  %xt = tdx.transpose %x 0, 1 : tensor<8x16xf32> -> tensor<16x8xf32>
  %gw = tdx.matmul %xt, %y : (tensor<16x8xf32>, tensor<8x16xf32>) -> tensor<16x16xf32>
  %r = tdx.annotate %y <@mesh, [Replicate, Replicate]> : tensor<8x16xf32>
  %s = tdx.annotate %gw <@mesh, [Replicate, Replicate]> : tensor<16x16xf32>
  return %r, %s : tensor<8x16xf32>, tensor<16x16xf32>
}
