//===- Rows.h - the per-row kernels of the CUDA backend -----------*- C++ -*-===//
//
// The non-elementwise ops of the CUDA backend (softmax, norms, reductions,
// cross-entropy, embedding rows) as `__host__ __device__` functions of one
// row, and `Iter`, the strided iteration of elementwise kernels and copies.
// lib/Runtime/cuda launches them one row (or element) per thread; the unit
// tests (test/unit/RowsTest.cpp) run the very same functions on the CPU
// against ATen. Statistics accumulate in double.
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

/// sum / mean / max of x[0], x[stride], ... (n elements; max of none: -inf).
template <class T> TDX_HD double reduceRow(int kind, const T *x, int64_t n, int64_t stride) {
  if (kind == RowMax) {
    double m = -INFINITY;
    for (int64_t i = 0; i < n; ++i) {
      double v = static_cast<double>(x[i * stride]);
      if (v != v)
        return v;
      m = v > m ? v : m;
    }
    return m;
  }
  double s = 0;
  for (int64_t i = 0; i < n; ++i)
    s += static_cast<double>(x[i * stride]);
  return kind == RowMean ? s / static_cast<double>(n) : s;
}

/// softmax (or log_softmax) of a strided row.
template <class T>
TDX_HD void softmaxRow(const T *x, T *y, int64_t n, int64_t stride, bool logSoftmax) {
  double m = reduceRow(RowMax, x, n, stride);
  double sum = 0;
  for (int64_t i = 0; i < n; ++i)
    sum += ::exp(static_cast<double>(x[i * stride]) - m);
  double logSum = ::log(sum);
  for (int64_t i = 0; i < n; ++i) {
    double v = static_cast<double>(x[i * stride]) - m;
    y[i * stride] = static_cast<T>(logSoftmax ? v - logSum : ::exp(v) / sum);
  }
}

/// layer_norm of a dense row: (x - mean) / sqrt(var + eps) * w + b, with the
/// biased variance; w and b may be null.
template <class T>
TDX_HD void layerNormRow(const T *x, const T *w, const T *b, T *y, int64_t n, double eps) {
  double mean = reduceRow(RowMean, x, n, 1), var = 0;
  for (int64_t i = 0; i < n; ++i) {
    double d = static_cast<double>(x[i]) - mean;
    var += d * d;
  }
  double rstd = 1.0 / ::sqrt(var / static_cast<double>(n) + eps);
  for (int64_t i = 0; i < n; ++i) {
    double v = (static_cast<double>(x[i]) - mean) * rstd;
    if (w)
      v *= static_cast<double>(w[i]);
    if (b)
      v += static_cast<double>(b[i]);
    y[i] = static_cast<T>(v);
  }
}

/// rms_norm of a dense row: x / sqrt(mean(x^2) + eps) * w; w may be null.
template <class T> TDX_HD void rmsNormRow(const T *x, const T *w, T *y, int64_t n, double eps) {
  double ms = 0;
  for (int64_t i = 0; i < n; ++i)
    ms += static_cast<double>(x[i]) * static_cast<double>(x[i]);
  double r = 1.0 / ::sqrt(ms / static_cast<double>(n) + eps);
  for (int64_t i = 0; i < n; ++i) {
    double v = static_cast<double>(x[i]) * r;
    y[i] = static_cast<T>(w ? v * static_cast<double>(w[i]) : v);
  }
}

/// The cross-entropy loss of one sample: logits of its n classes at stride
/// `stride`, its target class, and label smoothing eps:
/// -(1 - eps) * logp[target] - eps / n * sum(logp).
template <class T>
TDX_HD double crossEntropyRow(const T *logits, int64_t n, int64_t stride, int64_t target,
                              double smoothing) {
  double m = reduceRow(RowMax, logits, n, stride), sum = 0, all = 0;
  for (int64_t i = 0; i < n; ++i) {
    double v = static_cast<double>(logits[i * stride]) - m;
    sum += ::exp(v);
    all += v;
  }
  double logSum = ::log(sum);
  double picked = static_cast<double>(logits[target * stride]) - m - logSum;
  double mean = (all - static_cast<double>(n) * logSum) / static_cast<double>(n);
  return -(1.0 - smoothing) * picked - smoothing * mean;
}

} // namespace tdx::kern

#endif // TDX_RUNTIME_ROWS_H
