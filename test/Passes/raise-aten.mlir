// RUN: tdx-opt %s -split-input-file --tdx-raise-aten | FileCheck %s
// RUN: tdx-opt %s -split-input-file --tdx-raise-aten=report -verify-diagnostics -o /dev/null

// Rows of the elementwise table: unary ops, binary ops with a Scalar,
// alpha and type promotion made explicit.
// CHECK-LABEL: func.func @elementwise
func.func @elementwise(%x: tensor<4x8xf32>, %y: tensor<8xf32>, %i: tensor<4x8xi64>) -> (tensor<4x8xf32>, tensor<4x8xf32>, tensor<4x8xf32>, tensor<4x8xf32>) {
  // CHECK: %[[E:.*]] = tdx.exp %{{.*}} : tensor<4x8xf32>
  %0 = tdx.aten "aten::exp"(%x) : (tensor<4x8xf32>) -> tensor<4x8xf32>
  // CHECK: %[[A:.*]] = tdx.full 2.0{{.*}} : tensor<f32>
  // CHECK: %[[M:.*]] = tdx.mul %{{.*}}, %[[A]] : (tensor<8xf32>, tensor<f32>) -> tensor<8xf32>
  // CHECK: tdx.add %[[E]], %[[M]] : (tensor<4x8xf32>, tensor<8xf32>) -> tensor<4x8xf32>
  %1 = tdx.aten "aten::add.Tensor"(%0, %y) {args = {alpha = 2 : i64}} : (tensor<4x8xf32>, tensor<8xf32>) -> tensor<4x8xf32>
  // CHECK: %[[C:.*]] = tdx.cast %{{.*}} : tensor<4x8xi64> to tensor<4x8xf32>
  // CHECK: tdx.div %[[C]], %{{.*}} : (tensor<4x8xf32>, tensor<f32>) -> tensor<4x8xf32>
  %2 = tdx.aten "aten::div.Scalar"(%i) {args = {other = 3.0 : f64}} : (tensor<4x8xi64>) -> tensor<4x8xf32>
  // CHECK: tdx.hardswish %{{.*}} : tensor<4x8xf32>
  %3 = tdx.aten "aten::hardswish"(%x) : (tensor<4x8xf32>) -> tensor<4x8xf32>
  return %1, %2, %3, %0 : tensor<4x8xf32>, tensor<4x8xf32>, tensor<4x8xf32>, tensor<4x8xf32>
}

// -----

// What the table does not cover stays generic, and nothing a declining row
// built is left behind.
// CHECK-LABEL: func.func @declined
func.func @declined(%x: tensor<4x8xf32>, %y: tensor<4x8xf32>) -> (tensor<4x8xf32>, tensor<4x8xf32>) {
  // CHECK-NOT: tdx.div %
  // CHECK: tdx.aten "aten::div.Tensor_mode"
  // expected-remark @+1 {{aten::div.Tensor_mode stays generic (runs through ATen on the CPU backend)}}
  %0 = tdx.aten "aten::div.Tensor_mode"(%x, %y) {args = {rounding_mode = "floor"}} : (tensor<4x8xf32>, tensor<4x8xf32>) -> tensor<4x8xf32>
  // CHECK: tdx.aten "aten::erfinv"
  // expected-remark @+1 {{aten::erfinv stays generic}}
  %1 = tdx.aten "aten::erfinv"(%x) : (tensor<4x8xf32>) -> tensor<4x8xf32>
  return %0, %1 : tensor<4x8xf32>, tensor<4x8xf32>
}

// -----

// torch.matmul of a vector (F.linear of one) stays generic; of matrices it
// is tdx.matmul.
// CHECK-LABEL: func.func @matmul_of_a_vector
func.func @matmul_of_a_vector(%v: tensor<3xf32>, %x: tensor<2x3xf32>, %w: tensor<3x4xf32>) -> (tensor<4xf32>, tensor<2x4xf32>) {
  // CHECK: tdx.aten "aten::matmul"(%{{.*}}) : (tensor<3xf32>, tensor<3x4xf32>) -> tensor<4xf32>
  // expected-remark @+1 {{aten::matmul stays generic}}
  %0 = tdx.aten "aten::matmul"(%v, %w) : (tensor<3xf32>, tensor<3x4xf32>) -> tensor<4xf32>
  // CHECK: tdx.matmul
  %1 = tdx.aten "aten::matmul"(%x, %w) : (tensor<2x3xf32>, tensor<3x4xf32>) -> tensor<2x4xf32>
  return %0, %1 : tensor<4xf32>, tensor<2x4xf32>
}

