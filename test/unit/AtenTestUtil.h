//===- AtenTestUtil.h - ATen helpers of the host kernel tests ---*- C++ -*-===//

#ifndef TDX_TEST_UNIT_ATENTESTUTIL_H
#define TDX_TEST_UNIT_ATENTESTUTIL_H

#include <ATen/ATen.h>
#include <gtest/gtest.h>

namespace tdx::test {

/// A standard-normal tensor from its own seeded generator.
inline at::Tensor randn(std::vector<int64_t> shape, int64_t seed) {
  return at::randn(shape, at::make_generator<at::CPUGeneratorImpl>(seed));
}

/// `got` equals `want` in shape and within float32 rounding.
inline void expectClose(const at::Tensor &got, const at::Tensor &want, double rtol = 1e-5,
                        double atol = 1e-6) {
  ASSERT_EQ(got.sizes(), want.sizes());
  EXPECT_TRUE(at::allclose(got, want, rtol, atol))
      << "max abs difference " << (got - want).abs().max().item<double>();
}

} // namespace tdx::test

#endif // TDX_TEST_UNIT_ATENTESTUTIL_H
