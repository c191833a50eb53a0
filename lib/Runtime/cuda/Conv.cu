//===- Conv.cu - convolution (im2col + cuBLAS) and pooling ----------------===//
//
// Forward and backward (the AtenOps.def rows convolution_backward,
// max_pool2d_with_indices and its backward). The element functions are
// tdx/Runtime/Conv.h's, which the host unit tests run against ATen.
//
//===----------------------------------------------------------------------===//

#include "AtenArgs.cuh"
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

/// Pooling, one thread per output element; a max pooling also writes each
/// maximum's flat index where `indices` is given.
template <class T>
__global__ void poolKernel(Window g, const T *x, T *y, int64_t *indices, int64_t planes,
                           bool isMax, bool countIncludePad) {
  int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  int64_t per = g.oh * g.ow;
  if (i >= planes * per)
    return;
  const T *plane = x + (i / per) * g.h * g.w;
  int64_t oy = (i % per) / g.ow, ox = i % g.ow;
  if (!isMax) {
    y[i] = tdx::kern::avgPoolAt(g, plane, oy, ox, countIncludePad);
    return;
  }
  int64_t at = tdx::kern::maxPoolAt(g, plane, oy, ox, y[i]);
  if (indices)
    indices[i] = at;
}

/// dx of one image [c, h, w] from its im2col gradient (a gather per element).
template <class T>
__global__ void col2imKernel(Window g, const T *cols, T *dx) {
  int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (i < g.c * g.h * g.w)
    dx[i] = tdx::kern::col2imAt(g, cols, i / (g.h * g.w), (i / g.w) % g.h, i % g.w);
}

/// The bias gradient: each channel's sum over the batch and positions, in
/// that order (one thread per channel, deterministic).
template <class T>
__global__ void channelSumKernel(const T *dy, T *db, int64_t n, int64_t channels, int64_t plane) {
  int64_t c = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (c >= channels)
    return;
  double sum = 0;
  for (int64_t b = 0; b < n; ++b)
    for (int64_t l = 0; l < plane; ++l)
      sum += static_cast<double>(dy[(b * channels + c) * plane + l]);
  db[c] = static_cast<T>(sum);
}

/// max_pool2d_with_indices_backward: one thread per input element.
template <class T>
__global__ void maxPoolBackwardKernel(Window g, const T *dy, const int64_t *indices, T *dx,
                                      int64_t planes) {
  int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  int64_t per = g.h * g.w;
  if (i >= planes * per)
    return;
  int64_t p = i / per, out = g.oh * g.ow;
  dx[i] = tdx::kern::maxPoolBackwardAt(g, dy + p * out, indices + p * out, (i % per) / g.w,
                                       i % g.w);
}

void need(bool ok, const std::string &what) {
  if (!ok)
    throw std::runtime_error("tdx: " + what);
}

/// The window of a convolution of x [N, C, L] or [N, C, H, W] by w (1-D as
/// 2-D with a height of 1), its arguments checked.
Window convWindow(const Tensor &x, const Tensor &w, const std::vector<int64_t> &stride,
                  const std::vector<int64_t> &padding, const std::vector<int64_t> &dilation,
                  int64_t groups) {
  need(x.dim() == 3 || x.dim() == 4, "convolution: input must be [N, C, L] or [N, C, H, W]");
  int64_t spatial = x.dim() - 2;
  need(static_cast<int64_t>(stride.size()) == spatial &&
           static_cast<int64_t>(padding.size()) == spatial &&
           static_cast<int64_t>(dilation.size()) == spatial && w.dim() == x.dim(),
       "convolution: stride, padding, dilation and the weight must match the input's rank");
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
  int64_t o = w.size(0);
  need(groups >= 1 && g.c % groups == 0 && o % groups == 0 && w.size(1) * groups == g.c,
       "convolution: channels, weight and groups do not fit");
  return g;
}

