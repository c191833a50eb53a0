// RUN: tdx-opt %s -split-input-file --tdx-split-stages --tdx-schedule-pipeline | FileCheck %s

// Five layers on two pipeline ranks, two micro-batches (slices 0 and 1 of
// the stacked batch). l.0 costs as much as the other four together (its
// matmul is 64x256), so the split balanced by cost is [l.0 | l.1 ... l.4],
// not three and two layers. The backward of l.1 (its input's gradient
// reads l.1.w) runs on rank 1 and sends the gradient to rank 0, where l.0's
// weight gradient is made next to l.0.w (receiving 8 KiB instead of sending
// the 64 KiB gradient). 1F1B: rank 1 runs F0 B0 F1 B1; rank 0 F0 F1 B0 B1.
// The loss goes from rank 1 to rank 0. Rank 0 receives in the order rank 1
// sends (tags 2, 3, 4: the loss, read last, is received before the
// gradient sent after it), as a NCCL channel matches its messages.
// CHECK: tdx.pipeline = {axis = "pp", chunk_seconds = array<f64: {{.*}}>, functions = [@train_step_pp0, @train_step_pp1], layer_seconds = array<f64: {{.*}}>, microbatches = 2 : i64, schedule = "1f1b", stages = {{\[}}["l.0"], ["l.1", "l.2", "l.3", "l.4"]], stages_per_rank = 1 : i64, timeline = [
// CHECK: tdx.parameter @l.0.w
// CHECK: {tdx.stage = 0 : i64}
// CHECK: tdx.parameter @l.1.w
// CHECK: {tdx.stage = 1 : i64}
// CHECK-LABEL: func.func @train_step_pp0(%arg0: tensor<2x8x64xf32>) -> tensor<f32>
// CHECK:      %[[W0:.*]] = tdx.param_ref @l.0.w {tdx.stage = 0 : i64}
// CHECK:      %[[A0:.*]] = tdx.matmul %{{.*}}, %[[W0]] {tdx.stage = 0 : i64}
// CHECK-NEXT: tdx.send %[[A0]] on @mesh axes = ["pp"] to 1 tag 0 : tensor<8x256xf32>
// CHECK:      %[[A1:.*]] = tdx.matmul %{{.*}}, %[[W0]] {tdx.stage = 0 : i64}
// CHECK-NEXT: tdx.send %[[A1]] on @mesh axes = ["pp"] to 1 tag 1 : tensor<8x256xf32>
// CHECK:      %[[GA0:.*]] = tdx.recv on @mesh axes = ["pp"] from 1 tag 2 : tensor<8x256xf32>
// CHECK-NEXT: %[[GW0:.*]] = tdx.matmul %{{.*}}, %[[GA0]] {tdx.stage = 0 : i64} : (tensor<64x8xf32>, tensor<8x256xf32>) -> tensor<64x256xf32>
// CHECK:      %[[LOSS:.*]] = tdx.recv on @mesh axes = ["pp"] from 1 tag 3 : tensor<f32>
// CHECK-NEXT: %[[GA1:.*]] = tdx.recv on @mesh axes = ["pp"] from 1 tag 4 : tensor<8x256xf32>
// CHECK-NEXT: %[[GW1:.*]] = tdx.matmul %{{.*}}, %[[GA1]]
// CHECK-NEXT: %[[G:.*]] = tdx.add %[[GW0]], %[[GW1]]
// CHECK-NEXT: %[[NEW:.*]] = tdx.sub %[[W0]], %[[G]]
// CHECK-NEXT: tdx.assign @l.0.w, %[[NEW]]
// CHECK-NEXT: return %[[LOSS]] : tensor<f32>
// CHECK-LABEL: func.func @train_step_pp1(%arg0: tensor<2x8x64xf32>) -> tensor<f32>
// CHECK-NEXT: %[[X0:.*]] = tdx.recv on @mesh axes = ["pp"] from 0 tag 0 : tensor<8x256xf32>
// CHECK:      tdx.sum
// CHECK:      %[[G0:.*]] = tdx.matmul
// CHECK-NEXT: tdx.send %[[G0]] on @mesh axes = ["pp"] to 0 tag 2 : tensor<8x256xf32>
// CHECK:      %[[X1:.*]] = tdx.recv on @mesh axes = ["pp"] from 0 tag 1 : tensor<8x256xf32>
// CHECK:      %[[L:.*]] = tdx.add
// CHECK-NEXT: tdx.send %[[L]] on @mesh axes = ["pp"] to 0 tag 3 : tensor<f32>
// CHECK:      tdx.send %{{.*}} on @mesh axes = ["pp"] to 0 tag 4 : tensor<8x256xf32>
// CHECK:      tdx.assign @l.1.w
// CHECK-NEXT: return %[[L]] : tensor<f32>

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

// -----

// GPipe: rank 1 runs both forwards before the first backward, and sends the
// loss as soon as the forwards made it.
// CHECK-LABEL: func.func @train_step_pp1
// CHECK:      tdx.recv on @mesh axes = ["pp"] from 0 tag 0
// CHECK:      tdx.recv on @mesh axes = ["pp"] from 0 tag 1
// CHECK:      tdx.send %{{.*}} on @mesh axes = ["pp"] to 0 tag 2 : tensor<f32>
// CHECK:      tdx.send %{{.*}} on @mesh axes = ["pp"] to 0 tag 3 : tensor<8x256xf32>
// CHECK:      tdx.send %{{.*}} on @mesh axes = ["pp"] to 0 tag 4 : tensor<8x256xf32>

module attributes {tdx.partitioned, tdx.pipeline = {axis = "pp", microbatches = 2 : i64, schedule = "gpipe", stages_per_rank = 1 : i64}} {
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

// -----

// Zero bubble (ZB-H1): rank 1's backward of l.1 is split into B (the
// input's gradient, which reads l.1.w and goes to rank 0) and W (l.1.w's
// gradient); rank 0's backward is all W (it computes no input's gradient),
// one micro-batch behind (p - r - 1 = 1): its W's run after its B's. The
// timeline's entries are rank, phase (F 0, B 1, W 2), stage, micro-batch.
// CHECK: schedule = "zb-h1"
// CHECK-SAME: timeline = [array<f64: 0.000000e+00, 0.000000e+00, 0.000000e+00, 0.000000e+00,
// CHECK-SAME: array<f64: 1.000000e+00, 1.000000e+00, 1.000000e+00, 0.000000e+00,
// CHECK-SAME: array<f64: 1.000000e+00, 2.000000e+00, 1.000000e+00, 0.000000e+00,
// CHECK-SAME: array<f64: 0.000000e+00, 1.000000e+00, 0.000000e+00, 1.000000e+00,
// CHECK-SAME: array<f64: 0.000000e+00, 2.000000e+00, 0.000000e+00, 0.000000e+00,
// CHECK-SAME: array<f64: 0.000000e+00, 2.000000e+00, 0.000000e+00, 1.000000e+00,

module attributes {tdx.partitioned, tdx.pipeline = {axis = "pp", microbatches = 2 : i64, schedule = "zb-h1", stages_per_rank = 1 : i64}} {
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
