// RUN: tdx-opt %s -split-input-file --tdx-check-replication -verify-diagnostics

// An output claimed equal across dp that differs there (computed from a
// dp-split input): JAX's replication check, naming both lines.
tdx.mesh @mesh shape = [2] axes = ["dp"]
func.func @replicate_claim(%x: tensor<8x4xf32>) -> tensor<4x4xf32> {
  // expected-note @+1 {{it differs across "dp" from here}}
  %l = tdx.to_local %x <@mesh, [Shard(0)]> : tensor<8x4xf32> -> tensor<4x4xf32>
  %e = tdx.exp %l : tensor<4x4xf32>
  // expected-error @+1 {{'tdx.from_local' op declares the region's output Replicate over mesh axis "dp", but it differs across "dp"; reduce it there (all_reduce), declare it Shard or Partial, or turn the check off (check_replication=False)}}
  %g = tdx.from_local %e <@mesh, [Replicate]> : tensor<4x4xf32> -> tensor<4x4xf32>
  return %g : tensor<4x4xf32>
}

// -----

// A rank-dependent value (the rank, then a permute) differs too.
tdx.mesh @mesh shape = [2, 2] axes = ["dp", "tp"]
func.func @permuted(%x: tensor<4xf32>) -> tensor<4xf32> {
  %l = tdx.to_local %x <@mesh, [Replicate, Replicate]> : tensor<4xf32> -> tensor<4xf32>
  // expected-note @+1 {{it differs across "tp" from here}}
  %p = tdx.aten "tdx::permute"(%l) {args = {pairs = array<i64: 0, 1, 1, 0>, axes = "tp", group = 2 : i64}} : (tensor<4xf32>) -> tensor<4xf32>
  // expected-error @+1 {{declares the region's output Replicate over mesh axis "tp", but it differs across "tp"}}
  %g = tdx.from_local %p <@mesh, [Replicate, Replicate]> : tensor<4xf32> -> tensor<4xf32>
  return %g : tensor<4xf32>
}

// -----

// Reduced across the axis, or unchecked: no error.
tdx.mesh @mesh shape = [2] axes = ["dp"]
func.func @reduced(%x: tensor<8x4xf32>) -> (tensor<4x4xf32>, tensor<4x4xf32>) {
  %l = tdx.to_local %x <@mesh, [Shard(0)]> : tensor<8x4xf32> -> tensor<4x4xf32>
  %s = tdx.aten "tdx::all_reduce"(%l) {args = {reduce = "sum", axes = "dp", group = 2 : i64, site = "m.py:1"}} : (tensor<4x4xf32>) -> tensor<4x4xf32>
  %g = tdx.from_local %s <@mesh, [Replicate]> : tensor<4x4xf32> -> tensor<4x4xf32>
  %u = tdx.from_local %l <@mesh, [Replicate]> unchecked : tensor<4x4xf32> -> tensor<4x4xf32>
  return %g, %u : tensor<4x4xf32>, tensor<4x4xf32>
}
