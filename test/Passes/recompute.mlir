// RUN: tdx-opt %s -split-input-file --tdx-recompute | FileCheck %s
// RUN: tdx-opt %s -split-input-file --tdx-recompute --tdx-memory-report -o /dev/null | FileCheck %s --check-prefix=REPORT
// RUN: tdx-opt %s -split-input-file --tdx-recompute --tdx-memory-report=format=json -o /dev/null | FileCheck %s --check-prefix=JSON

// A forward and its backward in small: %a is made first and read again
// last, so it is held across the peak (at %d: a, b, c and d, 1024 bytes,
// with the 256-byte batch 1280). Under a budget of 1100, exp(%x) runs
// again right before its late reader (from the argument, always at hand),
// and the peak is 768 + 256 bytes.
// CHECK-LABEL: func.func @train_step
// CHECK:       %[[A:.*]] = tdx.exp %arg0 : tensor<64xf32>
// CHECK:       %[[D:.*]] = tdx.mul
// CHECK-NEXT:  %[[AGAIN:.*]] = tdx.exp %arg0 {tdx.recomputed} : tensor<64xf32>
// CHECK-NEXT:  tdx.mul %[[D]], %[[AGAIN]]
// REPORT:      peak                  1024 bytes
// REPORT-NEXT: budget                1100 bytes
// REPORT-NEXT: recomputed   1 ops run again after the peak, making 256 bytes again
// JSON:        "recomputed":{"bytes":256,"kinds":{"tdx.exp":1},"ops":1,"seconds":5.12{{[0-9]*}}e-08}
module attributes {tdx.partitioned, tdx.memory_budget = 1100 : i64} {
  func.func @train_step(%x: tensor<64xf32>) -> tensor<64xf32> {
    %a = tdx.exp %x : tensor<64xf32>
    %b = tdx.exp %a : tensor<64xf32>
    %c = tdx.exp %b : tensor<64xf32>
    %d = tdx.mul %c, %b : (tensor<64xf32>, tensor<64xf32>) -> tensor<64xf32>
    %e = tdx.mul %d, %a : (tensor<64xf32>, tensor<64xf32>) -> tensor<64xf32>
    return %e : tensor<64xf32>
  }
}

// -----

// The same step within its budget is left as it is.
// CHECK-LABEL: func.func @train_step
// CHECK-NOT:   tdx.recomputed
// REPORT:      peak                  1280 bytes
// REPORT-NEXT: budget                1280 bytes
// REPORT-NOT:  recomputed
// JSON:        "recomputed":{"bytes":0,"kinds":{},"ops":0,"seconds":0}
module attributes {tdx.partitioned, tdx.memory_budget = 1280 : i64} {
  func.func @train_step(%x: tensor<64xf32>) -> tensor<64xf32> {
    %a = tdx.exp %x : tensor<64xf32>
    %b = tdx.exp %a : tensor<64xf32>
    %c = tdx.exp %b : tensor<64xf32>
    %d = tdx.mul %c, %b : (tensor<64xf32>, tensor<64xf32>) -> tensor<64xf32>
    %e = tdx.mul %d, %a : (tensor<64xf32>, tensor<64xf32>) -> tensor<64xf32>
    return %e : tensor<64xf32>
  }
}

// -----

// A collective runs again only where that is the cheaper side of the cut.
// The gathered %g (4096 bytes) and the reduced %r (1024) are both read
// after the peak (at %z: g, r, y, z). Gathering again costs its latency
// and bytes but holds nothing across the peak (exp(%x) runs again too), so
// the gather is started and waited for again; running the all_reduce again
// would hold as much as its result, so %r is held. The peak: 14336 ->
// 10240 bytes, under the budget of 11000.
// CHECK-LABEL: func.func @train_step
// CHECK:       tdx.all_reduce
// CHECK:       %[[Q:.*]] = tdx.exp %{{.*}} : tensor<256xf32>
// CHECK-NEXT:  %[[S:.*]] = tdx.exp %arg0 {tdx.recomputed} : tensor<256xf32>
// CHECK-NEXT:  %[[T:.*]] = tdx.start {
// CHECK-NEXT:    tdx.all_gather %[[S]]
// CHECK:       } {tdx.recomputed}
// CHECK-NEXT:  %[[G:.*]] = tdx.wait %[[T]] {tdx.recomputed} : tensor<1024xf32>
// CHECK-NEXT:  tdx.slice %[[G]] dim 0 [256 : 512 : 1]
// CHECK-NOT:   tdx.all_reduce
// CHECK:       return
// REPORT:      peak                 10240 bytes
// REPORT-NEXT: budget               11000 bytes
// REPORT-NEXT: recomputed   2 ops run again after the peak, making 5120 bytes again
// JSON:        "recomputed":{"bytes":5120,"kinds":{"tdx.all_gather":1,"tdx.exp":1},"ops":2,"seconds":5.5512{{[0-9]*}}e-05}
module attributes {tdx.partitioned, tdx.memory_budget = 11000 : i64} {
  tdx.mesh @mesh shape = [4] axes = ["sp"]
  func.func @train_step(%x: tensor<256xf32>) -> tensor<256xf32> {
    %s = tdx.exp %x : tensor<256xf32>
    %t = tdx.start {
      %g0 = tdx.all_gather %s on @mesh axes = ["sp"] dim = 0 : tensor<256xf32> -> tensor<1024xf32>
      tdx.yield %g0 : tensor<1024xf32>
    }
    %g = tdx.wait %t : tensor<1024xf32>
    %r = tdx.all_reduce %s on @mesh axes = ["sp"] reduce = sum : tensor<256xf32> -> tensor<256xf32>
    %y = tdx.exp %g : tensor<1024xf32>
    %z = tdx.exp %y : tensor<1024xf32>
    %zs = tdx.slice %z dim 0 [0 : 256 : 1] : tensor<1024xf32> -> tensor<256xf32>
    %q = tdx.exp %zs : tensor<256xf32>
    %gs = tdx.slice %g dim 0 [256 : 512 : 1] : tensor<1024xf32> -> tensor<256xf32>
    %u = tdx.mul %q, %gs : (tensor<256xf32>, tensor<256xf32>) -> tensor<256xf32>
    %w = tdx.add %u, %r : (tensor<256xf32>, tensor<256xf32>) -> tensor<256xf32>
    return %w : tensor<256xf32>
  }
}

