// RUN: tdx-translate --tdx-to-cpp %s | FileCheck %s
// RUN: tdx-translate --tdx-to-cuda %s | FileCheck %s --check-prefix=CUDA

// Two chains with one text (an optimizer's update, once per parameter)
// share one kernel function; a different chain gets its own.
module attributes {tdx.partitioned} {
func.func @forward(%a: tensor<4x8xf32>, %b: tensor<4x8xf32>, %c: tensor<16xf32>, %d: tensor<16xf32>) -> (tensor<4x8xf32>, tensor<16xf32>, tensor<16xf32>) {
  %0 = tdx.mul %a, %b : (tensor<4x8xf32>, tensor<4x8xf32>) -> tensor<4x8xf32>
  %1 = tdx.add %0, %a : (tensor<4x8xf32>, tensor<4x8xf32>) -> tensor<4x8xf32>
  %2 = tdx.mul %c, %d : (tensor<16xf32>, tensor<16xf32>) -> tensor<16xf32>
  %3 = tdx.add %2, %c : (tensor<16xf32>, tensor<16xf32>) -> tensor<16xf32>
  %4 = tdx.sub %c, %d : (tensor<16xf32>, tensor<16xf32>) -> tensor<16xf32>
  %5 = tdx.exp %4 : tensor<16xf32>
  return %1, %3, %5 : tensor<4x8xf32>, tensor<16xf32>, tensor<16xf32>
}
}

// CHECK-COUNT-2: static void k{{[0-9]+}}_row(
// CHECK-NOT: static void k{{[0-9]+}}_row(
// CHECK-LABEL: static std::vector<T::Tensor> forward(
// CHECK: elementwise({4, 8}, {{.*}}, [[K:k[0-9]+]]_row);
// CHECK: elementwise({16}, {{.*}}, [[K]]_row);
// CHECK: elementwise({16}, {{.*}}, k{{[0-9]+}}_row);

// CUDA-COUNT-2: __global__ void k{{[0-9]+}}_kernel(
// CUDA-NOT: __global__ void k{{[0-9]+}}_kernel(
