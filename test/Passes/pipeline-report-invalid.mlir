// RUN: tdx-opt %s -split-input-file -verify-diagnostics --tdx-pipeline-report -o /dev/null

// A module without a pipeline, or one not scheduled yet, has no report.
// expected-error @below {{tdx-pipeline-report: the module has no scheduled pipeline; parallelize with pipeline= and run tdx-split-stages and tdx-schedule-pipeline (tdx-spmd) first}}
module attributes {tdx.partitioned} {
  func.func @train_step(%x: tensor<4xf32>) -> tensor<4xf32> {
    return %x : tensor<4xf32>
  }
}

// -----

// expected-error @below {{tdx-pipeline-report: the module has no scheduled pipeline}}
module attributes {tdx.partitioned, tdx.pipeline = {axis = "pp", microbatches = 2 : i64, schedule = "1f1b", stages_per_rank = 1 : i64}} {
  tdx.mesh @mesh shape = [2] axes = ["pp"]
  func.func @train_step(%x: tensor<4xf32>) -> tensor<4xf32> {
    return %x : tensor<4xf32>
  }
}
