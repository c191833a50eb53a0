// RUN: tdx-opt %s -split-input-file -verify-diagnostics --tdx-fold-mesh

// A folded axis must split evenly: each rank computes every shard with the
// shape the whole mesh's rank has.
tdx.mesh @mesh shape = [4] axes = ["dp"] ranks = [1]
func.func @uneven(%x: tensor<6x8xf32> {tdx.sharding = #tdx.sharding<@mesh, [Shard(0)]>}) -> tensor<6x8xf32> {
  // expected-error @+1 {{'tdx.exp' op splits dim 0 of size 6 into 4 shards over folded mesh axes; a folded axis needs an even split (change the batch or the plan, or do not fold)}}
  %0 = tdx.exp %x {tdx.shardings = [#tdx.sharding<@mesh, [Shard(0)]>]} : tensor<6x8xf32>
  return %0 : tensor<6x8xf32>
}

// -----

tdx.mesh @mesh shape = [2, 2] axes = ["dp", "tp"] ranks = [1, 2]
// expected-error @+1 {{'func.func' op splits dim 0 over folded mesh axis "dp" and over "tp"; a folded axis must be the only one that splits a dim (fold "tp" too, or place the dim on one axis)}}
func.func @two_axes(%x: tensor<8x8xf32> {tdx.sharding = #tdx.sharding<@mesh, [Shard(0), Shard(0)]>}) -> tensor<8x8xf32> {
  return %x : tensor<8x8xf32>
}

// -----

// An op whose per-rank form communicates by itself (a vocabulary-parallel
// embedding) cannot run its shards one after another.
tdx.mesh @mesh shape = [2] axes = ["tp"] ranks = [1]
tdx.parameter @wte : tensor<100x16xf32> sharding <@mesh, [Shard(0)]> init {
  %0 = tdx.normal(0.0, 0.02) seed(0, 0) : tensor<100x16xf32>
  tdx.yield %0 : tensor<100x16xf32>
}
func.func @vocab(%ids: tensor<2x8xi64>) -> tensor<2x8x16xf32> {
  %w = tdx.param_ref @wte {tdx.shardings = [#tdx.sharding<@mesh, [Shard(0)]>]} : tensor<100x16xf32>
  // expected-error @+1 {{'tdx.embedding' op communicates inside the op over a folded mesh axis (its per-rank form makes 'tdx.mesh_coord'), which tdx-fold-mesh cannot run; give that axis its ranks, or place the op's split dim on an axis that is not folded}}
  %e = tdx.embedding %w, %ids {tdx.shardings = [#tdx.sharding<@mesh, [Partial(sum)]>]} : (tensor<100x16xf32>, tensor<2x8xi64>) -> tensor<2x8x16xf32>
  %r = tdx.redistribute %e <@mesh, [Partial(sum)]> to <@mesh, [Replicate]> {tdx.shardings = [#tdx.sharding<@mesh, [Replicate]>]} : tensor<2x8x16xf32>
  return %r : tensor<2x8x16xf32>
}

// -----

// A redistribute of more than one axis has no single local form.
tdx.mesh @mesh shape = [2, 2] axes = ["dp", "tp"] ranks = [1, 2]
func.func @multi(%x: tensor<8x8xf32> {tdx.sharding = #tdx.sharding<@mesh, [Shard(0), Shard(1)]>}) -> tensor<8x8xf32> {
  // expected-error @+1 {{'tdx.redistribute' op changes 2 mesh axes at once; run tdx-insert-collectives first}}
  %0 = tdx.redistribute %x <@mesh, [Shard(0), Shard(1)]> to <@mesh, [Replicate, Replicate]> : tensor<8x8xf32>
  return %0 : tensor<8x8xf32>
}

// -----

// A value the whole program reads (here: returns) must not stay Partial.
tdx.mesh @mesh shape = [2] axes = ["dp"] ranks = [1]
func.func @partial_out(%x: tensor<8x4xf32> {tdx.sharding = #tdx.sharding<@mesh, [Shard(1)]>}) -> tensor<8xf32> {
  %0 = tdx.sum %x dims = [1] {tdx.shardings = [#tdx.sharding<@mesh, [Partial(sum)]>]} : tensor<8x4xf32> -> tensor<8xf32>
  // expected-error @+1 {{'func.return' op reads a value that is Partial over folded mesh axis "dp"; it must be reduced before}}
  return %0 : tensor<8xf32>
}

// -----

module attributes {tdx.partitioned} {
  // expected-error @+1 {{'tdx.mesh' op has folded axes but the module is already partitioned; run tdx-fold-mesh before tdx-partition}}
  tdx.mesh @mesh shape = [2] axes = ["dp"] ranks = [1]
}

// -----

// A split a folded redistribute makes must be even too.
tdx.mesh @mesh shape = [4] axes = ["dp"] ranks = [1]
func.func @uneven_split(%x: tensor<6x8xf32>) -> tensor<8xf32> {
  // expected-error @+1 {{'tdx.redistribute' op splits dim 0 of size 6 into 4 shards over folded mesh axes}}
  %s = tdx.redistribute %x <@mesh, [Replicate]> to <@mesh, [Shard(0)]> {tdx.shardings = [#tdx.sharding<@mesh, [Shard(0)]>]} : tensor<6x8xf32>
  %p = tdx.sum %s dims = [0] {tdx.shardings = [#tdx.sharding<@mesh, [Partial(sum)]>]} : tensor<6x8xf32> -> tensor<8xf32>
  %r = tdx.redistribute %p <@mesh, [Partial(sum)]> to <@mesh, [Replicate]> {tdx.shardings = [#tdx.sharding<@mesh, [Replicate]>]} : tensor<8xf32>
  return %r : tensor<8xf32>
}

// -----

// A function folded on one mesh places nothing on another.
tdx.mesh @a shape = [2] axes = ["dp"] ranks = [1]
tdx.mesh @b shape = [2, 2] axes = ["x", "y"]
func.func @two_meshes(%x: tensor<8x8xf32> {tdx.sharding = #tdx.sharding<@a, [Shard(0)]>}) -> tensor<8x8xf32> {
  // expected-error @+1 {{'tdx.exp' op is placed on mesh @b while its function is folded on @a; a folded program runs on one mesh}}
  %0 = tdx.exp %x {tdx.shardings = [#tdx.sharding<@b, [Shard(0), Replicate]>]} : tensor<8x8xf32>
  return %0 : tensor<8x8xf32>
}
