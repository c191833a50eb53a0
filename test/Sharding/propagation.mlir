// RUN: tdx-opt %s -split-input-file --tdx-propagate-sharding | FileCheck %s

// Propagation is bidirectional: the annotation on the output reaches back
// to the function argument and to the unannotated parameter.
tdx.mesh @mesh shape = [2] axes = ["dp"]
tdx.parameter @w : tensor<16x16xf32> init {
  %0 = tdx.normal(0.0, 0.02) seed(0, 0) : tensor<16x16xf32>
  tdx.yield %0 : tensor<16x16xf32>
}
// CHECK: tdx.parameter @w : tensor<16x16xf32> sharding <@mesh, [Replicate]>
// CHECK-LABEL: func.func @backward
// CHECK-SAME: tdx.sharding = #tdx.sharding<@mesh, [Shard(0)]>
// CHECK-NOT: tdx.redistribute
// CHECK-NOT: tdx.annotate
func.func @backward(%x: tensor<8x16xf32>) -> tensor<8x16xf32> {
  %w = tdx.param_ref @w : tensor<16x16xf32>
  %h = tdx.matmul %x, %w : (tensor<8x16xf32>, tensor<16x16xf32>) -> tensor<8x16xf32>
  %t = tdx.tanh %h : tensor<8x16xf32>
  %r = tdx.annotate %t <@mesh, [Shard(0)]> : tensor<8x16xf32>
  return %r : tensor<8x16xf32>
}

// -----

// Priorities: the lower number wins; the other annotation is honoured with
// a redistribute, never overridden.
tdx.mesh @mesh shape = [2] axes = ["tp"]
// CHECK-LABEL: func.func @priorities
// CHECK: %[[A:.*]] = tdx.add %{{.*}}, %{{.*}} {tdx.shardings = [#tdx.sharding<@mesh, [Shard(1)]>]}
// CHECK: tdx.redistribute %[[A]] <@mesh, [Shard(1)]> to <@mesh, [Shard(0)]>
func.func @priorities(%x: tensor<8x8xf32>, %y: tensor<8x8xf32>) -> tensor<8x8xf32> {
  %xs = tdx.annotate %x <@mesh, [Shard(1)]> : tensor<8x8xf32>
  %a = tdx.add %xs, %y : (tensor<8x8xf32>, tensor<8x8xf32>) -> tensor<8x8xf32>
  %r = tdx.annotate %a <@mesh, [Shard(0)]> priority 1 : tensor<8x8xf32>
  return %r : tensor<8x8xf32>
}

// -----

// Tied weights are one value: the embedding's layout is the head's.
tdx.mesh @mesh shape = [2] axes = ["tp"]
tdx.parameter @wte : tensor<100x16xf32> init {
  %0 = tdx.normal(0.0, 0.02) seed(0, 0) : tensor<100x16xf32>
  tdx.yield %0 : tensor<100x16xf32>
}
tdx.parameter @head : tensor<100x16xf32> tied_to @wte
// CHECK: tdx.parameter @wte : tensor<100x16xf32> sharding <@mesh, [Shard(1)]>
// CHECK: tdx.parameter @head : tensor<100x16xf32> tied_to @wte{{$}}
// CHECK-LABEL: func.func @tied
// CHECK: tdx.param_ref @wte {tdx.shardings = [#tdx.sharding<@mesh, [Shard(1)]>]}
// CHECK: tdx.param_ref @head {tdx.shardings = [#tdx.sharding<@mesh, [Shard(1)]>]}
func.func @tied(%ids: tensor<4xi64>) -> tensor<4x100xf32> {
  %w = tdx.param_ref @wte : tensor<100x16xf32>
  %ws = tdx.annotate %w <@mesh, [Shard(1)]> : tensor<100x16xf32>
  %e = tdx.embedding %ws, %ids : (tensor<100x16xf32>, tensor<4xi64>) -> tensor<4x16xf32>
  %h = tdx.param_ref @head : tensor<100x16xf32>
  %l = tdx.linear %e, %h : (tensor<4x16xf32>, tensor<100x16xf32>) -> tensor<4x100xf32>
  return %l : tensor<4x100xf32>
}

// -----

