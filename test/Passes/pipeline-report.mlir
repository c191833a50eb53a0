// RUN: tdx-opt %s --tdx-split-stages --tdx-schedule-pipeline --tdx-pipeline-report -o /dev/null \
// RUN:   | FileCheck %s
// RUN: tdx-opt %s --tdx-split-stages --tdx-schedule-pipeline \
// RUN:   --tdx-pipeline-report=format=json -o /dev/null | FileCheck %s --check-prefix=JSON
// RUN: not tdx-opt %s --tdx-split-stages --tdx-schedule-pipeline \
// RUN:   --tdx-pipeline-report=format=xml -o /dev/null 2>&1 | FileCheck %s --check-prefix=FORMAT

// test/Passes/pipeline.mlir's five layers on two ranks, 1F1B, two
// micro-batches: the stages as split, the schedule as the cost model timed
// it (8 tasks: F and B of each stage on each micro-batch), each rank's
// bubble next to (p-1)/m = 0.5.
// CHECK:      pipeline on "pp": 2 ranks, 1f1b, 2 micro-batches, 1 stage(s) per rank
// CHECK-NEXT: stage 0 on rank 0: {{.*}} s forward: l.0
// CHECK-NEXT: stage 1 on rank 1: {{.*}} s forward: l.1 l.2 l.3 l.4
// CHECK-NEXT: schedule by the cost model: 8 tasks, {{.*}} s
// CHECK-NEXT: rank 0: busy {{.*}} s, bubble {{[0-9.]+}}
// CHECK-NEXT: rank 1: busy {{.*}} s, bubble {{[0-9.]+}}
// CHECK-NEXT: ideal bubble (p-1)/(v m): 0.500

// JSON: {"axis":"pp","bubble":[{{.*}}],"busy":[{{.*}}],"end":{{.*}},"ideal_bubble":0.5,"layer_seconds":[{{.*}}],"microbatches":2,"ranks":2,"schedule":"1f1b","stage_seconds":[{{.*}}],"stages":{{\[}}["l.0"],["l.1","l.2","l.3","l.4"]],"stages_per_rank":1,"timeline":[{"end":{{.*}},"microbatch":0,"phase":"F","rank":0,"stage":0,"start":0}

// FORMAT: error: tdx-pipeline-report: unknown format 'xml'; use 'table' or 'json'

