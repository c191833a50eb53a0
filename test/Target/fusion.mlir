// RUN: tdx-translate --tdx-to-cpp %s | FileCheck %s

// Elementwise chains over one shape become one kernel each: a
// __host__ __device__ body (templated on the lane type when every value is
// one float type) and the CPU row loop around it. Splat constants, also
// through casts, are inlined as literals; a value used after the chain is an
// extra output; a non-elementwise user closes the chain.
module attributes {tdx.partitioned} {
  tdx.mesh @mesh shape = [1] axes = ["x"]
  func.func @forward(%x: tensor<4x8xf32>, %b: tensor<8xf32>) -> (tensor<4x8xf32>, tensor<4x1xf32>, tensor<4x8xf32>) {
    %c = arith.constant dense<5.000000e-01> : tensor<f64>
    %h = tdx.cast %c : tensor<f64> to tensor<f32>
    %0 = tdx.add %x, %b : (tensor<4x8xf32>, tensor<8xf32>) -> tensor<4x8xf32>
    %1 = tdx.mul %0, %h : (tensor<4x8xf32>, tensor<f32>) -> tensor<4x8xf32>
    %2 = tdx.gelu %1 : tensor<4x8xf32>
    %3 = tdx.sum %1 dims = [-1] keepdim : tensor<4x8xf32> -> tensor<4x1xf32>
    %4 = tdx.silu %2 : tensor<4x8xf32>
    %5 = tdx.cmp gt, %4, %x : (tensor<4x8xf32>, tensor<4x8xf32>) -> tensor<4x8xi1>
    %6 = tdx.where %5, %4, %x : (tensor<4x8xi1>, tensor<4x8xf32>, tensor<4x8xf32>) -> tensor<4x8xf32>
    return %2, %3, %6 : tensor<4x8xf32>, tensor<4x1xf32>, tensor<4x8xf32>
  }
}

// CHECK:      template <class V>
// CHECK-NEXT: TDX_HD inline void k0(V a0, V a1, V &y0, V &y1) {
// CHECK-NEXT:   V t0 = ::tdx::kern::add(a0, a1); // tdx.add
// CHECK-NEXT:   V t1 = ::tdx::kern::mul(t0, V(5.00000000000000000e-01)); // tdx.mul
// CHECK-NEXT:   V t2 = ::tdx::kern::gelu(t1); // tdx.gelu
// CHECK-NEXT:   y0 = t1;
// CHECK-NEXT:   y1 = t2;
// CHECK-NEXT: }
// CHECK:      static void k0_row(char *const *p, const int64_t *s, int64_t n) {
// CHECK:        if (true && s[0] <= 1 && s[1] <= 1) {
// CHECK-NEXT:     using V = at::vec::Vectorized<float>;
// CHECK:            k0<V>(s[0] ? V::loadu(a0 + j) : V(a0[0]), s[1] ? V::loadu(a1 + j) : V(a1[0]), r0, r1);
// CHECK:          k0<float>(a0[j * s[0]], a1[j * s[1]], y0[j], y1[j]);

// The chain after the sum reads its first output; cmp makes it mixed-type,
// so it runs element by element with concrete types.
// CHECK:      TDX_HD inline void k1(float a0, float a1, float &y0) {
// CHECK-NEXT:   float t0 = ::tdx::kern::silu(a0); // tdx.silu
// CHECK-NEXT:   bool t1 = t0 > a1; // tdx.cmp
// CHECK-NEXT:   float t2 = t1 ? t0 : a1; // tdx.where
// CHECK-NEXT:   y0 = t2;
// CHECK-NEXT: }
// CHECK-NOT:  Vectorized
// CHECK:        k1(a0[j * s[0]], a1[j * s[1]], y0[j]);

// CHECK-LABEL: forward(
// CHECK-NOT:   constant(
// CHECK:       ctx.place({{[{][{]}}0, 128}, {-1, 128{{[}][}]}});
// CHECK-NEXT:  std::vector<T::Tensor> [[R0:r[0-9]+]] = elementwise({4, 8}, {[[X:v[0-9]+]], [[B:v[0-9]+]]}, {T::kFloat, T::kFloat}, k0_row);
// CHECK-NEXT:  T::Tensor [[T1:v[0-9]+]] = std::move([[R0]][0]);
// CHECK-NEXT:  T::Tensor [[T2:v[0-9]+]] = std::move([[R0]][1]);
// CHECK-NEXT:  ctx.placed();
// CHECK-NEXT:  T::Tensor [[S:v[0-9]+]] = T::sum([[T1]], std::vector<int64_t>{-1}, true);
// CHECK-NEXT:  [[T1]] = T::Tensor();
// CHECK-NEXT:  std::vector<T::Tensor> [[R1:r[0-9]+]] = elementwise({4, 8}, {[[T2]], [[X]]}, {T::kFloat}, k1_row);
// CHECK:       return {[[T2]], [[S]], {{v[0-9]+}}};
