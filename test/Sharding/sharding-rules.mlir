// The factor mapping of every op family, as tdx-propagate-sharding sees it.
// A dim lists its factors major to minor ("kl": split by a reshape), "1" when
// it has none (a broadcast dim).
// RUN: tdx-opt %s -split-input-file -verify-diagnostics --tdx-print-sharding-rules -o /dev/null

func.func @rules(%a: tensor<4x1xf32>, %b: tensor<8xf32>, %m: tensor<2x1x8x16xf32>, %n: tensor<3x16x4xf32>,
                 %x: tensor<2x8x16xf32>, %w: tensor<32x16xf32>, %bias: tensor<32xf32>, %g: tensor<16xf32>,
                 %emb: tensor<100x16xf32>, %ids: tensor<2x8xi64>, %logits: tensor<16x100xf32>, %labels: tensor<16xi64>,
                 %c: tensor<4x8xi1>, %v: tensor<16xf32>) {
  // expected-remark @+1 {{sharding rule: ([i, 1], [j]) -> ([i, j]) {i=4, j=8}}}
  %0 = tdx.add %a, %b : (tensor<4x1xf32>, tensor<8xf32>) -> tensor<4x8xf32>
  // expected-remark @+1 {{sharding rule: ([i, j], [i, 1], [j]) -> ([i, j]) {i=4, j=8}}}
  %1 = tdx.where %c, %a, %b : (tensor<4x8xi1>, tensor<4x1xf32>, tensor<8xf32>) -> tensor<4x8xf32>
  // expected-remark @+1 {{sharding rule: ([i]) -> ([i]) {i=8}}}
  %2 = tdx.exp %b : tensor<8xf32>
  // expected-remark @+1 {{sharding rule: ([i, 1, k, m], [j, m, l]) -> ([i, j, k, l]) {i=2, j=3, k=8, l=4, m=16} reduction={m} partial=sum}}
  %3 = tdx.matmul %m, %n : (tensor<2x1x8x16xf32>, tensor<3x16x4xf32>) -> tensor<2x3x8x4xf32>
  // expected-remark @+1 {{sharding rule: ([k], [i, k, j]) -> ([i, j]) {i=3, j=4, k=16} reduction={k} partial=sum}}
  %4 = tdx.matmul %v, %n : (tensor<16xf32>, tensor<3x16x4xf32>) -> tensor<3x4xf32>
  // expected-remark @+1 {{sharding rule: ([i, j, l], [k, l], [k]) -> ([i, j, k]) {i=2, j=8, k=32, l=16} reduction={l} partial=sum}}
  %5 = tdx.linear %x, %w, %bias : (tensor<2x8x16xf32>, tensor<32x16xf32>, tensor<32xf32>) -> tensor<2x8x32xf32>
  // expected-remark @+1 {{sharding rule: ([i, j, k]) -> ([i, k]) {i=2, j=8, k=16} reduction={j} partial=sum}}
  %6 = tdx.sum %x dims = [1] : tensor<2x8x16xf32> -> tensor<2x16xf32>
  // expected-remark @+1 {{sharding rule: ([i, j, k]) -> ([i, j, 1]) {i=2, j=8, k=16} reduction={k} partial=max}}
  %7 = tdx.max %x dims = [-1] keepdim : tensor<2x8x16xf32> -> tensor<2x8x1xf32>
  // expected-remark @+1 {{sharding rule: ([i, j, k]) -> ([i, k]) {i=2, j=8, k=16} replicated={j}}}
  %8 = tdx.mean %x dims = [1] : tensor<2x8x16xf32> -> tensor<2x16xf32>
  // expected-remark @+1 {{sharding rule: ([i, j, k]) -> ([i, j, k]) {i=2, j=8, k=16} replicated={k}}}
  %9 = tdx.softmax %x dim = -1 : tensor<2x8x16xf32>
  // expected-remark @+1 {{sharding rule: ([i, j, k], [k], [k]) -> ([i, j, k]) {i=2, j=8, k=16} replicated={k}}}
  %10 = tdx.layer_norm %x weight %g bias %g normalized_shape = [16] eps = 1.0e-5 : (tensor<2x8x16xf32>, tensor<16xf32>, tensor<16xf32>) -> tensor<2x8x16xf32>
  // expected-remark @+1 {{sharding rule: ([i, j, k], [k]) -> ([i, j, k]) {i=2, j=8, k=16} replicated={k}}}
  %11 = tdx.rms_norm %x weight %g normalized_shape = [16] eps = 1.0e-5 : (tensor<2x8x16xf32>, tensor<16xf32>) -> tensor<2x8x16xf32>
  // expected-remark @+1 {{sharding rule: ([i, l], [j, k]) -> ([j, k, l]) {i=100, j=2, k=8, l=16} reduction={i} partial=sum}}
  %12 = tdx.embedding %emb, %ids : (tensor<100x16xf32>, tensor<2x8xi64>) -> tensor<2x8x16xf32>
  // expected-remark @+1 {{sharding rule: ([i, j], [i]) -> ([]) {i=16, j=100} reduction={i, j} partial=sum}}
  %13 = tdx.cross_entropy %logits, %labels reduction = sum : (tensor<16x100xf32>, tensor<16xi64>) -> tensor<f32>
  // expected-remark @+1 {{sharding rule: ([i, j], [i]) -> ([i]) {i=16, j=100} reduction={j} partial=sum}}
  %14 = tdx.cross_entropy %logits, %labels reduction = none : (tensor<16x100xf32>, tensor<16xi64>) -> tensor<16xf32>
  // expected-remark @+1 {{sharding rule: ([i, j, kl]) -> ([i, j, k, l]) {i=2, j=8, k=4, l=4}}}
  %15 = tdx.reshape %x [2, 8, 4, 4] : tensor<2x8x16xf32> -> tensor<2x8x4x4xf32>
  // expected-remark @+1 {{sharding rule: ([i, j, k]) -> ([ij, k]) {i=2, j=8, k=16}}}
  %16 = tdx.reshape %x [16, 16] : tensor<2x8x16xf32> -> tensor<16x16xf32>
  // expected-remark @+1 {{sharding rule: ([i, j, k]) -> ([k, j, i]) {i=2, j=8, k=16}}}
  %17 = tdx.transpose %x 0, 2 : tensor<2x8x16xf32> -> tensor<16x8x2xf32>
  // expected-remark @+1 {{sharding rule: ([i, j, k]) -> ([k, i, j]) {i=2, j=8, k=16}}}
  %18 = tdx.permute %x [2, 0, 1] : tensor<2x8x16xf32> -> tensor<16x2x8xf32>
  // expected-remark @+1 {{sharding rule: ([i, j, k]) -> ([i, j, l]) {i=2, j=8, k=16, l=8} replicated={k, l}}}
  %19 = tdx.slice %x dim 2 [0 : 8 : 1] : tensor<2x8x16xf32> -> tensor<2x8x8xf32>
  // expected-remark @+1 {{sharding rule: ([i, k, j], [i, l, j]) -> ([i, m, j]) {i=2, j=16, k=8, l=8, m=16} replicated={k, l, m}}}
  %20 = tdx.concat %x, %x dim 1 : (tensor<2x8x16xf32>, tensor<2x8x16xf32>) -> tensor<2x16x16xf32>
  // expected-remark @+1 {{sharding rule: ([j, 1]) -> ([i, j, k]) {i=3, j=4, k=8}}}
  %21 = tdx.expand %a [3, 4, 8] : tensor<4x1xf32> -> tensor<3x4x8xf32>
  // expected-remark @+1 {{sharding rule: () -> ([i, j]) {i=4, j=4}}}
  %22 = tdx.full 0.0 : tensor<4x4xf32>
  // expected-remark @+1 {{sharding rule: ([i, j]) -> ([i, j]) {i=4, j=1}}}
  %23 = tdx.cast %a : tensor<4x1xf32> to tensor<4x1xbf16>
  // expected-remark @+1 {{sharding rule: ([i]) -> ([j]) {i=8, j=8} replicated={i, j}}}
  %24 = tdx.aten "aten::cumsum"(%b) {args = {dim = 0 : i64}} : (tensor<8xf32>) -> tensor<8xf32>
  // A random op draws any box of its global tensor.
  // expected-remark @+1 {{sharding rule: () -> ([i]) {i=4}}}
  %25 = tdx.uniform(0.0, 1.0) seed(0, 0) : tensor<4xf32>
  // expected-remark @+1 {{sharding rule: () -> ([i, j]) {i=4, j=8}}}
  %26 = tdx.bernoulli(0.9) seed(0, 1) : tensor<4x8xf32>
  return
}

