//===- Aten.cu - the generic aten ops CUDA binaries run -------------------===//
//
// The rows of tdx/Runtime/cuda/AtenOps.def: a training step's backward ops
// that stay generic `tdx.aten` ops. Each runs a row function of
// tdx/Runtime/Rows.h (checked against ATen on the host by RowsTest) one
// thread block per row, on dense copies of its operands.
//
//===----------------------------------------------------------------------===//

#include "AtenArgs.cuh"
#include "Blas.cuh"
#include "RowLaunch.cuh"

#include <cstdint>
#include <stdexcept>
#include <string>

using namespace tdx::cu;
using namespace tdx::cu::detail;

namespace {

/// int64 values between host and device memory.
void copyLongs(void *dst, const void *src, int64_t count, cudaMemcpyKind kind) {
  if (count)
    checkCuda(cudaMemcpy(dst, src, count * sizeof(int64_t), kind), "cudaMemcpy");
}

template <class T>
__global__ void softmaxBackwardKernel(const T *dy, const T *y, T *dx, int64_t rows, int64_t n,
                                      bool log) {
  TDX_FOR_ROWS(r, rows) tdx::kern::softmaxBackwardRow(lanes, dy + r * n, y + r * n, dx + r * n, n, log);
}

template <class T>
__global__ void layerNormStatsKernel(const T *x, const T *w, const T *b, T *y, T *mean, T *rstd,
                                     int64_t rows, int64_t n, double eps) {
  TDX_FOR_ROWS(r, rows)
  tdx::kern::layerNormRow(lanes, x + r * n, w, b, y + r * n, n, eps, mean + r, rstd + r);
}

template <class T>
__global__ void layerNormBackwardKernel(const T *dy, const T *x, const T *mean, const T *rstd,
                                        const T *w, T *dx, int64_t rows, int64_t n) {
  TDX_FOR_ROWS(r, rows)
  tdx::kern::layerNormBackwardRow(lanes, dy + r * n, x + r * n, static_cast<double>(mean[r]),
                                  static_cast<double>(rstd[r]), w, dx + r * n, n);
}

template <class T>
__global__ void layerNormParamGradKernel(const T *dy, const T *x, const T *mean, const T *rstd,
                                         int64_t rows, int64_t n, T *dw, T *db) {
  int64_t j = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (j < n)
    tdx::kern::layerNormParamGradColumn(dy, x, mean, rstd, rows, n, j, dw, db);
}

/// One thread per sample: its row of dx (zeroed before) gets its target's
/// gradient. grad_output is a scalar unless `perSample` (reduction none).
template <class T>
__global__ void nllLossBackwardKernel(const T *dy, bool perSample, const T *target_weight,
                                      const T *totalWeight, const int64_t *target, T *dx,
                                      int64_t rows, int64_t classes, int64_t reduction,
                                      int64_t ignore, int *bad) {
  int64_t r = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (r >= rows)
    return;
  int64_t t = target[r];
  if (t == ignore)
    return;
  if (t < 0 || t >= classes) {
    atomicExch(bad, 1);
    return;
  }
  double w = target_weight ? static_cast<double>(target_weight[t]) : 1.0;
  dx[r * classes + t] = tdx::kern::narrow<T>(tdx::kern::nllLossGrad(
      reduction, static_cast<double>(dy[perSample ? r : 0]), w,
      static_cast<double>(totalWeight[0])));
}

template <class T>
__global__ void embeddingBackwardKernel(const T *grad, const int64_t *start,
                                        const int64_t *tokens, T *out, int64_t vocab,
                                        int64_t dim) {
  TDX_FOR_ROWS(v, vocab)
  tdx::kern::embeddingBackwardRow(lanes, grad, dim, tokens + start[v], start[v + 1] - start[v],
                                  out + v * dim);
}

/// Batch norm, one block per channel of the channel-major input x [C, n]:
/// weight, bias, running mean and variance per channel, each may be null.
/// In training the running statistics move by `momentum` towards the
/// batch's (as ATen's native_batch_norm does to its arguments).
template <class T>
__global__ void batchNormKernel(const T *x, T *y, const T *w, const T *b, T *runMean, T *runVar,
                                T *saveMean, T *saveInvstd, int64_t channels, int64_t n,
                                bool training, double momentum, double eps) {
  TDX_FOR_ROWS(c, channels) {
    double mean = training || !runMean ? 0.0 : static_cast<double>(runMean[c]);
    double var = training || !runVar ? 1.0 : static_cast<double>(runVar[c]), unbiased = 0;
    tdx::kern::batchNormRow(lanes, x + c * n, y + c * n, n, training, mean, var,
                            w ? static_cast<double>(w[c]) : 1.0,
                            b ? static_cast<double>(b[c]) : 0.0, eps,
                            training ? saveMean + c : nullptr,
                            training ? saveInvstd + c : nullptr, &unbiased);
    if (training && lanes.lane() == 0) {
      if (runMean)
        runMean[c] = static_cast<T>(momentum * static_cast<double>(saveMean[c]) +
                                    (1 - momentum) * static_cast<double>(runMean[c]));
      if (runVar)
        runVar[c] = static_cast<T>(momentum * unbiased +
                                   (1 - momentum) * static_cast<double>(runVar[c]));
    }
  }
}

/// The gradients of batch norm, one block per channel of the channel-major
/// dy and x [C, n]; mean and invstd per channel (the saved statistics in
/// training, else the running ones' mean and 1 / sqrt(var + eps)).
template <class T>
__global__ void batchNormBackwardKernel(const T *dy, const T *x, T *dx, const T *w,
                                        const T *mean, const T *invstd, T *dw, T *db,
                                        int64_t channels, int64_t n, bool training) {
  TDX_FOR_ROWS(c, channels)
  tdx::kern::batchNormBackwardRow(lanes, dy + c * n, x + c * n, dx ? dx + c * n : nullptr, n,
                                  training, static_cast<double>(mean[c]),
                                  static_cast<double>(invstd[c]),
                                  w ? static_cast<double>(w[c]) : 1.0, dw ? dw + c : nullptr,
                                  db ? db + c : nullptr);
}

/// 1 / sqrt(var + eps) per channel.
template <class T>
__global__ void invstdKernel(const T *var, T *invstd, int64_t channels, double eps) {
  int64_t c = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (c < channels)
    invstd[c] = static_cast<T>(1.0 / ::sqrt(static_cast<double>(var[c]) + eps));
}

/// grad where x > threshold, else 0 (dense operands of one shape).
template <class T>
__global__ void thresholdBackwardKernel(const T *dy, const T *x, T *dx, int64_t n, T threshold) {
  int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (i < n)
    dx[i] = x[i] <= threshold ? T(0) : dy[i];
}

/// x [N, C, ...] as dense channel-major rows [C, N * ...].
Tensor channelMajor(const Tensor &x) { return x.transpose(0, 1).contiguous(); }

/// The dense rows of a softmax backward along `dim`: operands with `dim`
/// moved last, as contiguous copies.
std::vector<Tensor> softmaxBackward(const std::vector<Tensor> &tensors, const Args &args,
                                    bool log) {
  const char *op = log ? "_log_softmax_backward_data" : "_softmax_backward_data";
  expectTensors(tensors, 2, op);
  const Tensor &dy0 = tensors[0], &y0 = tensors[1];
  int64_t dim = y0.wrap(intArg(args, "dim", op)), last = y0.dim() - 1;
  Tensor dy = dy0.transpose(dim, last).contiguous(), y = y0.transpose(dim, last).contiguous();
  Tensor dx = Tensor::empty(y.sizes(), y.dtype());
  int64_t n = y.dim() ? y.size(-1) : 1, rows = n ? y.numel() / n : 0;
  anyFloatTypes(y.dtype(), op, [&](auto tag) {
    using T = decltype(tag);
    softmaxBackwardKernel<T><<<rowBlocks(rows), kRowThreads, kRowShared>>>(
        ptr<T>(dy), ptr<T>(y), out<T>(dx), rows, n, log);
  });
  checkLaunch(op);
  return {dx.transpose(dim, last).contiguous()};
}

/// What native_layer_norm and its backward read alike: the input (tensor
/// `input`), weight and bias when given (after `leading` tensors), the
/// normalized shape, its size and the number of rows.
struct LayerNormArgs {
  bool hasW, hasB;
  std::vector<int64_t> normalized;
  Tensor x, w, b;
  int64_t n, rows;
};

LayerNormArgs layerNormArgs(const std::vector<Tensor> &tensors, const Args &args, size_t input,
                            size_t leading, const char *op) {
  LayerNormArgs a{given(args, "weight"), given(args, "bias"),
                  intsArg(args, "normalized_shape", op), {}, {}, {}, 0, 0};
  expectTensors(tensors, leading + a.hasW + a.hasB, op);
  a.x = tensors[input].contiguous();
  if (a.hasW)
    a.w = tensors[leading].contiguous();
  if (a.hasB)
    a.b = tensors[leading + a.hasW].contiguous();
  a.n = product(a.normalized, 0, a.normalized.size());
  a.rows = a.n ? a.x.numel() / a.n : 0;
  return a;
}

} // namespace

