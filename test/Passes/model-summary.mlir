// RUN: tdx-opt %s --tdx-model-summary -o /dev/null | FileCheck %s
// The pass leaves the IR unchanged.
// RUN: tdx-opt %s --tdx-model-summary=output=%t.txt | FileCheck %s --check-prefix=IR
// RUN: FileCheck %s --input-file=%t.txt
// An output file that cannot be opened is an error, not a crash.
// RUN: not tdx-opt %s --tdx-model-summary=output=%t.missing/dir/x.txt -o /dev/null 2>&1 | FileCheck %s --check-prefix=NOFILE

// CHECK:      name            kind       dtype  shape   elements    bytes       init              sharding
// CHECK-NEXT: emb.weight      parameter  f32    100x16  1600        6.25 KiB    tdx.normal        #tdx.sharding<@mesh, [Shard(0)]>
// CHECK-NEXT: fc.weight       parameter  bf16   32x16   512         1.00 KiB    tdx.uniform       -
// CHECK-NEXT: fc.bias         parameter  f32    32      32          128 B       tdx.cast (2 ops)  -
// CHECK-NEXT: head.weight     parameter  f32    100x16  -           -           tied to emb.weight  -
// CHECK-NEXT: bn.num_batches  buffer     i64    scalar  1           8 B         tdx.full          -
// CHECK-NEXT: bn.mask         buffer     i1     4x4     16          16 B        tdx.full          -
// CHECK-NEXT: total parameters: 4 (1 tied), 2144 elements, 7.38 KiB
// CHECK-NEXT: total buffers: 2 (0 tied), 17 elements, 24 B
// CHECK-EMPTY:
// CHECK-NEXT: func @forward: 4 op(s)
// CHECK-NEXT:   tdx.param_ref           2
// CHECK-NEXT:   func.return             1
// CHECK-NEXT:   tdx.embedding           1

// IR: tdx.parameter @emb.weight
// IR: func.func @forward

// NOFILE: error: tdx-model-summary: cannot open '{{.*}}x.txt'

tdx.mesh @mesh shape = [2] axes = ["tp"]
tdx.parameter @"emb.weight" : tensor<100x16xf32> sharding <@mesh, [Shard(0)]> init {
  %0 = tdx.normal(0.0, 1.0) seed(0, 0) : tensor<100x16xf32>
  tdx.yield %0 : tensor<100x16xf32>
}
tdx.parameter @"fc.weight" : tensor<32x16xbf16> init {
  %0 = tdx.uniform(-0.25, 0.25) seed(0, 1) : tensor<32x16xbf16>
  tdx.yield %0 : tensor<32x16xbf16>
}
tdx.parameter @"fc.bias" : tensor<32xf32> init {
  %0 = tdx.uniform(-0.25, 0.25) seed(0, 2) : tensor<32xbf16>
  %1 = tdx.cast %0 : tensor<32xbf16> to tensor<32xf32>
  tdx.yield %1 : tensor<32xf32>
}
tdx.parameter @"head.weight" : tensor<100x16xf32> tied_to @"emb.weight"
tdx.buffer @"bn.num_batches" : tensor<i64> init {
  %0 = tdx.full 0.0 : tensor<i64>
  tdx.yield %0 : tensor<i64>
}
tdx.buffer @"bn.mask" : tensor<4x4xi1> init {
  %0 = tdx.full 1.0 : tensor<4x4xi1>
  tdx.yield %0 : tensor<4x4xi1>
}
func.func @forward(%ids: tensor<2x8xi64>) -> tensor<2x8x16xf32> {
  %w = tdx.param_ref @"head.weight" : tensor<100x16xf32>
  %unused = tdx.param_ref @"fc.bias" : tensor<32xf32>
  %e = tdx.embedding %w, %ids : (tensor<100x16xf32>, tensor<2x8xi64>) -> tensor<2x8x16xf32>
  return %e : tensor<2x8x16xf32>
}