// -----

// Generic aten ops: replicated, except the backward ops with a rule in
// AtenShardingRules.cpp.
func.func @aten_rules(%g: tensor<2x8x16xf32>, %x: tensor<2x8x16xf32>, %s: tensor<2x8x1xf32>,
                      %w: tensor<16xf32>, %ids: tensor<2x8xi64>, %lp: tensor<4x10xf32>,
                      %t: tensor<4xi64>, %one: tensor<f32>) {
  // expected-remark @+1 {{sharding rule: ([i, j, k], [i, j, k]) -> ([i, j, k]) {i=2, j=8, k=16}}}
  %0 = tdx.aten "aten::hardswish_backward"(%g, %x) : (tensor<2x8x16xf32>, tensor<2x8x16xf32>) -> tensor<2x8x16xf32>
  // expected-remark @+1 {{sharding rule: ([i, j, k], [i, j, k]) -> ([i, j, k]) {i=2, j=8, k=16} replicated={k}}}
  %1 = tdx.aten "aten::_softmax_backward_data"(%g, %x) {args = {dim = -1 : i64, input_dtype = 6 : i64}} : (tensor<2x8x16xf32>, tensor<2x8x16xf32>) -> tensor<2x8x16xf32>
  // expected-remark @+1 {{sharding rule: ([i, j, k], [i, j, k], [i, j, 1], [i, j, 1], [k], [k]) -> ([i, j, k], [k], [k]) {i=2, j=8, k=16} reduction={i, j} partial=sum replicated={k}}}
  %2:3 = tdx.aten "aten::native_layer_norm_backward"(%g, %x, %s, %s, %w, %w) {args = {normalized_shape = array<i64: 16>, output_mask = [true, true, true]}} : (tensor<2x8x16xf32>, tensor<2x8x16xf32>, tensor<2x8x1xf32>, tensor<2x8x1xf32>, tensor<16xf32>, tensor<16xf32>) -> (tensor<2x8x16xf32>, tensor<16xf32>, tensor<16xf32>)
  // expected-remark @+1 {{sharding rule: ([i, j, k], [i, j]) -> ([l, k]) {i=2, j=8, k=16, l=100} reduction={i, j} partial=sum replicated={l}}}
  %3 = tdx.aten "aten::embedding_dense_backward"(%g, %ids) {args = {num_weights = 100 : i64, padding_idx = -1 : i64, scale_grad_by_freq = false}} : (tensor<2x8x16xf32>, tensor<2x8xi64>) -> tensor<100x16xf32>
  // Frequencies count over every index: replicated.
  // expected-remark @+1 {{sharding rule: ([i, j, k], [l, m]) -> ([n, o]) {i=2, j=8, k=16, l=2, m=8, n=100, o=16} replicated={i, j, k, l, m, n, o}}}
  %4 = tdx.aten "aten::embedding_dense_backward"(%g, %ids) {args = {num_weights = 100 : i64, padding_idx = -1 : i64, scale_grad_by_freq = true}} : (tensor<2x8x16xf32>, tensor<2x8xi64>) -> tensor<100x16xf32>
  // expected-remark @+1 {{sharding rule: ([], [i, j], [i], []) -> ([i, j]) {i=4, j=10} replicated={j}}}
  %5 = tdx.aten "aten::nll_loss_backward"(%one, %lp, %t, %one) {args = {weight = unit, reduction = 1 : i64, ignore_index = -100 : i64}} : (tensor<f32>, tensor<4x10xf32>, tensor<4xi64>, tensor<f32>) -> tensor<4x10xf32>
  // The sliced dim is replicated; the others split alike.
  // expected-remark @+1 {{sharding rule: ([i, j, k]) -> ([i, j, l]) {i=2, j=8, k=16, l=32} replicated={k, l}}}
  %6 = tdx.aten "aten::slice_backward"(%g) {args = {dim = -1 : i64, input_sizes = array<i64: 2, 8, 32>, start = 1 : i64, end = 9223372036854775807 : i64, step = 2 : i64}} : (tensor<2x8x16xf32>) -> tensor<2x8x32xf32>
  return
}

