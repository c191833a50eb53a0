// RUN: tdx-opt %s --tdx-propagate-sharding | FileCheck %s --check-prefix=MEM
// RUN: tdx-opt %s --tdx-propagate-sharding=memory=0 | FileCheck %s --check-prefix=NOMEM
// RUN: tdx-opt %s --tdx-propagate-sharding="explain memory=1e-10" -o /dev/null 2>&1 | FileCheck %s --check-prefix=EXPLAIN
// RUN: not tdx-opt %s --tdx-propagate-sharding=memory=-1 -o /dev/null 2>&1 | FileCheck %s --check-prefix=BAD

// The memory term of the cost model: the bytes each rank holds of an op's
// results. x wants the matmul's reduction factor split over "tp" and w its
// columns. Moving the operands costs about the same either way, but the
// reduction leaves the 64 MiB product Partial, held whole by both ranks,
// while splitting the columns holds half of it on each. Without the memory
// term the reduction wins by a hair; with it, the columns.

tdx.mesh @mesh shape = [2] axes = ["tp"]
// MEM-LABEL: func.func @contested
// NOMEM-LABEL: func.func @contested
func.func @contested(%x: tensor<4096x64xf32>, %w: tensor<64x4096xf32>) -> tensor<4096x4096xf32> {
  %xs = tdx.annotate %x <@mesh, [Shard(1)]> : tensor<4096x64xf32>
  %x2 = tdx.exp %xs : tensor<4096x64xf32>
  %ws = tdx.annotate %w <@mesh, [Shard(1)]> : tensor<64x4096xf32>
  %w2 = tdx.exp %ws : tensor<64x4096xf32>
  // MEM: tdx.matmul {{.*}}tdx.shardings = [#tdx.sharding<@mesh, [Shard(1)]>]
  // NOMEM: tdx.matmul {{.*}}tdx.shardings = [#tdx.sharding<@mesh, [Partial(sum)]>]
  // EXPLAIN: remark: tdx-propagate-sharding: on mesh axis "tp" chose factor #1 (size 4096, parallel) by cost among factor #2 (size 64, reduction)
  %y = tdx.matmul %x2, %w2 : (tensor<4096x64xf32>, tensor<64x4096xf32>) -> tensor<4096x4096xf32>
  return %y : tensor<4096x4096xf32>
}

// BAD: error: the 'memory' option must be non-negative, got -1
