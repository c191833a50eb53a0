//===- RowsTest.cpp - the CUDA backend's row kernels, run on CPU vs ATen ---===//
//
// The functions of tdx/Runtime/Rows.h are what lib/Runtime/cuda launches one
// row per thread; here the same functions run on the host against ATen.

#include "tdx/Runtime/Box.h"
#include "tdx/Runtime/Rows.h"

#include "AtenTestUtil.h"

using namespace tdx::kern;
using tdx::test::expectClose;
using tdx::test::randn;

TEST(RowsTest, SoftmaxAndLogSoftmaxAlongEveryDim) {
  at::Tensor x = randn({3, 5, 7}, 1) * 4;
  for (int64_t dim = 0; dim < 3; ++dim)
    for (bool log : {false, true}) {
      at::Tensor y = at::empty_like(x);
      int64_t n = x.size(dim), stride = x.stride(dim);
      // Every row along `dim`: the elements whose index there is 0.
      for (int64_t i = 0; i < x.numel(); ++i)
        if ((i / stride) % n == 0)
          softmaxRow(x.data_ptr<float>() + i, y.data_ptr<float>() + i, n, stride, log);
      expectClose(y, log ? at::log_softmax(x, dim) : at::softmax(x, dim));
    }
}

TEST(RowsTest, LayerNormWithAndWithoutAffine) {
  at::Tensor x = randn({6, 32}, 2) * 3 + 1, w = randn({32}, 3), b = randn({32}, 4);
  at::Tensor y = at::empty_like(x), z = at::empty_like(x);
  for (int64_t r = 0; r < 6; ++r) {
    layerNormRow(x.data_ptr<float>() + r * 32, w.data_ptr<float>(), b.data_ptr<float>(),
                 y.data_ptr<float>() + r * 32, 32, 1e-5);
    layerNormRow<float>(x.data_ptr<float>() + r * 32, nullptr, nullptr,
                        z.data_ptr<float>() + r * 32, 32, 1e-5);
  }
  expectClose(y, at::layer_norm(x, {32}, w, b, 1e-5));
  expectClose(z, at::layer_norm(x, {32}, {}, {}, 1e-5));
}

TEST(RowsTest, RmsNorm) {
  at::Tensor x = randn({4, 16}, 5), w = randn({16}, 6), y = at::empty_like(x);
  for (int64_t r = 0; r < 4; ++r)
    rmsNormRow(x.data_ptr<float>() + r * 16, w.data_ptr<float>(), y.data_ptr<float>() + r * 16,
               16, 1e-6);
  expectClose(y, x * at::rsqrt(x.pow(2).mean({-1}, true) + 1e-6) * w);
}

TEST(RowsTest, Reductions) {
  at::Tensor x = randn({5, 9}, 7);
  for (int kind : {RowSum, RowMean, RowMax}) {
    at::Tensor y = at::empty({9});
    for (int64_t c = 0; c < 9; ++c)
      y[c] = reduceRow(kind, x.data_ptr<float>() + c, 5, 9);
    at::Tensor want = kind == RowSum ? x.sum(0) : kind == RowMean ? x.mean(0) : x.amax(0);
    expectClose(y, want);
  }
  float nan[] = {1.0f, NAN, 3.0f};
  EXPECT_TRUE(std::isnan(reduceRow(RowMax, nan, 3, 1)));
}

TEST(RowsTest, CrossEntropyWithSmoothingAndIgnoredTargets) {
  at::Tensor logits = randn({8, 11}, 8) * 2;
  at::Tensor target = at::randint(0, 11, {8}, at::make_generator<at::CPUGeneratorImpl>(9));
  target[3] = -100;
  for (double smoothing : {0.0, 0.1}) {
    double total = 0;
    int64_t counted = 0;
    for (int64_t r = 0; r < 8; ++r) {
      int64_t t = target[r].item<int64_t>();
      if (t == -100)
        continue;
      total += crossEntropyRow(logits.data_ptr<float>() + r * 11, 11, 1, t, smoothing);
      ++counted;
    }
    double want =
        at::cross_entropy_loss(logits, target, {}, at::Reduction::Mean, -100, smoothing).item<double>();
    EXPECT_NEAR(total / counted, want, 1e-5 * std::abs(want));
  }
}

TEST(RowsTest, IterWalksBroadcastAndTransposedOperands) {
  at::Tensor a = randn({4, 6}, 10).t(), b = randn({6, 1}, 11);
  Iter it;
  it.rank = 2;
  it.operands = 2;
  it.shape[0] = 6, it.shape[1] = 4;
  it.numel = 24;
  at::Tensor bx = b.expand({6, 4});
  for (int d = 0; d < 2; ++d) {
    it.strides[0][d] = a.stride(d);
    it.strides[1][d] = bx.stride(d);
  }
  it.data[0] = a.data_ptr();
  it.data[1] = b.data_ptr();
  at::Tensor y = at::empty({6, 4});
  for (int64_t i = 0; i < 24; ++i)
    y.data_ptr<float>()[i] = it.at<float>(0, i) * it.at<float>(1, i);
  expectClose(y, a * b);
}

TEST(RowsTest, BoxRunsCoverTheBoxInOrder) {
  at::Tensor g = at::arange(4 * 6 * 5, at::kFloat).reshape({4, 6, 5});
  std::vector<std::vector<int64_t>> offsets = {{1, 2, 0}, {0, 0, 0}, {2, 0, 0}, {0, 3, 1}};
  std::vector<std::vector<int64_t>> sizes = {{2, 3, 5}, {4, 6, 5}, {1, 6, 5}, {4, 2, 3}};
  for (size_t c = 0; c < offsets.size(); ++c) {
    at::Tensor want = g;
    for (int64_t d = 0; d < 3; ++d)
      want = want.narrow(d, offsets[c][d], sizes[c][d]);
    at::Tensor got = at::empty(sizes[c]);
    tdx::rt::forEachBoxRun({4, 6, 5}, offsets[c], sizes[c], [&](int64_t gl, int64_t lo, int64_t n) {
      std::memcpy(got.data_ptr<float>() + lo, g.data_ptr<float>() + gl, n * sizeof(float));
    });
    EXPECT_TRUE(at::equal(got, want.contiguous())) << "case " << c;
  }
}
