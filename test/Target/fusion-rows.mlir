// RUN: tdx-translate --tdx-to-cpp -split-input-file %s | FileCheck %s
// RUN: tdx-translate --tdx-to-cuda -split-input-file %s | FileCheck %s --check-prefix=CUDA

// A softmax over the last dim ends the kernel that makes its input: the
// scale and the mask make no tensor of their own. The body writes the
// softmax's input into its result; the row function then runs the softmax
// on each whole row (`true`: rows are the last dim) in place. On CUDA one
// block per row runs the body and then the lanes' softmax.
module attributes {tdx.partitioned} {
  tdx.mesh @mesh shape = [1] axes = ["x"]
  func.func @forward(%x: tensor<2x4x8xf32>, %mask: tensor<4x8xi1>) -> tensor<2x4x8xf32> {
    %s = tdx.full 2.500000e-01 : tensor<f32>
    %inf = tdx.full 0xFFF0000000000000 : tensor<f32>
    %0 = tdx.mul %x, %s : (tensor<2x4x8xf32>, tensor<f32>) -> tensor<2x4x8xf32>
    %1 = tdx.where %mask, %inf, %0 : (tensor<4x8xi1>, tensor<f32>, tensor<2x4x8xf32>) -> tensor<2x4x8xf32>
    %2 = tdx.softmax %1 dim = -1 : tensor<2x4x8xf32>
    return %2 : tensor<2x4x8xf32>
  }
}

// CHECK-LABEL: TDX_HD inline void k0(float a0, bool a1, float &y0) {
// CHECK-NEXT:   float t0 = ::tdx::kern::mul(a0, float(2.50000000000000000e-01)); // tdx.mul
// CHECK-NEXT:   float t1 = a1 ? float(-INFINITY) : t0; // tdx.where
// CHECK-NEXT:   y0 = t1;
// CHECK-NEXT: }
// CHECK:        k0(a0[j * s[0]], a1[j * s[1]], y0[j]);
// CHECK-NEXT:   ::tdx::rt::rows::softmax(y0, n, false);
// CHECK-NEXT: }
// CHECK-LABEL: forward(
// CHECK-NOT:   T::softmax
// CHECK:       elementwise({2, 4, 8}, {{{v[0-9]+}}, {{v[0-9]+}}}, {T::kFloat}, k0_row, true);
// CHECK-NOT:   elementwise(
// CHECK-NOT:   T::softmax
// CHECK:       return

// CUDA:       #include "tdx/Runtime/cuda/Lanes.cuh"
// CUDA-LABEL: __global__ void k0_kernel(tdx::kern::Iter it) {
// CUDA:         ::tdx::cu::BlockLanes lanes{rowScratch};
// CUDA:         for (int64_t r = blockIdx.x; r < rows; r += gridDim.x) {
// CUDA:           k0(it.at<float>(0, i), it.at<bool>(1, i), it.at<float>(2, i));
// CUDA:         float *y = &it.at<float>(2, r * n);
// CUDA-NEXT:    ::tdx::kern::softmaxRow(lanes, y, y, n, 1, false);
// CUDA:       k0_kernel<<<::tdx::cu::rowBlocks(it.numel / it.shape[it.rank - 1]), ::tdx::cu::kRowThreads, ::tdx::cu::kRowShared, s>>>(it);
// CUDA-LABEL: forward(
// CUDA-NOT:   T::softmax
// CUDA:       elementwise({2, 4, 8}, {{{v[0-9]+}}, {{v[0-9]+}}}, {T::kFloat}, k0_launch);

// -----

// Residual add + layer norm: the sum is read again later, so the kernel
// writes it (y0) and the norm's row (y1), which the norm then normalizes
// with its weight and bias (kernel inputs 2 and 3, with their strides).
module attributes {tdx.partitioned} {
  tdx.mesh @mesh shape = [1] axes = ["x"]
  func.func @forward(%x: tensor<4x8xf32>, %h: tensor<4x8xf32>, %w: tensor<8xf32>, %b: tensor<8xf32>) -> (tensor<4x8xf32>, tensor<4x8xf32>) {
    %0 = tdx.add %x, %h : (tensor<4x8xf32>, tensor<4x8xf32>) -> tensor<4x8xf32>
    %1 = tdx.layer_norm %0 weight %w bias %b normalized_shape = [8] eps = 1.000000e-05 : (tensor<4x8xf32>, tensor<8xf32>, tensor<8xf32>) -> tensor<4x8xf32>
    return %0, %1 : tensor<4x8xf32>, tensor<4x8xf32>
  }
}

