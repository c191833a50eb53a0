// RUN: tdx-opt %s --split-input-file --tdx-check-messages | FileCheck %s

// Two pipeline ranks: the forward's activation to rank 1, its gradient back
// (the derived backward), a collective over the pipeline axis both reach,
// and a collective over dp inside each stage. Nothing changes.
// CHECK-LABEL: func.func @step_pp0
// CHECK: tdx.send %{{.*}} on @mesh axes = ["pp"] to 1 tag 0
// CHECK: tdx.recv on @mesh axes = ["pp"] from 1 tag 1
// CHECK-LABEL: func.func @step_pp1
module attributes {tdx.partitioned, tdx.pipeline = {axis = "pp", functions = [@step_pp0, @step_pp1], microbatches = 1 : i64, schedule = "1f1b", stages_per_rank = 1 : i64}} {
  tdx.mesh @mesh shape = [2, 2] axes = ["dp", "pp"]
  func.func @step_pp0(%x: tensor<4x8xf32>) -> tensor<f32> {
    tdx.send %x on @mesh axes = ["pp"] to 1 tag 0 : tensor<4x8xf32>
    %g = tdx.recv on @mesh axes = ["pp"] from 1 tag 1 : tensor<4x8xf32>
    %s = tdx.all_reduce %g on @mesh axes = ["dp"] reduce = sum : tensor<4x8xf32> -> tensor<4x8xf32>
    %l = tdx.sum %s : tensor<4x8xf32> -> tensor<f32>
    %t = tdx.all_reduce %l on @mesh axes = ["pp"] reduce = sum : tensor<f32> -> tensor<f32>
    return %t : tensor<f32>
  }
  func.func @step_pp1(%x: tensor<4x8xf32>) -> tensor<f32> {
    %a = tdx.recv on @mesh axes = ["pp"] from 0 tag 0 : tensor<4x8xf32>
    tdx.send %a on @mesh axes = ["pp"] to 0 tag 1 : tensor<4x8xf32>
    %s = tdx.all_reduce %a on @mesh axes = ["dp"] reduce = sum : tensor<4x8xf32> -> tensor<4x8xf32>
    %l = tdx.sum %s : tensor<4x8xf32> -> tensor<f32>
    %t = tdx.all_reduce %l on @mesh axes = ["pp"] reduce = sum : tensor<f32> -> tensor<f32>
    return %t : tensor<f32>
  }
}
