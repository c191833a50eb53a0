//===- ConvTest.cpp - the CUDA backend's conv/pool elements, on CPU vs ATen ===//
//
// tdx/Runtime/Conv.h is what lib/Runtime/cuda/Conv.cu launches; here the
// same functions run on the host: im2col times the weight (as the CUDA
// gemm does, group by group) against at::convolution, and the pooling
// elements against at::max_pool2d / at::avg_pool2d.

#include "tdx/Runtime/Conv.h"

#include "AtenTestUtil.h"

using namespace tdx::kern;
using tdx::test::expectClose;
using tdx::test::randn;

namespace {

/// The window of conv2d of x by w.
Window convWindow(const at::Tensor &x, const at::Tensor &w, std::vector<int64_t> s,
                  std::vector<int64_t> p, std::vector<int64_t> d) {
  Window g;
  g.c = x.size(1), g.h = x.size(2), g.w = x.size(3);
  g.kh = w.size(2), g.kw = w.size(3);
  g.sh = s[0], g.sw = s[1], g.ph = p[0], g.pw = p[1], g.dh = d[0], g.dw = d[1];
  g.oh = windowOutputSize(g.h, g.kh, g.sh, g.ph, g.dh, false);
  g.ow = windowOutputSize(g.w, g.kw, g.sw, g.pw, g.dw, false);
  return g;
}

/// The im2col matrix of image b of x.
at::Tensor im2col(const Window &g, const at::Tensor &x, int64_t b) {
  int64_t rows = g.c * g.kh * g.kw, l = g.oh * g.ow;
  at::Tensor image = x[b].contiguous(), cols = at::empty({rows, l});
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t c = 0; c < l; ++c)
      cols.data_ptr<float>()[r * l + c] = im2colAt(g, image.data_ptr<float>(), r, c);
  return cols;
}

/// conv2d as the CUDA backend computes it: im2col, then W[g] @ cols[g].
at::Tensor im2colConv(const at::Tensor &x, const at::Tensor &w, std::vector<int64_t> s,
                      std::vector<int64_t> p, std::vector<int64_t> d, int64_t groups) {
  Window g = convWindow(x, w, s, p, d);
  int64_t k = g.c / groups * g.kh * g.kw, l = g.oh * g.ow, o = w.size(0);
  at::Tensor y = at::empty({x.size(0), o, g.oh, g.ow});
  at::Tensor wg = w.reshape({groups, o / groups, k});
  for (int64_t b = 0; b < x.size(0); ++b)
    y[b] = at::bmm(wg, im2col(g, x, b).reshape({groups, k, l})).reshape({o, g.oh, g.ow});
  return y;
}

/// Convolutions (input, weight, stride, padding, dilation, groups) the
/// forward and backward tests run.
struct ConvCase {
  std::vector<int64_t> x, w, s, p, d;
  int64_t groups;
};
const ConvCase kConvCases[] = {
    {{2, 3, 9, 7}, {4, 3, 3, 3}, {1, 1}, {0, 0}, {1, 1}, 1},
    {{2, 4, 10, 10}, {6, 2, 3, 3}, {2, 2}, {1, 1}, {1, 1}, 2}, // groups, stride, padding
    {{1, 6, 9, 9}, {6, 1, 3, 3}, {1, 1}, {2, 2}, {2, 2}, 6},   // depthwise, dilation
    {{2, 3, 8, 8}, {5, 3, 4, 2}, {4, 4}, {0, 1}, {1, 1}, 1},   // patchify, uneven kernel
    {{2, 3, 11, 9}, {4, 3, 7, 7}, {2, 2}, {3, 3}, {1, 1}, 1},  // ResNet's stem
};

} // namespace

TEST(ConvTest, Im2colTimesWeightIsConvolution) {
  for (const ConvCase &c : kConvCases) {
    at::Tensor x = randn(c.x, 1), w = randn(c.w, 2);
    expectClose(im2colConv(x, w, c.s, c.p, c.d, c.groups),
                at::convolution(x, w, {}, c.s, c.p, c.d, false, {0, 0}, c.groups), 1e-5, 1e-5);
  }
}

/// convolution_backward as the CUDA backend computes it, image by image:
/// dW[g] += dY[g] cols[g]^T, dcols[g] = W[g]^T dY[g] and col2im of it,
/// the bias gradient a sum per channel; against ATen's.
TEST(ConvTest, Col2imAndGemmsAreConvolutionBackward) {
  for (const ConvCase &c : kConvCases) {
    at::Tensor x = randn(c.x, 1), w = randn(c.w, 2);
    Window g = convWindow(x, w, c.s, c.p, c.d);
    int64_t o = w.size(0), og = o / c.groups, k = g.c / c.groups * g.kh * g.kw, l = g.oh * g.ow;
    at::Tensor dy = randn({x.size(0), o, g.oh, g.ow}, 3);
    auto [dx0, dw0, db0] = at::convolution_backward(dy, x, w, at::IntArrayRef{o}, c.s, c.p, c.d,
                                                    false, {0, 0}, c.groups, {true, true, true});
    at::Tensor dw = at::zeros({c.groups, og, k}), dx = at::empty_like(x);
    at::Tensor wg = w.reshape({c.groups, og, k});
    for (int64_t b = 0; b < x.size(0); ++b) {
      at::Tensor cols = im2col(g, x, b).reshape({c.groups, k, l});
      at::Tensor dyb = dy[b].reshape({c.groups, og, l});
      dw += at::bmm(dyb, cols.transpose(1, 2));
      at::Tensor dcols = at::bmm(wg.transpose(1, 2), dyb).contiguous();
      for (int64_t ch = 0; ch < g.c; ++ch)
        for (int64_t iy = 0; iy < g.h; ++iy)
          for (int64_t ix = 0; ix < g.w; ++ix)
            dx[b][ch][iy][ix] = col2imAt(g, dcols.data_ptr<float>(), ch, iy, ix);
    }
    expectClose(dx, dx0, 1e-5, 1e-5);
    expectClose(dw.reshape(w.sizes()), dw0, 1e-5, 1e-5);
    expectClose(dy.sum({0, 2, 3}), db0, 1e-5, 1e-5);
  }
}

