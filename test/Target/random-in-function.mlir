// RUN: tdx-opt %s --tdx-propagate-sharding --tdx-insert-collectives --tdx-partition \
// RUN:   | FileCheck %s --check-prefix=IR
// RUN: tdx-opt %s --tdx-propagate-sharding --tdx-insert-collectives --tdx-partition \
// RUN:   | tdx-translate --tdx-to-cpp | FileCheck %s
// RUN: tdx-opt %s --tdx-propagate-sharding --tdx-insert-collectives --tdx-partition \
// RUN:   | tdx-translate --tdx-to-cuda | FileCheck %s --check-prefix=CUDA

// Dropout's mask in a step function: split like the activation it masks,
// partitioned with its global shape, and drawn per rank as its box of the
// global draw of this call.
tdx.mesh @mesh shape = [2] axes = ["dp"]
func.func @forward(%x: tensor<7x8xf32>) -> tensor<7x8xf32> {
  %xs = tdx.annotate %x <@mesh, [Shard(0)]> : tensor<7x8xf32>
  %m = tdx.bernoulli(0.9) seed(3, 0) : tensor<7x8xf32>
  %y = tdx.mul %xs, %m : (tensor<7x8xf32>, tensor<7x8xf32>) -> tensor<7x8xf32>
  return %y : tensor<7x8xf32>
}

// IR: tdx.bernoulli(9.000000e-01) seed(3, 0) {global_shape = array<i64: 7, 8>, tdx.shardings = [#tdx.sharding<@mesh, [Shard(0)]>]} : tensor<?x8xf32>

// CHECK: static const int64_t [[SHAPE:kInitArray[0-9]+]][] = {7, 8};
// CHECK: {tdx::rt::InitProgram::Bernoulli, tdx::rt::DType::F32, [[SHAPE]], 2, -1, -1, {9.00000000000000022e-01, {{.*}}}, 3ull, 0ull, nullptr, 0, -1},
// CHECK-LABEL: static std::vector<T::Tensor> forward(
// CHECK: const uint64_t call = ctx.nextCall();
// CHECK: = ctx.init(tdx::rt::atCall(kInit(0), call), parseLayout("[Shard(0)]"));

// The CUDA backend draws the same way (its Context::init).
// CUDA: const uint64_t call = ctx.nextCall();
// CUDA: = ctx.init(tdx::rt::atCall(kInit(0), call), parseLayout("[Shard(0)]"));