// -----

// torch's grouped GEMM (a Mixture of Experts' experts): the dim offs groups
// and the groups stay whole, the rest splits as a matmul's.
func.func @grouped_mm(%x: tensor<64x32xf32>, %w: tensor<4x32x16xf32>, %offs: tensor<4xi32>,
                      %t: tensor<32x64xf32>, %g: tensor<64x16xf32>, %a: tensor<4x8x32xf32>,
                      %bias: tensor<4x16xf32>) {
  // expected-remark @+1 {{sharding rule: ([i, j], [k, j, l], [k]) -> ([i, l]) {i=64, j=32, k=4, l=16} reduction={j} partial=sum replicated={i, k}}}
  %0 = tdx.aten "aten::_grouped_mm"(%x, %w, %offs) {args = {bias, out_dtype}} : (tensor<64x32xf32>, tensor<4x32x16xf32>, tensor<4xi32>) -> tensor<64x16xf32>
  // The weights' gradient, grouped over the contracted dim.
  // expected-remark @+1 {{sharding rule: ([i, j], [j, k], [l]) -> ([l, i, k]) {i=32, j=64, k=16, l=4} replicated={j, l}}}
  %1 = tdx.aten "aten::_grouped_mm"(%t, %g, %offs) {args = {bias, out_dtype}} : (tensor<32x64xf32>, tensor<64x16xf32>, tensor<4xi32>) -> tensor<4x32x16xf32>
  // Without offs: a batched matmul.
  // expected-remark @+1 {{sharding rule: ([i, j, k], [i, k, l]) -> ([i, j, l]) {i=4, j=8, k=32, l=16} reduction={k} partial=sum}}
  %2 = tdx.aten "aten::_grouped_mm"(%a, %w) {args = {offs, bias, out_dtype}} : (tensor<4x8x32xf32>, tensor<4x32x16xf32>) -> tensor<4x8x16xf32>
  // With a bias: replicated.
  // expected-remark @+1 {{sharding rule: ([i, j], [k, l, m], [n], [o, p]) -> ([q, r]) {i=64, j=32, k=4, l=32, m=16, n=4, o=4, p=16, q=64, r=16} replicated={i, j, k, l, m, n, o, p, q, r}}}
  %3 = tdx.aten "aten::_grouped_mm"(%x, %w, %offs, %bias) {args = {out_dtype}} : (tensor<64x32xf32>, tensor<4x32x16xf32>, tensor<4xi32>, tensor<4x16xf32>) -> tensor<64x16xf32>
  return
}