/// A pooling's int[2] argument as ATen reads it: one value for both dims,
/// and an empty list (stride) for `otherwise`.
std::vector<int64_t> poolPair(const std::vector<int64_t> &xs, const std::vector<int64_t> &otherwise) {
  if (xs.empty())
    return poolPair(otherwise, {0, 0});
  return xs.size() == 1 ? std::vector<int64_t>{xs[0], xs[0]} : xs;
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

/// The pooling of x [N, C, H, W] over `g`; `indices` (int64, the output's
/// shape), when given, gets a max pooling's flat indices.
Tensor pool(const Tensor &x0, const Window &g, bool isMax, bool countIncludePad, const char *op,
            const Tensor &indices = {}) {
  Tensor x = x0.contiguous();
  Tensor y = Tensor::empty({x.size(0), x.size(1), g.oh, g.ow}, x.dtype());
  int64_t planes = x.size(0) * x.size(1);
  floatTypes(x.dtype(), op, [&](auto tag) {
    using T = decltype(tag);
    poolKernel<T><<<blocksFor(planes * g.oh * g.ow), 256>>>(
        g, static_cast<const T *>(x.data()), static_cast<T *>(y.data()),
        static_cast<int64_t *>(indices.data()), planes, isMax, countIncludePad);
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
  Tensor x = x0.contiguous(), w = w0.contiguous();
  Window g = convWindow(x, w, stride, padding, dilation, groups);
  int64_t spatial = x.dim() - 2;
  int64_t n = x.size(0), o = w.size(0);
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

/// convolution_backward(grad_output, input, weight; bias_sizes, stride,
/// padding, dilation, transposed, output_padding, groups, output_mask) ->
/// (grad_input, grad_weight, grad_bias), per image: the weight's gradient
/// accumulates dY[g] cols[g]^T over the batch, the input's is col2im of
/// W[g]^T dY[g].
std::vector<Tensor> tdx::cu::aten::convolutionBackward(const std::vector<Tensor> &tensors,
                                                       const Args &args) {
  const char *op = "convolution_backward";
  expectTensors(tensors, 3, op);
  need(!boolArg(args, "transposed", op),
       "convolution_backward: transposed convolution is not supported by the CUDA backend");
  int64_t groups = intArg(args, "groups", op);
  const std::vector<bool> &mask = maskArg(args, op, 3);
  Tensor dy = tensors[0].contiguous(), x = tensors[1].contiguous(), w = tensors[2].contiguous();
  Window g = convWindow(x, w, intsArg(args, "stride", op), intsArg(args, "padding", op),
                        intsArg(args, "dilation", op), groups);
  int64_t n = x.size(0), o = w.size(0), og = o / groups;
  int64_t k = g.c / groups * g.kh * g.kw, l = g.oh * g.ow, image = g.c * g.h * g.w;
  need(dy.dim() == x.dim() && dy.size(0) == n && dy.size(1) == o && dy.numel() == n * o * l,
       "convolution_backward: grad_output does not have the convolution's output shape");
  Tensor dx = mask[0] ? Tensor::empty(x.sizes(), x.dtype()) : Tensor();
  Tensor dw = mask[1] ? Tensor::empty(w.sizes(), w.dtype()) : Tensor();
  Tensor db = mask[2] ? Tensor::empty({o}, dy.dtype()) : Tensor();
  Tensor cols = Tensor::empty({groups * k, l}, x.dtype());
  floatTypes(x.dtype(), op, [&](auto tag) {
    using T = decltype(tag);
    const T *xp = ptr<T>(x), *dyp = ptr<T>(dy), *wp = ptr<T>(w);
    T *cp = out<T>(cols);
    for (int64_t b = 0; b < n; ++b) {
      const T *dyb = dyp + b * o * l;
      if (dw.defined()) {
        im2colKernel<T><<<blocksFor(groups * k * l), 256>>>(g, xp + b * image, cp, groups * k, l);
        checkLaunch("im2col");
        // dW[g] [og x k] (+)= dY[b, g] [og x l] @ cols[g]^T.
        gemm<T>(false, true, og, k, l, dyb, og * l, cp, k * l, out<T>(dw), og * k, groups,
                b ? T(1) : T(0));
      }
      if (dx.defined()) {
        // dcols[g] [k x l] = W[g]^T [k x og] @ dY[b, g], then col2im.
        gemm<T>(true, false, k, l, og, wp, og * k, dyb, og * l, cp, k * l, groups);
        col2imKernel<T><<<blocksFor(image), 256>>>(g, cp, out<T>(dx) + b * image);
        checkLaunch("col2im");
      }
    }
    if (db.defined()) {
      channelSumKernel<T><<<blocksFor(o), 256>>>(dyp, out<T>(db), n, o, l);
      checkLaunch("convolution_backward bias");
    }
  });
  return {dx, dw, db};
}

/// max_pool2d_with_indices(self [N, C, H, W]; kernel_size, stride,
/// padding, dilation, ceil_mode) -> (out, indices): the flat index of each
/// maximum in its plane, as ATen's.
std::vector<Tensor> tdx::cu::aten::maxPool2dWithIndices(const std::vector<Tensor> &tensors,
                                                        const Args &args) {
  const char *op = "max_pool2d_with_indices";
  expectTensors(tensors, 1, op);
  Tensor x = tensors[0].contiguous();
  Window g = poolWindow(x, poolPair(intsArg(args, "kernel_size", op), {}),
                        poolPair(intsArg(args, "stride", op), intsArg(args, "kernel_size", op)),
                        poolPair(intsArg(args, "padding", op), {}),
                        poolPair(intsArg(args, "dilation", op), {}),
                        boolArg(args, "ceil_mode", op));
  Tensor indices = Tensor::empty({x.size(0), x.size(1), g.oh, g.ow}, DType::I64);
  Tensor y = pool(x, g, true, false, op, indices);
  return {y, indices};
}

/// max_pool2d_with_indices_backward(grad_output, self, indices; the
/// forward's window) -> the gradient of self.
std::vector<Tensor> tdx::cu::aten::maxPool2dWithIndicesBackward(const std::vector<Tensor> &tensors,
                                                                const Args &args) {
  const char *op = "max_pool2d_with_indices_backward";
  expectTensors(tensors, 3, op);
  Tensor dy = tensors[0].contiguous(), x = tensors[1], indices = tensors[2].contiguous();
  need(indices.dtype() == DType::I64, "max_pool2d_with_indices_backward: indices must be int64");
  Window g = poolWindow(x, poolPair(intsArg(args, "kernel_size", op), {}),
                        poolPair(intsArg(args, "stride", op), intsArg(args, "kernel_size", op)),
                        poolPair(intsArg(args, "padding", op), {}),
                        poolPair(intsArg(args, "dilation", op), {}),
                        boolArg(args, "ceil_mode", op));
  need(dy.sizes() == indices.sizes() && dy.numel() == x.size(0) * x.size(1) * g.oh * g.ow,
       "max_pool2d_with_indices_backward: grad_output and indices must have the output's shape");
  int64_t planes = x.size(0) * x.size(1);
  Tensor dx = Tensor::empty(x.sizes(), dy.dtype());
  floatTypes(dy.dtype(), op, [&](auto tag) {
    using T = decltype(tag);
    maxPoolBackwardKernel<T><<<blocksFor(dx.numel()), 256>>>(
        g, ptr<T>(dy), static_cast<const int64_t *>(indices.data()), out<T>(dx), planes);
  });
  checkLaunch(op);
  return {dx};
}
