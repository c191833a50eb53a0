// RUN: tdx-opt %s -split-input-file --tdx-propagate-sharding --tdx-insert-collectives --tdx-partition --tdx-widen-reductions | FileCheck %s

// A bf16 matmul split along its reduction leaves a Partial sum. The cost
// model sums it in bf16 (half the bytes of f32), and mixed precision's
// reduce type (tdx-widen-reductions) sums it in f32 instead; the cast back
// up to the fp32 gradient reads that f32 sum, not its bf16 rounding.
// CHECK-LABEL: func.func @widen
// CHECK:      %[[P:.*]] = tdx.matmul {{.*}} -> tensor<8x8xbf16>
// CHECK-NEXT: %[[W:.*]] = tdx.cast %[[P]] {{.*}}: tensor<8x8xbf16> to tensor<8x8xf32>
// CHECK-NEXT: %[[R:.*]] = tdx.all_reduce %[[W]] {{.*}}tdx.payload_bytes = 256{{.*}}: tensor<8x8xf32> -> tensor<8x8xf32>
// CHECK-NEXT: return %[[R]]
module attributes {tdx.reduce_type = f32} {
  tdx.mesh @mesh shape = [2] axes = ["dp"]
  func.func @widen(%x: tensor<8x16xbf16>, %dy: tensor<16x8xbf16>) -> tensor<8x8xf32> {
    %xs = tdx.annotate %x <@mesh, [Shard(1)]> : tensor<8x16xbf16>
    %ds = tdx.annotate %dy <@mesh, [Shard(0)]> : tensor<16x8xbf16>
    %g = tdx.matmul %xs, %ds : (tensor<8x16xbf16>, tensor<16x8xbf16>) -> tensor<8x8xbf16>
    %w = tdx.cast %g : tensor<8x8xbf16> to tensor<8x8xf32>
    %r = tdx.annotate %w <@mesh, [Replicate]> : tensor<8x8xf32>
    return %r : tensor<8x8xf32>
  }
}

// -----

// A narrowing cast (f32 -> bf16) rounds: a sum of rounded parts is not the
// rounded sum, so the f32 Partial is summed before it (and an f32 sum is
// wide enough for the reduce type).
// CHECK-LABEL: func.func @narrow
// CHECK:      %[[P:.*]] = tdx.matmul {{.*}} -> tensor<8x8xf32>
// CHECK-NEXT: %[[R:.*]] = tdx.all_reduce %[[P]] {{.*}}: tensor<8x8xf32> -> tensor<8x8xf32>
// CHECK-NEXT: tdx.cast %[[R]] {{.*}}: tensor<8x8xf32> to tensor<8x8xbf16>
tdx.mesh @mesh shape = [2] axes = ["dp"]
func.func @narrow(%x: tensor<8x16xf32>, %dy: tensor<16x8xf32>) -> tensor<8x8xbf16> {
  %xs = tdx.annotate %x <@mesh, [Shard(1)]> : tensor<8x16xf32>
  %ds = tdx.annotate %dy <@mesh, [Shard(0)]> : tensor<16x8xf32>
  %g = tdx.matmul %xs, %ds : (tensor<8x16xf32>, tensor<16x8xf32>) -> tensor<8x8xf32>
  %w = tdx.cast %g : tensor<8x8xf32> to tensor<8x8xbf16>
  %r = tdx.annotate %w <@mesh, [Replicate]> : tensor<8x8xbf16>
  return %r : tensor<8x8xbf16>
}
