// RUN: tdx-opt %s -split-input-file -verify-diagnostics --tdx-partition

tdx.mesh @mesh shape = [2, 2] axes = ["dp", "tp"]
func.func @multi_axis(%x: tensor<8x8xf32> {tdx.sharding = #tdx.sharding<@mesh, [Shard(0), Shard(1)]>}) -> tensor<8x8xf32> {
  // expected-error @+1 {{'tdx.redistribute' op changes 2 mesh axes at once; run tdx-insert-collectives first so that every redistribute is one collective}}
  %0 = tdx.redistribute %x <@mesh, [Shard(0), Shard(1)]> to <@mesh, [Replicate, Replicate]> : tensor<8x8xf32>
  return %0 : tensor<8x8xf32>
}

// -----

tdx.mesh @mesh shape = [2] axes = ["tp"]
func.func @unplaced(%x: tensor<8xf32> {tdx.sharding = #tdx.sharding<@mesh, [Shard(0)]>}) -> tensor<8xf32> {
  // expected-error @+1 {{'tdx.exp' op has no placement for its results ('tdx.shardings'); run tdx-propagate-sharding before tdx-partition}}
  %0 = tdx.exp %x : tensor<8xf32>
  return %0 : tensor<8xf32>
}

// -----

tdx.mesh @mesh shape = [2] axes = ["tp"]
func.func @annotated(%x: tensor<8xf32> {tdx.sharding = #tdx.sharding<@mesh, [Shard(0)]>}) -> tensor<8xf32> {
  // expected-error @+1 {{'tdx.annotate' op is still here; run tdx-propagate-sharding before tdx-partition}}
  %0 = tdx.annotate %x <@mesh, [Shard(0)]> : tensor<8xf32>
  return %0 : tensor<8xf32>
}

// -----

// expected-error @+1 {{tdx-partition: the module is already partitioned (its types are per-rank); partition the global program once}}
module attributes {tdx.partitioned} {
  func.func @f() { return }
}

// -----

tdx.mesh @mesh shape = [2] axes = ["tp"]
// expected-error @+1 {{'func.func' op placement of argument #0 has 2 placement(s) but mesh @mesh has 1 axes ("tp")}}
func.func @bad_arg(%x: tensor<8xf32> {tdx.sharding = #tdx.sharding<@mesh, [Shard(0), Replicate]>}) -> tensor<8xf32> {
  return %x : tensor<8xf32>
}
