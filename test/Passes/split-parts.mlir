// RUN: tdx-opt -split-input-file --tdx-split-parts="ops-per-part=2" %s | FileCheck %s
// RUN: tdx-opt -split-input-file --tdx-split-parts="ops-per-part=8" %s | FileCheck %s --check-prefix=REPEAT
// RUN: not tdx-opt -split-input-file --tdx-split-parts="ops-per-part=0" %s 2>&1 | FileCheck %s --check-prefix=BAD

// Every op gets the part it is emitted in. A part ends after an op whose
// kind and types hash to 0 modulo half of ops-per-part, once that many ops
// ran, or after twice ops-per-part (with 2: after every op that runs). A
// wait starts a part with the op that reads it, a state write stays with
// the op that makes its value, and the return closes the last part.
// CHECK-LABEL: func.func @train_step
// CHECK-NEXT:    tdx.param_ref @w {tdx.part = 0 : i64}
// CHECK-NEXT:    tdx.start {
// CHECK:         } {tdx.part = 1 : i64}
// CHECK-NEXT:    tdx.exp {{.*}}{tdx.part = 2 : i64}
// CHECK-NEXT:    tdx.neg {{.*}}{tdx.part = 3 : i64}
// CHECK-NEXT:    tdx.assign @w, {{.*}}{tdx.part = 3 : i64}
// CHECK-NEXT:    tdx.wait {{.*}}{tdx.part = 4 : i64}
// CHECK-NEXT:    tdx.add {{.*}}{tdx.part = 4 : i64}
// CHECK-NEXT:    return {tdx.part = 4 : i64}
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

// -----

// The cuts depend on the ops, not on where they stand: a block repeated
// (a layer) is cut the same way each time, so its parts repeat. Here a
// 5-op block, three times: the part numbers of the second and third block
// are the first's, moved by the same count.
// REPEAT-LABEL: func.func @layers
// REPEAT:      tdx.exp {{.*}}tdx.part = [[#A0:]]
// REPEAT-NEXT: tdx.mul {{.*}}tdx.part = [[#A1:]]
// REPEAT-NEXT: tdx.neg {{.*}}tdx.part = [[#A2:]]
// REPEAT-NEXT: tdx.add {{.*}}tdx.part = [[#A3:]]
// REPEAT-NEXT: tdx.tanh {{.*}}tdx.part = [[#A4:]]
// REPEAT-NEXT: tdx.exp {{.*}}tdx.part = [[#B0:]]
// REPEAT-NEXT: tdx.mul {{.*}}tdx.part = [[#B0+A1-A0]]
// REPEAT-NEXT: tdx.neg {{.*}}tdx.part = [[#B0+A2-A0]]
// REPEAT-NEXT: tdx.add {{.*}}tdx.part = [[#B0+A3-A0]]
// REPEAT-NEXT: tdx.tanh {{.*}}tdx.part = [[#B0+A4-A0]]
// REPEAT-NEXT: tdx.exp {{.*}}tdx.part = [[#C0:]]
// REPEAT-NEXT: tdx.mul {{.*}}tdx.part = [[#C0+A1-A0]]
// REPEAT-NEXT: tdx.neg {{.*}}tdx.part = [[#C0+A2-A0]]
// REPEAT-NEXT: tdx.add {{.*}}tdx.part = [[#C0+A3-A0]]
// REPEAT-NEXT: tdx.tanh {{.*}}tdx.part = [[#C0+A4-A0]]
module attributes {tdx.partitioned} {
  func.func @layers(%x: tensor<4xf32>) -> tensor<4xf32> {
    %e0 = tdx.exp %x : tensor<4xf32>
    %m0 = tdx.mul %e0, %x : (tensor<4xf32>, tensor<4xf32>) -> tensor<4xf32>
    %n0 = tdx.neg %m0 : tensor<4xf32>
    %a0 = tdx.add %n0, %e0 : (tensor<4xf32>, tensor<4xf32>) -> tensor<4xf32>
    %t0 = tdx.tanh %a0 : tensor<4xf32>
    %e1 = tdx.exp %t0 : tensor<4xf32>
    %m1 = tdx.mul %e1, %t0 : (tensor<4xf32>, tensor<4xf32>) -> tensor<4xf32>
    %n1 = tdx.neg %m1 : tensor<4xf32>
    %a1 = tdx.add %n1, %e1 : (tensor<4xf32>, tensor<4xf32>) -> tensor<4xf32>
    %t1 = tdx.tanh %a1 : tensor<4xf32>
    %e2 = tdx.exp %t1 : tensor<4xf32>
    %m2 = tdx.mul %e2, %t1 : (tensor<4xf32>, tensor<4xf32>) -> tensor<4xf32>
    %n2 = tdx.neg %m2 : tensor<4xf32>
    %a2 = tdx.add %n2, %e2 : (tensor<4xf32>, tensor<4xf32>) -> tensor<4xf32>
    %t2 = tdx.tanh %a2 : tensor<4xf32>
    return %t2 : tensor<4xf32>
  }
}
