// RUN: tdx-opt %s --tdx-propagate-sharding --tdx-insert-collectives --tdx-partition \
// RUN:   | tdx-translate --tdx-to-cpp | FileCheck %s

// A Megatron MLP on 2 tensor-parallel ranks: the row-parallel linear's
// partial sum becomes an all_reduce over "tp"; init makes local shards.
tdx.mesh @mesh shape = [2] axes = ["tp"]
tdx.parameter @fc : tensor<8x4xf32> sharding <@mesh, [Shard(0)]> init {
  %0 = tdx.normal(0.0, 0.02) seed(0, 1) : tensor<8x4xf32>
  tdx.yield %0 : tensor<8x4xf32>
}
tdx.parameter @proj : tensor<4x8xf32> sharding <@mesh, [Shard(1)]> init {
  %0 = tdx.uniform(-0.5, 0.5) seed(0, 2) : tensor<4x8xf32>
  tdx.yield %0 : tensor<4x8xf32>
}
func.func @forward(%x: tensor<3x4xf32>) -> tensor<3x4xf32> {
  %w1 = tdx.param_ref @fc : tensor<8x4xf32>
  %h = tdx.linear %x, %w1 : (tensor<3x4xf32>, tensor<8x4xf32>) -> tensor<3x8xf32>
  %g = tdx.relu %h : tensor<3x8xf32>
  %w2 = tdx.param_ref @proj : tensor<4x8xf32>
  %y = tdx.linear %g, %w2 : (tensor<3x8xf32>, tensor<4x8xf32>) -> tensor<3x4xf32>
  %t = tdx.aten "aten::triu"(%y) {args = {diagonal = 1 : i64}} : (tensor<3x4xf32>) -> tensor<3x4xf32>
  return %t : tensor<3x4xf32>
}

// CHECK: #include "tdx/Runtime/Runtime.h"
// Each init program is written out for the runtime to evaluate on the rank's box.
// CHECK:      {tdx::rt::InitProgram::Normal, tdx::rt::DType::F32, {{kInitArray[0-9]+}}, 2, -1, -1, {0.0{{0*}}e+00, 2.0{{0*}}4e-02, {{.*}}}, 0ull, 1ull, nullptr, 0, -1},
// CHECK-NEXT: {tdx::rt::InitProgram::Uniform, tdx::rt::DType::F32, {{kInitArray[0-9]+}}, 2, -1, -1, {-5.0{{0*}}e-01, 5.0{{0*}}e-01, {{.*}}}, 0ull, 2ull, nullptr, 0, -1},
// CHECK:      static const EmittedInit kInitEntries[] = {
// CHECK-NEXT:   {"fc", 0, "[Shard(0)]"},
// CHECK-NEXT:   {"proj", 1, "[Shard(1)]"},
// CHECK-LABEL: static void init(Context &ctx, State &s) {
// CHECK-NEXT: for (const EmittedInit &e : kInitEntries)
// CHECK-NEXT: if (!s.count(e.name))
// CHECK-NEXT: s[e.name] = ctx.init(kInit(e.program), parseLayout(e.layout));
// CHECK-LABEL: static std::vector<T::Tensor> forward(
// CHECK: T::linear(
// CHECK: elementwise({3, 4}, {{.*}}, {T::kFloat}, k0_row);
// CHECK: [[P:v[0-9]+]] = T::linear(
// CHECK: const int64_t [[C:c[0-9]+]] = ctx.startAllReduce([[P]], {"tp"}, 0);
// CHECK: [[R:v[0-9]+]] = ctx.wait([[C]]);
// CHECK: [[T:r[0-9]+]] = callAten("aten::triu", {[[R]]}, {{[{][{]}}"diagonal", c10::IValue(int64_t(1))}}, {{[{][{]}}3, 4{{[}][}]}});
// CHECK: return {
// The parameters' global shapes (dims from an offset), types and layouts as
// constant tables, read by describe().
// CHECK: static const int64_t kParamDims[] = {8, 4, 4, 8, 0};
// CHECK: static const EmittedParam kParams[] = {
// CHECK-NEXT: {"fc", 0, 2, T::kFloat, "[Shard(0)]"},
// CHECK-LABEL: static Program describe(
// CHECK: p.meshShape = {2};
// CHECK: p.axes = {"tp"};
// CHECK: for (const EmittedParam &e : kParams)
// CHECK: p.inputs.push_back({{[{][{]}}3, 4}, T::kFloat, "[Replicate]"});
// CHECK: p.outputs.push_back({{[{][{]}}3, 4}, T::kFloat, "[Replicate]"});
// CHECK: return p;
// CHECK: int main(int argc, char **argv) { return runMain(argc, argv, describe()); }
// CHECK: extern "C" const void *tdx_program()

