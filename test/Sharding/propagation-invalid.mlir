// RUN: tdx-opt %s -split-input-file -verify-diagnostics --tdx-propagate-sharding

// Two user annotations ask the same op to shard different factors over one
// axis at the same priority: an error, never a silent choice.
tdx.mesh @mesh shape = [2] axes = ["tp"]
func.func @conflict(%x: tensor<8x16xf32>, %w: tensor<32x16xf32>) -> tensor<8x32xf32> {
  // expected-note @+1 {{the sharding of operand #0}}
  %xs = tdx.annotate %x <@mesh, [Shard(0)]> : tensor<8x16xf32>
  // expected-note @+1 {{the sharding of operand #1}}
  %ws = tdx.annotate %w <@mesh, [Shard(0)]> : tensor<32x16xf32>
  // expected-error @+1 {{conflicting user shardings on mesh axis "tp": operand #0 and operand #1 ask this op to shard different dims over it, both at priority 0; give one annotation a larger 'priority' number (lower priority) or make them agree}}
  %y = tdx.linear %xs, %ws : (tensor<8x16xf32>, tensor<32x16xf32>) -> tensor<8x32xf32>
  return %y : tensor<8x32xf32>
}

// -----

tdx.mesh @a shape = [2] axes = ["tp"]
tdx.mesh @b shape = [2] axes = ["tp"]
// expected-error @+1 {{uses two meshes, @a and @b; tdx places one function on one mesh}}
func.func @two_meshes(%x: tensor<8xf32>, %y: tensor<8xf32>) -> tensor<8xf32> {
  // expected-note @+1 {{mesh @a here}}
  %xs = tdx.annotate %x <@a, [Shard(0)]> : tensor<8xf32>
  // expected-note @+1 {{mesh @b here}}
  %ys = tdx.annotate %y <@b, [Shard(0)]> : tensor<8xf32>
  %s = tdx.add %xs, %ys : (tensor<8xf32>, tensor<8xf32>) -> tensor<8xf32>
  return %s : tensor<8xf32>
}

// -----

module attributes {tdx.partitioned} {
  // expected-error @-1 {{tdx-propagate-sharding runs on the global view, but this module is already partitioned}}
  func.func @f() { return }
}

// -----

tdx.mesh @mesh shape = [2] axes = ["tp"]
tdx.mesh @other shape = [2, 2] axes = ["a", "b"]
// expected-note @+1 {{mesh @other here}}
tdx.parameter @w : tensor<8xf32> sharding <@other, [Shard(0), Replicate]> init {
  %0 = tdx.full 0.0 : tensor<8xf32>
  tdx.yield %0 : tensor<8xf32>
}
tdx.parameter @v : tensor<8xf32> tied_to @w
// A tied name is placed where its owner is: two meshes in one function.
// expected-error @+1 {{uses two meshes}}
func.func @tied_mesh(%x: tensor<8xf32>) -> tensor<8xf32> {
  // expected-note @+1 {{mesh @mesh here}}
  %xs = tdx.annotate %x <@mesh, [Shard(0)]> : tensor<8xf32>
  %v = tdx.param_ref @v : tensor<8xf32>
  %s = tdx.add %xs, %v : (tensor<8xf32>, tensor<8xf32>) -> tensor<8xf32>
  return %s : tensor<8xf32>
}
