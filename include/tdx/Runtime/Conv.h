//===- Conv.h - convolution and pooling elements, host and device -*- C++ -*-===//
//
// The CUDA backend computes a convolution as im2col + one cuBLAS gemm per
// batch element (all groups in one strided batch), and pooling one output
// element per thread. The element functions below are `__host__ __device__`:
// lib/Runtime/cuda launches them, and the unit tests (test/unit/ConvTest.cpp)
// run the same functions on the CPU against ATen.
//
//===----------------------------------------------------------------------===//

#ifndef TDX_RUNTIME_CONV_H
#define TDX_RUNTIME_CONV_H

#include "tdx/Runtime/Kernel.h"

namespace tdx::kern {

/// One 2-D window geometry (1-D: h = kh = oh = 1, stride/dilation 1 there).
struct Window {
  int64_t c = 0, h = 1, w = 1;       // input channels and size
  int64_t kh = 1, kw = 1;            // kernel
  int64_t oh = 1, ow = 1;            // output size
  int64_t sh = 1, sw = 1, ph = 0, pw = 0, dh = 1, dw = 1;
};

/// The output size of a window over `in` elements (ATen's
/// pooling_output_shape; convolution uses it with ceilMode = false).
TDX_HD inline int64_t windowOutputSize(int64_t in, int64_t k, int64_t s, int64_t p, int64_t d,
                                       bool ceilMode) {
  int64_t span = in + 2 * p - d * (k - 1) - 1;
  int64_t out = (span + (ceilMode ? s - 1 : 0)) / s + 1;
  if (ceilMode && (out - 1) * s >= in + p)
    --out;
  return out;
}

/// Element (row, col) of the im2col matrix of one image `x` ([c, h, w],
/// dense): row = channel * kh * kw + ky * kw + kx, col = oy * ow + ox; zero
/// where the window reads padding. Rows of group g are [g*K, (g+1)*K) with
/// K = c / groups * kh * kw, matching the weight's [O, c / groups, kh, kw].
template <class T> TDX_HD T im2colAt(const Window &g, const T *x, int64_t row, int64_t col) {
  int64_t ch = row / (g.kh * g.kw), r = row % (g.kh * g.kw);
  int64_t ky = r / g.kw, kx = r % g.kw;
  int64_t oy = col / g.ow, ox = col % g.ow;
  int64_t iy = oy * g.sh - g.ph + ky * g.dh, ix = ox * g.sw - g.pw + kx * g.dw;
  if (iy < 0 || iy >= g.h || ix < 0 || ix >= g.w)
    return T(0);
  return x[(ch * g.h + iy) * g.w + ix];
}

/// Element (ch, iy, ix) of the input gradient of one image from the
/// gradient of its im2col matrix `cols` ([c * kh * kw, oh * ow], dense): the
/// sum of the columns that read that element, kernel positions (ky, kx) in
/// ascending order (col2im as a gather: deterministic, no atomics).
template <class T>
TDX_HD T col2imAt(const Window &g, const T *cols, int64_t ch, int64_t iy, int64_t ix) {
  T sum = T(0);
  int64_t l = g.oh * g.ow;
  for (int64_t ky = 0; ky < g.kh; ++ky) {
    int64_t ty = iy + g.ph - ky * g.dh;
    if (ty < 0 || ty % g.sh != 0 || ty / g.sh >= g.oh)
      continue;
    for (int64_t kx = 0; kx < g.kw; ++kx) {
      int64_t tx = ix + g.pw - kx * g.dw;
      if (tx < 0 || tx % g.sw != 0 || tx / g.sw >= g.ow)
        continue;
      sum += cols[((ch * g.kh + ky) * g.kw + kx) * l + (ty / g.sh) * g.ow + tx / g.sw];
    }
  }
  return sum;
}

/// Max pooling of output element (oy, ox) of one channel plane `x` ([h, w])
/// as ATen's max_pool2d_with_indices computes it: padding is ignored, NaN
/// wins. Returns the maximum's flat index (iy * w + ix: the first maximum
/// in window order, the last NaN if there is one) and sets `best` to it.
template <class T>
TDX_HD int64_t maxPoolAt(const Window &g, const T *x, int64_t oy, int64_t ox, T &best) {
  int64_t y0 = oy * g.sh - g.ph, x0 = ox * g.sw - g.pw;
  while (y0 < 0)
    y0 += g.dh;
  while (x0 < 0)
    x0 += g.dw;
  int64_t index = y0 * g.w + x0;
  best = -INFINITY;
  for (int64_t ky = 0; ky < g.kh; ++ky)
    for (int64_t kx = 0; kx < g.kw; ++kx) {
      int64_t iy = oy * g.sh - g.ph + ky * g.dh, ix = ox * g.sw - g.pw + kx * g.dw;
      if (iy < 0 || iy >= g.h || ix < 0 || ix >= g.w)
        continue;
      T v = x[iy * g.w + ix];
      if (v > best || v != v) {
        best = v;
        index = iy * g.w + ix;
      }
    }
  return index;
}

/// Element (iy, ix) of the input gradient of a max pooling of one plane:
/// the output gradients `dy` ([oh, ow]) of the windows whose maximum
/// (`indices`, flat as maxPoolAt returns them) is that element, summed in output
/// order from zero (as ATen's backward adds them; a gather, no atomics).
template <class T>
TDX_HD T maxPoolBackwardAt(const Window &g, const T *dy, const int64_t *indices, int64_t iy,
                           int64_t ix) {
  // The windows that can hold (iy, ix): a superset, the index decides.
  int64_t top = iy + g.ph - (g.kh - 1) * g.dh, left = ix + g.pw - (g.kw - 1) * g.dw;
  int64_t oy0 = top <= 0 ? 0 : top / g.sh, ox0 = left <= 0 ? 0 : left / g.sw;
  int64_t oy1 = (iy + g.ph) / g.sh, ox1 = (ix + g.pw) / g.sw;
  oy1 = oy1 < g.oh - 1 ? oy1 : g.oh - 1;
  ox1 = ox1 < g.ow - 1 ? ox1 : g.ow - 1;
  int64_t self = iy * g.w + ix;
  T sum = T(0);
  for (int64_t oy = oy0; oy <= oy1; ++oy)
    for (int64_t ox = ox0; ox <= ox1; ++ox)
      if (indices[oy * g.ow + ox] == self)
        sum += dy[oy * g.ow + ox];
  return sum;
}

/// Average pooling of output element (oy, ox) of one plane (ATen's
/// avg_pool2d: the divisor is the window clipped to the padded input with
/// `countIncludePad`, else the input elements in it).
template <class T>
TDX_HD T avgPoolAt(const Window &g, const T *x, int64_t oy, int64_t ox, bool countIncludePad) {
  int64_t y0 = oy * g.sh - g.ph, x0 = ox * g.sw - g.pw;
  int64_t y1 = y0 + g.kh < g.h + g.ph ? y0 + g.kh : g.h + g.ph;
  int64_t x1 = x0 + g.kw < g.w + g.pw ? x0 + g.kw : g.w + g.pw;
  int64_t padded = (y1 - y0) * (x1 - x0);
  y0 = y0 < 0 ? 0 : y0;
  x0 = x0 < 0 ? 0 : x0;
  y1 = y1 < g.h ? y1 : g.h;
  x1 = x1 < g.w ? x1 : g.w;
  T sum = T(0);
  for (int64_t iy = y0; iy < y1; ++iy)
    for (int64_t ix = x0; ix < x1; ++ix)
      sum += x[iy * g.w + ix];
  int64_t divisor = countIncludePad ? padded : (y1 - y0) * (x1 - x0);
  return sum / static_cast<T>(divisor);
}

} // namespace tdx::kern

#endif // TDX_RUNTIME_CONV_H