// -----

// Convolution, pooling, eval-mode batch norm and adaptive pooling to 1x1.
// CHECK-LABEL: func.func @vision
func.func @vision(%x: tensor<2x3x8x8xf32>, %w: tensor<4x3x3x3xf32>, %m: tensor<4xf32>, %v: tensor<4xf32>) -> tensor<2x4x1x1xf32> {
  // CHECK: %[[C:.*]] = tdx.conv %{{.*}}, %{{.*}} stride = [2, 2] padding = [1, 1] dilation = [1, 1] groups = 1 : (tensor<2x3x8x8xf32>, tensor<4x3x3x3xf32>) -> tensor<2x4x4x4xf32>
  %0 = tdx.aten "aten::convolution"(%x, %w) {args = {bias, stride = array<i64: 2, 2>, padding = array<i64: 1, 1>, dilation = array<i64: 1, 1>, transposed = false, output_padding = array<i64: 0, 0>, groups = 1 : i64}} : (tensor<2x3x8x8xf32>, tensor<4x3x3x3xf32>) -> tensor<2x4x4x4xf32>
  // batch norm without weight and bias: alpha = rsqrt(var + eps), beta = 0 - mean * alpha.
  // CHECK: %[[R:.*]] = tdx.rsqrt
  // CHECK: tdx.reshape %{{.*}} [4, 1, 1]
  // CHECK: %[[BN:.*]] = tdx.add %{{.*}}, %{{.*}} : (tensor<2x4x4x4xf32>, tensor<4x1x1xf32>) -> tensor<2x4x4x4xf32>
  %1:3 = tdx.aten "aten::native_batch_norm"(%0, %m, %v) {args = {weight, bias, training = false, momentum = 0.1 : f64, eps = 1.0e-05 : f64}} : (tensor<2x4x4x4xf32>, tensor<4xf32>, tensor<4xf32>) -> (tensor<2x4x4x4xf32>, tensor<0xf32>, tensor<0xf32>)
  // CHECK: %[[P:.*]] = tdx.max_pool %[[BN]] kernel = [3, 3] stride = [2, 2] padding = [1, 1] dilation = [1, 1] : tensor<2x4x4x4xf32> -> tensor<2x4x2x2xf32>
  %2:2 = tdx.aten "aten::max_pool2d_with_indices"(%1#0) {args = {kernel_size = array<i64: 3, 3>, stride = array<i64: 2, 2>, padding = array<i64: 1, 1>, dilation = array<i64: 1, 1>, ceil_mode = false}} : (tensor<2x4x4x4xf32>) -> (tensor<2x4x2x2xf32>, tensor<2x4x2x2xi64>)
  // CHECK: tdx.mean %[[P]] dims = [-2, -1] keepdim
  %3 = tdx.aten "aten::adaptive_avg_pool2d"(%2#0) {args = {output_size = array<i64: 1, 1>}} : (tensor<2x4x2x2xf32>) -> tensor<2x4x1x1xf32>
  return %3 : tensor<2x4x1x1xf32>
}

// -----

// A used second result (the pooling indices) and training-mode batch norm
// keep the generic op.
// CHECK-LABEL: func.func @needs_all_results
func.func @needs_all_results(%x: tensor<2x4x4x4xf32>) -> (tensor<2x4x2x2xf32>, tensor<2x4x2x2xi64>, tensor<2x4x4x4xf32>) {
  // CHECK: tdx.aten "aten::max_pool2d_with_indices"
  // expected-remark @+1 {{stays generic}}
  %0:2 = tdx.aten "aten::max_pool2d_with_indices"(%x) {args = {kernel_size = array<i64: 2, 2>, stride = array<i64>, padding = array<i64: 0, 0>, dilation = array<i64: 1, 1>, ceil_mode = false}} : (tensor<2x4x4x4xf32>) -> (tensor<2x4x2x2xf32>, tensor<2x4x2x2xi64>)
  // CHECK: tdx.aten "aten::native_batch_norm"
  // expected-remark @+1 {{stays generic}}
  %1:3 = tdx.aten "aten::native_batch_norm"(%x) {args = {weight, bias, running_mean, running_var, training = true, momentum = 0.1 : f64, eps = 1.0e-05 : f64}} : (tensor<2x4x4x4xf32>) -> (tensor<2x4x4x4xf32>, tensor<4xf32>, tensor<4xf32>)
  return %0#0, %0#1, %1#0 : tensor<2x4x2x2xf32>, tensor<2x4x2x2xi64>, tensor<2x4x4x4xf32>
}

// -----

// Tensor lists (cat, stack) and decompositions (clamp, triu).
// CHECK-LABEL: func.func @lists_and_decompositions
func.func @lists_and_decompositions(%x: tensor<4x4xf32>, %y: tensor<4x4xf32>) -> (tensor<8x4xf32>, tensor<4x2x4xf32>, tensor<4x4xf32>, tensor<4x4xf32>) {
  // CHECK: tdx.concat %{{.*}}, %{{.*}} dim 0
  %0 = tdx.aten "aten::cat"(%x, %y) {args = {tensors = [0 : index, 1 : index], dim = 0 : i64}} : (tensor<4x4xf32>, tensor<4x4xf32>) -> tensor<8x4xf32>
  // CHECK: tdx.reshape %{{.*}} [4, 1, 4]
  // CHECK: tdx.concat %{{.*}}, %{{.*}} dim 1
  %1 = tdx.aten "aten::stack"(%x, %y) {args = {tensors = [0 : index, 1 : index], dim = 1 : i64}} : (tensor<4x4xf32>, tensor<4x4xf32>) -> tensor<4x2x4xf32>
  // CHECK: tdx.maximum
  // CHECK: tdx.minimum
  %2 = tdx.aten "aten::clamp"(%x) {args = {min = -1.0 : f64, max = 1.0 : f64}} : (tensor<4x4xf32>) -> tensor<4x4xf32>
  // CHECK: tdx.cmp ge
  // CHECK: tdx.where
  %3 = tdx.aten "aten::triu"(%x) {args = {diagonal = 1 : i64}} : (tensor<4x4xf32>) -> tensor<4x4xf32>
  return %0, %1, %2, %3 : tensor<8x4xf32>, tensor<4x2x4xf32>, tensor<4x4xf32>, tensor<4x4xf32>
}

// -----

// Swin's shifted windows and relative position bias: roll, constant
// padding, writes through slices and selects, and a gather by index.
// CHECK-LABEL: func.func @windows
func.func @windows(%x: tensor<4x6xf32>, %s: tensor<4x2xf32>, %r: tensor<6xf32>, %t: tensor<10x3xf32>, %i: tensor<5xi64>) -> (tensor<4x6xf32>, tensor<5x9xf32>, tensor<4x6xf32>, tensor<4x6xf32>, tensor<5x3xf32>) {
  // roll by 2 on dim 1: the last two columns, then the first four.
  // CHECK: %[[A:.*]] = tdx.slice %{{.*}} dim 1 [4 : 6 : 1]
  // CHECK: %[[B:.*]] = tdx.slice %{{.*}} dim 1 [0 : 4 : 1]
  // CHECK: tdx.concat %[[A]], %[[B]] dim 1
  %0 = tdx.aten "aten::roll"(%x) {args = {shifts = array<i64: -4>, dims = array<i64: 1>}} : (tensor<4x6xf32>) -> tensor<4x6xf32>
  // pad = [left 1, right 2] on dim 1, [top 0, bottom 1] on dim 0, with -1.
  // CHECK: tdx.full -1.0{{.*}} : tensor<4x1xf32>
  // CHECK: tdx.full -1.0{{.*}} : tensor<4x2xf32>
  // CHECK: tdx.concat %{{.*}}, %{{.*}}, %{{.*}} dim 1 : (tensor<4x1xf32>, tensor<4x6xf32>, tensor<4x2xf32>) -> tensor<4x9xf32>
  // CHECK: tdx.concat %{{.*}}, %{{.*}} dim 0 : (tensor<4x9xf32>, tensor<1x9xf32>) -> tensor<5x9xf32>
  %1 = tdx.aten "aten::constant_pad_nd"(%x) {args = {pad = array<i64: 1, 2, 0, 1>, value = -1.0 : f64}} : (tensor<4x6xf32>) -> tensor<5x9xf32>
  // CHECK: tdx.concat %{{.*}}, %{{.*}}, %{{.*}} dim 1 : (tensor<4x1xf32>, tensor<4x2xf32>, tensor<4x3xf32>) -> tensor<4x6xf32>
  %2 = tdx.aten "aten::slice_scatter"(%x, %s) {args = {dim = 1 : i64, start = 1 : i64, end = 3 : i64, step = 1 : i64}} : (tensor<4x6xf32>, tensor<4x2xf32>) -> tensor<4x6xf32>
  // CHECK: tdx.reshape %{{.*}} [1, 6]
  // CHECK: tdx.concat %{{.*}}, %{{.*}} dim 0 : (tensor<3x6xf32>, tensor<1x6xf32>) -> tensor<4x6xf32>
  %3 = tdx.aten "aten::select_scatter"(%x, %r) {args = {dim = 0 : i64, index = -1 : i64}} : (tensor<4x6xf32>, tensor<6xf32>) -> tensor<4x6xf32>
  // Indexing counts negative indices from the end (i + 10), a lookup does not.
  // CHECK: %[[NEG:.*]] = tdx.cmp lt, %{{.*}}, %{{.*}} : (tensor<5xi64>, tensor<i64>) -> tensor<5xi1>
  // CHECK: %[[TEN:.*]] = tdx.full 1.000000e+01 : tensor<i64>
  // CHECK: %[[UP:.*]] = tdx.add %{{.*}}, %[[TEN]]
  // CHECK: %[[IDS:.*]] = tdx.where %[[NEG]], %[[UP]], %{{.*}}
  // CHECK: tdx.embedding %{{.*}}, %[[IDS]] : (tensor<10x3xf32>, tensor<5xi64>) -> tensor<5x3xf32>
  %4 = tdx.aten "aten::index.Tensor"(%t, %i) {args = {indices = [1 : index]}} : (tensor<10x3xf32>, tensor<5xi64>) -> tensor<5x3xf32>
  return %0, %1, %2, %3, %4 : tensor<4x6xf32>, tensor<5x9xf32>, tensor<4x6xf32>, tensor<4x6xf32>, tensor<5x3xf32>
}

// -----

// as_strided in row-major order is a reshape (strides of size-1 dims do not
// matter); any other stride stays generic.
// CHECK-LABEL: func.func @strided
func.func @strided(%x: tensor<2x32x1x1xf32>) -> (tensor<2x32x1x1xf32>, tensor<64xf32>, tensor<2x32x1x1xf32>) {
  %0 = tdx.aten "aten::as_strided"(%x) {args = {size = array<i64: 2, 32, 1, 1>, stride = array<i64: 32, 1, 32, 32>, storage_offset}} : (tensor<2x32x1x1xf32>) -> tensor<2x32x1x1xf32>
  // CHECK: %[[R:.*]] = tdx.reshape %{{.*}} [64]
  %1 = tdx.aten "aten::as_strided"(%x) {args = {size = array<i64: 64>, stride = array<i64: 1>, storage_offset = 0 : i64}} : (tensor<2x32x1x1xf32>) -> tensor<64xf32>
  // CHECK: %[[G:.*]] = tdx.aten "aten::as_strided"
  // expected-remark @+1 {{stays generic}}
  %2 = tdx.aten "aten::as_strided"(%x) {args = {size = array<i64: 2, 32, 1, 1>, stride = array<i64: 1, 2, 1, 1>, storage_offset}} : (tensor<2x32x1x1xf32>) -> tensor<2x32x1x1xf32>
  // CHECK: return %arg0, %[[R]], %[[G]]
  return %0, %1, %2 : tensor<2x32x1x1xf32>, tensor<64xf32>, tensor<2x32x1x1xf32>
}

// -----

// as_strided_scatter writing every element in row-major order (a flattened
// view's backward) is its source reshaped; a partial write stays generic.
// CHECK-LABEL: func.func @strided_scatter
func.func @strided_scatter(%base: tensor<256xf32>, %src: tensor<8x32xf32>, %part: tensor<4x32xf32>) -> (tensor<256xf32>, tensor<256xf32>) {
  // CHECK: %[[R:.*]] = tdx.reshape %arg1 [256]
  %0 = tdx.aten "aten::as_strided_scatter"(%base, %src) {args = {size = array<i64: 8, 32>, stride = array<i64: 32, 1>, storage_offset = 0 : i64}} : (tensor<256xf32>, tensor<8x32xf32>) -> tensor<256xf32>
  // CHECK: %[[G:.*]] = tdx.aten "aten::as_strided_scatter"
  // expected-remark @+1 {{stays generic}}
  %1 = tdx.aten "aten::as_strided_scatter"(%base, %part) {args = {size = array<i64: 4, 32>, stride = array<i64: 32, 1>, storage_offset = 0 : i64}} : (tensor<256xf32>, tensor<4x32xf32>) -> tensor<256xf32>
  // CHECK: return %[[R]], %[[G]]
  return %0, %1 : tensor<256xf32>, tensor<256xf32>
}

// -----

// A view that narrows one dim of a contiguous base (autograd's replay of a
// split, as the backward of MLA's key split and concat writes it) is a
// slice, and writing it is the rest of the base around the source; a box
// narrowed in two dims, or out of the base, stays generic.
// CHECK-LABEL: func.func @narrowed
func.func @narrowed(%g: tensor<2x4x16x16xf32>, %src: tensor<2x4x16x8xf32>) -> (tensor<2x4x16x8xf32>, tensor<2x4x16x16xf32>, tensor<2x4x8x8xf32>) {
  // CHECK: %[[S:.*]] = tdx.slice %arg0 dim 3 [8 : 16 : 1]
  %0 = tdx.aten "aten::as_strided"(%g) {args = {size = array<i64: 2, 4, 16, 8>, stride = array<i64: 1024, 256, 16, 1>, storage_offset = 8 : i64}} : (tensor<2x4x16x16xf32>) -> tensor<2x4x16x8xf32>
  // CHECK: %[[HEAD:.*]] = tdx.slice %arg0 dim 3 [0 : 8 : 1]
  // CHECK: %[[W:.*]] = tdx.concat %[[HEAD]], %arg1 dim 3
  %1 = tdx.aten "aten::as_strided_scatter"(%g, %src) {args = {size = array<i64: 2, 4, 16, 8>, stride = array<i64: 1024, 256, 16, 1>, storage_offset = 8 : i64}} : (tensor<2x4x16x16xf32>, tensor<2x4x16x8xf32>) -> tensor<2x4x16x16xf32>
  // CHECK: %[[G:.*]] = tdx.aten "aten::as_strided"
  // expected-remark @+1 {{stays generic}}
  %2 = tdx.aten "aten::as_strided"(%g) {args = {size = array<i64: 2, 4, 8, 8>, stride = array<i64: 1024, 256, 16, 1>, storage_offset = 8 : i64}} : (tensor<2x4x16x16xf32>) -> tensor<2x4x8x8xf32>
  // CHECK: return %[[S]], %[[W]], %[[G]]
  return %0, %1, %2 : tensor<2x4x16x8xf32>, tensor<2x4x16x16xf32>, tensor<2x4x8x8xf32>
}

// -----

// A view of an empty base (no element to narrow) stays as it is.
// CHECK-LABEL: func.func @narrowed_empty
func.func @narrowed_empty(%g: tensor<0x4xf32>) -> tensor<0x2xf32> {
  // CHECK: tdx.aten "aten::as_strided"
  // expected-remark @+1 {{stays generic}}
  %0 = tdx.aten "aten::as_strided"(%g) {args = {size = array<i64: 0, 2>, stride = array<i64: 4, 1>, storage_offset = 2 : i64}} : (tensor<0x4xf32>) -> tensor<0x2xf32>
  return %0 : tensor<0x2xf32>
}

// -----

// The 2-norm is sqrt(sum(x * x)), a reduction that shards; other orders
// stay generic.
// CHECK-LABEL: func.func @norms
func.func @norms(%x: tensor<4x8xf32>) -> (tensor<f32>, tensor<4xf32>, tensor<f32>, tensor<f32>) {
  // CHECK: %[[S:.*]] = tdx.mul %{{.*}}, %{{.*}} : (tensor<4x8xf32>, tensor<4x8xf32>) -> tensor<4x8xf32>
  // CHECK: %[[T:.*]] = tdx.sum %[[S]] dims = [0, 1] : tensor<4x8xf32> -> tensor<f32>
  // CHECK: %[[N:.*]] = tdx.sqrt %[[T]] : tensor<f32>
  %0 = tdx.aten "aten::norm.ScalarOpt_dim"(%x) {args = {p = 2.0 : f64, dim = array<i64: 0, 1>, keepdim = false}} : (tensor<4x8xf32>) -> tensor<f32>
  // CHECK: tdx.sum %{{.*}} dims = [1] : tensor<4x8xf32> -> tensor<4xf32>
  %1 = tdx.aten "aten::linalg_vector_norm"(%x) {args = {ord = 2.0 : f64, dim = array<i64: 1>, keepdim = false, dtype}} : (tensor<4x8xf32>) -> tensor<4xf32>
  // CHECK: tdx.sum %{{.*}} : tensor<4x8xf32> -> tensor<f32>
  %2 = tdx.aten "aten::norm.Scalar"(%x) {args = {p = 2 : i64}} : (tensor<4x8xf32>) -> tensor<f32>
  // CHECK: tdx.aten "aten::norm.Scalar"
  // expected-remark @+1 {{stays generic}}
  %3 = tdx.aten "aten::norm.Scalar"(%x) {args = {p = 1 : i64}} : (tensor<4x8xf32>) -> tensor<f32>
  return %0, %1, %2, %3 : tensor<f32>, tensor<4xf32>, tensor<f32>, tensor<f32>
}

// -----

// Backward and optimizer formulas become fused elementwise ops, ATen's
// arithmetic in its order: sigmoid/tanh/silu/gelu backward their
// derivatives, addcmul/addcdiv/rsub an Adam update's.
// CHECK-LABEL: func.func @backward_formulas
func.func @backward_formulas(%g: tensor<4x8xf32>, %x: tensor<4x8xf32>, %s: tensor<f32>) -> (tensor<4x8xf32>, tensor<4x8xf32>, tensor<4x8xf32>, tensor<4x8xf32>, tensor<4x8xf32>, tensor<4x8xf32>, tensor<4x8xf32>, tensor<4x8xf32>, tensor<f32>) {
  // threshold_backward stays generic (measured: fusing it moved a ResNet's
  // parameters after 10 training steps by 1.2e-4 relative, past the 1e-4
  // the training tests allow).
  // CHECK: tdx.aten "aten::threshold_backward"
  // expected-remark @+1 {{stays generic}}
  %0 = tdx.aten "aten::threshold_backward"(%g, %x) {args = {threshold = 0 : i64}} : (tensor<4x8xf32>, tensor<4x8xf32>) -> tensor<4x8xf32>
  // CHECK: %[[ONE:.*]] = tdx.full 1.000000e+00 : tensor<f32>
  // CHECK: %[[D:.*]] = tdx.sub %[[ONE]], %{{.*}} : (tensor<f32>, tensor<4x8xf32>)
  // CHECK: %[[GD:.*]] = tdx.mul %{{.*}}, %[[D]]
  // CHECK: tdx.mul %[[GD]], %{{.*}}
  %1 = tdx.aten "aten::sigmoid_backward"(%g, %x) : (tensor<4x8xf32>, tensor<4x8xf32>) -> tensor<4x8xf32>
  // CHECK: %[[YY:.*]] = tdx.mul %{{.*}}, %{{.*}} : (tensor<4x8xf32>, tensor<4x8xf32>)
  // CHECK: tdx.sub %{{.*}}, %[[YY]]
  %2 = tdx.aten "aten::tanh_backward"(%g, %x) : (tensor<4x8xf32>, tensor<4x8xf32>) -> tensor<4x8xf32>
  // CHECK: tdx.sigmoid
  %3 = tdx.aten "aten::silu_backward"(%g, %x) : (tensor<4x8xf32>, tensor<4x8xf32>) -> tensor<4x8xf32>
  // CHECK: tdx.erf
  // CHECK: tdx.exp
  %4 = tdx.aten "aten::gelu_backward"(%g, %x) {args = {approximate = "none"}} : (tensor<4x8xf32>, tensor<4x8xf32>) -> tensor<4x8xf32>
  // CHECK: tdx.tanh
  %5 = tdx.aten "aten::gelu_backward"(%g, %x) {args = {approximate = "tanh"}} : (tensor<4x8xf32>, tensor<4x8xf32>) -> tensor<4x8xf32>
  // CHECK: %[[V:.*]] = tdx.full 5.000000e+00 : tensor<f32>
  // CHECK: %[[VT:.*]] = tdx.mul %[[V]], %{{.*}}
  // CHECK: %[[P:.*]] = tdx.mul %[[VT]], %{{.*}}
  // CHECK: tdx.add %{{.*}}, %[[P]]
  %6 = tdx.aten "aten::addcmul"(%g, %x, %x) {args = {value = 5.0 : f64}} : (tensor<4x8xf32>, tensor<4x8xf32>, tensor<4x8xf32>) -> tensor<4x8xf32>
  // CHECK: %[[Q:.*]] = tdx.div %{{.*}}, %{{.*}} : (tensor<4x8xf32>, tensor<4x8xf32>)
  // CHECK: tdx.add %{{.*}}, %[[Q]]
  %7 = tdx.aten "aten::addcdiv"(%g, %x, %x) {args = {value = 1 : i64}} : (tensor<4x8xf32>, tensor<4x8xf32>, tensor<4x8xf32>) -> tensor<4x8xf32>
  // rsub(self, other) = other - self.
  // CHECK: %[[O:.*]] = tdx.full 1.000000e+00 : tensor<f32>
  // CHECK: tdx.sub %[[O]], %{{.*}} : (tensor<f32>, tensor<f32>) -> tensor<f32>
  %8 = tdx.aten "aten::rsub.Scalar"(%s) {args = {other = 1 : i64, alpha = 1 : i64}} : (tensor<f32>) -> tensor<f32>
  return %0, %1, %2, %3, %4, %5, %6, %7, %8 : tensor<4x8xf32>, tensor<4x8xf32>, tensor<4x8xf32>, tensor<4x8xf32>, tensor<4x8xf32>, tensor<4x8xf32>, tensor<4x8xf32>, tensor<4x8xf32>, tensor<f32>
}

// -----

// Complex tensors have no first-class ops: their ops stay generic (ATen
// runs them); ui8 arithmetic is first-class. A row whose op would not
// verify (a dim out of range) leaves the op generic, saying why.
// CHECK-LABEL: func.func @stays_generic_by_type
func.func @stays_generic_by_type(%z: tensor<4xcomplex<f32>>, %u: tensor<4xui8>, %x: tensor<4x8xf32>) -> (tensor<4xcomplex<f32>>, tensor<4xui8>, tensor<4x8xf32>) {
  // CHECK: tdx.aten "aten::mul.Tensor"
  // expected-remark @+1 {{aten::mul.Tensor stays generic (runs through ATen on the CPU backend)}}
  %0 = tdx.aten "aten::mul.Tensor"(%z, %z) : (tensor<4xcomplex<f32>>, tensor<4xcomplex<f32>>) -> tensor<4xcomplex<f32>>
  // CHECK: tdx.add %{{.*}} : (tensor<4xui8>, tensor<4xui8>) -> tensor<4xui8>
  %1 = tdx.aten "aten::add.Tensor"(%u, %u) : (tensor<4xui8>, tensor<4xui8>) -> tensor<4xui8>
  // CHECK: tdx.aten "aten::_softmax"
  // expected-remark @+2 {{aten::_softmax stays generic: 'tdx.softmax' op dim 5 is out of range for a tensor of rank 2}}
  // expected-remark @+1 {{aten::_softmax stays generic (runs through ATen on the CPU backend)}}
  %2 = tdx.aten "aten::_softmax"(%x) {args = {dim = 5 : i64, half_to_float = false}} : (tensor<4x8xf32>) -> tensor<4x8xf32>
  return %0, %1, %2 : tensor<4xcomplex<f32>>, tensor<4xui8>, tensor<4x8xf32>
}

// -----

// torch's fused CPU attention and its backward, every result; with dropout
// it stays generic.
// CHECK-LABEL: func.func @sdpa
func.func @sdpa(%q: tensor<2x4x8x16xf32>, %k: tensor<2x2x8x16xf32>, %g: tensor<2x4x8x16xf32>) -> (tensor<2x4x8x16xf32>, tensor<2x2x8x16xf32>, tensor<2x4x8x16xf32>) {
  // CHECK: %[[O:.*]], %[[L:.*]] = tdx.sdpa %{{.*}}, %{{.*}}, %{{.*}} causal :
  %o:2 = tdx.aten "aten::_scaled_dot_product_flash_attention_for_cpu"(%q, %k, %k) {args = {attn_mask, dropout_p = 0.000000e+00 : f64, is_causal = true, scale}} : (tensor<2x4x8x16xf32>, tensor<2x2x8x16xf32>, tensor<2x2x8x16xf32>) -> (tensor<2x4x8x16xf32>, tensor<2x4x8xf32>)
  // CHECK: tdx.sdpa_backward %{{.*}}, %{{.*}}, %{{.*}}, %{{.*}}, %[[O]], %[[L]] causal :
  %d:3 = tdx.aten "aten::_scaled_dot_product_flash_attention_for_cpu_backward"(%g, %q, %k, %k, %o#0, %o#1) {args = {attn_mask, dropout_p = 0.000000e+00 : f64, is_causal = true, scale}} : (tensor<2x4x8x16xf32>, tensor<2x4x8x16xf32>, tensor<2x2x8x16xf32>, tensor<2x2x8x16xf32>, tensor<2x4x8x16xf32>, tensor<2x4x8xf32>) -> (tensor<2x4x8x16xf32>, tensor<2x2x8x16xf32>, tensor<2x2x8x16xf32>)
  // CHECK: tdx.aten "aten::_scaled_dot_product_flash_attention_for_cpu"
  // expected-remark @+1 {{stays generic}}
  %p:2 = tdx.aten "aten::_scaled_dot_product_flash_attention_for_cpu"(%q, %k, %k) {args = {attn_mask, dropout_p = 1.000000e-01 : f64, is_causal = false, scale}} : (tensor<2x4x8x16xf32>, tensor<2x2x8x16xf32>, tensor<2x2x8x16xf32>) -> (tensor<2x4x8x16xf32>, tensor<2x4x8xf32>)
  return %d#0, %d#1, %p#0 : tensor<2x4x8x16xf32>, tensor<2x2x8x16xf32>, tensor<2x4x8x16xf32>
}

// -----

// torch's fused RMS norm (what it dispatches for CUDA tensors) whose rstd
// nothing reads: tdx.rms_norm, eps None the dtype's epsilon.
// CHECK-LABEL: func.func @fused_rms_norm
func.func @fused_rms_norm(%x: tensor<2x8x16xf32>, %w: tensor<16xf32>) -> tensor<2x8x16xf32> {
  // CHECK: tdx.rms_norm %{{.*}} weight %{{.*}} normalized_shape = [16] eps = 1.1920928955078125E-7
  %y:2 = tdx.aten "aten::_fused_rms_norm"(%x, %w) {args = {eps, normalized_shape = array<i64: 16>}} : (tensor<2x8x16xf32>, tensor<16xf32>) -> (tensor<2x8x16xf32>, tensor<2x8x1xf32>)
  return %y#0 : tensor<2x8x16xf32>
}

// -----

// torch 2.x's CPU decomposition of F.rms_norm (nn.RMSNorm) in a forward:
// one tdx.rms_norm. Where a backward reads a piece (the rsqrt), the chain
// stays as it is.
// CHECK-LABEL: func.func @rms_norm_chain
func.func @rms_norm_chain(%x: tensor<2x8x16xf32>, %w: tensor<16xf32>) -> (tensor<2x8x16xf32>, tensor<2x8x16xf32>, tensor<2x8x1xf32>) {
  // CHECK: %[[N:.*]] = tdx.rms_norm %{{.*}} weight %{{.*}} normalized_shape = [16] eps = 9.9999999999999995E-7
  %two = tdx.full 2.0 : tensor<f32>
  %sq = tdx.pow %x, %two : (tensor<2x8x16xf32>, tensor<f32>) -> tensor<2x8x16xf32>
  %m = tdx.mean %sq dims = [2] keepdim : tensor<2x8x16xf32> -> tensor<2x8x1xf32>
  %eps = tdx.full 1.0e-6 : tensor<f32>
  %a = tdx.add %m, %eps : (tensor<2x8x1xf32>, tensor<f32>) -> tensor<2x8x1xf32>
  %r = tdx.rsqrt %a : tensor<2x8x1xf32>
  %n = tdx.mul %x, %r : (tensor<2x8x16xf32>, tensor<2x8x1xf32>) -> tensor<2x8x16xf32>
  %y = tdx.mul %n, %w : (tensor<2x8x16xf32>, tensor<16xf32>) -> tensor<2x8x16xf32>
  // CHECK: tdx.rsqrt
  // CHECK: %[[K:.*]] = tdx.mul
  %sq2 = tdx.pow %x, %two : (tensor<2x8x16xf32>, tensor<f32>) -> tensor<2x8x16xf32>
  %m2 = tdx.mean %sq2 dims = [-1] keepdim : tensor<2x8x16xf32> -> tensor<2x8x1xf32>
  %a2 = tdx.add %m2, %eps : (tensor<2x8x1xf32>, tensor<f32>) -> tensor<2x8x1xf32>
  %r2 = tdx.rsqrt %a2 : tensor<2x8x1xf32>
  %k = tdx.mul %x, %r2 : (tensor<2x8x16xf32>, tensor<2x8x1xf32>) -> tensor<2x8x16xf32>
  // CHECK: return %[[N]], %[[K]]
  return %y, %k, %r2 : tensor<2x8x16xf32>, tensor<2x8x16xf32>, tensor<2x8x1xf32>
}