std::vector<Tensor> tdx::cu::aten::softmaxBackwardData(const std::vector<Tensor> &tensors,
                                                       const Args &args) {
  return softmaxBackward(tensors, args, false);
}

std::vector<Tensor> tdx::cu::aten::logSoftmaxBackwardData(const std::vector<Tensor> &tensors,
                                                          const Args &args) {
  return softmaxBackward(tensors, args, true);
}

/// native_layer_norm(input, normalized_shape, weight?, bias?, eps) ->
/// (out, mean, rstd), the statistics shaped [B..., 1...].
std::vector<Tensor> tdx::cu::aten::nativeLayerNorm(const std::vector<Tensor> &tensors,
                                                   const Args &args) {
  const char *op = "native_layer_norm";
  const LayerNormArgs a = layerNormArgs(tensors, args, 0, 1, op);
  const Tensor &x = a.x;
  double eps = doubleArg(args, "eps", op);
  std::vector<int64_t> stats = x.sizes();
  for (size_t i = stats.size() - a.normalized.size(); i < stats.size(); ++i)
    stats[i] = 1;
  Tensor y = Tensor::empty(x.sizes(), x.dtype());
  Tensor mean = Tensor::empty(stats, x.dtype()), rstd = Tensor::empty(stats, x.dtype());
  anyFloatTypes(x.dtype(), op, [&](auto tag) {
    using T = decltype(tag);
    layerNormStatsKernel<T><<<rowBlocks(a.rows), kRowThreads, kRowShared>>>(
        ptr<T>(x), ptr<T>(a.w), ptr<T>(a.b), out<T>(y), out<T>(mean), out<T>(rstd), a.rows,
        a.n, eps);
  });
  checkLaunch(op);
  return {y, mean, rstd};
}

