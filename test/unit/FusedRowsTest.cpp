//===- FusedRowsTest.cpp - the row ops that end fused CPU kernels vs ATen -===//
//
// tdx/Runtime/FusedRows.h runs a softmax, log_softmax, layer_norm or
// rms_norm on a row in place at the end of an emitted kernel; here it runs
// on the rows of tensors against ATen's own ops: row lengths below, at and
// past a vector's lanes, with and without weight and bias, strided weights,
// float and double, and a row with -inf (a masked attention row).

#include "tdx/Runtime/FusedRows.h"

#include "AtenTestUtil.h"

using tdx::test::expectClose;
using tdx::test::randn;
namespace rows = tdx::rt::rows;

namespace {

/// `x` with `fn` run on each row of its last dim, in place on a copy.
template <class T, class Fn> at::Tensor eachRow(const at::Tensor &x, Fn fn) {
  at::Tensor y = x.contiguous().clone();
  int64_t n = y.size(-1);
  T *data = y.data_ptr<T>();
  for (int64_t r = 0; r < y.numel() / n; ++r)
    fn(data + r * n, n);
  return y;
}

const int64_t kLengths[] = {1, 3, 8, 16, 37, 64};

TEST(FusedRows, SoftmaxAndLogSoftmaxMatchAten) {
  for (int64_t n : kLengths) {
    at::Tensor x = randn({5, n}, n) * 4;
    expectClose(eachRow<float>(x, [](float *y, int64_t m) { rows::softmax(y, m, false); }),
                at::softmax(x, -1));
    expectClose(eachRow<float>(x, [](float *y, int64_t m) { rows::softmax(y, m, true); }),
                at::log_softmax(x, -1));
    at::Tensor xd = x.to(at::kDouble);
    expectClose(eachRow<double>(xd, [](double *y, int64_t m) { rows::softmax(y, m, false); }),
                at::softmax(xd, -1));
  }
}

TEST(FusedRows, SoftmaxOfAMaskedRowIsZeroWhereMasked) {
  at::Tensor x = randn({4, 9}, 3);
  at::Tensor mask = at::arange(9).gt(4).expand({4, 9});
  at::Tensor masked = x.masked_fill(mask, -INFINITY);
  at::Tensor got = eachRow<float>(masked, [](float *y, int64_t m) { rows::softmax(y, m, false); });
  expectClose(got, at::softmax(masked, -1));
  EXPECT_TRUE(got.masked_select(mask).eq(0).all().item<bool>());
}

TEST(FusedRows, LayerNormMatchesAten) {
  // (Not rows of 1: there ATen's x * rstd - mean * rstd cancels to within
  // 3e-5 of the exact 0 that both compute in double.)
  for (int64_t n : {3, 8, 16, 37, 64}) {
    at::Tensor x = randn({6, n}, n + 1) * 3 + 1, w = randn({n}, n + 2), b = randn({n}, n + 3);
    expectClose(eachRow<float>(x, [&](float *y, int64_t m) {
                  rows::layerNorm(y, w.data_ptr<float>(), 1, b.data_ptr<float>(), 1, m, 1e-5);
                }),
                at::layer_norm(x, {n}, w, b, 1e-5), 1e-5, 1e-5);
    expectClose(eachRow<float>(x, [&](float *y, int64_t m) {
                  rows::layerNorm(y, nullptr, 0, nullptr, 0, m, 1e-5);
                }),
                at::layer_norm(x, {n}, {}, {}, 1e-5), 1e-5, 1e-5);
    // A weight every other element of a longer tensor, and no bias.
    at::Tensor wide = randn({2 * n}, n + 4), strided = wide.slice(0, 0, 2 * n, 2);
    expectClose(eachRow<float>(x, [&](float *y, int64_t m) {
                  rows::layerNorm(y, wide.data_ptr<float>(), 2, nullptr, 0, m, 1e-5);
                }),
                at::layer_norm(x, {n}, strided, {}, 1e-5), 1e-5, 1e-5);
  }
}

TEST(FusedRows, RmsNormMatchesItsFormula) {
  for (int64_t n : kLengths) {
    at::Tensor x = randn({6, n}, n + 5), w = randn({n}, n + 6);
    at::Tensor want = x * at::rsqrt(x.pow(2).mean(-1, true) + 1e-6);
    expectClose(eachRow<float>(x, [&](float *y, int64_t m) {
                  rows::rmsNorm(y, nullptr, 0, m, 1e-6);
                }),
                want);
    expectClose(eachRow<float>(x, [&](float *y, int64_t m) {
                  rows::rmsNorm(y, w.data_ptr<float>(), 1, m, 1e-6);
                }),
                want * w);
  }
}

} // namespace
