// RUN: tdx-opt %s | tdx-opt | FileCheck %s
// RUN: tdx-opt %s --tdx-print-sharding-rules -o /dev/null 2>&1 | FileCheck %s --check-prefix=RULE

// CHECK-LABEL: func.func @conv_and_pools
func.func @conv_and_pools(%x: tensor<2x4x9x9xf32>, %w: tensor<6x4x3x3xf32>, %b: tensor<6xf32>, %dw: tensor<4x1x3x3xf32>, %x1: tensor<2x4x12xf32>, %w1: tensor<6x2x3xf32>) {
  // A convolution: batch and output channels parallel, input channels a
  // reduction (partial sums), spatial dims replicated.
  // CHECK: tdx.conv %{{.*}}, %{{.*}}, %{{.*}} stride = [2, 2] padding = [1, 1] dilation = [1, 1] groups = 1 : (tensor<2x4x9x9xf32>, tensor<6x4x3x3xf32>, tensor<6xf32>) -> tensor<2x6x5x5xf32>
  // RULE: sharding rule: ([i, k, l, o], [j, k, m, p], [j]) -> ([i, j, n, q]) {i=2, j=6, k=4, l=9, m=3, n=5, o=9, p=3, q=5} reduction={k} partial=sum replicated={l, m, n, o, p, q}
  %0 = tdx.conv %x, %w, %b stride = [2, 2] padding = [1, 1] dilation = [1, 1] groups = 1 : (tensor<2x4x9x9xf32>, tensor<6x4x3x3xf32>, tensor<6xf32>) -> tensor<2x6x5x5xf32>
  // Depthwise: the channels shard like an elementwise op.
  // CHECK: groups = 4
  // RULE: sharding rule: ([i, j, k, n], [j, 1, l, o]) -> ([i, j, m, p]) {i=2, j=4, k=9, l=3, m=9, n=9, o=3, p=9} replicated={k, l, m, n, o, p}
  // A grouped convolution keeps its channels replicated.
  // RULE: sharding rule: ([i, k, m], [j, l, n]) -> ([i, j, o]) {i=2, j=6, k=4, l=2, m=12, n=3, o=8} replicated={j, k, l, m, n, o}
  %1 = tdx.conv %x, %dw stride = [1, 1] padding = [1, 1] dilation = [1, 1] groups = 4 : (tensor<2x4x9x9xf32>, tensor<4x1x3x3xf32>) -> tensor<2x4x9x9xf32>
  // 1-D, grouped, dilated.
  // CHECK: tdx.conv %{{.*}}, %{{.*}} stride = [1] padding = [0] dilation = [2] groups = 2 : (tensor<2x4x12xf32>, tensor<6x2x3xf32>) -> tensor<2x6x8xf32>
  %2 = tdx.conv %x1, %w1 stride = [1] padding = [0] dilation = [2] groups = 2 : (tensor<2x4x12xf32>, tensor<6x2x3xf32>) -> tensor<2x6x8xf32>
  // CHECK: tdx.max_pool %{{.*}} kernel = [3, 3] stride = [2, 2] padding = [1, 1] dilation = [1, 1] ceil_mode : tensor<2x4x9x9xf32> -> tensor<2x4x5x5xf32>
  // RULE: sharding rule: ([i, j, k, m]) -> ([i, j, l, n]) {i=2, j=4, k=9, l=5, m=9, n=5} replicated={k, l, m, n}
  %3 = tdx.max_pool %x kernel = [3, 3] stride = [2, 2] padding = [1, 1] dilation = [1, 1] ceil_mode : tensor<2x4x9x9xf32> -> tensor<2x4x5x5xf32>
  // CHECK: tdx.avg_pool %{{.*}} kernel = [2, 2] stride = [2, 2] padding = [0, 0] dilation = [1, 1] ceil_mode count_include_pad : tensor<2x4x9x9xf32> -> tensor<2x4x5x5xf32>
  %4 = tdx.avg_pool %x kernel = [2, 2] stride = [2, 2] padding = [0, 0] dilation = [1, 1] ceil_mode count_include_pad : tensor<2x4x9x9xf32> -> tensor<2x4x5x5xf32>
  return
}