// -----

// index_copy (a generation step writing its key/value cache at its
// position): the written dim and the index stay whole, the rest splits.
func.func @index_copy(%cache: tensor<4x2x40x8xf32>, %pos: tensor<6xi64>, %new: tensor<4x2x6x8xf32>) {
  // expected-remark @+1 {{sharding rule: ([j, k, l, m], [i], [j, k, i, m]) -> ([j, k, l, m]) {i=6, j=4, k=2, l=40, m=8} replicated={i, l}}}
  %0 = tdx.aten "aten::index_copy"(%cache, %pos, %new) {args = {dim = 2 : i64}} : (tensor<4x2x40x8xf32>, tensor<6xi64>, tensor<4x2x6x8xf32>) -> tensor<4x2x40x8xf32>
  return
}

// -----

// Creation ops: a filled tensor may be made split (each rank its box); a
// range is made whole (a split one would need each rank's own start).
func.func @creation() {
  // expected-remark @+1 {{sharding rule: () -> ([i, j]) {i=4, j=8}}}
  %0 = tdx.full 0.0 : tensor<4x8xf32>
  // expected-remark @+1 {{sharding rule: () -> ([i]) {i=8} replicated={i}}}
  %1 = tdx.arange start 0.0 end 8.0 step 1.0 : tensor<8xi64>
  return
}

// -----

