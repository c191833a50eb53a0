// RUN: tdx-opt %s --tdx-propagate-sharding --tdx-insert-collectives --tdx-partition \
// RUN:   | tdx-translate --tdx-to-cuda | FileCheck %s

// The Megatron MLP of tdx-to-cpp.mlir as CUDA: the same emitter with the
// CUDA runtime's spelling (namespace T = tdx::cu), the fused bias + GELU
// kernel launched one thread per element over the same body the CPU loops
// over, and cuBLAS linears.
tdx.mesh @mesh shape = [2] axes = ["tp"]
tdx.parameter @fc : tensor<8x4xf32> sharding <@mesh, [Shard(0)]> init {
  %0 = tdx.normal(0.0, 0.02) seed(0, 1) : tensor<8x4xf32>
  tdx.yield %0 : tensor<8x4xf32>
}
tdx.parameter @bias : tensor<8xf32> sharding <@mesh, [Shard(0)]> init {
  %0 = tdx.full 0.0 : tensor<8xf32>
  tdx.yield %0 : tensor<8xf32>
}
tdx.parameter @proj : tensor<4x8xf32> sharding <@mesh, [Shard(1)]> init {
  %0 = tdx.uniform(-0.5, 0.5) seed(0, 2) : tensor<4x8xf32>
  tdx.yield %0 : tensor<4x8xf32>
}
func.func @forward(%x: tensor<3x4xf32>) -> tensor<3x4xf32> {
  %w1 = tdx.param_ref @fc : tensor<8x4xf32>
  %b = tdx.param_ref @bias : tensor<8xf32>
  %h = tdx.linear %x, %w1 : (tensor<3x4xf32>, tensor<8x4xf32>) -> tensor<3x8xf32>
  %hb = tdx.add %h, %b : (tensor<3x8xf32>, tensor<8xf32>) -> tensor<3x8xf32>
  %g = tdx.gelu %hb : tensor<3x8xf32>
  %w2 = tdx.param_ref @proj : tensor<4x8xf32>
  %y = tdx.linear %g, %w2 : (tensor<3x8xf32>, tensor<4x8xf32>) -> tensor<3x4xf32>
  return %y : tensor<3x4xf32>
}

// CHECK:      #include "tdx/Runtime/cuda/Runtime.h"
// CHECK:      namespace T = tdx::cu;
// CHECK:      template <class V>
// CHECK-NEXT: TDX_HD inline void k0(V a0, V a1, V &y0) {
// CHECK-NEXT:   V t0 = ::tdx::kern::add(a0, a1); // tdx.add
// CHECK-NEXT:   V t1 = ::tdx::kern::gelu(t0); // tdx.gelu
// CHECK-NEXT:   y0 = t1;
// CHECK-NEXT: }
// CHECK-NEXT: __global__ void k0_kernel(tdx::kern::Iter it) {
// CHECK:        k0<float>(it.at<float>(0, i), it.at<float>(1, i), it.at<float>(2, i));
// CHECK:      static void k0_launch(const tdx::kern::Iter &it, cudaStream_t s) {
// CHECK-NEXT:   k0_kernel<<<blocksFor(it.numel), 256, 0, s>>>(it);
// CHECK-NOT:  _row(
// CHECK:      {tdx::rt::InitProgram::Full, tdx::rt::DType::F32, {{kInitArray[0-9]+}}, 1, -1, -1,
// CHECK:      {"fc", 0, "[Shard(0)]"},
// CHECK-NEXT: {"bias", 1, "[Shard(0)]"},
// CHECK-LABEL: static void init(Context &ctx, State &s) {
// CHECK-NEXT: for (const EmittedInit &e : kInitEntries)
// CHECK-NEXT: if (!s.count(e.name))
// CHECK-NEXT: s[e.name] = ctx.init(kInit(e.program), parseLayout(e.layout));
// CHECK-LABEL: static std::vector<T::Tensor> forward(
// CHECK:      T::Tensor [[H:v[0-9]+]] = T::linear(
// CHECK:      = elementwise({3, 4}, {[[H]], {{v[0-9]+}}}, {T::kFloat}, k0_launch);
// CHECK:      T::linear(
// CHECK:      {"fc", 0, 2, T::kFloat, "[Shard(0)]"},
// CHECK-LABEL: static Program describe(
// The row-parallel result stays a partial sum; gathering it sums.
// CHECK:      p.outputs.push_back({{[{][{]}}3, 4}, T::kFloat, "[Partial(sum)]"});
// CHECK:      return p;
// CHECK:      int main(int argc, char **argv) { return runMain(argc, argv, describe()); }
// CHECK:      extern "C" const void *tdx_program()