// -----

// A generic aten op that draws random numbers is held: running it again
// would not give the same values. The budget cannot be met; the step is
// left for tdx-memory-report to refuse.
// CHECK-LABEL: func.func @train_step
// CHECK-NOT:   tdx.recomputed
module attributes {tdx.partitioned, tdx.memory_budget = 1100 : i64} {
  func.func @train_step(%x: tensor<64xf32>) -> tensor<64xf32> {
    %a = tdx.aten "aten::rand_like"(%x) {args = {dtype = unit, layout = unit, device = unit, pin_memory = unit, memory_format = unit}} : (tensor<64xf32>) -> tensor<64xf32>
    %b = tdx.exp %a : tensor<64xf32>
    %c = tdx.exp %b : tensor<64xf32>
    %d = tdx.mul %c, %b : (tensor<64xf32>, tensor<64xf32>) -> tensor<64xf32>
    %e = tdx.mul %d, %a : (tensor<64xf32>, tensor<64xf32>) -> tensor<64xf32>
    return %e : tensor<64xf32>
  }
}

// -----

// tdx's random ops are counter-based: a draw is a function of its seed,
// stream, the call and the element, so running one again in the same call
// gives the same values, and the mask is drawn again rather than held.
// CHECK-LABEL: func.func @train_step
// CHECK:       tdx.exp
// CHECK-NEXT:  %[[D:.*]] = tdx.mul
// CHECK-NEXT:  %[[AGAIN:.*]] = tdx.bernoulli(9.000000e-01) seed(3, 7) {tdx.recomputed} : tensor<64xf32>
// CHECK-NEXT:  tdx.mul %[[D]], %[[AGAIN]]
module attributes {tdx.partitioned, tdx.memory_budget = 1100 : i64} {
  func.func @train_step(%x: tensor<64xf32>) -> tensor<64xf32> {
    %a = tdx.bernoulli(0.9) seed(3, 7) : tensor<64xf32>
    %b = tdx.mul %a, %x : (tensor<64xf32>, tensor<64xf32>) -> tensor<64xf32>
    %c = tdx.exp %b : tensor<64xf32>
    %d = tdx.mul %c, %b : (tensor<64xf32>, tensor<64xf32>) -> tensor<64xf32>
    %e = tdx.mul %d, %a : (tensor<64xf32>, tensor<64xf32>) -> tensor<64xf32>
    return %e : tensor<64xf32>
  }
}

// -----

// A pipeline's ranks each fit their own step: rank 1's step (the first
// case's) runs exp(%x) again; rank 0's, within the budget, is left as it
// is. The report is of rank 1, whose step peaks highest.
// CHECK-LABEL: func.func @train_step_pp0
// CHECK-NOT:   tdx.recomputed
// CHECK-LABEL: func.func @train_step_pp1
// CHECK:       %[[D:.*]] = tdx.mul
// CHECK-NEXT:  %[[AGAIN:.*]] = tdx.exp %arg0 {tdx.recomputed} : tensor<64xf32>
// CHECK-NEXT:  tdx.mul %[[D]], %[[AGAIN]]
// REPORT:      memory per rank of @train_step_pp1
// REPORT:      peak                  1024 bytes
// REPORT-NEXT: budget                1100 bytes
// REPORT-NEXT: recomputed   1 ops run again after the peak, making 256 bytes again
// JSON:        "recomputed":{"bytes":256,"kinds":{"tdx.exp":1},"ops":1,
module attributes {tdx.partitioned, tdx.memory_budget = 1100 : i64, tdx.pipeline = {axis = "pp", microbatches = 1 : i64, schedule = "1f1b", stages_per_rank = 1 : i64, functions = [@train_step_pp0, @train_step_pp1], timeline = []}} {
  tdx.mesh @mesh shape = [2] axes = ["pp"]
  func.func @train_step_pp0(%x: tensor<64xf32>) -> tensor<64xf32> {
    %a = tdx.exp %x : tensor<64xf32>
    return %a : tensor<64xf32>
  }
  func.func @train_step_pp1(%x: tensor<64xf32>) -> tensor<64xf32> {
    %a = tdx.exp %x : tensor<64xf32>
    %b = tdx.exp %a : tensor<64xf32>
    %c = tdx.exp %b : tensor<64xf32>
    %d = tdx.mul %c, %b : (tensor<64xf32>, tensor<64xf32>) -> tensor<64xf32>
    %e = tdx.mul %d, %a : (tensor<64xf32>, tensor<64xf32>) -> tensor<64xf32>
    return %e : tensor<64xf32>
  }
}