// CHECK-LABEL: TDX_HD inline void k0(V a0, V a1, V a2, V a3, V &y0, V &y1) {
// CHECK-NEXT:   V t0 = ::tdx::kern::add(a0, a1); // tdx.add
// CHECK-NEXT:   y0 = t0;
// CHECK-NEXT:   y1 = t0;
// CHECK-NEXT: }
// CHECK:        ::tdx::rt::rows::layerNorm(y1, a2, s[2], a3, s[3], n, 1.00000000000000008e-05);
// CHECK-LABEL: forward(
// CHECK:       elementwise({4, 8}, {[[X:v[0-9]+]], [[H:v[0-9]+]], [[W:v[0-9]+]], [[B:v[0-9]+]]}, {T::kFloat, T::kFloat}, k0_row, true);
// CHECK-NOT:   T::layer_norm

// CUDA:         const float *w2 = &it.at<float>(2, 0);
// CUDA-NEXT:    const float *w3 = &it.at<float>(3, 0);
// CUDA:         ::tdx::kern::layerNormRow(lanes, y, w2, w3, y, n, 1.00000000000000008e-05);
// CUDA:         if (it.strides[2][it.rank - 1] != 1)
// CUDA-NEXT:      throw std::runtime_error("tdx: a fused layer_norm's weight or bias must be dense on CUDA");

// -----

// rms_norm without a weight and log_softmax end their kernels too.
module attributes {tdx.partitioned} {
  tdx.mesh @mesh shape = [1] axes = ["x"]
  func.func @forward(%x: tensor<4x8xf32>, %y: tensor<4x8xf32>) -> (tensor<4x8xf32>, tensor<4x8xf32>) {
    %0 = tdx.mul %x, %y : (tensor<4x8xf32>, tensor<4x8xf32>) -> tensor<4x8xf32>
    %1 = tdx.rms_norm %0 normalized_shape = [8] eps = 1.000000e-06 : (tensor<4x8xf32>) -> tensor<4x8xf32>
    %2 = tdx.sub %x, %y : (tensor<4x8xf32>, tensor<4x8xf32>) -> tensor<4x8xf32>
    %3 = tdx.log_softmax %2 dim = 1 : tensor<4x8xf32>
    return %1, %3 : tensor<4x8xf32>, tensor<4x8xf32>
  }
}

// CHECK:        ::tdx::rt::rows::rmsNorm(y0, nullptr, 0, n, 9.99999999999999955e-07);
// CHECK:        ::tdx::rt::rows::softmax(y0, n, true);
// CHECK-LABEL: forward(
// CHECK-NOT:   rms_norm(
// CHECK-NOT:   T::log_softmax

// CUDA:         ::tdx::kern::rmsNormRow(lanes, y, static_cast<const float *>(nullptr), y, n, 9.99999999999999955e-07);
// CUDA:         ::tdx::kern::softmaxRow(lanes, y, y, n, 1, true);

// -----

// What stays a plain kernel and a plain row op: a softmax over another dim
// than the last, a layer norm over two dims, a softmax whose input is no
// kernel's, and a softmax whose input kernel already ran (a matmul read it
// first).
module attributes {tdx.partitioned} {
  tdx.mesh @mesh shape = [1] axes = ["x"]
  func.func @forward(%x: tensor<4x8xf32>, %y: tensor<4x8xf32>, %z: tensor<8x8xf32>) -> (tensor<4x8xf32>, tensor<4x8xf32>, tensor<4x8xf32>, tensor<4x8xf32>, tensor<4x8xf32>) {
    %0 = tdx.mul %x, %y : (tensor<4x8xf32>, tensor<4x8xf32>) -> tensor<4x8xf32>
    %1 = tdx.softmax %0 dim = 0 : tensor<4x8xf32>
    %2 = tdx.sub %x, %y : (tensor<4x8xf32>, tensor<4x8xf32>) -> tensor<4x8xf32>
    %3 = tdx.layer_norm %2 normalized_shape = [4, 8] eps = 1.000000e-05 : (tensor<4x8xf32>) -> tensor<4x8xf32>
    %4 = tdx.softmax %x dim = 1 : tensor<4x8xf32>
    %5 = tdx.add %x, %y : (tensor<4x8xf32>, tensor<4x8xf32>) -> tensor<4x8xf32>
    %6 = tdx.matmul %5, %z : (tensor<4x8xf32>, tensor<8x8xf32>) -> tensor<4x8xf32>
    %7 = tdx.softmax %5 dim = 1 : tensor<4x8xf32>
    return %1, %3, %4, %6, %7 : tensor<4x8xf32>, tensor<4x8xf32>, tensor<4x8xf32>, tensor<4x8xf32>, tensor<4x8xf32>
  }
}

// CHECK-NOT:   ::tdx::rt::rows::
// CHECK-LABEL: forward(
// CHECK:       k0_row);
// CHECK-NEXT:  T::Tensor [[P:v[0-9]+]] = std::move(
// CHECK:       T::softmax([[P]], 0)
// CHECK:       T::layer_norm(
// CHECK:       T::softmax({{v[0-9]+}}, 1)
// CHECK:       k2_row);
// CHECK-NEXT:  T::Tensor [[S:v[0-9]+]] = std::move(
// CHECK:       T::matmul([[S]],
// CHECK:       T::softmax([[S]], 1)
