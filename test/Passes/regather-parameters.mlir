// RUN: tdx-opt %s -split-input-file --tdx-regather-parameters=distance=3 | FileCheck %s
// RUN: tdx-opt %s -split-input-file --tdx-regather-parameters=distance=0 | FileCheck %s --check-prefix=OFF

// ZeRO-3: w is stored split and gathered for the forward's reader; its
// backward reader, 3 or more ops later, gets a gather of its own (with its
// param_ref), so the gathered w is not held in between.
// CHECK-LABEL: func.func @step
// CHECK:      %[[W:.*]] = tdx.param_ref @w
// CHECK-NEXT: %[[G:.*]] = tdx.all_gather %[[W]]
// CHECK-NEXT: %[[F:.*]] = tdx.matmul %arg0, %[[G]]
// CHECK:      tdx.tanh
// CHECK-NEXT: %[[W2:.*]] = tdx.param_ref @w
// CHECK-NEXT: %[[G2:.*]] = tdx.all_gather %[[W2]]
// CHECK-NEXT: tdx.matmul %{{.*}}, %[[G2]]
// OFF-LABEL: func.func @step
// OFF-COUNT-1: tdx.all_gather
// OFF-NOT: tdx.all_gather
// OFF: return
module attributes {tdx.partitioned} {
  tdx.mesh @mesh shape = [2] axes = ["dp"]
  tdx.parameter @w : tensor<8x8xf32> sharding <@mesh, [Shard(0)]> init {
    %0 = tdx.full 0.0 : tensor<8x8xf32>
    tdx.yield %0 : tensor<8x8xf32>
  }
  func.func @step(%x: tensor<8x8xf32>) -> tensor<8x8xf32> {
    %w = tdx.param_ref @w : tensor<4x8xf32>
    %g = tdx.all_gather %w on @mesh axes = ["dp"] dim = 0 : tensor<4x8xf32> -> tensor<8x8xf32>
    %f = tdx.matmul %x, %g : (tensor<8x8xf32>, tensor<8x8xf32>) -> tensor<8x8xf32>
    %a = tdx.exp %f : tensor<8x8xf32>
    %b = tdx.neg %a : tensor<8x8xf32>
    %c = tdx.tanh %b : tensor<8x8xf32>
    %d = tdx.matmul %c, %g : (tensor<8x8xf32>, tensor<8x8xf32>) -> tensor<8x8xf32>
    return %d : tensor<8x8xf32>
  }
}

// -----

// Mixed precision gathers the bf16 cast: it is cast and gathered again.
// CHECK-LABEL: func.func @cast
// CHECK:      tdx.tanh
// CHECK-NEXT: %[[W2:.*]] = tdx.param_ref @w
// CHECK-NEXT: %[[C2:.*]] = tdx.cast %[[W2]] : tensor<4x8xf32> to tensor<4x8xbf16>
// CHECK-NEXT: %[[G2:.*]] = tdx.all_gather %[[C2]]
// CHECK-NEXT: tdx.matmul %{{.*}}, %[[G2]]
module attributes {tdx.partitioned} {
  tdx.mesh @mesh shape = [2] axes = ["dp"]
  tdx.parameter @w : tensor<8x8xf32> sharding <@mesh, [Shard(0)]> init {
    %0 = tdx.full 0.0 : tensor<8x8xf32>
    tdx.yield %0 : tensor<8x8xf32>
  }
  func.func @cast(%x: tensor<8x8xbf16>) -> tensor<8x8xbf16> {
    %w = tdx.param_ref @w : tensor<4x8xf32>
    %h = tdx.cast %w : tensor<4x8xf32> to tensor<4x8xbf16>
    %g = tdx.all_gather %h on @mesh axes = ["dp"] dim = 0 : tensor<4x8xbf16> -> tensor<8x8xbf16>
    %f = tdx.matmul %x, %g : (tensor<8x8xbf16>, tensor<8x8xbf16>) -> tensor<8x8xbf16>
    %a = tdx.exp %f : tensor<8x8xbf16>
    %b = tdx.neg %a : tensor<8x8xbf16>
    %c = tdx.tanh %b : tensor<8x8xbf16>
    %d = tdx.matmul %c, %g : (tensor<8x8xbf16>, tensor<8x8xbf16>) -> tensor<8x8xbf16>
    return %d : tensor<8x8xbf16>
  }
}

// -----

// A state written between its read and the later reader keeps its one
// gather (the later reader reads the value the step started with).
// CHECK-LABEL: func.func @written
// CHECK-COUNT-1: tdx.all_gather
// CHECK-NOT: tdx.all_gather
module attributes {tdx.partitioned} {
  tdx.mesh @mesh shape = [2] axes = ["dp"]
  tdx.parameter @w : tensor<8x8xf32> sharding <@mesh, [Shard(0)]> init {
    %0 = tdx.full 0.0 : tensor<8x8xf32>
    tdx.yield %0 : tensor<8x8xf32>
  }
  func.func @written(%x: tensor<8x8xf32>) -> tensor<8x8xf32> {
    %w = tdx.param_ref @w : tensor<4x8xf32>
    %g = tdx.all_gather %w on @mesh axes = ["dp"] dim = 0 : tensor<4x8xf32> -> tensor<8x8xf32>
    %f = tdx.matmul %x, %g : (tensor<8x8xf32>, tensor<8x8xf32>) -> tensor<8x8xf32>
    %u = tdx.neg %w : tensor<4x8xf32>
    tdx.assign @w, %u : tensor<4x8xf32>
    %a = tdx.exp %f : tensor<8x8xf32>
    %b = tdx.neg %a : tensor<8x8xf32>
    %d = tdx.matmul %b, %g : (tensor<8x8xf32>, tensor<8x8xf32>) -> tensor<8x8xf32>
    return %d : tensor<8x8xf32>
  }
}
