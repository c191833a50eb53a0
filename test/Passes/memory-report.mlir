// RUN: tdx-opt %s --tdx-memory-report -o /dev/null | FileCheck %s
// RUN: tdx-opt %s --tdx-memory-report=format=json -o /dev/null | FileCheck %s --check-prefix=JSON
// RUN: not tdx-opt %s --tdx-memory-report=format=xml -o /dev/null 2>&1 | FileCheck %s --check-prefix=FORMAT

// A rank of a ZeRO-3 step on dp2: w [8x4] f32 stored split (64 bytes), its
// Adam state split as it is (exp_avg 64 bytes, step 4), a replicated buffer
// (16 bytes), a [2x4] batch half of [4x4] (32 bytes). The step writes w: its
// gradient as the update reads it, placed as exp_avg (64 bytes). The step's
// own tensors: e (32 bytes, returned), g (128, gathered) and u (64, written)
// are alive together: 224 bytes of working memory, 160 of them besides the
// gradient; the peak is 80 + 68 + 32 + 224.
// CHECK:      memory per rank of @train_step
// CHECK-NEXT: parameters              80 bytes
// CHECK-NEXT: optimizer               68 bytes
// CHECK-NEXT: inputs                  32 bytes
// CHECK-NEXT: gradients               64 bytes
// CHECK-NEXT: activations            160 bytes
// CHECK-NEXT: peak                   404 bytes
// JSON: {"activations":160,"gradients":64,"inputs":32,"largest":[{"bytes":128,"name":"the result of tdx.all_gather at {{.*}}memory-report.mlir:{{[0-9]+}} (tensor<8x4xf32>)"},{"bytes":64,"name":"state w"},{{.*}}],"optimizer":68,"parameters":80,"peak":404,"recomputed":{"bytes":0,"kinds":{},"ops":0,"seconds":0},"working":224}
// FORMAT: error: tdx-memory-report: unknown format 'xml'; use 'table', 'json' or 'none'
module attributes {tdx.partitioned} {
  tdx.mesh @mesh shape = [2] axes = ["dp"]
  tdx.parameter @w : tensor<8x4xf32> sharding <@mesh, [Shard(0)]> init {
    %0 = tdx.full 0.0 : tensor<8x4xf32>
    tdx.yield %0 : tensor<8x4xf32>
  }
  tdx.buffer @b : tensor<4xf32> init {
    %0 = tdx.full 0.0 : tensor<4xf32>
    tdx.yield %0 : tensor<4xf32>
  }
  tdx.parameter @optimizer.w.exp_avg : tensor<8x4xf32> sharding <@mesh, [Shard(0)]> init {
    %0 = tdx.full 0.0 : tensor<8x4xf32>
    tdx.yield %0 : tensor<8x4xf32>
  }
  tdx.parameter @optimizer.w.step : tensor<f32> init {
    %0 = tdx.full 0.0 : tensor<f32>
    tdx.yield %0 : tensor<f32>
  }
  func.func @train_step(%x: tensor<2x4xf32> {tdx.global_type = tensor<4x4xf32>, tdx.sharding = #tdx.sharding<@mesh, [Shard(0)]>}) -> tensor<2x4xf32> {
    %w = tdx.param_ref @w : tensor<4x4xf32>
    %e = tdx.exp %x : tensor<2x4xf32>
    %g = tdx.all_gather %w on @mesh axes = ["dp"] dim = 0 : tensor<4x4xf32> -> tensor<8x4xf32>
    %m = tdx.param_ref @optimizer.w.exp_avg : tensor<4x4xf32>
    %s = tdx.slice %g dim 0 [0 : 4 : 1] : tensor<8x4xf32> -> tensor<4x4xf32>
    %u = tdx.add %s, %m : (tensor<4x4xf32>, tensor<4x4xf32>) -> tensor<4x4xf32>
    tdx.assign @w, %u : tensor<4x4xf32>
    return %e : tensor<2x4xf32>
  }
}
