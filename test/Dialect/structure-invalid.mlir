// RUN: tdx-opt %s -split-input-file -verify-diagnostics

// expected-error @+1 {{'tdx.mesh' op has 2 dims in shape but 1 axis names; give one name per mesh dim}}
tdx.mesh @m shape = [2, 2] axes = ["dp"]

// -----

// expected-error @+1 {{'tdx.mesh' op axis "tp" has size 0; mesh axis sizes must be positive}}
tdx.mesh @m shape = [2, 0] axes = ["dp", "tp"]

// -----

// expected-error @+1 {{'tdx.mesh' op names axis "tp" twice; axis names must be unique}}
tdx.mesh @m shape = [2, 2] axes = ["tp", "tp"]

// -----

// expected-error @+1 {{'tdx.mesh' op needs at least one axis}}
tdx.mesh @m shape = [] axes = []

// -----

// expected-error @+1 {{'tdx.mesh' op has an empty axis name}}
tdx.mesh @m shape = [2] axes = [""]

// -----

// expected-error @+1 {{'tdx.parameter' op has no init region; give one ending in 'tdx.yield' or tie it to another name with 'tied_to @name'}}
tdx.parameter @w : tensor<4xf32>

// -----

tdx.parameter @w : tensor<4xf32> init {
  %0 = tdx.full 0.0 : tensor<4xf32>
  tdx.yield %0 : tensor<4xf32>
}
// expected-error @+1 {{'tdx.parameter' op is tied to @w and so takes its value from there; remove the init region}}
tdx.parameter @v : tensor<4xf32> tied_to @w init {
  %0 = tdx.full 0.0 : tensor<4xf32>
  tdx.yield %0 : tensor<4xf32>
}

// -----

tdx.parameter @w : tensor<4xf32> init {
  %0 = tdx.full 0.0 : tensor<8xf32>
  // expected-error @+1 {{'tdx.yield' op must yield exactly one value of the declared type 'tensor<4xf32>' of @w}}
  tdx.yield %0 : tensor<8xf32>
}

// -----

// expected-error @+1 {{'tdx.parameter' op init region takes no arguments}}
tdx.parameter @w : tensor<4xf32> init {
^bb0(%a: tensor<4xf32>):
  tdx.yield %a : tensor<4xf32>
}

// -----

// expected-error @+1 {{'tdx.parameter' op is tied to @nope, which is not a tdx.parameter or tdx.buffer}}
tdx.parameter @w : tensor<4xf32> tied_to @nope

// -----

tdx.parameter @w : tensor<4xf32> init {
  %0 = tdx.full 0.0 : tensor<4xf32>
  tdx.yield %0 : tensor<4xf32>
}
// expected-error @+1 {{'tdx.parameter' op has type 'tensor<8xf32>' but is tied to @w of type 'tensor<4xf32>'; tied names must have one type}}
tdx.parameter @v : tensor<8xf32> tied_to @w

// -----

tdx.parameter @w : tensor<4xf32> init {
  %0 = tdx.full 0.0 : tensor<4xf32>
  tdx.yield %0 : tensor<4xf32>
}
tdx.parameter @v : tensor<4xf32> tied_to @w
// expected-error @+1 {{'tdx.parameter' op is tied to @v, which is itself tied; tie to the name that owns the init region}}
tdx.parameter @u : tensor<4xf32> tied_to @v

// -----

// expected-error @+1 {{'tdx.parameter' op is tied to itself}}
tdx.parameter @w : tensor<4xf32> tied_to @w

// -----

// expected-error @+1 {{'tdx.parameter' op attribute 'type' failed to satisfy constraint: type attribute of ranked tensor of any type values}}
tdx.parameter @w : memref<4xf32> init {
  %0 = tdx.full 0.0 : tensor<4xf32>
  tdx.yield %0 : tensor<4xf32>
}

// -----

tdx.mesh @mesh shape = [2] axes = ["tp"]
// expected-error @+1 {{'tdx.parameter' op sharding places Shard(1) on mesh axis "tp" but the tensor 'tensor<4xf32>' has rank 1; valid shard dims are 0 to 0}}
tdx.parameter @w : tensor<4xf32> sharding <@mesh, [Shard(1)]> init {
  %0 = tdx.full 0.0 : tensor<4xf32>
  tdx.yield %0 : tensor<4xf32>
}

