//===- Conv.cu - convolution (im2col + cuBLAS) and pooling ----------------===//
//
// The element functions are tdx/Runtime/Conv.h's, which the host unit tests
// run against ATen.
//
//===----------------------------------------------------------------------===//

#include "Blas.cuh"

#include "tdx/Runtime/Conv.h"

using namespace tdx::cu;
using namespace tdx::cu::detail;
using tdx::kern::Window;

namespace {

template <class T>
__global__ void im2colKernel(Window g, const T *x, T *cols, int64_t rows, int64_t cols_) {
  int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (i < rows * cols_)
    cols[i] = tdx::kern::im2colAt(g, x, i / cols_, i % cols_);
}

template <class T>
__global__ void channelBiasKernel(T *y, const T *bias, int64_t channels, int64_t plane,
                                  int64_t total) {
  int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (i < total)
    y[i] += bias[(i / plane) % channels];
}

template <class T>
__global__ void poolKernel(Window g, const T *x, T *y, int64_t planes, bool isMax,
                           bool countIncludePad) {
  int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  int64_t per = g.oh * g.ow;
  if (i >= planes * per)
    return;
  const T *plane = x + (i / per) * g.h * g.w;
  int64_t oy = (i % per) / g.ow, ox = i % g.ow;
  y[i] = isMax ? tdx::kern::maxPoolAt(g, plane, oy, ox)
               : tdx::kern::avgPoolAt(g, plane, oy, ox, countIncludePad);
}

void need(bool ok, const std::string &what) {
  if (!ok)
    throw std::runtime_error("tdx: " + what);
}

/// The window of a pooling over [N, C, H, W].
Window poolWindow(const Tensor &x, const std::vector<int64_t> &kernel,
                  const std::vector<int64_t> &stride, const std::vector<int64_t> &padding,
                  const std::vector<int64_t> &dilation, bool ceilMode) {
  need(x.dim() == 4 && kernel.size() == 2 && stride.size() == 2 && padding.size() == 2 &&
           dilation.size() == 2,
       "pooling takes [N, C, H, W] and 2-D window parameters");
  Window g;
  g.c = x.size(1);
  g.h = x.size(2);
  g.w = x.size(3);
  g.kh = kernel[0];
  g.kw = kernel[1];
  g.sh = stride[0];
  g.sw = stride[1];
  g.ph = padding[0];
  g.pw = padding[1];
  g.dh = dilation[0];
  g.dw = dilation[1];
  g.oh = tdx::kern::windowOutputSize(g.h, g.kh, g.sh, g.ph, g.dh, ceilMode);
  g.ow = tdx::kern::windowOutputSize(g.w, g.kw, g.sw, g.pw, g.dw, ceilMode);
  return g;
}

Tensor pool(const Tensor &x0, const Window &g, bool isMax, bool countIncludePad, const char *op) {
  Tensor x = x0.contiguous();
  Tensor y = Tensor::empty({x.size(0), x.size(1), g.oh, g.ow}, x.dtype());
  int64_t planes = x.size(0) * x.size(1);
  floatTypes(x.dtype(), op, [&](auto tag) {
    using T = decltype(tag);
    poolKernel<T><<<blocksFor(planes * g.oh * g.ow), 256>>>(
        g, static_cast<const T *>(x.data()), static_cast<T *>(y.data()), planes, isMax,
        countIncludePad);
  });
  checkLaunch(op);
  return y;
}

} // namespace

Tensor tdx::cu::convolution(const Tensor &x0, const Tensor &w0, const Tensor &bias,
                            const std::vector<int64_t> &stride,
                            const std::vector<int64_t> &padding,
                            const std::vector<int64_t> &dilation, bool transposed,
                            const std::vector<int64_t> &outputPadding, int64_t groups) {
  need(!transposed, "convolution: transposed convolution is not supported by the CUDA backend");
  need(x0.dim() == 3 || x0.dim() == 4, "convolution: input must be [N, C, L] or [N, C, H, W]");
  int64_t spatial = x0.dim() - 2;
  need(static_cast<int64_t>(stride.size()) == spatial &&
           static_cast<int64_t>(padding.size()) == spatial &&
           static_cast<int64_t>(dilation.size()) == spatial && w0.dim() == x0.dim(),
       "convolution: stride, padding, dilation and the weight must match the input's rank");
  // 1-D as 2-D with a height of 1.
  Tensor x = x0.contiguous(), w = w0.contiguous();
  Window g;
  g.c = x.size(1);
  if (spatial == 2) {
    g.h = x.size(2);
    g.kh = w.size(2);
    g.sh = stride[0];
    g.ph = padding[0];
    g.dh = dilation[0];
  }
  g.w = x.size(-1);
  g.kw = w.size(-1);
  g.sw = stride.back();
  g.pw = padding.back();
  g.dw = dilation.back();
  g.oh = tdx::kern::windowOutputSize(g.h, g.kh, g.sh, g.ph, g.dh, false);
  g.ow = tdx::kern::windowOutputSize(g.w, g.kw, g.sw, g.pw, g.dw, false);
  int64_t n = x.size(0), o = w.size(0);
  need(groups >= 1 && g.c % groups == 0 && o % groups == 0 && w.size(1) * groups == g.c,
       "convolution: channels, weight and groups do not fit");
  int64_t k = g.c / groups * g.kh * g.kw, l = g.oh * g.ow, og = o / groups;
  std::vector<int64_t> shape = {n, o};
  if (spatial == 2)
    shape.push_back(g.oh);
  shape.push_back(g.ow);
  Tensor y = Tensor::empty(shape, x.dtype());
  Tensor cols = Tensor::empty({groups * k, l}, x.dtype());
  floatTypes(x.dtype(), "convolution", [&](auto tag) {
    using T = decltype(tag);
    const T *xp = static_cast<const T *>(x.data());
    T *yp = static_cast<T *>(y.data()), *cp = static_cast<T *>(cols.data());
    for (int64_t b = 0; b < n; ++b) {
      im2colKernel<T><<<blocksFor(groups * k * l), 256>>>(g, xp + b * g.c * g.h * g.w, cp,
                                                          groups * k, l);
      checkLaunch("im2col");
      // y[b, g] = W[g] [og x k] @ cols[g] [k x l], all groups at once.
      gemm<T>(static_cast<const T *>(w.data()), cp, yp + b * o * l, og, l, k, groups, false);
    }
    if (bias.defined()) {
      Tensor bc = bias.contiguous();
      channelBiasKernel<T><<<blocksFor(y.numel()), 256>>>(yp, static_cast<const T *>(bc.data()),
                                                          o, l, y.numel());
      checkLaunch("convolution bias");
    }
  });
  return y;
}

Tensor tdx::cu::max_pool2d(const Tensor &x, const std::vector<int64_t> &kernel,
                           const std::vector<int64_t> &stride, const std::vector<int64_t> &padding,
                           const std::vector<int64_t> &dilation, bool ceilMode) {
  return pool(x, poolWindow(x, kernel, stride, padding, dilation, ceilMode), true, false,
              "max_pool2d");
}

Tensor tdx::cu::avg_pool2d(const Tensor &x, const std::vector<int64_t> &kernel,
                           const std::vector<int64_t> &stride, const std::vector<int64_t> &padding,
                           bool ceilMode, bool countIncludePad) {
  return pool(x, poolWindow(x, kernel, stride, padding, {1, 1}, ceilMode), false,
              countIncludePad, "avg_pool2d");
}