/// native_layer_norm_backward(grad_out, input, normalized_shape, mean, rstd,
/// weight?, bias?, output_mask) -> (grad_input, grad_weight, grad_bias);
/// an output the mask leaves out is undefined.
std::vector<Tensor> tdx::cu::aten::nativeLayerNormBackward(const std::vector<Tensor> &tensors,
                                                           const Args &args) {
  const char *op = "native_layer_norm_backward";
  const LayerNormArgs a = layerNormArgs(tensors, args, 1, 4, op);
  const Tensor &x = a.x;
  const int64_t rows = a.rows, n = a.n;
  const std::vector<bool> &mask = maskArg(args, op, 3);
  Tensor dy = tensors[0].contiguous();
  Tensor mean = tensors[2].contiguous(), rstd = tensors[3].contiguous();
  Tensor dx, dw, db;
  if (mask[0])
    dx = Tensor::empty(x.sizes(), x.dtype());
  if (mask[1] && a.hasW)
    dw = Tensor::empty(a.normalized, x.dtype());
  if (mask[2] && a.hasB)
    db = Tensor::empty(a.normalized, x.dtype());
  anyFloatTypes(x.dtype(), op, [&](auto tag) {
    using T = decltype(tag);
    if (dx.defined())
      layerNormBackwardKernel<T><<<rowBlocks(rows), kRowThreads, kRowShared>>>(
          ptr<T>(dy), ptr<T>(x), ptr<T>(mean), ptr<T>(rstd), ptr<T>(a.w), out<T>(dx), rows, n);
    if (dw.defined() || db.defined())
      layerNormParamGradKernel<T><<<blocksFor(n), 256>>>(ptr<T>(dy), ptr<T>(x), ptr<T>(mean),
                                                         ptr<T>(rstd), rows, n, out<T>(dw),
                                                         out<T>(db));
  });
  checkLaunch(op);
  return {dx, dw, db};
}