module attributes {tdx.partitioned, tdx.pipeline = {axis = "pp", microbatches = 2 : i64, schedule = "1f1b", stages_per_rank = 1 : i64}} {
  tdx.mesh @mesh shape = [2] axes = ["pp"]
  tdx.parameter @"l.0.w" : tensor<64x256xf32> init {
    %0 = tdx.full 0.0 : tensor<64x256xf32>
    tdx.yield %0 : tensor<64x256xf32>
  }
  tdx.parameter @"l.1.w" : tensor<256x16xf32> init {
    %0 = tdx.full 0.0 : tensor<256x16xf32>
    tdx.yield %0 : tensor<256x16xf32>
  }
  tdx.parameter @"l.2.w" : tensor<16x16xf32> init {
    %0 = tdx.full 0.0 : tensor<16x16xf32>
    tdx.yield %0 : tensor<16x16xf32>
  }
  tdx.parameter @"l.3.w" : tensor<16x16xf32> init {
    %0 = tdx.full 0.0 : tensor<16x16xf32>
    tdx.yield %0 : tensor<16x16xf32>
  }
  tdx.parameter @"l.4.w" : tensor<16x16xf32> init {
    %0 = tdx.full 0.0 : tensor<16x16xf32>
    tdx.yield %0 : tensor<16x16xf32>
  }
  func.func @train_step(%x: tensor<2x8x64xf32>) -> tensor<f32> {
    %w0 = tdx.param_ref @"l.0.w" : tensor<64x256xf32>
    %w1 = tdx.param_ref @"l.1.w" : tensor<256x16xf32>
    %w2 = tdx.param_ref @"l.2.w" : tensor<16x16xf32>
    %w3 = tdx.param_ref @"l.3.w" : tensor<16x16xf32>
    %w4 = tdx.param_ref @"l.4.w" : tensor<16x16xf32>
    %s0 = tdx.slice %x dim 0 [0 : 1 : 1] : tensor<2x8x64xf32> -> tensor<1x8x64xf32>
    %x0 = tdx.reshape %s0 [8, 64] : tensor<1x8x64xf32> -> tensor<8x64xf32>
    %a0 = tdx.matmul %x0, %w0 : (tensor<8x64xf32>, tensor<64x256xf32>) -> tensor<8x256xf32>
    %b0 = tdx.matmul %a0, %w1 : (tensor<8x256xf32>, tensor<256x16xf32>) -> tensor<8x16xf32>
    %c0 = tdx.matmul %b0, %w2 : (tensor<8x16xf32>, tensor<16x16xf32>) -> tensor<8x16xf32>
    %d0 = tdx.matmul %c0, %w3 : (tensor<8x16xf32>, tensor<16x16xf32>) -> tensor<8x16xf32>
    %e0 = tdx.matmul %d0, %w4 : (tensor<8x16xf32>, tensor<16x16xf32>) -> tensor<8x16xf32>
    %l0 = tdx.sum %e0 dims = [0, 1] : tensor<8x16xf32> -> tensor<f32>
    // The backward of l.1 and l.0 (d l / d b taken as b itself).
    %w1t0 = tdx.transpose %w1 0, 1 : tensor<256x16xf32> -> tensor<16x256xf32>
    %ga0 = tdx.matmul %b0, %w1t0 : (tensor<8x16xf32>, tensor<16x256xf32>) -> tensor<8x256xf32>
    %at0 = tdx.transpose %a0 0, 1 : tensor<8x256xf32> -> tensor<256x8xf32>
    %gw1_0 = tdx.matmul %at0, %b0 : (tensor<256x8xf32>, tensor<8x16xf32>) -> tensor<256x16xf32>
    %xt0 = tdx.transpose %x0 0, 1 : tensor<8x64xf32> -> tensor<64x8xf32>
    %gw0_0 = tdx.matmul %xt0, %ga0 : (tensor<64x8xf32>, tensor<8x256xf32>) -> tensor<64x256xf32>
    %s1 = tdx.slice %x dim 0 [1 : 2 : 1] : tensor<2x8x64xf32> -> tensor<1x8x64xf32>
    %x1 = tdx.reshape %s1 [8, 64] : tensor<1x8x64xf32> -> tensor<8x64xf32>
    %a1 = tdx.matmul %x1, %w0 : (tensor<8x64xf32>, tensor<64x256xf32>) -> tensor<8x256xf32>
    %b1 = tdx.matmul %a1, %w1 : (tensor<8x256xf32>, tensor<256x16xf32>) -> tensor<8x16xf32>
    %c1 = tdx.matmul %b1, %w2 : (tensor<8x16xf32>, tensor<16x16xf32>) -> tensor<8x16xf32>
    %d1 = tdx.matmul %c1, %w3 : (tensor<8x16xf32>, tensor<16x16xf32>) -> tensor<8x16xf32>
    %e1 = tdx.matmul %d1, %w4 : (tensor<8x16xf32>, tensor<16x16xf32>) -> tensor<8x16xf32>
    %l1 = tdx.sum %e1 dims = [0, 1] : tensor<8x16xf32> -> tensor<f32>
    // The backward of l.1 and l.0 (d l / d b taken as b itself).
    %w1t1 = tdx.transpose %w1 0, 1 : tensor<256x16xf32> -> tensor<16x256xf32>
    %ga1 = tdx.matmul %b1, %w1t1 : (tensor<8x16xf32>, tensor<16x256xf32>) -> tensor<8x256xf32>
    %at1 = tdx.transpose %a1 0, 1 : tensor<8x256xf32> -> tensor<256x8xf32>
    %gw1_1 = tdx.matmul %at1, %b1 : (tensor<256x8xf32>, tensor<8x16xf32>) -> tensor<256x16xf32>
    %xt1 = tdx.transpose %x1 0, 1 : tensor<8x64xf32> -> tensor<64x8xf32>
    %gw0_1 = tdx.matmul %xt1, %ga1 : (tensor<64x8xf32>, tensor<8x256xf32>) -> tensor<64x256xf32>
    %gw0 = tdx.add %gw0_0, %gw0_1 : (tensor<64x256xf32>, tensor<64x256xf32>) -> tensor<64x256xf32>
    %nw0 = tdx.sub %w0, %gw0 : (tensor<64x256xf32>, tensor<64x256xf32>) -> tensor<64x256xf32>
    tdx.assign @"l.0.w", %nw0 : tensor<64x256xf32>
    %gw1 = tdx.add %gw1_0, %gw1_1 : (tensor<256x16xf32>, tensor<256x16xf32>) -> tensor<256x16xf32>
    %nw1 = tdx.sub %w1, %gw1 : (tensor<256x16xf32>, tensor<256x16xf32>) -> tensor<256x16xf32>
    tdx.assign @"l.1.w", %nw1 : tensor<256x16xf32>
    %loss = tdx.add %l0, %l1 : (tensor<f32>, tensor<f32>) -> tensor<f32>
    return %loss : tensor<f32>
  }
}