// -----

// expected-note @+1 {{see existing symbol definition here}}
tdx.parameter @w : tensor<4xf32> init {
  %0 = tdx.full 0.0 : tensor<4xf32>
  tdx.yield %0 : tensor<4xf32>
}
// expected-error @+1 {{redefinition of symbol named 'w'}}
tdx.buffer @w : tensor<4xf32> init {
  %0 = tdx.full 0.0 : tensor<4xf32>
  tdx.yield %0 : tensor<4xf32>
}

// -----

func.func @ref_unknown() -> tensor<4xf32> {
  // expected-error @+1 {{'tdx.param_ref' op refers to @nope, which is not a tdx.parameter or tdx.buffer in scope}}
  %0 = tdx.param_ref @nope : tensor<4xf32>
  return %0 : tensor<4xf32>
}

// -----

tdx.parameter @w : tensor<4xf32> init {
  %0 = tdx.full 0.0 : tensor<4xf32>
  tdx.yield %0 : tensor<4xf32>
}
func.func @ref_wrong_type() -> tensor<8xf32> {
  // expected-error @+1 {{'tdx.param_ref' op result type 'tensor<8xf32>' differs from @w's declared type 'tensor<4xf32>'}}
  %0 = tdx.param_ref @w : tensor<8xf32>
  return %0 : tensor<8xf32>
}

// -----

func.func @yield_outside() {
  %0 = tdx.full 0.0 : tensor<4xf32>
  // expected-error @+1 {{'tdx.yield' op expects parent op to be one of 'tdx.parameter, tdx.buffer, tdx.fused, tdx.start'}}
  tdx.yield %0 : tensor<4xf32>
}

// -----

// expected-error @+1 {{'tdx.buffer' op has no init region; give one ending in 'tdx.yield' or tie it to another name with 'tied_to @name'}}
tdx.buffer @b : tensor<4xf32>

// -----

tdx.buffer @b : tensor<4xf32> init {
  %0 = tdx.full 0.0 : tensor<4xf32>
  tdx.yield %0 : tensor<4xf32>
}
// expected-error @+1 {{'tdx.buffer' op has type 'tensor<4xi64>' but is tied to @b of type 'tensor<4xf32>'; tied names must have one type}}
tdx.buffer @c : tensor<4xi64> tied_to @b

// -----

func.func @assign_unknown(%v: tensor<4xf32>) {
  // expected-error @+1 {{'tdx.assign' op refers to @nope, which is not a tdx.parameter or tdx.buffer in scope}}
  tdx.assign @nope, %v : tensor<4xf32>
  return
}

// -----

tdx.parameter @w : tensor<4xf32> init {
  %0 = tdx.full 0.0 : tensor<4xf32>
  tdx.yield %0 : tensor<4xf32>
}
func.func @assign_wrong_type(%v: tensor<4xf64>) {
  // expected-error @+1 {{'tdx.assign' op value type 'tensor<4xf64>' differs from @w's declared type 'tensor<4xf32>'}}
  tdx.assign @w, %v : tensor<4xf64>
  return
}

// -----

tdx.parameter @w : tensor<4xf32> init {
  %0 = tdx.full 0.0 : tensor<4xf32>
  tdx.yield %0 : tensor<4xf32>
}
func.func @assign_twice(%v: tensor<4xf32>) {
  tdx.assign @w, %v : tensor<4xf32>
  // expected-error @+1 {{'tdx.assign' op writes @w a second time in one function; write each state once}}
  tdx.assign @w, %v : tensor<4xf32>
  return
}

// -----

// expected-error @+1 {{'tdx.mesh' op has 1 entries in ranks for 2 axes; give one per mesh axis}}
tdx.mesh @m shape = [2, 2] axes = ["dp", "tp"] ranks = [1]

// -----

// expected-error @+1 {{'tdx.mesh' op runs axis "tp" of size 4 on 2 ranks; an axis runs on 1 rank (folded) or on one rank per device}}
tdx.mesh @m shape = [2, 4] axes = ["dp", "tp"] ranks = [2, 2]
