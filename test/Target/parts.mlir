// RUN: tdx-translate --tdx-to-cpp %s | FileCheck %s --check-prefix=ONE
// RUN: tdx-translate --tdx-to-cpp --tdx-ops-per-part=1 %s | FileCheck %s
// RUN: not tdx-translate --tdx-to-cpp --tdx-ops-per-part=0 %s 2>&1 | FileCheck %s --check-prefix=BAD

// A long step is emitted as functions of --tdx-ops-per-part ops (tdx.part,
// tdx-split-parts; the C++ compiler's time grows faster than a function's size), which
// `forward` calls in order. A tensor still held where a part ends moves into
// a slot of `carry` that later parts name with the tensor's name until its
// release frees the slot for another; the handles of collectives in flight
// go through `handles`. A short step stays one function.
module attributes {tdx.partitioned} {
  tdx.mesh @mesh shape = [2] axes = ["dp"]
  func.func @forward(%g1: tensor<4x8xf32>, %g2: tensor<4x8xf32>, %x: tensor<4x8xf32>) -> (tensor<4x8xf32>, tensor<2x8xf32>) {
    %r1 = tdx.all_reduce %g1 on @mesh axes = ["dp"] reduce = sum : tensor<4x8xf32> -> tensor<4x8xf32>
    %r2 = tdx.reduce_scatter %g2 on @mesh axes = ["dp"] reduce = sum dim = 0 : tensor<4x8xf32> -> tensor<2x8xf32>
    %e = tdx.exp %x : tensor<4x8xf32>
    %s = tdx.sum %e dims = [0] keepdim : tensor<4x8xf32> -> tensor<1x8xf32>
    %y = tdx.add %r1, %s : (tensor<4x8xf32>, tensor<1x8xf32>) -> tensor<4x8xf32>
    return %y, %r2 : tensor<4x8xf32>, tensor<2x8xf32>
  }
}

// ONE-NOT:   forward0
// ONE:       static std::vector<T::Tensor> forward(Context &ctx, State &s, const std::vector<T::Tensor> &in) {
// ONE-NEXT:    const uint64_t call = ctx.nextCall();
// ONE-NOT:   carry

// CHECK-LABEL: static std::vector<T::Tensor> forward0(Context &ctx, State &s, const std::vector<T::Tensor> &in, uint64_t call, T::Tensor *carry, int64_t *handles) {
// CHECK:       const T::Tensor &[[G1:v[0-9]+]] = in[0];
// CHECK:       const int64_t [[C1:c[0-9]+]] = ctx.startAllReduce([[G1]], {"dp"}, 0);
// CHECK:       handles[0] = [[C1]];
// CHECK-NEXT:  return {};
// CHECK-LABEL: forward1(
// CHECK:       const int64_t [[C1]] = handles[0];
// CHECK-NEXT:  const int64_t [[C2:c[0-9]+]] = ctx.startReduceScatter(
// CHECK:       handles[0] = [[C1]];
// CHECK-NEXT:  handles[1] = [[C2]];
// The exp's result outlives its part: it moves into a slot.
// CHECK-LABEL: forward2(
// CHECK:       T::Tensor [[E:v[0-9]+]] = std::move(
// CHECK:       carry[0] = std::move([[E]]);
// CHECK-LABEL: forward3(
// CHECK:       T::Tensor &[[E]] = carry[0];
// CHECK:       T::Tensor [[S:v[0-9]+]] = T::sum([[E]],
// CHECK:       [[E]] = T::Tensor();
// Its release freed slot 0, which the sum takes.
// CHECK:       carry[0] = std::move([[S]]);
// CHECK-LABEL: forward4(
// CHECK:       T::Tensor &[[S]] = carry[0];
// CHECK:       T::Tensor [[R1:v[0-9]+]] = ctx.wait([[C1]]);
// CHECK:       handles[0] = [[C2]];
// CHECK-LABEL: forward5(
// CHECK:       const int64_t [[C2]] = handles[0];
// CHECK-NEXT:  T::Tensor [[R2:v[0-9]+]] = ctx.wait([[C2]]);
// CHECK-NEXT:  return {{[{]}}{{v[0-9]+}}, [[R2]]};
// CHECK-LABEL: static std::vector<T::Tensor> forward(Context &ctx, State &s, const std::vector<T::Tensor> &in) {
// CHECK-NEXT:  const uint64_t call = ctx.nextCall();
// CHECK-NEXT:  std::vector<T::Tensor> carry(1);
// CHECK-NEXT:  std::vector<int64_t> handles(2);
// CHECK-NEXT:  forward0(ctx, s, in, call, carry.data(), handles.data());
// CHECK:       forward4(ctx, s, in, call, carry.data(), handles.data());
// CHECK-NEXT:  return forward5(ctx, s, in, call, carry.data(), handles.data());

// BAD: error: --tdx-ops-per-part must be positive
