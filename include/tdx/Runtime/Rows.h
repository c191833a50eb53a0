//===- Rows.h - the per-row kernels of the CUDA backend -----------*- C++ -*-===//
//
// The non-elementwise ops of the CUDA backend (softmax, norms, reductions,
// cross-entropy, embedding rows) as `__host__ __device__` functions of one
// row, and `Iter`, the strided iteration of elementwise kernels and copies.
// lib/Runtime/cuda launches them one thread block per row (the lanes of a
// row share its elements and combine their partial sums with warp shuffles
// and shared memory); the unit tests (test/unit/RowsTest.cpp) run the very
// same functions on the CPU, one lane per row, against ATen. Statistics
// accumulate in double, for every float type (bf16 and f16 included), and
// each result is rounded once (narrow).
//
//===----------------------------------------------------------------------===//

#ifndef TDX_RUNTIME_ROWS_H
#define TDX_RUNTIME_ROWS_H

#include "tdx/Runtime/Kernel.h"

namespace tdx::kern {

constexpr int kMaxRank = 8;
constexpr int kMaxOperands = 16;

/// `operands` tensors walked over one shape in row-major order: element i's
/// offset in operand k is sum(index_d(i) * strides[k][d]) (0 = broadcast).
struct Iter {
  int rank = 0;
  int operands = 0;
  int64_t numel = 1;
  int64_t shape[kMaxRank] = {};
  int64_t strides[kMaxOperands][kMaxRank] = {};
  void *data[kMaxOperands] = {};

