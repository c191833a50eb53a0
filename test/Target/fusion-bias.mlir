// RUN: tdx-translate --tdx-to-cuda -split-input-file %s | FileCheck %s --check-prefix=CUDA
// RUN: tdx-translate --tdx-to-cpp -split-input-file %s | FileCheck %s --check-prefix=CPU

// Bias + activation: a linear read by kernels only runs without its bias,
// and the kernel that reads it adds the bias before the activation (cuBLAS's
// gemm cannot add it; on the CPU the kernel's add costs what addmm's does).
module attributes {tdx.partitioned} {
  tdx.mesh @mesh shape = [1] axes = ["x"]
  func.func @forward(%x: tensor<4x8xf32>, %w: tensor<16x8xf32>, %b: tensor<16xf32>) -> tensor<4x16xf32> {
    %0 = tdx.linear %x, %w, %b : (tensor<4x8xf32>, tensor<16x8xf32>, tensor<16xf32>) -> tensor<4x16xf32>
    %1 = tdx.gelu %0 approximate = tanh : tensor<4x16xf32>
    return %1 : tensor<4x16xf32>
  }
}

// CUDA-LABEL: TDX_HD inline void k0(V a0, V a1, V &y0) {
// CUDA-NEXT:    V t0 = ::tdx::kern::add(a0, a1); // tdx.add
// CUDA-NEXT:    V t1 = ::tdx::kern::geluTanh(t0); // tdx.gelu
// CUDA-NEXT:    y0 = t1;
// CUDA-LABEL: forward(
// CUDA:         T::Tensor [[Y:v[0-9]+]] = T::linear({{v[0-9]+}}, {{v[0-9]+}}, {});
// CUDA:         std::vector<T::Tensor> r0 = elementwise({4, 16}, {[[Y]], {{v[0-9]+}}}, {T::kFloat}, k0_launch);

// CPU-LABEL: TDX_HD inline void k0(V a0, V a1, V &y0) {
// CPU-NEXT:    V t0 = ::tdx::kern::add(a0, a1); // tdx.add
// CPU-NEXT:    V t1 = ::tdx::kern::geluTanh(t0); // tdx.gelu
// CPU-LABEL: forward(
// CPU:         T::Tensor [[Y:v[0-9]+]] = T::linear(v0, v1, {});
// CPU:          std::vector<T::Tensor> r0 = elementwise({4, 16}, {[[Y]], v2}, {T::kFloat}, k0_row);

// -----

// A linear that something other than a kernel reads (here the return)
// keeps its bias.
module attributes {tdx.partitioned} {
  tdx.mesh @mesh shape = [1] axes = ["x"]
  func.func @forward(%x: tensor<4x8xf32>, %w: tensor<16x8xf32>, %b: tensor<16xf32>) -> (tensor<4x16xf32>, tensor<4x16xf32>) {
    %0 = tdx.linear %x, %w, %b : (tensor<4x8xf32>, tensor<16x8xf32>, tensor<16xf32>) -> tensor<4x16xf32>
    %1 = tdx.relu %0 : tensor<4x16xf32>
    return %0, %1 : tensor<4x16xf32>, tensor<4x16xf32>
  }
}

// CUDA-NOT:     linear's bias
// CUDA-LABEL: forward(
// CUDA:         T::linear(v0, v1, v2);
// CPU-NOT:      linear's bias
// CPU-LABEL:  forward(
// CPU:          T::linear(v0, v1, v2);
