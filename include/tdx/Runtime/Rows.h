//===- Rows.h - the per-row kernels of the CUDA backend -----------*- C++ -*-===//
//
// The non-elementwise ops of the CUDA backend (softmax, norms, reductions,
// cross-entropy, embedding rows) as `__host__ __device__` functions of one
// row, and `Iter`, the strided iteration of elementwise kernels and copies.
// lib/Runtime/cuda launches them one thread block per row (the lanes of a
// row share its elements and combine their partial sums with warp shuffles
// and shared memory); the unit tests (test/unit/RowsTest.cpp) run the very
// same functions on the CPU, one lane per row, against ATen. Statistics
// accumulate in double.
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
    y[i * stride] = static_cast<T>(logSoftmax ? v - logSum : ::exp(v) / sum);
  }
}

/// layer_norm of a dense row: (x - mean) / sqrt(var + eps) * w + b, with the
/// biased variance; w and b may be null.
template <class T, class Lanes>
TDX_HD void layerNormRow(const Lanes &g, const T *x, const T *w, const T *b, T *y, int64_t n,
                         double eps) {
  double mean = reduceRow(g, RowMean, x, n, 1), var = 0;
  for (int64_t i = g.lane(); i < n; i += g.count()) {
    double d = static_cast<double>(x[i]) - mean;
    var += d * d;
  }
  var = g.sum(var);
  double rstd = 1.0 / ::sqrt(var / static_cast<double>(n) + eps);
  for (int64_t i = g.lane(); i < n; i += g.count()) {
    double v = (static_cast<double>(x[i]) - mean) * rstd;
    if (w)
      v *= static_cast<double>(w[i]);
    if (b)
      v += static_cast<double>(b[i]);
    y[i] = static_cast<T>(v);
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
    y[i] = static_cast<T>(w ? v * static_cast<double>(w[i]) : v);
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

} // namespace tdx::kern

#endif // TDX_RUNTIME_ROWS_H
