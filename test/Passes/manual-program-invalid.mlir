// RUN: tdx-opt %s --split-input-file --verify-diagnostics --tdx-manual-program="mesh=world shape=4 axes=world"

// A placed parameter: such a program's state is replicated.
module {
  tdx.mesh @world shape = [4] axes = ["world"]
  // expected-error @+1 {{is placed (#tdx.sharding<@world, [Shard(0)]>), but its program's communication is the user's (tdx.mpi)}}
  tdx.parameter @w : tensor<4xf32> sharding <@world, [Shard(0)]> init {
    %0 = tdx.full 0.0 : tensor<4xf32>
    tdx.yield %0 : tensor<4xf32>
  }
}

// -----

// expected-error @+1 {{is not the mesh the program's communicators name (world)}}
tdx.mesh @world shape = [2] axes = ["world"]

// -----

func.func @unknown(%x: tensor<2xf32>) -> tensor<2xf32> {
  // expected-error @+1 {{(tdx::scan) is not one of tdx's collectives}}
  %0 = tdx.aten "tdx::scan"(%x) {args = {axes = "world", group = 4 : i64, site = "a.py:1"}} : (tensor<2xf32>) -> tensor<2xf32>
  return %0 : tensor<2xf32>
}

// -----

func.func @reduce(%x: tensor<2xf32>) -> tensor<2xf32> {
  // expected-error @+1 {{(tdx::all_reduce) reduces by 'prod'; sum, avg, max or min}}
  %0 = tdx.aten "tdx::all_reduce"(%x) {args = {reduce = "prod", axes = "world", group = 4 : i64, site = "a.py:1"}} : (tensor<2xf32>) -> tensor<2xf32>
  return %0 : tensor<2xf32>
}

// -----

func.func @missing_dim(%x: tensor<2xf32>) -> tensor<8xf32> {
  // expected-error @+1 {{(tdx::all_gather) has no integer 'dim'}}
  %0 = tdx.aten "tdx::all_gather"(%x) {args = {axes = "world", group = 4 : i64, site = "a.py:1"}} : (tensor<2xf32>) -> tensor<8xf32>
  return %0 : tensor<8xf32>
}

// -----

func.func @unknown_axis(%x: tensor<2xf32>) -> tensor<2xf32> {
  // expected-error @+1 {{(tdx::broadcast) names axis "tp", which mesh @world does not have}}
  %0 = tdx.aten "tdx::broadcast"(%x) {args = {root = 0 : i64, axes = "tp", group = 4 : i64, site = "a.py:1"}} : (tensor<2xf32>) -> tensor<2xf32>
  return %0 : tensor<2xf32>
}

// -----

func.func @no_operand() -> tensor<2xf32> {
  // expected-error @+1 {{(tdx::all_reduce) takes one tensor and gives one; the IR has 0 and 1}}
  %0 = tdx.aten "tdx::all_reduce"() {args = {reduce = "sum", axes = "world", group = 4 : i64, site = "a.py:1"}} : () -> tensor<2xf32>
  return %0 : tensor<2xf32>
}

// -----

func.func @ragged_without_sizes(%x: tensor<2xf32>) -> tensor<8xf32> {
  // expected-error @+1 {{(tdx::ragged_all_to_all) takes the rows, the input offsets, the send sizes, the output offsets and the receive sizes, and gives one; the IR has 1 and 1}}
  %0 = tdx.aten "tdx::ragged_all_to_all"(%x) {args = {rows = 8 : i64, axes = "world", group = 4 : i64, site = "a.py:1"}} : (tensor<2xf32>) -> tensor<8xf32>
  return %0 : tensor<8xf32>
}
