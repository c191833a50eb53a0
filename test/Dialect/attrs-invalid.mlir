// RUN: tdx-opt %s -split-input-file -verify-diagnostics

// expected-error @+1 {{Shard(-1) has a negative dim}}
func.func @negative_dim() attributes {test.p = #tdx.placement<Shard(-1)>} { return }

// -----

// expected-error @+1 {{unknown placement 'Sharded'; expected Shard(<dim>), Replicate or Partial(sum|avg|max|min)}}
func.func @unknown_placement() attributes {test.p = #tdx.placement<Sharded(0)>} { return }

// -----

// expected-error @+1 {{unknown Partial reduction 'prod'; expected sum, avg, max or min}}
func.func @unknown_reduce() attributes {test.p = #tdx.placement<Partial(prod)>} { return }

// -----

// expected-error @+1 {{expected integer value}}
func.func @shard_without_dim() attributes {test.p = #tdx.placement<Shard(x)>} { return }

// -----

// expected-error @+1 {{expected attribute value}}
func.func @sharding_without_mesh() attributes {test.s = #tdx.sharding<[Shard(0)]>} { return }

// -----

// expected-error @+1 {{expected '['}}
func.func @sharding_without_list() attributes {test.s = #tdx.sharding<@m, Shard(0)>} { return }

// -----

tdx.mesh @mesh shape = [4] axes = ["tp"]
func.func @more_placements_than_axes(%x: tensor<8x8xf32>) -> tensor<8x8xf32> {
  // expected-error @+1 {{'tdx.annotate' op sharding has 2 placement(s) but mesh @mesh has 1 axes ("tp"); give exactly one placement per mesh axis}}
  %0 = tdx.annotate %x <@mesh, [Shard(0), Shard(1)]> : tensor<8x8xf32>
  return %0 : tensor<8x8xf32>
}

// -----

tdx.mesh @mesh shape = [2, 2] axes = ["dp", "tp"]
func.func @fewer_placements_than_axes(%x: tensor<8x8xf32>) -> tensor<8x8xf32> {
  // expected-error @+1 {{sharding has 1 placement(s) but mesh @mesh has 2 axes ("dp", "tp")}}
  %0 = tdx.annotate %x <@mesh, [Shard(0)]> : tensor<8x8xf32>
  return %0 : tensor<8x8xf32>
}

// -----

tdx.mesh @mesh shape = [2, 2] axes = ["dp", "tp"]
func.func @shard_dim_out_of_range(%x: tensor<8x8xf32>) -> tensor<8x8xf32> {
  // expected-error @+1 {{sharding places Shard(2) on mesh axis "tp" but the tensor 'tensor<8x8xf32>' has rank 2; valid shard dims are 0 to 1}}
  %0 = tdx.annotate %x <@mesh, [Replicate, Shard(2)]> : tensor<8x8xf32>
  return %0 : tensor<8x8xf32>
}

// -----

tdx.mesh @mesh shape = [2] axes = ["tp"]
func.func @shard_scalar(%x: tensor<f32>) -> tensor<f32> {
  // expected-error @+1 {{sharding places Shard(0) on a 0-D tensor, which has no dim to split; use Replicate}}
  %0 = tdx.annotate %x <@mesh, [Shard(0)]> : tensor<f32>
  return %0 : tensor<f32>
}

// -----

func.func @unknown_mesh(%x: tensor<8x8xf32>) -> tensor<8x8xf32> {
  // expected-error @+1 {{'tdx.annotate' op sharding refers to mesh @nope, which is not a 'tdx.mesh' in scope; declare it with 'tdx.mesh @nope shape = [...] axes = [...]'}}
  %0 = tdx.annotate %x <@nope, [Shard(0)]> : tensor<8x8xf32>
  return %0 : tensor<8x8xf32>
}

// -----

// The dialect's discardable attributes are checked where they appear.
// expected-error @+1 {{unknown tdx attribute 'tdx.shardingz'; tdx puts 'tdx.shardings', 'tdx.partitioned', 'tdx.payload_bytes', 'tdx.arena', 'tdx.arena_bytes', 'tdx.step_bytes', 'tdx.recomputed', 'tdx.stage' and 'tdx.part' on ops, and 'tdx.reduce_type', 'tdx.batch_norm', 'tdx.pipeline' and 'tdx.memory_budget' on a module}}
func.func @misspelled() attributes {tdx.shardingz = 1} { return }

// -----

func.func @bad_shardings(%x: tensor<4xf32>) -> tensor<4xf32> {
  // expected-error @+1 {{'tdx.shardings' must be an array of #tdx.sharding, one per result, got [1]}}
  %0 = tdx.neg %x {tdx.shardings = [1]} : tensor<4xf32>
  return %0 : tensor<4xf32>
}

// -----

// expected-error @+1 {{'tdx.global_type' must be a type, got 3 : i64}}
func.func @bad_global_type(%x: tensor<4xf32> {tdx.global_type = 3}) { return }

// -----

// expected-error @+1 {{unknown tdx attribute 'tdx.shardings' on a function argument or result; tdx uses 'tdx.sharding', 'tdx.sharding_priority' and 'tdx.global_type' there}}
func.func @op_attr_on_argument(%x: tensor<4xf32> {tdx.shardings = []}) { return }

// -----

// expected-error @+1 {{'tdx.sharding_priority' must be an i64 priority >= 0, got -1 : i64}}
func.func @negative_priority(%x: tensor<4xf32> {tdx.sharding_priority = -1 : i64}) { return }

// -----

// expected-error @+1 {{'tdx.sharding_priority' must be an i64 priority >= 0, got "dp"}}
func.func @priority_not_integer(%x: tensor<4xf32> {tdx.sharding_priority = "dp"}) { return }

// -----

// expected-error @+1 {{'tdx.reduce_type' must be f32 or f64 on a module, got bf16}}
module attributes {tdx.reduce_type = bf16} {
}

// -----

// expected-error @+1 {{'tdx.batch_norm' must be {axis = "<mesh axis>", statistics = "global" or "local"} on a module, got {axis = "dp", statistics = "sync"}}}
module attributes {tdx.batch_norm = {axis = "dp", statistics = "sync"}} {
}

// -----

func.func @recomputed_is_a_unit(%x: tensor<4xf32>) -> tensor<4xf32> {
  // expected-error @+1 {{'tdx.recomputed' must be a unit attribute}}
  %y = tdx.exp %x {tdx.recomputed = 1 : i64} : tensor<4xf32>
  return %y : tensor<4xf32>
}

// -----

// expected-error @+1 {{'tdx.pipeline' has schedule "zb"; the schedules are "gpipe", "1f1b", "interleaved-1f1b" and "zb-h1"}}
module attributes {tdx.pipeline = {axis = "pp", microbatches = 2 : i64, schedule = "zb", stages_per_rank = 1 : i64}} {
}

// -----

// expected-error @+1 {{'tdx.pipeline' must be a dictionary with axis (a string), microbatches (>= 1), schedule (a string) and stages_per_rank (>= 1)}}
module attributes {tdx.pipeline = {axis = "pp", microbatches = 0 : i64, schedule = "1f1b", stages_per_rank = 1 : i64}} {
}

// -----

// What the pipeline passes add is checked too (tdx-explain and
// tdx-pipeline-report read it).
// expected-error @+1 {{'tdx.pipeline' must be timeline as an array of array<f64: rank, phase, stage, micro-batch, start, end>}}
module attributes {tdx.pipeline = {axis = "pp", microbatches = 2 : i64, schedule = "1f1b", stages_per_rank = 1 : i64, timeline = [array<f64: 0.0, 0.0, 0.0>]}} {
}

// -----

// expected-error @+1 {{'tdx.pipeline' must be stages as an array of each stage's layer names}}
module attributes {tdx.pipeline = {axis = "pp", microbatches = 2 : i64, schedule = "1f1b", stages_per_rank = 1 : i64, stages = [["l.0"], [1]]}} {
}

// -----

// expected-error @+1 {{'tdx.pipeline' must be chunk_seconds as an array<f64>}}
module attributes {tdx.pipeline = {axis = "pp", microbatches = 2 : i64, schedule = "1f1b", stages_per_rank = 1 : i64, chunk_seconds = [1.0]}} {
}

// -----

func.func @stage_is_a_chunk(%x: tensor<4xf32>) -> tensor<4xf32> {
  // expected-error @+1 {{'tdx.stage' must be an i64 chunk index >= 0, got -1 : i64}}
  %y = tdx.exp %x {tdx.stage = -1 : i64} : tensor<4xf32>
  return %y : tensor<4xf32>
}
