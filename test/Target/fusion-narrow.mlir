// RUN: tdx-translate --tdx-to-cpp %s | FileCheck %s
// RUN: tdx-translate --tdx-to-cuda %s | FileCheck %s --check-prefix=CUDA

// bf16 and f16 kernels compute each op in float and round its result to the
// value's type, as ATen's kernels do (opmath); 8- and 16-bit integers
// compute in C++'s integer arithmetic and wrap where they are stored.
module attributes {tdx.partitioned} {
  tdx.mesh @mesh shape = [1] axes = ["x"]
  func.func @forward(%x: tensor<4x8xf32>, %i: tensor<4x8xi8>, %u: tensor<4x8xui8>) -> (tensor<4x8xbf16>, tensor<4x8xf16>, tensor<4x8xi8>, tensor<4x8xi16>, tensor<4x8xui8>) {
    %h = tdx.cast %x : tensor<4x8xf32> to tensor<4x8xbf16>
    %c = arith.constant dense<5.000000e-01> : tensor<bf16>
    %0 = tdx.mul %h, %c : (tensor<4x8xbf16>, tensor<bf16>) -> tensor<4x8xbf16>
    %1 = tdx.exp %0 : tensor<4x8xbf16>
    %2 = tdx.cast %x : tensor<4x8xf32> to tensor<4x8xf16>
    %3 = tdx.add %i, %i : (tensor<4x8xi8>, tensor<4x8xi8>) -> tensor<4x8xi8>
    %4 = tdx.cast %3 : tensor<4x8xi8> to tensor<4x8xi16>
    %5 = tdx.cast %x : tensor<4x8xf32> to tensor<4x8xui8>
    return %1, %2, %3, %4, %5 : tensor<4x8xbf16>, tensor<4x8xf16>, tensor<4x8xi8>, tensor<4x8xi16>, tensor<4x8xui8>
  }
}

// CHECK-LABEL: TDX_HD inline void k0(float a0, ::tdx::kern::bf16 &y0) {
// CHECK-NEXT:   ::tdx::kern::bf16 t0 = static_cast<::tdx::kern::bf16>(a0); // tdx.cast
// CHECK-NEXT:   ::tdx::kern::bf16 t1 = ::tdx::kern::mul(static_cast<float>(t0), static_cast<float>(::tdx::kern::bf16(5.00000000000000000e-01))); // tdx.mul
// CHECK-NEXT:   ::tdx::kern::bf16 t2 = ::tdx::kern::exp(static_cast<float>(t1)); // tdx.exp
// CHECK-NEXT:   y0 = t2;
// CHECK:      TDX_HD inline void k{{[0-9]+}}(float a0, ::tdx::kern::f16 &y0) {
// CHECK-NEXT:   ::tdx::kern::f16 t0 = static_cast<::tdx::kern::f16>(a0); // tdx.cast
// CHECK:      TDX_HD inline void k{{[0-9]+}}(int8_t a0, int8_t &y0, int16_t &y1) {
// CHECK-NEXT:   int8_t t0 = ::tdx::kern::add(a0, a0); // tdx.add
// CHECK-NEXT:   int16_t t1 = static_cast<int16_t>(t0); // tdx.cast
// CHECK:      TDX_HD inline void k{{[0-9]+}}(float a0, uint8_t &y0) {
// CHECK-NEXT:   uint8_t t0 = static_cast<uint8_t>(static_cast<int64_t>(a0)); // tdx.cast

// The CUDA backend launches the same bodies on its 16-bit float types.
// CUDA: TDX_HD inline void k0(float a0, ::tdx::kern::bf16 &y0) {
// CUDA: ::tdx::kern::bf16 t2 = ::tdx::kern::exp(static_cast<float>(t1)); // tdx.exp
