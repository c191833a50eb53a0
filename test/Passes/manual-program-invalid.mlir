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
