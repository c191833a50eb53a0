// RUN: tdx-opt --tdx-split-parts="ops-per-part=2" %s | FileCheck %s
// RUN: not tdx-opt --tdx-split-parts="ops-per-part=0" %s 2>&1 | FileCheck %s --check-prefix=BAD

// Every op gets the part it is emitted in: a new part starts after every
// ops-per-part ops that run. A wait starts a part with the op that reads
// it, a state write stays with the op that makes its value, and the return
// closes the last part.
// CHECK-LABEL: func.func @train_step
// CHECK-NEXT:    tdx.param_ref @w {tdx.part = 0 : i64}
// CHECK-NEXT:    tdx.start {
// CHECK:         } {tdx.part = 0 : i64}
// CHECK-NEXT:    tdx.exp {{.*}}{tdx.part = 1 : i64}
// CHECK-NEXT:    tdx.neg {{.*}}{tdx.part = 1 : i64}
// CHECK-NEXT:    tdx.assign @w, {{.*}}{tdx.part = 1 : i64}
// CHECK-NEXT:    tdx.wait {{.*}}{tdx.part = 2 : i64}
// CHECK-NEXT:    tdx.add {{.*}}{tdx.part = 2 : i64}
// CHECK-NEXT:    return {tdx.part = 2 : i64}
// BAD: error: tdx-split-parts: ops-per-part must be positive, got 0
module attributes {tdx.partitioned} {
  tdx.mesh @mesh shape = [2] axes = ["dp"]
  tdx.parameter @w : tensor<4xf32> init {
    %0 = tdx.normal(0.0, 0.02) seed(0, 1) : tensor<4xf32>
    tdx.yield %0 : tensor<4xf32>
  }
  func.func @train_step(%x: tensor<4xf32>) -> tensor<4xf32> {
    %w = tdx.param_ref @w : tensor<4xf32>
    %t = tdx.start {
      %r = tdx.all_reduce %x on @mesh axes = ["dp"] reduce = sum : tensor<4xf32> -> tensor<4xf32>
      tdx.yield %r : tensor<4xf32>
    }
    %e = tdx.exp %w : tensor<4xf32>
    %n = tdx.neg %e : tensor<4xf32>
    tdx.assign @w, %n : tensor<4xf32>
    %r = tdx.wait %t : tensor<4xf32>
    %s = tdx.add %r, %n : (tensor<4xf32>, tensor<4xf32>) -> tensor<4xf32>
    return %s : tensor<4xf32>
  }
}