// Generic aten ops keep replicated operands.
tdx.mesh @mesh shape = [2] axes = ["tp"]
// CHECK-LABEL: func.func @generic
// CHECK: %[[R:.*]] = tdx.redistribute %{{.*}} <@mesh, [Shard(0)]> to <@mesh, [Replicate]>
// CHECK: tdx.aten "aten::cumsum"(%[[R]]) {args = {dim = 0 : i64}, tdx.shardings = [#tdx.sharding<@mesh, [Replicate]>]}
func.func @generic(%x: tensor<8xf32>) -> tensor<8xf32> {
  %xs = tdx.annotate %x <@mesh, [Shard(0)]> : tensor<8xf32>
  %c = tdx.aten "aten::cumsum"(%xs) {args = {dim = 0 : i64}} : (tensor<8xf32>) -> tensor<8xf32>
  return %c : tensor<8xf32>
}

// -----

// Uneven: 5 rows over 4 ranks stay sharded (torch.chunk: 2, 2, 1, 0).
tdx.mesh @mesh shape = [4] axes = ["tp"]
// CHECK-LABEL: func.func @uneven
// CHECK: tdx.exp %{{.*}} {tdx.shardings = [#tdx.sharding<@mesh, [Shard(0)]>]} : tensor<5x3xf32>
func.func @uneven(%x: tensor<5x3xf32>) -> tensor<5x3xf32> {
  %xs = tdx.annotate %x <@mesh, [Shard(0)]> : tensor<5x3xf32>
  %e = tdx.exp %xs : tensor<5x3xf32>
  return %e : tensor<5x3xf32>
}

// -----

// A huge priority is just a low priority (no loop over the numbers between).
tdx.mesh @mesh shape = [2] axes = ["tp"]
// CHECK-LABEL: func.func @huge_priority
// CHECK: tdx.exp %{{.*}} {tdx.shardings = [#tdx.sharding<@mesh, [Shard(0)]>]}
func.func @huge_priority(%x: tensor<8xf32>) -> tensor<8xf32> {
  %xs = tdx.annotate %x <@mesh, [Shard(0)]> priority 2147483647 : tensor<8xf32>
  %e = tdx.exp %xs : tensor<8xf32>
  return %e : tensor<8xf32>
}

// -----

// A sum of partial gradients reduces once: add keeps Partial(sum) operands
// Partial, and the one all_reduce comes where a replicated value is needed.
tdx.mesh @mesh shape = [2] axes = ["tp"]
// CHECK-LABEL: func.func @partial_sums
// CHECK: %[[A:.*]] = tdx.add %{{.*}}, %{{.*}} {tdx.shardings = [#tdx.sharding<@mesh, [Partial(sum)]>]}
// CHECK: tdx.redistribute %[[A]] <@mesh, [Partial(sum)]> to <@mesh, [Replicate]>
// CHECK-NOT: tdx.redistribute
func.func @partial_sums(%x: tensor<8x16xf32>, %y: tensor<8x16xf32>, %w: tensor<16x4xf32>, %v: tensor<16x4xf32>, %r: tensor<8x4xf32>) -> tensor<8x4xf32> {
  %xs = tdx.annotate %x <@mesh, [Shard(1)]> : tensor<8x16xf32>
  %ys = tdx.annotate %y <@mesh, [Shard(1)]> : tensor<8x16xf32>
  %ws = tdx.annotate %w <@mesh, [Shard(0)]> : tensor<16x4xf32>
  %vs = tdx.annotate %v <@mesh, [Shard(0)]> : tensor<16x4xf32>
  %rr = tdx.annotate %r <@mesh, [Replicate]> : tensor<8x4xf32>
  %p = tdx.matmul %xs, %ws : (tensor<8x16xf32>, tensor<16x4xf32>) -> tensor<8x4xf32>
  %q = tdx.matmul %ys, %vs : (tensor<8x16xf32>, tensor<16x4xf32>) -> tensor<8x4xf32>
  %a = tdx.add %p, %q : (tensor<8x4xf32>, tensor<8x4xf32>) -> tensor<8x4xf32>
  %b = tdx.add %a, %rr : (tensor<8x4xf32>, tensor<8x4xf32>) -> tensor<8x4xf32>
  %o = tdx.annotate %b <@mesh, [Replicate]> : tensor<8x4xf32>
  return %o : tensor<8x4xf32>
}

// -----

