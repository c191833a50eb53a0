// RUN: tdx-opt %s -split-input-file --tdx-schedule-pipeline -verify-diagnostics

// The stages come first.
module attributes {tdx.partitioned, tdx.pipeline = {axis = "pp", microbatches = 1 : i64, schedule = "1f1b", stages_per_rank = 1 : i64}} {
  tdx.mesh @mesh shape = [2] axes = ["pp"]
  tdx.parameter @"a.0.w" : tensor<4xf32> init {
    %0 = tdx.full 0.0 : tensor<4xf32>
    tdx.yield %0 : tensor<4xf32>
  }
  // expected-error @+1 {{tdx-schedule-pipeline: no op of the step has a stage; run tdx-split-stages first}}
  func.func @train_step(%x: tensor<4xf32>) -> tensor<4xf32> {
    %w = tdx.param_ref @"a.0.w" : tensor<4xf32>
    %0 = tdx.mul %x, %w : (tensor<4xf32>, tensor<4xf32>) -> tensor<4xf32>
    return %0 : tensor<4xf32>
  }
}

// -----

// A stage beyond the pipeline's.
module attributes {tdx.partitioned, tdx.pipeline = {axis = "pp", microbatches = 1 : i64, schedule = "1f1b", stages_per_rank = 1 : i64}} {
  tdx.mesh @mesh shape = [2] axes = ["pp"]
  func.func @train_step(%x: tensor<4xf32>) -> tensor<4xf32> {
    // expected-error @+1 {{tdx-schedule-pipeline: chunk 2 of 2; run tdx-split-stages first}}
    %0 = tdx.exp %x {tdx.stage = 2 : i64} : tensor<4xf32>
    return %0 : tensor<4xf32>
  }
}

// -----

// Another entry beside the step.
module attributes {tdx.partitioned, tdx.pipeline = {axis = "pp", microbatches = 1 : i64, schedule = "1f1b", stages_per_rank = 1 : i64}} {
  tdx.mesh @mesh shape = [2] axes = ["pp"]
  func.func @train_step(%x: tensor<4xf32>) -> tensor<4xf32> {
    return %x : tensor<4xf32>
  }
  // expected-error @+1 {{tdx-schedule-pipeline: a pipelined program has one entry, @train_step; compile other entries (prog.add_entry) without pipeline=}}
  func.func @evaluate(%x: tensor<4xf32>) -> tensor<4xf32> {
    return %x : tensor<4xf32>
  }
}