// Conv nets' generic ops: the batch splits (a weight's gradient sums it:
// Partial); channels and the spatial dims, whose windows cross a split,
// stay whole. Group norm normalizes each sample on its own.
func.func @conv_net_rules(%dy: tensor<2x8x4x4xf32>, %x: tensor<2x3x8x8xf32>, %w: tensor<8x3x3x3xf32>,
                          %p: tensor<2x8x8x8xf32>, %pi: tensor<2x8x4x4xi64>, %c: tensor<8xf32>,
                          %stats: tensor<2x4xf32>) {
  // expected-remark @+1 {{sharding rule: ([i, m, n, o], [i, j, k, l], [p, q, r, s]) -> ([i, j, k, l], [t, u, v, w], [x]) {i=2, j=3, k=8, l=8, m=8, n=4, o=4, p=8, q=3, r=3, s=3, t=8, u=3, v=3, w=3, x=8} reduction={i} partial=sum replicated={j, k, l, m, n, o, p, q, r, s, t, u, v, w, x}}}
  %0:3 = tdx.aten "aten::convolution_backward"(%dy, %x, %w) {args = {bias_sizes = array<i64: 8>, dilation = array<i64: 1, 1>, groups = 1 : i64, output_mask = [true, true, true], output_padding = array<i64: 0, 0>, padding = array<i64: 1, 1>, stride = array<i64: 2, 2>, transposed = false}} : (tensor<2x8x4x4xf32>, tensor<2x3x8x8xf32>, tensor<8x3x3x3xf32>) -> (tensor<2x3x8x8xf32>, tensor<8x3x3x3xf32>, tensor<8xf32>)
  // expected-remark @+1 {{sharding rule: ([i, j, k, l]) -> ([i, j, m, n], [i, j, o, p]) {i=2, j=8, k=8, l=8, m=4, n=4, o=4, p=4} replicated={k, l, m, n, o, p}}}
  %1:2 = tdx.aten "aten::max_pool2d_with_indices"(%p) {args = {ceil_mode = false, dilation = array<i64: 1, 1>, kernel_size = array<i64: 3, 3>, padding = array<i64: 1, 1>, stride = array<i64: 2, 2>}} : (tensor<2x8x8x8xf32>) -> (tensor<2x8x4x4xf32>, tensor<2x8x4x4xi64>)
  // expected-remark @+1 {{sharding rule: ([i, j, k, l], [i, j, m, n], [i, j, o, p]) -> ([i, j, q, r]) {i=2, j=8, k=4, l=4, m=8, n=8, o=4, p=4, q=8, r=8} replicated={k, l, m, n, o, p, q, r}}}
  %2 = tdx.aten "aten::max_pool2d_with_indices_backward"(%dy, %p, %pi) {args = {ceil_mode = false, dilation = array<i64: 1, 1>, kernel_size = array<i64: 3, 3>, padding = array<i64: 1, 1>, stride = array<i64: 2, 2>}} : (tensor<2x8x4x4xf32>, tensor<2x8x8x8xf32>, tensor<2x8x4x4xi64>) -> tensor<2x8x8x8xf32>
  // expected-remark @+1 {{sharding rule: ([i, j, k, l], [m], [n]) -> ([i, o, p, q], [i, r], [i, s]) {i=2, j=8, k=8, l=8, m=8, n=8, o=8, p=8, q=8, r=4, s=4} replicated={j, k, l, m, n, o, p, q, r, s}}}
  %3:3 = tdx.aten "aten::native_group_norm"(%p, %c, %c) {args = {N = 2 : i64, C = 8 : i64, HxW = 64 : i64, group = 4 : i64, eps = 1.000000e-05 : f64}} : (tensor<2x8x8x8xf32>, tensor<8xf32>, tensor<8xf32>) -> (tensor<2x8x8x8xf32>, tensor<2x4xf32>, tensor<2x4xf32>)
  // expected-remark @+1 {{sharding rule: ([i, j, k, l], [i, m, n, o], [i, p], [i, q], [r]) -> ([i, s, t, u], [v], [w]) {i=2, j=8, k=8, l=8, m=8, n=8, o=8, p=4, q=4, r=8, s=8, t=8, u=8, v=8, w=8} reduction={i} partial=sum replicated={j, k, l, m, n, o, p, q, r, s, t, u, v, w}}}
  %4:3 = tdx.aten "aten::native_group_norm_backward"(%p, %p, %stats, %stats, %c) {args = {N = 2 : i64, C = 8 : i64, HxW = 64 : i64, group = 4 : i64, output_mask = [true, true, true]}} : (tensor<2x8x8x8xf32>, tensor<2x8x8x8xf32>, tensor<2x4xf32>, tensor<2x4xf32>, tensor<8xf32>) -> (tensor<2x8x8x8xf32>, tensor<8xf32>, tensor<8xf32>)
  return
}
