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

/// conv2d as the CUDA backend computes it: im2col, then W[g] @ cols[g].
at::Tensor im2colConv(const at::Tensor &x, const at::Tensor &w, std::vector<int64_t> s,
                      std::vector<int64_t> p, std::vector<int64_t> d, int64_t groups) {
  Window g;
  g.c = x.size(1), g.h = x.size(2), g.w = x.size(3);
  g.kh = w.size(2), g.kw = w.size(3);
  g.sh = s[0], g.sw = s[1], g.ph = p[0], g.pw = p[1], g.dh = d[0], g.dw = d[1];
  g.oh = windowOutputSize(g.h, g.kh, g.sh, g.ph, g.dh, false);
  g.ow = windowOutputSize(g.w, g.kw, g.sw, g.pw, g.dw, false);
  int64_t k = g.c / groups * g.kh * g.kw, l = g.oh * g.ow, o = w.size(0);
  at::Tensor y = at::empty({x.size(0), o, g.oh, g.ow});
  at::Tensor cols = at::empty({groups * k, l});
  for (int64_t b = 0; b < x.size(0); ++b) {
    at::Tensor image = x[b].contiguous();
    for (int64_t r = 0; r < groups * k; ++r)
      for (int64_t c = 0; c < l; ++c)
        cols.data_ptr<float>()[r * l + c] = im2colAt(g, image.data_ptr<float>(), r, c);
    at::Tensor wg = w.reshape({groups, o / groups, k});
    y[b] = at::bmm(wg, cols.reshape({groups, k, l})).reshape({o, g.oh, g.ow});
  }
  return y;
}

} // namespace

TEST(ConvTest, Im2colTimesWeightIsConvolution) {
  struct Case {
    std::vector<int64_t> x, w, s, p, d;
    int64_t groups;
  } cases[] = {
      {{2, 3, 9, 7}, {4, 3, 3, 3}, {1, 1}, {0, 0}, {1, 1}, 1},
      {{2, 4, 10, 10}, {6, 2, 3, 3}, {2, 2}, {1, 1}, {1, 1}, 2},  // groups, stride, padding
      {{1, 6, 9, 9}, {6, 1, 3, 3}, {1, 1}, {2, 2}, {2, 2}, 6},    // depthwise, dilation
      {{2, 3, 8, 8}, {5, 3, 4, 2}, {4, 4}, {0, 1}, {1, 1}, 1},    // patchify, uneven kernel
  };
  for (const Case &c : cases) {
    at::Tensor x = randn(c.x, 1), w = randn(c.w, 2);
    expectClose(im2colConv(x, w, c.s, c.p, c.d, c.groups),
                at::convolution(x, w, {}, c.s, c.p, c.d, false, {0, 0}, c.groups), 1e-5, 1e-5);
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
            got.data_ptr<float>()[(plane * g.oh + oy) * g.ow + ox] =
                isMax ? maxPoolAt(g, in, oy, ox) : avgPoolAt(g, in, oy, ox, countPad);
          }
      expectClose(got, want, 1e-5, 1e-5);
    }
}
