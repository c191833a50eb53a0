// RUN: tdx-opt %s -split-input-file | tdx-opt -split-input-file | FileCheck %s
// RUN: tdx-opt %s -split-input-file -mlir-print-op-generic | tdx-opt -split-input-file | FileCheck %s

// Placements print like PyTorch DTensor; `Replicate()` is accepted too.
// CHECK-LABEL: func.func @placements
// CHECK-SAME: tdx.p0 = #tdx.placement<Shard(1)>
// CHECK-SAME: tdx.p1 = #tdx.placement<Replicate>
// CHECK-SAME: tdx.p2 = #tdx.placement<Partial(sum)>
// CHECK-SAME: tdx.p3 = #tdx.placement<Partial(avg)>
// CHECK-SAME: tdx.p4 = #tdx.placement<Partial(max)>
// CHECK-SAME: tdx.p5 = #tdx.placement<Partial(min)>
// CHECK-SAME: tdx.p6 = #tdx.placement<Partial(sum)>
// CHECK-SAME: tdx.p7 = #tdx.placement<Replicate>
func.func @placements() attributes {
    tdx.p0 = #tdx.placement<Shard(1)>, tdx.p1 = #tdx.placement<Replicate>,
    tdx.p2 = #tdx.placement<Partial(sum)>, tdx.p3 = #tdx.placement<Partial(avg)>,
    tdx.p4 = #tdx.placement<Partial(max)>, tdx.p5 = #tdx.placement<Partial(min)>,
    tdx.p6 = #tdx.placement<Partial>, tdx.p7 = #tdx.placement<Replicate()>} {
  return
}

// -----

// CHECK-LABEL: func.func @shardings
// CHECK-SAME: tdx.s0 = #tdx.sharding<@mesh, [Shard(0), Replicate]>
// CHECK-SAME: tdx.s1 = #tdx.sharding<@mesh, [Partial(sum), Shard(1)]>
tdx.mesh @mesh shape = [2, 4] axes = ["dp", "tp"]
func.func @shardings() attributes {
    tdx.s0 = #tdx.sharding<@mesh, [Shard(0), Replicate]>,
    tdx.s1 = #tdx.sharding<@mesh, [Partial(sum), Shard(1)]>} {
  return
}
