//===- Aten.cu - the generic aten ops CUDA binaries run -------------------===//
//
// The rows of tdx/Runtime/cuda/AtenOps.def: a training step's backward ops
// that stay generic `tdx.aten` ops. Each runs a row function of
// tdx/Runtime/Rows.h (checked against ATen on the host by RowsTest) one
// thread block per row, on dense copies of its operands.
//
//===----------------------------------------------------------------------===//

#include "Blas.cuh"
#include "RowLaunch.cuh"

#include <cstdint>
#include <stdexcept>
#include <string>

using namespace tdx::cu;
using namespace tdx::cu::detail;

namespace {

const Arg &arg(const Args &args, const char *name, const char *op) {
  auto it = args.find(name);
  if (it == args.end())
    throw std::runtime_error(std::string("tdx: ") + op + " has no argument '" + name +
                             "' (a program emitted for another libtorch?)");
  return it->second;
}
int64_t intArg(const Args &args, const char *name, const char *op) {
  const Arg &a = arg(args, name, op);
  if (a.kind != Arg::Int)
    throw std::runtime_error(std::string("tdx: ") + op + "'s '" + name + "' is not an int");
  return a.i;
}
const std::vector<int64_t> &intsArg(const Args &args, const char *name, const char *op) {
  const Arg &a = arg(args, name, op);
  if (a.kind != Arg::Ints)
    throw std::runtime_error(std::string("tdx: ") + op + "'s '" + name + "' is not a list");
  return a.ints;
}
/// int64 values between host and device memory.
void copyLongs(void *dst, const void *src, int64_t count, cudaMemcpyKind kind) {
  if (count)
    checkCuda(cudaMemcpy(dst, src, count * sizeof(int64_t), kind), "cudaMemcpy");
}
/// Whether the optional tensor argument `name` was given (None is Arg()).
bool given(const Args &args, const char *name) {
  auto it = args.find(name);
  return it == args.end() || it->second.kind != Arg::None;
}
void expectTensors(const std::vector<Tensor> &tensors, size_t n, const char *op) {
  if (tensors.size() != n)
    throw std::runtime_error(std::string("tdx: ") + op + " takes " + std::to_string(n) +
                             " tensors here, not " + std::to_string(tensors.size()));
}
template <class T> const T *ptr(const Tensor &t) { return static_cast<const T *>(t.data()); }
template <class T> T *out(const Tensor &t) { return static_cast<T *>(t.data()); }

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
  dx[r * classes + t] = static_cast<T>(tdx::kern::nllLossGrad(
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
  floatTypes(y.dtype(), op, [&](auto tag) {
    using T = decltype(tag);
    softmaxBackwardKernel<T><<<rowBlocks(rows), kRowThreads, kRowShared>>>(
        ptr<T>(dy), ptr<T>(y), out<T>(dx), rows, n, log);
  });
  checkLaunch(op);
  return {dx.transpose(dim, last).contiguous()};
}

int64_t normalizedSize(const Args &args, const char *op, std::vector<int64_t> &shape) {
  shape = intsArg(args, "normalized_shape", op);
  return product(shape, 0, shape.size());
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
  bool hasW = given(args, "weight"), hasB = given(args, "bias");
  expectTensors(tensors, 1 + hasW + hasB, op);
  std::vector<int64_t> normalized;
  int64_t n = normalizedSize(args, op, normalized);
  const Arg &eps = arg(args, "eps", op);
  Tensor x = tensors[0].contiguous();
  Tensor w = hasW ? tensors[1].contiguous() : Tensor();
  Tensor b = hasB ? tensors[1 + hasW].contiguous() : Tensor();
  std::vector<int64_t> stats = x.sizes();
  for (size_t i = stats.size() - normalized.size(); i < stats.size(); ++i)
    stats[i] = 1;
  Tensor y = Tensor::empty(x.sizes(), x.dtype());
  Tensor mean = Tensor::empty(stats, x.dtype()), rstd = Tensor::empty(stats, x.dtype());
  int64_t rows = n ? x.numel() / n : 0;
  floatTypes(x.dtype(), op, [&](auto tag) {
    using T = decltype(tag);
    layerNormStatsKernel<T><<<rowBlocks(rows), kRowThreads, kRowShared>>>(
        ptr<T>(x), ptr<T>(w), ptr<T>(b), out<T>(y), out<T>(mean), out<T>(rstd), rows, n,
        eps.kind == Arg::Double ? eps.d : static_cast<double>(eps.i));
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
  bool hasW = given(args, "weight"), hasB = given(args, "bias");
  expectTensors(tensors, 4 + hasW + hasB, op);
  std::vector<int64_t> normalized;
  int64_t n = normalizedSize(args, op, normalized);
  const Arg &mask = arg(args, "output_mask", op);
  if (mask.kind != Arg::Bools || mask.bools.size() != 3)
    throw std::runtime_error("tdx: native_layer_norm_backward's output_mask is not 3 bools");
  Tensor dy = tensors[0].contiguous(), x = tensors[1].contiguous();
  Tensor mean = tensors[2].contiguous(), rstd = tensors[3].contiguous();
  Tensor w = hasW ? tensors[4].contiguous() : Tensor();
  int64_t rows = n ? x.numel() / n : 0;
  Tensor dx, dw, db;
  if (mask.bools[0])
    dx = Tensor::empty(x.sizes(), x.dtype());
  if (mask.bools[1] && hasW)
    dw = Tensor::empty(normalized, x.dtype());
  if (mask.bools[2] && hasB)
    db = Tensor::empty(normalized, x.dtype());
  floatTypes(x.dtype(), op, [&](auto tag) {
    using T = decltype(tag);
    if (dx.defined())
      layerNormBackwardKernel<T><<<rowBlocks(rows), kRowThreads, kRowShared>>>(
          ptr<T>(dy), ptr<T>(x), ptr<T>(mean), ptr<T>(rstd), ptr<T>(w), out<T>(dx), rows, n);
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
  floatTypes(self.dtype(), op, [&](auto tag) {
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
  floatTypes(grad.dtype(), op, [&](auto tag) {
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