  TDX_HD int64_t offset(int operand, int64_t i) const {
    int64_t off = 0;
    for (int d = rank - 1; d >= 0; --d) {
      off += (i % shape[d]) * strides[operand][d];
      i /= shape[d];
    }
    return off;
  }
  template <class T> TDX_HD T &at(int operand, int64_t i) const {
    return static_cast<T *>(data[operand])[offset(operand, i)];
  }
};

enum RowReduce : int { RowSum = 0, RowMean = 1, RowMax = 2 };

/// A row's result (computed in double) as T: bf16 and f16 through float,
/// one rounding of a float as ATen's kernels of those types round theirs,
/// the same on the host (c10's types) and the device (CUDA's).
template <class T> TDX_HD inline T narrow(double v) {
  if constexpr (sizeof(T) == 2)
    return static_cast<T>(static_cast<float>(v));
  else
    return static_cast<T>(v);
}

/// The larger of two values; NaN wins (as ATen's max does).
TDX_HD inline double maxNaN(double a, double b) {
  if (a != a)
    return a;
  if (b != b)
    return b;
  return b > a ? b : a;
}

/// The threads that share a row: lane() of count() threads, each taking
/// elements lane(), lane() + count(), ...; sum and max combine every
/// lane's value and give the result to all of them. One lane on the host
/// and in the unit tests (OneLane); a thread block on the GPU (BlockLanes in
/// lib/Runtime/cuda/Ops.cu), with warp shuffles and shared memory.
struct OneLane {
  TDX_HD int lane() const { return 0; }
  TDX_HD int count() const { return 1; }
  TDX_HD double sum(double v) const { return v; }
  TDX_HD double max(double v) const { return v; }
};

/// sum / mean / max of x[0], x[stride], ... (n elements; max of none: -inf,
/// of a row with a NaN: NaN).
template <class T, class Lanes>
TDX_HD double reduceRow(const Lanes &g, int kind, const T *x, int64_t n, int64_t stride) {
  double acc = kind == RowMax ? -INFINITY : 0.0;
  for (int64_t i = g.lane(); i < n; i += g.count()) {
    double v = static_cast<double>(x[i * stride]);
    acc = kind == RowMax ? maxNaN(acc, v) : acc + v;
  }
  acc = kind == RowMax ? g.max(acc) : g.sum(acc);
  return kind == RowMean ? acc / static_cast<double>(n) : acc;
}

/// softmax (or log_softmax) of a strided row.
template <class T, class Lanes>
TDX_HD void softmaxRow(const Lanes &g, const T *x, T *y, int64_t n, int64_t stride,
                       bool logSoftmax) {
  double m = reduceRow(g, RowMax, x, n, stride);
  double sum = 0;
  for (int64_t i = g.lane(); i < n; i += g.count())
    sum += ::exp(static_cast<double>(x[i * stride]) - m);
  sum = g.sum(sum);
  double logSum = ::log(sum);
  for (int64_t i = g.lane(); i < n; i += g.count()) {
    double v = static_cast<double>(x[i * stride]) - m;
    y[i * stride] = narrow<T>(logSoftmax ? v - logSum : ::exp(v) / sum);
  }
}

/// layer_norm of a dense row: (x - mean) / sqrt(var + eps) * w + b, with the
/// biased variance; w and b may be null. The row's mean and 1/sqrt(var +
/// eps) go to *meanOut and *rstdOut when given (native_layer_norm).
template <class T, class Lanes>
TDX_HD void layerNormRow(const Lanes &g, const T *x, const T *w, const T *b, T *y, int64_t n,
                         double eps, T *meanOut = nullptr, T *rstdOut = nullptr) {
  double mean = reduceRow(g, RowMean, x, n, 1), var = 0;
  for (int64_t i = g.lane(); i < n; i += g.count()) {
    double d = static_cast<double>(x[i]) - mean;
    var += d * d;
  }
  var = g.sum(var);
  double rstd = 1.0 / ::sqrt(var / static_cast<double>(n) + eps);
  if (meanOut && g.lane() == 0)
    *meanOut = narrow<T>(mean), *rstdOut = narrow<T>(rstd);
  for (int64_t i = g.lane(); i < n; i += g.count()) {
    double v = (static_cast<double>(x[i]) - mean) * rstd;
    if (w)
      v *= static_cast<double>(w[i]);
    if (b)
      v += static_cast<double>(b[i]);
    y[i] = narrow<T>(v);
  }
}

/// rms_norm of a dense row: x / sqrt(mean(x^2) + eps) * w; w may be null.
template <class T, class Lanes>
TDX_HD void rmsNormRow(const Lanes &g, const T *x, const T *w, T *y, int64_t n, double eps) {
  double ms = 0;
  for (int64_t i = g.lane(); i < n; i += g.count())
    ms += static_cast<double>(x[i]) * static_cast<double>(x[i]);
  ms = g.sum(ms);
  double r = 1.0 / ::sqrt(ms / static_cast<double>(n) + eps);
  for (int64_t i = g.lane(); i < n; i += g.count()) {
    double v = static_cast<double>(x[i]) * r;
    y[i] = narrow<T>(w ? v * static_cast<double>(w[i]) : v);
  }
}

/// The cross-entropy loss of one sample: logits of its n classes at stride
/// `stride`, its target class, and label smoothing eps:
/// -(1 - eps) * logp[target] - eps / n * sum(logp).
template <class T, class Lanes>
TDX_HD double crossEntropyRow(const Lanes &g, const T *logits, int64_t n, int64_t stride,
                              int64_t target, double smoothing) {
  double m = reduceRow(g, RowMax, logits, n, stride), sum = 0, all = 0;
  for (int64_t i = g.lane(); i < n; i += g.count()) {
    double v = static_cast<double>(logits[i * stride]) - m;
    sum += ::exp(v);
    all += v;
  }
  sum = g.sum(sum);
  all = g.sum(all);
  double logSum = ::log(sum);
  double picked = static_cast<double>(logits[target * stride]) - m - logSum;
  double mean = (all - static_cast<double>(n) * logSum) / static_cast<double>(n);
  return -(1.0 - smoothing) * picked - smoothing * mean;
}

/// The sum and the count of the losses that are not NaN (NaN marks an
/// ignored sample), over loss[0..n).
template <class Lanes>
TDX_HD void countedSum(const Lanes &g, const double *loss, int64_t n, double &sum,
                       double &count) {
  sum = 0, count = 0;
  for (int64_t i = g.lane(); i < n; i += g.count())
    if (loss[i] == loss[i])
      sum += loss[i], count += 1;
  sum = g.sum(sum);
  count = g.sum(count);
}

//===----------------------------------------------------------------------===//
// Backward rows (the generic aten ops of a training step's backward that the
// CUDA backend runs, include/tdx/Runtime/cuda/AtenOps.def)
//===----------------------------------------------------------------------===//

/// The gradient dx of softmax along a dense row from its output y and the
/// output's gradient dy: y (dy - sum(dy y)); of log_softmax: dy - exp(y)
/// sum(dy) (ATen's _softmax_backward_data and _log_softmax_backward_data).
template <class T, class Lanes>
TDX_HD void softmaxBackwardRow(const Lanes &g, const T *dy, const T *y, T *dx, int64_t n,
                               bool logSoftmax) {
  double s = 0;
  for (int64_t i = g.lane(); i < n; i += g.count())
    s += logSoftmax ? static_cast<double>(dy[i])
                    : static_cast<double>(dy[i]) * static_cast<double>(y[i]);
  s = g.sum(s);
  for (int64_t i = g.lane(); i < n; i += g.count()) {
    double d = static_cast<double>(dy[i]), v = static_cast<double>(y[i]);
    dx[i] = narrow<T>(logSoftmax ? d - ::exp(v) * s : v * (d - s));
  }
}

/// The input gradient of layer_norm over a dense row from the forward's
/// mean and rstd: rstd (dy w - mean(dy w) - xhat mean(dy w xhat)), xhat =
/// (x - mean) rstd; w may be null.
template <class T, class Lanes>
TDX_HD void layerNormBackwardRow(const Lanes &g, const T *dy, const T *x, double mean,
                                 double rstd, const T *w, T *dx, int64_t n) {
  double a = 0, b = 0;
  for (int64_t i = g.lane(); i < n; i += g.count()) {
    double dyw = static_cast<double>(dy[i]) * (w ? static_cast<double>(w[i]) : 1.0);
    a += dyw;
    b += dyw * (static_cast<double>(x[i]) - mean) * rstd;
  }
  a = g.sum(a) / static_cast<double>(n);
  b = g.sum(b) / static_cast<double>(n);
  for (int64_t i = g.lane(); i < n; i += g.count()) {
    double dyw = static_cast<double>(dy[i]) * (w ? static_cast<double>(w[i]) : 1.0);
    double xhat = (static_cast<double>(x[i]) - mean) * rstd;
    dx[i] = narrow<T>(rstd * (dyw - a - xhat * b));
  }
}

/// Column j of layer_norm's weight and bias gradients over `rows` dense
/// rows of n: sum_r dy xhat and sum_r dy (either output may be null).
template <class T>
TDX_HD void layerNormParamGradColumn(const T *dy, const T *x, const T *mean, const T *rstd,
                                     int64_t rows, int64_t n, int64_t j, T *dw, T *db) {
  double w = 0, b = 0;
  for (int64_t r = 0; r < rows; ++r) {
    double d = static_cast<double>(dy[r * n + j]);
    w += d * (static_cast<double>(x[r * n + j]) - static_cast<double>(mean[r])) *
         static_cast<double>(rstd[r]);
    b += d;
  }
  if (dw)
    dw[j] = narrow<T>(w);
  if (db)
    db[j] = narrow<T>(b);
}

/// Batch norm of one channel's n elements (a dense row of the input moved
/// channel-major): in training from the row's own mean and biased variance,
/// else from the running `mean` and `var` given; y = (x - mean) invstd w + b
/// (w, b: this channel's, or 1 and 0). In training the row's mean, invstd
/// and unbiased variance go to *meanOut, *invstdOut and *varOut
/// (native_batch_norm's save_mean and save_invstd, and what the running
/// statistics move towards).
template <class T, class Lanes>
TDX_HD void batchNormRow(const Lanes &g, const T *x, T *y, int64_t n, bool training, double mean,
                         double var, double w, double b, double eps, T *meanOut, T *invstdOut,
                         double *varOut) {
  if (training) {
    mean = reduceRow(g, RowMean, x, n, 1);
    double ss = 0;
    for (int64_t i = g.lane(); i < n; i += g.count()) {
      double d = static_cast<double>(x[i]) - mean;
      ss += d * d;
    }
    ss = g.sum(ss);
    var = ss / static_cast<double>(n);
    if (g.lane() == 0) {
      *meanOut = narrow<T>(mean);
      *invstdOut = narrow<T>(1.0 / ::sqrt(var + eps));
      *varOut = ss / static_cast<double>(n - 1); // NaN for one element, as ATen
    }
  }
  double invstd = 1.0 / ::sqrt(var + eps);
  for (int64_t i = g.lane(); i < n; i += g.count())
    y[i] = narrow<T>((static_cast<double>(x[i]) - mean) * invstd * w + b);
}

/// The gradients of batch norm over one channel's n elements (dense rows of
/// dy and x moved channel-major), ATen's native_batch_norm_backward: in
/// training dx = (dy - mean(dy) - (x - mean) invstd^2 mean(dy (x - mean)))
/// invstd w, else dy invstd w; the channel's weight gradient
/// sum(dy (x - mean)) invstd and bias gradient sum(dy) go to *dw and *db
/// (either may be null, as dx may).
template <class T, class Lanes>
TDX_HD void batchNormBackwardRow(const Lanes &g, const T *dy, const T *x, T *dx, int64_t n,
                                 bool training, double mean, double invstd, double w, T *dw,
                                 T *db) {
  double sum = 0, dot = 0;
  for (int64_t i = g.lane(); i < n; i += g.count()) {
    double d = static_cast<double>(dy[i]);
    sum += d;
    dot += d * (static_cast<double>(x[i]) - mean);
  }
  sum = g.sum(sum);
  dot = g.sum(dot);
  if (g.lane() == 0) {
    if (dw)
      *dw = narrow<T>(dot * invstd);
    if (db)
      *db = narrow<T>(sum);
  }
  if (!dx)
    return;
  double k = dot * invstd * invstd / static_cast<double>(n), gradMean = sum / static_cast<double>(n);
  for (int64_t i = g.lane(); i < n; i += g.count()) {
    double d = static_cast<double>(dy[i]);
    dx[i] = narrow<T>(training
                               ? (d - (static_cast<double>(x[i]) - mean) * k - gradMean) * invstd * w
                               : d * invstd * w);
  }
}

/// nll_loss_backward's one nonzero of a sample's row, at its target:
/// -weight * dy, over the total weight for reduction mean (1); dy is the
/// sample's own gradient for reduction none (0).
TDX_HD inline double nllLossGrad(int64_t reduction, double dy, double weight,
                                 double totalWeight) {
  return -weight * (reduction == 1 ? dy / totalWeight : dy);
}

/// Row `row` of embedding_dense_backward over dim columns: the sum of the
/// gradient rows of the tokens that looked it up, in token order (tokens
/// from embeddingBackwardOrder).
template <class T, class Lanes>
TDX_HD void embeddingBackwardRow(const Lanes &g, const T *grad, int64_t dim,
                                 const int64_t *tokens, int64_t count, T *out) {
  for (int64_t j = g.lane(); j < dim; j += g.count()) {
    double acc = 0;
    for (int64_t k = 0; k < count; ++k)
      acc += static_cast<double>(grad[tokens[k] * dim + j]);
    out[j] = narrow<T>(acc);
  }
}

/// The tokens of each table row, in token order (compressed rows: row v's
/// tokens are tokens[start[v] .. start[v + 1])), skipping padding_idx.
/// Returns false if an index is outside [0, vocab).
inline bool embeddingBackwardOrder(const int64_t *ids, int64_t count, int64_t vocab,
                                   int64_t paddingIdx, int64_t *start, int64_t *tokens) {
  for (int64_t v = 0; v <= vocab; ++v)
    start[v] = 0;
  for (int64_t k = 0; k < count; ++k) {
    if (ids[k] < 0 || ids[k] >= vocab)
      return false;
    if (ids[k] != paddingIdx)
      ++start[ids[k] + 1];
  }
  for (int64_t v = 0; v < vocab; ++v)
    start[v + 1] += start[v];
  // Fill each row from its start; `start` is restored afterwards.
  for (int64_t k = 0; k < count; ++k)
    if (ids[k] != paddingIdx)
      tokens[start[ids[k]]++] = k;
  for (int64_t v = vocab; v > 0; --v)
    start[v] = start[v - 1];
  start[0] = 0;
  return true;
}

} // namespace tdx::kern

#endif // TDX_RUNTIME_ROWS_H
