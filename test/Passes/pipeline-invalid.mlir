// RUN: tdx-opt %s -split-input-file --tdx-split-stages -verify-diagnostics

// The plan put a collective on the pipeline's axis.
module attributes {tdx.partitioned, tdx.pipeline = {axis = "pp", microbatches = 1 : i64, schedule = "1f1b", stages_per_rank = 1 : i64}} {
  tdx.mesh @mesh shape = [2] axes = ["pp"]
  tdx.parameter @"a.0.w" : tensor<4xf32> init {
    %0 = tdx.full 0.0 : tensor<4xf32>
    tdx.yield %0 : tensor<4xf32>
  }
  func.func @train_step(%x: tensor<4xf32>) -> tensor<4xf32> {
    // expected-error @+1 {{tdx-split-stages: this collective communicates over the pipeline's axis "pp"; the stages are on it, so the plan, data_parallel and zero must name other axes}}
    %0 = tdx.all_reduce %x on @mesh axes = ["pp"] reduce = sum : tensor<4xf32> -> tensor<4xf32>
    return %0 : tensor<4xf32>
  }
}

// -----

// One layer for two stages.
module attributes {tdx.partitioned, tdx.pipeline = {axis = "pp", microbatches = 1 : i64, schedule = "1f1b", stages_per_rank = 1 : i64}} {
  tdx.mesh @mesh shape = [2] axes = ["pp"]
  tdx.parameter @"a.0.w" : tensor<4xf32> init {
    %0 = tdx.full 0.0 : tensor<4xf32>
    tdx.yield %0 : tensor<4xf32>
  }
  // expected-error @+1 {{tdx-split-stages: the step's forward reads 1 layer(s) of parameters, too few for 2 pipeline stages (2 ranks on "pp" x stages_per_rank 1); use fewer stages}}
  func.func @train_step(%x: tensor<4xf32>) -> tensor<4xf32> {
    %w = tdx.param_ref @"a.0.w" : tensor<4xf32>
    %0 = tdx.mul %x, %w : (tensor<4xf32>, tensor<4xf32>) -> tensor<4xf32>
    return %0 : tensor<4xf32>
  }
}

// -----

// A forward, not a training step.
// expected-error @+1 {{tdx-split-stages: a pipeline splits a training step (tdx.trace_train_step's @train_step), which the module does not have}}
module attributes {tdx.partitioned, tdx.pipeline = {axis = "pp", microbatches = 1 : i64, schedule = "1f1b", stages_per_rank = 1 : i64}} {
  tdx.mesh @mesh shape = [2] axes = ["pp"]
  func.func @forward(%x: tensor<4xf32>) -> tensor<4xf32> {
    return %x : tensor<4xf32>
  }
}

// -----

// The axis is not the mesh's.
// expected-error @+1 {{tdx-split-stages: the pipeline's axis "pp" is not an axis of mesh @mesh}}
module attributes {tdx.partitioned, tdx.pipeline = {axis = "pp", microbatches = 1 : i64, schedule = "1f1b", stages_per_rank = 1 : i64}} {
  tdx.mesh @mesh shape = [2] axes = ["dp"]
  func.func @train_step(%x: tensor<4xf32>) -> tensor<4xf32> {
    return %x : tensor<4xf32>
  }
}

// -----

// The interleaved schedule runs rounds of the pipeline's ranks.
// expected-error @+1 {{tdx-split-stages: the interleaved 1F1B schedule runs the micro-batches in rounds of the pipeline's 2 ranks; microbatches=3 is not a multiple of 2}}
module attributes {tdx.partitioned, tdx.pipeline = {axis = "pp", microbatches = 3 : i64, schedule = "interleaved-1f1b", stages_per_rank = 2 : i64}} {
  tdx.mesh @mesh shape = [2] axes = ["pp"]
  func.func @train_step(%x: tensor<4xf32>) -> tensor<4xf32> {
    return %x : tensor<4xf32>
  }
}

// -----

// Several stages per rank are the interleaved schedule's.
// expected-error @+1 {{tdx-split-stages: stages_per_rank=2 is for schedule="interleaved-1f1b"; the gpipe schedule runs one stage per rank}}
module attributes {tdx.partitioned, tdx.pipeline = {axis = "pp", microbatches = 2 : i64, schedule = "gpipe", stages_per_rank = 2 : i64}} {
  tdx.mesh @mesh shape = [2] axes = ["pp"]
  func.func @train_step(%x: tensor<4xf32>) -> tensor<4xf32> {
    return %x : tensor<4xf32>
  }
}

// -----

// Stages split the per-rank program.
// expected-error @+1 {{tdx-split-stages: split stages after tdx-partition (`--tdx-spmd`): it splits the per-rank program}}
module attributes {tdx.pipeline = {axis = "pp", microbatches = 1 : i64, schedule = "1f1b", stages_per_rank = 1 : i64}} {
  tdx.mesh @mesh shape = [2] axes = ["pp"]
  func.func @train_step(%x: tensor<4xf32>) -> tensor<4xf32> {
    return %x : tensor<4xf32>
  }
}

// -----

// State that no layer of the forward reads has no stage to live on.
module attributes {tdx.partitioned, tdx.pipeline = {axis = "pp", microbatches = 1 : i64, schedule = "1f1b", stages_per_rank = 1 : i64}} {
  tdx.mesh @mesh shape = [2] axes = ["pp"]
  tdx.parameter @"a.0.w" : tensor<4xf32> init {
    %0 = tdx.full 0.0 : tensor<4xf32>
    tdx.yield %0 : tensor<4xf32>
  }
  tdx.parameter @"a.1.w" : tensor<4xf32> init {
    %0 = tdx.full 0.0 : tensor<4xf32>
    tdx.yield %0 : tensor<4xf32>
  }
  tdx.buffer @count : tensor<4xf32> init {
    %0 = tdx.full 0.0 : tensor<4xf32>
    tdx.yield %0 : tensor<4xf32>
  }
  func.func @train_step(%x: tensor<4xf32>) -> tensor<4xf32> {
    %w0 = tdx.param_ref @"a.0.w" : tensor<4xf32>
    %w1 = tdx.param_ref @"a.1.w" : tensor<4xf32>
    %0 = tdx.mul %x, %w0 : (tensor<4xf32>, tensor<4xf32>) -> tensor<4xf32>
    %1 = tdx.mul %0, %w1 : (tensor<4xf32>, tensor<4xf32>) -> tensor<4xf32>
    // expected-error @+1 {{tdx-split-stages: the step writes state 'count', which no layer of the forward reads, so no pipeline stage holds it}}
    tdx.assign @count, %x : tensor<4xf32>
    return %1 : tensor<4xf32>
  }
}
