// RUN: tdx-opt %s --tdx-explain -o /dev/null | FileCheck %s
// RUN: not tdx-opt %s --tdx-explain=output=%t.missing/plan.html -o /dev/null 2>&1 | FileCheck %s --check-prefix=OUTPUT

// OUTPUT: error: tdx-explain: cannot open '{{.*}}.missing/plan.html'

// A rank of a ZeRO-3 step on dp2 (test/Passes/memory-report.mlir's): w is
// stored split on dp and so is its optimizer state; the step gathers w and
// sums the batch's gradient over dp.
// CHECK:      <!doctype html>
// CHECK:      <title>tdx plan: @train_step</title>
// CHECK:      Mesh @mesh [dp 2]. 7 ops per rank, 2 collectives, 404 B per rank at the peak.
// CHECK:      <h2>Placements</h2>
// A name without a layer number is in no layer; the buffer is replicated.
// CHECK:      (not in a layer)
// CHECK:      >w</text>
// CHECK-NEXT: fill="#4e79a7"/>{{.*}}>Shard(0)</text>
// CHECK:      >b</text>
// CHECK-NEXT: fill="#bab0ac"/>{{.*}}>Replicate</text>
// CHECK:      <h2>The step: memory and collectives over time</h2>
// CHECK:      <polyline
// CHECK:      peak 224 B
// CHECK:      <title>all_gather over dp: 64 B f32 at {{.*}}explain.mlir:{{[0-9]+}}:{{[0-9]+}}</title>
// CHECK:      <title>all_reduce over dp: 32 B f32 at
// CHECK:      <tr><td>all_gather</td><td>dp</td><td>f32</td><td>1</td><td>64 B</td></tr>
// CHECK-NEXT: <tr><td>all_reduce</td><td>dp</td><td>f32</td><td>1</td><td>32 B</td></tr>
// CHECK:      <h2>Memory per rank</h2>
// CHECK:      parameters</td><td>80</td>
// CHECK:      optimizer</td><td>68</td>
// CHECK:      inputs</td><td>32</td>
// CHECK:      gradients</td><td>64</td>
// CHECK:      activations</td><td>160</td>
// CHECK:      <tr><th>peak</th><th>404</th>
// CHECK:      </html>
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
    %r = tdx.all_reduce %e on @mesh axes = ["dp"] reduce = sum : tensor<2x4xf32> -> tensor<2x4xf32>
    tdx.assign @w, %u : tensor<4x4xf32>
    return %r : tensor<2x4xf32>
  }
}
