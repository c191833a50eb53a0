// RUN: tdx-opt %s -split-input-file --tdx-prefetch-all-gathers | FileCheck %s
// RUN: tdx-opt %s -split-input-file --tdx-prefetch-all-gathers=ahead=0 | FileCheck %s --check-prefix=NONE

// ZeRO-3: each parameter is stored split and gathered where the step reads
// it. Each gather (with its param_ref) moves up to right after the first
// reader of the gather before it: w2's gather runs while the first matmul
// computes, w3's while the second does.
module attributes {tdx.partitioned} {
  tdx.mesh @mesh shape = [2] axes = ["dp"]
  tdx.parameter @w1 : tensor<8x8xf32> sharding <@mesh, [Shard(0)]> init {
    %0 = tdx.full 1.0 : tensor<8x8xf32>
    tdx.yield %0 : tensor<8x8xf32>
  }
  tdx.parameter @w2 : tensor<8x8xf32> sharding <@mesh, [Shard(0)]> init {
    %0 = tdx.full 1.0 : tensor<8x8xf32>
    tdx.yield %0 : tensor<8x8xf32>
  }
  tdx.parameter @w3 : tensor<8x8xf32> sharding <@mesh, [Shard(0)]> init {
    %0 = tdx.full 1.0 : tensor<8x8xf32>
    tdx.yield %0 : tensor<8x8xf32>
  }
  // CHECK-LABEL: func.func @forward
  // CHECK:      %[[R1:.*]] = tdx.param_ref @w1
  // CHECK-NEXT: %[[G1:.*]] = tdx.all_gather %[[R1]]
  // CHECK-NEXT: %[[A:.*]] = tdx.matmul %{{.*}}, %[[G1]]
  // CHECK-NEXT: %[[R2:.*]] = tdx.param_ref @w2
  // CHECK-NEXT: %[[G2:.*]] = tdx.all_gather %[[R2]]
  // CHECK-NEXT: %[[E:.*]] = tdx.exp %[[A]]
  // CHECK-NEXT: %[[B:.*]] = tdx.matmul %[[E]], %[[G2]]
  // CHECK-NEXT: %[[R3:.*]] = tdx.param_ref @w3
  // CHECK-NEXT: %[[G3:.*]] = tdx.all_gather %[[R3]]
  // CHECK-NEXT: %[[F:.*]] = tdx.exp %[[B]]
  // CHECK-NEXT: tdx.matmul %[[F]], %[[G3]]
  // NONE-LABEL: func.func @forward
  // NONE:      tdx.matmul
  // NONE-NEXT: tdx.exp
  // NONE-NEXT: tdx.param_ref @w2
  func.func @forward(%x: tensor<4x8xf32>) -> tensor<4x8xf32> {
    %r1 = tdx.param_ref @w1 : tensor<4x8xf32>
    %g1 = tdx.all_gather %r1 on @mesh axes = ["dp"] dim = 0 : tensor<4x8xf32> -> tensor<8x8xf32>
    %a = tdx.matmul %x, %g1 : (tensor<4x8xf32>, tensor<8x8xf32>) -> tensor<4x8xf32>
    %e = tdx.exp %a : tensor<4x8xf32>
    %r2 = tdx.param_ref @w2 : tensor<4x8xf32>
    %g2 = tdx.all_gather %r2 on @mesh axes = ["dp"] dim = 0 : tensor<4x8xf32> -> tensor<8x8xf32>
    %b = tdx.matmul %e, %g2 : (tensor<4x8xf32>, tensor<8x8xf32>) -> tensor<4x8xf32>
    %f = tdx.exp %b : tensor<4x8xf32>
    %r3 = tdx.param_ref @w3 : tensor<4x8xf32>
    %g3 = tdx.all_gather %r3 on @mesh axes = ["dp"] dim = 0 : tensor<4x8xf32> -> tensor<8x8xf32>
    %c = tdx.matmul %f, %g3 : (tensor<4x8xf32>, tensor<8x8xf32>) -> tensor<4x8xf32>
    return %c : tensor<4x8xf32>
  }
}

// -----

// A gather does not move above a write of its parameter (the step would
// read the new value), and a gather of a computed value stays where it is.
module attributes {tdx.partitioned} {
  tdx.mesh @mesh shape = [2] axes = ["dp"]
  tdx.parameter @w1 : tensor<8x8xf32> sharding <@mesh, [Shard(0)]> init {
    %0 = tdx.full 1.0 : tensor<8x8xf32>
    tdx.yield %0 : tensor<8x8xf32>
  }
  tdx.parameter @w2 : tensor<8x8xf32> sharding <@mesh, [Shard(0)]> init {
    %0 = tdx.full 1.0 : tensor<8x8xf32>
    tdx.yield %0 : tensor<8x8xf32>
  }
  // CHECK-LABEL: func.func @written
  // CHECK:      tdx.matmul
  // CHECK-NEXT: tdx.assign @w2
  // CHECK-NEXT: tdx.param_ref @w2
  // CHECK-NEXT: tdx.all_gather
  // CHECK-NEXT: tdx.exp
  // CHECK-NEXT: tdx.all_gather
  func.func @written(%x: tensor<4x8xf32>, %n: tensor<4x8xf32>) -> (tensor<4x8xf32>, tensor<8x8xf32>) {
    %r1 = tdx.param_ref @w1 : tensor<4x8xf32>
    %g1 = tdx.all_gather %r1 on @mesh axes = ["dp"] dim = 0 : tensor<4x8xf32> -> tensor<8x8xf32>
    %a = tdx.matmul %x, %g1 : (tensor<4x8xf32>, tensor<8x8xf32>) -> tensor<4x8xf32>
    tdx.assign @w2, %n : tensor<4x8xf32>
    %r2 = tdx.param_ref @w2 : tensor<4x8xf32>
    %g2 = tdx.all_gather %r2 on @mesh axes = ["dp"] dim = 0 : tensor<4x8xf32> -> tensor<8x8xf32>
    %e = tdx.exp %a : tensor<4x8xf32>
    %g3 = tdx.all_gather %e on @mesh axes = ["dp"] dim = 0 : tensor<4x8xf32> -> tensor<8x8xf32>
    %s = tdx.add %g2, %g3 : (tensor<8x8xf32>, tensor<8x8xf32>) -> tensor<8x8xf32>
    return %a, %s : tensor<4x8xf32>, tensor<8x8xf32>
  }
}
