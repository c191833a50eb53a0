// RUN: tdx-opt %s -split-input-file | tdx-opt -split-input-file | FileCheck %s
// RUN: tdx-opt %s -split-input-file -mlir-print-op-generic | tdx-opt -split-input-file | FileCheck %s

// Placements print like PyTorch DTensor; `Replicate()` is accepted too.
// CHECK-LABEL: func.func @placements
// CHECK-SAME: test.p0 = #tdx.placement<Shard(1)>
// CHECK-SAME: test.p1 = #tdx.placement<Replicate>
// CHECK-SAME: test.p2 = #tdx.placement<Partial(sum)>
// CHECK-SAME: test.p3 = #tdx.placement<Partial(avg)>
// CHECK-SAME: test.p4 = #tdx.placement<Partial(max)>
// CHECK-SAME: test.p5 = #tdx.placement<Partial(min)>
// CHECK-SAME: test.p6 = #tdx.placement<Partial(sum)>
// CHECK-SAME: test.p7 = #tdx.placement<Replicate>
func.func @placements() attributes {
    test.p0 = #tdx.placement<Shard(1)>, test.p1 = #tdx.placement<Replicate>,
    test.p2 = #tdx.placement<Partial(sum)>, test.p3 = #tdx.placement<Partial(avg)>,
    test.p4 = #tdx.placement<Partial(max)>, test.p5 = #tdx.placement<Partial(min)>,
    test.p6 = #tdx.placement<Partial>, test.p7 = #tdx.placement<Replicate()>} {
  return
}

// -----

// CHECK-LABEL: func.func @shardings
// CHECK-SAME: test.s0 = #tdx.sharding<@mesh, [Shard(0), Replicate]>
// CHECK-SAME: test.s1 = #tdx.sharding<@mesh, [Partial(sum), Shard(1)]>
tdx.mesh @mesh shape = [2, 4] axes = ["dp", "tp"]
func.func @shardings() attributes {
    test.s0 = #tdx.sharding<@mesh, [Shard(0), Replicate]>,
    test.s1 = #tdx.sharding<@mesh, [Partial(sum), Shard(1)]>} {
  return
}