// Preferences (tdx.sharding_priority, data parallelism's batch split): two
// arguments that prefer to split different factors of one matmul are
// settled by cost, not refused, and the preference leaves the IR once it is
// the argument's placement. Gathering %w moves twice the bytes of sending
// %x's columns and holds %w whole (its growth is memory too); splitting the
// reduction holds the product whole. The same bytes held, less moved: %x
// is sent and the product is a partial sum.
tdx.mesh @mesh shape = [2] axes = ["dp"]
// CHECK-LABEL: func.func @preferences
// CHECK-NOT: tdx.sharding_priority
// CHECK: tdx.redistribute %arg0 <@mesh, [Shard(0)]> to <@mesh, [Shard(1)]>
// CHECK: tdx.matmul
// CHECK-SAME: tdx.shardings = [#tdx.sharding<@mesh, [Partial(sum)]>]
func.func @preferences(%x: tensor<6x6xf32> {tdx.sharding = #tdx.sharding<@mesh, [Shard(0)]>, tdx.sharding_priority = 0 : i64},
                       %w: tensor<6x6xf32> {tdx.sharding = #tdx.sharding<@mesh, [Shard(0)]>, tdx.sharding_priority = 0 : i64}) -> tensor<6x6xf32> {
  %y = tdx.matmul %x, %w : (tensor<6x6xf32>, tensor<6x6xf32>) -> tensor<6x6xf32>
  return %y : tensor<6x6xf32>
}

// -----

// A user's fixed placement beats a preference at the same priority: the
// matmul computes as %w's fixed Shard(1) asks (the j factor), and the
// preferred batch split of %x is gathered.
tdx.mesh @mesh shape = [2] axes = ["dp"]
// CHECK-LABEL: func.func @fixed_beats_preference
// CHECK: tdx.redistribute %{{.*}} <@mesh, [Shard(0)]> to <@mesh, [Replicate]>
// CHECK: tdx.matmul
// CHECK-SAME: tdx.shardings = [#tdx.sharding<@mesh, [Shard(1)]>]
func.func @fixed_beats_preference(%x: tensor<6x4xf32> {tdx.sharding = #tdx.sharding<@mesh, [Shard(0)]>, tdx.sharding_priority = 0 : i64},
                                  %w: tensor<4x6xf32> {tdx.sharding = #tdx.sharding<@mesh, [Shard(1)]>}) -> tensor<6x6xf32> {
  %y = tdx.matmul %x, %w : (tensor<6x4xf32>, tensor<4x6xf32>) -> tensor<6x6xf32>
  return %y : tensor<6x6xf32>
}

// -----

// A result leaves the program Shard, Replicate or Partial(sum): an amax over
// the split dim is Partial(max), reduced by a redistribute before the return
// (the runtimes add a result's boxes).
tdx.mesh @mesh shape = [2] axes = ["dp"]
// CHECK-LABEL: func.func @max_result
// CHECK: %[[M:.*]] = tdx.max %{{.*}} dims = [0] {tdx.shardings = [#tdx.sharding<@mesh, [Partial(max)]>]}
// CHECK: %[[R:.*]] = tdx.redistribute %[[M]] <@mesh, [Partial(max)]> to <@mesh, [Replicate]>
// CHECK: return %[[R]]
func.func @max_result(%x: tensor<6x3xf32> {tdx.sharding = #tdx.sharding<@mesh, [Shard(0)]>}) -> tensor<3xf32> {
  %0 = tdx.max %x dims = [0] : tensor<6x3xf32> -> tensor<3xf32>
  return %0 : tensor<3xf32>
}

// -----

// A sum stays Partial(sum) up to the return: the runtime adds the boxes.
tdx.mesh @mesh shape = [2] axes = ["dp"]
// CHECK-LABEL: func.func @sum_result
// CHECK-NOT: tdx.redistribute
// CHECK: tdx.sum %{{.*}} dims = [0] {tdx.shardings = [#tdx.sharding<@mesh, [Partial(sum)]>]}
func.func @sum_result(%x: tensor<6x3xf32> {tdx.sharding = #tdx.sharding<@mesh, [Shard(0)]>}) -> tensor<3xf32> {
  %0 = tdx.sum %x dims = [0] : tensor<6x3xf32> -> tensor<3xf32>
  return %0 : tensor<3xf32>
}