/// nll_loss_backward(grad_output, self [N, C] or [C], target, weight?,
/// total_weight; reduction, ignore_index) -> grad of self.
std::vector<Tensor> tdx::cu::aten::nllLossBackward(const std::vector<Tensor> &tensors,
                                                   const Args &args) {
  const char *op = "nll_loss_backward";
  bool hasW = given(args, "weight");
  expectTensors(tensors, 4 + hasW, op);
  const Tensor &dy = tensors[0], &self = tensors[1], &target = tensors[2];
  const Tensor &total = tensors[3 + hasW];
  if (target.dtype() != DType::I64)
    throw std::runtime_error("tdx: nll_loss_backward targets must be int64");
  int64_t reduction = intArg(args, "reduction", op), ignore = intArg(args, "ignore_index", op);
  int64_t classes = self.size(-1), rows = self.dim() == 2 ? self.size(0) : 1;
  Tensor dx = zeros(self.sizes(), self.dtype());
  Tensor dyc = dy.contiguous(), tc = target.contiguous(), totalc = total.contiguous();
  Tensor wc = hasW ? tensors[3].contiguous() : Tensor();
  int *bad = newFlag();
  anyFloatTypes(self.dtype(), op, [&](auto tag) {
    using T = decltype(tag);
    nllLossBackwardKernel<T><<<blocksFor(rows), 256>>>(
        ptr<T>(dyc), reduction == 0 && dy.numel() == rows, ptr<T>(wc), ptr<T>(totalc),
        static_cast<const int64_t *>(tc.data()), out<T>(dx), rows, classes, reduction, ignore,
        bad);
  });
  checkLaunch(op);
  checkFlag(bad, "tdx: nll_loss_backward: a target is out of range of the classes");
  return {dx};
}

/// embedding_dense_backward(grad_output [S..., D], indices [S...];
/// num_weights, padding_idx, scale_grad_by_freq) -> [V, D]. Each table row
/// sums its tokens' gradient rows in token order (deterministic; no
/// atomics): the tokens are ordered by row on the host.
std::vector<Tensor> tdx::cu::aten::embeddingDenseBackward(const std::vector<Tensor> &tensors,
                                                          const Args &args) {
  const char *op = "embedding_dense_backward";
  expectTensors(tensors, 2, op);
  const Arg &byFreq = arg(args, "scale_grad_by_freq", op);
  if (byFreq.kind == Arg::Bool && byFreq.b)
    throw std::runtime_error("tdx: embedding_dense_backward with scale_grad_by_freq is not "
                             "supported on CUDA; train with --target cpu");
  int64_t vocab = intArg(args, "num_weights", op), padding = intArg(args, "padding_idx", op);
  Tensor grad = tensors[0].contiguous(), ids = tensors[1].contiguous();
  if (ids.dtype() != DType::I64)
    throw std::runtime_error("tdx: embedding_dense_backward indices must be int64");
  int64_t dim = grad.size(-1), count = ids.numel();
  std::vector<int64_t> hostIds(count), start(vocab + 1), tokens(count);
  copyLongs(hostIds.data(), ids.data(), count, cudaMemcpyDeviceToHost);
  if (!tdx::kern::embeddingBackwardOrder(hostIds.data(), count, vocab, padding, start.data(),
                                         tokens.data()))
    throw std::runtime_error("tdx: embedding_dense_backward: an index is out of range of the "
                             "table");
  Tensor startD = Tensor::empty({vocab + 1}, DType::I64), tokensD = Tensor::empty({count}, DType::I64);
  copyLongs(startD.data(), start.data(), vocab + 1, cudaMemcpyHostToDevice);
  copyLongs(tokensD.data(), tokens.data(), count, cudaMemcpyHostToDevice);
  Tensor table = Tensor::empty({vocab, dim}, grad.dtype());
  anyFloatTypes(grad.dtype(), op, [&](auto tag) {
    using T = decltype(tag);
    embeddingBackwardKernel<T><<<rowBlocks(vocab), kRowThreads>>>(
        ptr<T>(grad), static_cast<const int64_t *>(startD.data()),
        static_cast<const int64_t *>(tokensD.data()), out<T>(table), vocab, dim);
  });
  checkLaunch(op);
  return {table};
}