/// max_pool2d_with_indices' indices (ties: the first in window order) and
/// its backward's gather, against ATen's, overlapping windows included.
TEST(ConvTest, MaxPoolIndicesAndBackwardMatchATen) {
  at::Tensor x = randn({2, 3, 9, 8}, 4);
  x.index_put_({0, 0, 2}, 1.5f); // a row of ties
  struct Case {
    std::vector<int64_t> k, s, p, d;
    bool ceil;
  } cases[] = {{{3, 3}, {2, 2}, {1, 1}, {1, 1}, false},  // ResNet's
               {{2, 2}, {2, 2}, {0, 0}, {1, 1}, true},
               {{3, 2}, {1, 2}, {1, 0}, {1, 1}, true},
               {{3, 3}, {2, 2}, {1, 1}, {2, 2}, false}};
  for (const Case &c : cases) {
    Window g;
    g.c = 3, g.h = 9, g.w = 8, g.kh = c.k[0], g.kw = c.k[1], g.sh = c.s[0], g.sw = c.s[1];
    g.ph = c.p[0], g.pw = c.p[1], g.dh = c.d[0], g.dw = c.d[1];
    g.oh = windowOutputSize(g.h, g.kh, g.sh, g.ph, g.dh, c.ceil);
    g.ow = windowOutputSize(g.w, g.kw, g.sw, g.pw, g.dw, c.ceil);
    auto [y0, indices0] = at::max_pool2d_with_indices(x, c.k, c.s, c.p, c.d, c.ceil);
    at::Tensor dy = randn(y0.sizes().vec(), 5);
    at::Tensor dx0 = at::max_pool2d_with_indices_backward(dy, x, c.k, c.s, c.p, c.d, c.ceil,
                                                          indices0);
    at::Tensor y = at::empty_like(y0), indices = at::empty_like(indices0), dx = at::empty_like(x);
    int64_t out = g.oh * g.ow;
    for (int64_t plane = 0; plane < 6; ++plane) {
      const float *in = x.data_ptr<float>() + plane * 72;
      for (int64_t i = 0; i < out; ++i)
        indices.data_ptr<int64_t>()[plane * out + i] =
            maxPoolAt(g, in, i / g.ow, i % g.ow, y.data_ptr<float>()[plane * out + i]);
      for (int64_t i = 0; i < 72; ++i)
        dx.data_ptr<float>()[plane * 72 + i] =
            maxPoolBackwardAt(g, dy.data_ptr<float>() + plane * out,
                              indices0.data_ptr<int64_t>() + plane * out, i / g.w, i % g.w);
    }
    EXPECT_TRUE(at::equal(y, y0));
    EXPECT_TRUE(at::equal(indices, indices0));
    // The same additions in the same order: bitwise.
    EXPECT_TRUE(at::equal(dx, dx0)) << "max abs difference " << (dx - dx0).abs().max().item<double>();
  }
}

TEST(ConvTest, PoolingElementsMatchATen) {
  at::Tensor x = randn({2, 3, 9, 8}, 3);
  struct Case {
    std::vector<int64_t> k, s, p, d;
    bool ceil;
  } cases[] = {{{3, 3}, {2, 2}, {1, 1}, {1, 1}, false},
               {{2, 2}, {2, 2}, {0, 0}, {1, 1}, true},
               {{3, 2}, {1, 2}, {1, 0}, {1, 1}, true},
               {{3, 3}, {2, 2}, {1, 1}, {2, 2}, false}};
  for (const Case &c : cases)
    for (int kind = 0; kind < 3; ++kind) {
      bool isMax = kind == 0, countPad = kind == 2;
      if (!isMax && c.d[0] != 1)
        continue;
      Window g;
      g.c = 3, g.h = 9, g.w = 8, g.kh = c.k[0], g.kw = c.k[1], g.sh = c.s[0], g.sw = c.s[1];
      g.ph = c.p[0], g.pw = c.p[1], g.dh = c.d[0], g.dw = c.d[1];
      g.oh = windowOutputSize(g.h, g.kh, g.sh, g.ph, g.dh, c.ceil);
      g.ow = windowOutputSize(g.w, g.kw, g.sw, g.pw, g.dw, c.ceil);
      at::Tensor want = isMax ? at::max_pool2d(x, c.k, c.s, c.p, c.d, c.ceil)
                              : at::avg_pool2d(x, c.k, c.s, c.p, c.ceil, countPad);
      at::Tensor got = at::empty({2, 3, g.oh, g.ow});
      for (int64_t plane = 0; plane < 6; ++plane)
        for (int64_t oy = 0; oy < g.oh; ++oy)
          for (int64_t ox = 0; ox < g.ow; ++ox) {
            const float *in = x.data_ptr<float>() + plane * 72;
            float &out = got.data_ptr<float>()[(plane * g.oh + oy) * g.ow + ox];
            if (isMax)
              maxPoolAt(g, in, oy, ox, out);
            else
              out = avgPoolAt(g, in, oy, ox, countPad);
          }
      expectClose(got, want, 1e-5, 1e-5);
    }
}
