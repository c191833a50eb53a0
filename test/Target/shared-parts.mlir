// RUN: tdx-opt %s --tdx-backend="ops-per-part=4" | tdx-translate --tdx-to-cpp | FileCheck %s

// Four layers of the same ops on other parameters: tdx-split-parts cuts
// each layer the same way, so parts of different layers differ only in
// local names and literals (here the parameter's name). One function holds
// their code, and each part calls it with its own literals.
// CHECK:      static std::vector<T::Tensor> [[SHARED:forward[0-9]+_shared0]](Context &ctx, State &s, const std::vector<T::Tensor> &in, uint64_t call, T::Tensor *carry, int64_t *handles, const int64_t *I, const uint64_t *U, const double *F, const char *const *S) {
// CHECK:        = s.at(S[0]);
// CHECK:        static const char *const S[] = {"w1"};
// CHECK-NEXT:   return [[SHARED]](ctx, s, in, call, carry, handles, nullptr, nullptr, nullptr, S);
// CHECK:        static const char *const S[] = {"w3"};
// CHECK-NEXT:   return [[SHARED]](ctx, s, in, call, carry, handles, nullptr, nullptr, nullptr, S);
module attributes {tdx.partitioned} {
    tdx.parameter @w0 : tensor<8x8xf32> init {
      %0 = tdx.normal(0.0, 0.02) seed(0, 1) : tensor<8x8xf32>
      tdx.yield %0 : tensor<8x8xf32>
    }
    tdx.parameter @w1 : tensor<8x8xf32> init {
      %0 = tdx.normal(0.0, 0.02) seed(0, 2) : tensor<8x8xf32>
      tdx.yield %0 : tensor<8x8xf32>
    }
    tdx.parameter @w2 : tensor<8x8xf32> init {
      %0 = tdx.normal(0.0, 0.02) seed(0, 3) : tensor<8x8xf32>
      tdx.yield %0 : tensor<8x8xf32>
    }
    tdx.parameter @w3 : tensor<8x8xf32> init {
      %0 = tdx.normal(0.0, 0.02) seed(0, 4) : tensor<8x8xf32>
      tdx.yield %0 : tensor<8x8xf32>
    }
    func.func @forward(%x: tensor<8x8xf32>) -> tensor<8x8xf32> {
      %w0 = tdx.param_ref @w0 : tensor<8x8xf32>
      %m0 = tdx.matmul %x, %w0 : (tensor<8x8xf32>, tensor<8x8xf32>) -> tensor<8x8xf32>
      %s0 = tdx.softmax %m0 dim = -1 : tensor<8x8xf32>
      %t0 = tdx.matmul %s0, %w0 : (tensor<8x8xf32>, tensor<8x8xf32>) -> tensor<8x8xf32>
      %a0 = tdx.softmax %t0 dim = 0 : tensor<8x8xf32>
      %b0 = tdx.matmul %a0, %w0 : (tensor<8x8xf32>, tensor<8x8xf32>) -> tensor<8x8xf32>
      %c0 = tdx.softmax %b0 dim = -1 : tensor<8x8xf32>
      %d0 = tdx.matmul %c0, %m0 : (tensor<8x8xf32>, tensor<8x8xf32>) -> tensor<8x8xf32>
      %e0 = tdx.softmax %d0 dim = 0 : tensor<8x8xf32>
      %r0 = tdx.matmul %e0, %s0 : (tensor<8x8xf32>, tensor<8x8xf32>) -> tensor<8x8xf32>
      %w1 = tdx.param_ref @w1 : tensor<8x8xf32>
      %m1 = tdx.matmul %r0, %w1 : (tensor<8x8xf32>, tensor<8x8xf32>) -> tensor<8x8xf32>
      %s1 = tdx.softmax %m1 dim = -1 : tensor<8x8xf32>
      %t1 = tdx.matmul %s1, %w1 : (tensor<8x8xf32>, tensor<8x8xf32>) -> tensor<8x8xf32>
      %a1 = tdx.softmax %t1 dim = 0 : tensor<8x8xf32>
      %b1 = tdx.matmul %a1, %w1 : (tensor<8x8xf32>, tensor<8x8xf32>) -> tensor<8x8xf32>
      %c1 = tdx.softmax %b1 dim = -1 : tensor<8x8xf32>
      %d1 = tdx.matmul %c1, %m1 : (tensor<8x8xf32>, tensor<8x8xf32>) -> tensor<8x8xf32>
      %e1 = tdx.softmax %d1 dim = 0 : tensor<8x8xf32>
      %r1 = tdx.matmul %e1, %s1 : (tensor<8x8xf32>, tensor<8x8xf32>) -> tensor<8x8xf32>
      %w2 = tdx.param_ref @w2 : tensor<8x8xf32>
      %m2 = tdx.matmul %r1, %w2 : (tensor<8x8xf32>, tensor<8x8xf32>) -> tensor<8x8xf32>
      %s2 = tdx.softmax %m2 dim = -1 : tensor<8x8xf32>
      %t2 = tdx.matmul %s2, %w2 : (tensor<8x8xf32>, tensor<8x8xf32>) -> tensor<8x8xf32>
      %a2 = tdx.softmax %t2 dim = 0 : tensor<8x8xf32>
      %b2 = tdx.matmul %a2, %w2 : (tensor<8x8xf32>, tensor<8x8xf32>) -> tensor<8x8xf32>
      %c2 = tdx.softmax %b2 dim = -1 : tensor<8x8xf32>
      %d2 = tdx.matmul %c2, %m2 : (tensor<8x8xf32>, tensor<8x8xf32>) -> tensor<8x8xf32>
      %e2 = tdx.softmax %d2 dim = 0 : tensor<8x8xf32>
      %r2 = tdx.matmul %e2, %s2 : (tensor<8x8xf32>, tensor<8x8xf32>) -> tensor<8x8xf32>
      %w3 = tdx.param_ref @w3 : tensor<8x8xf32>
      %m3 = tdx.matmul %r2, %w3 : (tensor<8x8xf32>, tensor<8x8xf32>) -> tensor<8x8xf32>
      %s3 = tdx.softmax %m3 dim = -1 : tensor<8x8xf32>
      %t3 = tdx.matmul %s3, %w3 : (tensor<8x8xf32>, tensor<8x8xf32>) -> tensor<8x8xf32>
      %a3 = tdx.softmax %t3 dim = 0 : tensor<8x8xf32>
      %b3 = tdx.matmul %a3, %w3 : (tensor<8x8xf32>, tensor<8x8xf32>) -> tensor<8x8xf32>
      %c3 = tdx.softmax %b3 dim = -1 : tensor<8x8xf32>
      %d3 = tdx.matmul %c3, %m3 : (tensor<8x8xf32>, tensor<8x8xf32>) -> tensor<8x8xf32>
      %e3 = tdx.softmax %d3 dim = 0 : tensor<8x8xf32>
      %r3 = tdx.matmul %e3, %s3 : (tensor<8x8xf32>, tensor<8x8xf32>) -> tensor<8x8xf32>
      return %r3 : tensor<8x8xf32>
    }
}