/// slice_backward(grad; input_sizes, dim, start, end, step): grad placed in
/// zeros of the input's shape.
std::vector<Tensor> tdx::cu::aten::sliceBackward(const std::vector<Tensor> &tensors,
                                                 const Args &args) {
  const char *op = "slice_backward";
  expectTensors(tensors, 1, op);
  const Tensor &grad = tensors[0];
  Tensor result = zeros(intsArg(args, "input_sizes", op), grad.dtype());
  // Tensor::slice wraps and clamps start and end as ATen does.
  copyInto(result.slice(intArg(args, "dim", op), intArg(args, "start", op),
                        intArg(args, "end", op), intArg(args, "step", op)),
           grad);
  return {result};
}

/// native_batch_norm(input [N, C, ...], weight?, bias?, running_mean?,
/// running_var?, training, momentum, eps) -> (out, save_mean, save_invstd);
/// in training the running statistics given are updated in place, as ATen
/// does (the statistics are empty outside training, as ATen's CPU kernel
/// makes them).
std::vector<Tensor> tdx::cu::aten::nativeBatchNorm(const std::vector<Tensor> &tensors,
                                                   const Args &args) {
  const char *op = "native_batch_norm";
  std::vector<Tensor> in =
      schemaTensors(tensors, args, 1, {"weight", "bias", "running_mean", "running_var"}, op);
  bool training = boolArg(args, "training", op);
  double momentum = doubleArg(args, "momentum", op), eps = doubleArg(args, "eps", op);
  if (in[0].dim() < 2)
    throw std::runtime_error("tdx: native_batch_norm takes [N, C, ...] inputs");
  const Tensor &runMean0 = in[3], &runVar0 = in[4];
  bool hasMean = runMean0.defined(), hasVar = runVar0.defined();
  if (!training && (!hasMean || !hasVar))
    throw std::runtime_error("tdx: native_batch_norm outside training needs running statistics");
  Tensor w = dense(in[1]), b = dense(in[2]), runMean = dense(runMean0), runVar = dense(runVar0);
  Tensor x = channelMajor(in[0]);
  int64_t channels = x.size(0), n = channels ? x.numel() / channels : 0;
  Tensor y = Tensor::empty(x.sizes(), x.dtype());
  Tensor saveMean = Tensor::empty({training ? channels : 0}, x.dtype());
  Tensor saveInvstd = Tensor::empty({training ? channels : 0}, x.dtype());
  floatTypes(x.dtype(), op, [&](auto tag) {
    using T = decltype(tag);
    batchNormKernel<T><<<rowBlocks(channels), kRowThreads, kRowShared>>>(
        ptr<T>(x), out<T>(y), ptr<T>(w), ptr<T>(b), out<T>(runMean), out<T>(runVar),
        out<T>(saveMean), out<T>(saveInvstd), channels, n, training, momentum, eps);
  });
  checkLaunch(op);
  // Statistics given as views write back through them.
  if (training && hasMean && runMean.data() != runMean0.data())
    copyInto(runMean0, runMean);
  if (training && hasVar && runVar.data() != runVar0.data())
    copyInto(runVar0, runVar);
  return {y.transpose(0, 1).contiguous(), saveMean, saveInvstd};
}

/// native_batch_norm_backward(grad_out, input, weight?, running_mean?,
/// running_var?, save_mean?, save_invstd?, train, eps, output_mask) ->
/// (grad_input, grad_weight, grad_bias).
std::vector<Tensor> tdx::cu::aten::nativeBatchNormBackward(const std::vector<Tensor> &tensors,
                                                           const Args &args) {
  const char *op = "native_batch_norm_backward";
  std::vector<Tensor> in = schemaTensors(
      tensors, args, 2, {"weight", "running_mean", "running_var", "save_mean", "save_invstd"}, op);
  Tensor w = dense(in[2]), runMean = dense(in[3]), runVar = dense(in[4]);
  bool train = boolArg(args, "train", op);
  double eps = doubleArg(args, "eps", op);
  const std::vector<bool> &mask = maskArg(args, op, 3);
  Tensor mean = dense(train ? in[5] : runMean), invstd = train ? dense(in[6]) : Tensor();
  if (!mean.defined() || (train ? !invstd.defined() : !runVar.defined()))
    throw std::runtime_error(std::string("tdx: native_batch_norm_backward needs ") +
                             (train ? "save_mean and save_invstd" : "running statistics"));
  Tensor dy = channelMajor(in[0]), x = channelMajor(in[1]);
  int64_t channels = x.size(0), n = channels ? x.numel() / channels : 0;
  Tensor dx = mask[0] ? Tensor::empty(x.sizes(), x.dtype()) : Tensor();
  Tensor dw = mask[1] ? Tensor::empty({channels}, x.dtype()) : Tensor();
  Tensor db = mask[2] ? Tensor::empty({channels}, x.dtype()) : Tensor();
  floatTypes(x.dtype(), op, [&](auto tag) {
    using T = decltype(tag);
    if (!train) {
      invstd = Tensor::empty({channels}, x.dtype());
      invstdKernel<T><<<blocksFor(channels), 256>>>(ptr<T>(runVar), out<T>(invstd), channels,
                                                    eps);
    }
    batchNormBackwardKernel<T><<<rowBlocks(channels), kRowThreads, kRowShared>>>(
        ptr<T>(dy), ptr<T>(x), out<T>(dx), ptr<T>(w), ptr<T>(mean), ptr<T>(invstd), out<T>(dw),
        out<T>(db), channels, n, train);
  });
  checkLaunch(op);
  return {dx.defined() ? dx.transpose(0, 1).contiguous() : dx, dw, db};
}

/// threshold_backward(grad_output, self, threshold): grad_output where self
/// > threshold, else 0 (ReLU's backward).
std::vector<Tensor> tdx::cu::aten::thresholdBackward(const std::vector<Tensor> &tensors,
                                                     const Args &args) {
  const char *op = "threshold_backward";
  expectTensors(tensors, 2, op);
  double threshold = doubleArg(args, "threshold", op);
  if (tensors[0].sizes() != tensors[1].sizes() || tensors[0].dtype() != tensors[1].dtype())
    throw std::runtime_error("tdx: threshold_backward takes a gradient and an input of one "
                             "shape and type");
  Tensor dy = tensors[0].contiguous(), x = tensors[1].contiguous();
  Tensor dx = Tensor::empty(x.sizes(), x.dtype());
  floatTypes(x.dtype(), op, [&](auto tag) {
    using T = decltype(tag);
    thresholdBackwardKernel<T><<<blocksFor(x.numel()), 256>>>(ptr<T>(dy), ptr<T>(x), out<T>(dx),
                                                              x.numel(), static_cast<T>(threshold));
  });
  checkLaunch(op);
  return {dx};
}

std::vector<Tensor> tdx::cu::callAten(const std::string &schema,
                                      const std::vector<Tensor> &tensors, const Args &args) {
  std::string name = schema.substr(0, schema.find('.'));
#define TDX_CUDA_ATEN(row, fn)                                                                 \
  if (name == row)                                                                             \
    return aten::fn(tensors, args);
#include "tdx/Runtime/cuda/AtenOps.def"
  throw std::runtime_error("tdx: " + schema + " has no CUDA implementation (see "
                           "tdx/Runtime/cuda/AtenOps.def); compile with --target cpu");
}
