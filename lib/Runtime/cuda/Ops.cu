//===- Ops.cu - matmul on cuBLAS, the row kernels of tdx/Runtime/Rows.h ---===//
//
// Each non-elementwise op runs its row function (shared with the host unit
// tests) one thread block per row over a dense, row-major copy of its input
// with the reduced dims innermost; the block's threads share the row's
// elements and combine through warp shuffles and shared memory. cuBLAS does
// matmul and linear.
//
//===----------------------------------------------------------------------===//

#include "Blas.cuh"
#include "RowLaunch.cuh"

#include <stdexcept>

using namespace tdx::cu;
using tdx::kern::crossEntropyRow;
using tdx::kern::layerNormRow;
using tdx::kern::reduceRow;
using tdx::kern::rmsNormRow;
using tdx::kern::RowMax;
using tdx::kern::RowMean;
using tdx::kern::RowSum;
using tdx::kern::softmaxRow;

using namespace tdx::cu::detail;

namespace {

template <class T> __global__ void addBiasKernel(T *y, const T *bias, int64_t rows, int64_t n) {
  int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (i < rows * n)
    if constexpr (sizeof(T) == 2) // bf16, f16: in float, rounded once
      y[i] = static_cast<T>(static_cast<float>(y[i]) + static_cast<float>(bias[i % n]));
    else
      y[i] += bias[i % n];
}

template <class T> __global__ void reduceKernel(const T *x, T *y, int64_t rows, int64_t n, int kind) {
  TDX_FOR_ROWS(r, rows) {
    double v = reduceRow(lanes, kind, x + r * n, n, 1);
    if (threadIdx.x == 0)
      y[r] = tdx::kern::narrow<T>(v);
  }
}

template <class T> __global__ void softmaxKernel(const T *x, T *y, int64_t rows, int64_t n, bool log) {
  TDX_FOR_ROWS(r, rows) softmaxRow(lanes, x + r * n, y + r * n, n, 1, log);
}

template <class T>
__global__ void layerNormKernel(const T *x, const T *w, const T *b, T *y, int64_t rows, int64_t n,
                                double eps) {
  TDX_FOR_ROWS(r, rows) layerNormRow(lanes, x + r * n, w, b, y + r * n, n, eps);
}

template <class T>
__global__ void rmsNormKernel(const T *x, const T *w, T *y, int64_t rows, int64_t n, double eps) {
  TDX_FOR_ROWS(r, rows) rmsNormRow(lanes, x + r * n, w, y + r * n, n, eps);
}

template <class T>
__global__ void embeddingKernel(const T *w, const int64_t *ids, T *y, int64_t count, int64_t vocab,
                                int64_t dim, int *bad) {
  // A block per looked-up row, its threads over the row's elements.
  for (int64_t r = blockIdx.x; r < count; r += gridDim.x) {
    int64_t id = ids[r];
    if (id < 0 || id >= vocab) {
      if (threadIdx.x == 0)
        atomicExch(bad, 1);
      id = 0;
    }
    for (int64_t j = threadIdx.x; j < dim; j += blockDim.x)
      y[r * dim + j] = w[id * dim + j];
  }
}

template <class T>
__global__ void crossEntropyKernel(const T *logits, const int64_t *target, double *loss,
                                   int64_t rows, int64_t classes, int64_t inner, int64_t ignore,
                                   double smoothing, int *bad) {
  TDX_FOR_ROWS(r, rows) {
    int64_t t = target[r];
    if (t == ignore || t < 0 || t >= classes) { // the whole block takes this branch
      if (threadIdx.x == 0) {
        loss[r] = NAN; // not counted
        if (t != ignore)
          atomicExch(bad, 1);
      }
      continue;
    }
    const T *row = logits + (r / inner) * classes * inner + r % inner;
    double v = crossEntropyRow(lanes, row, classes, inner, t, smoothing);
    if (threadIdx.x == 0)
      loss[r] = v;
  }
}

/// out = sum or mean of the counted (non-NaN) losses, by one block; or each
/// loss (0 when ignored) for reduction none.
template <class T>
__global__ void lossReduceKernel(const double *loss, T *out, int64_t rows, int64_t reduction) {
  extern __shared__ double rowScratch[];
  BlockLanes lanes{rowScratch};
  if (reduction == 0) {
    for (int64_t r = threadIdx.x; r < rows; r += blockDim.x)
      out[r] = tdx::kern::narrow<T>(loss[r] != loss[r] ? 0.0 : loss[r]);
    return;
  }
  double sum, counted;
  tdx::kern::countedSum(lanes, loss, rows, sum, counted);
  if (threadIdx.x == 0)
    out[0] = tdx::kern::narrow<T>(reduction == 1 ? sum / counted : sum);
}

Tensor reduce(int kind, const Tensor &x, std::vector<int64_t> dims, bool keepdim, const char *op) {
  int64_t rank = x.dim();
  if (dims.empty())
    for (int64_t d = 0; d < rank; ++d)
      dims.push_back(d);
  std::vector<bool> reduced(rank, false);
  for (int64_t d : dims)
    reduced[x.wrap(d)] = true;
  std::vector<int64_t> order, kept, outShape;
  for (int64_t d = 0; d < rank; ++d)
    if (!reduced[d]) {
      order.push_back(d);
      kept.push_back(x.size(d));
    }
  int64_t n = 1;
  for (int64_t d = 0; d < rank; ++d)
    if (reduced[d]) {
      order.push_back(d);
      n *= x.size(d);
    }
  for (int64_t d = 0; d < rank; ++d)
    if (!reduced[d] || keepdim)
      outShape.push_back(reduced[d] ? 1 : x.size(d));
  Tensor xp = x.permute(order).contiguous();
  Tensor out = Tensor::empty(outShape, x.dtype());
  int64_t rows = out.numel();
  anyFloatTypes(x.dtype(), op, [&](auto tag) {
    using T = decltype(tag);
    reduceKernel<T><<<rowBlocks(rows), kRowThreads, kRowShared>>>(static_cast<const T *>(xp.data()),
                                              static_cast<T *>(out.data()), rows, n, kind);
  });
  checkLaunch(op);
  return out;
}

Tensor softmaxAlong(const Tensor &x, int64_t dim, bool log) {
  dim = x.wrap(dim);
  Tensor xt = x.transpose(dim, x.dim() - 1).contiguous();
  Tensor y = Tensor::empty(xt.sizes(), x.dtype());
  int64_t n = x.dim() ? x.size(dim) : 1, rows = n ? xt.numel() / n : 0;
  anyFloatTypes(x.dtype(), "softmax", [&](auto tag) {
    using T = decltype(tag);
    softmaxKernel<T><<<rowBlocks(rows), kRowThreads, kRowShared>>>(static_cast<const T *>(xt.data()),
                                               static_cast<T *>(y.data()), rows, n, log);
  });
  checkLaunch("softmax");
  return y.transpose(dim, x.dim() - 1).contiguous();
}

} // namespace

Tensor tdx::cu::matmul(const Tensor &a0, const Tensor &b0) {
  Tensor a = a0.dim() == 1 ? a0.reshape({1, a0.size(0)}) : a0;
  Tensor b = b0.dim() == 1 ? b0.reshape({b0.size(0), 1}) : b0;
  if (a.dtype() != b.dtype())
    throw std::runtime_error("tdx: matmul of different dtypes");
  int64_t m = a.size(-2), k = a.size(-1), n = b.size(-1);
  if (b.size(-2) != k)
    throw std::runtime_error("tdx: matmul: inner dimensions differ");
  std::vector<int64_t> shape;
  Tensor out;
  if (b.dim() == 2) {
    // Fold a's batch into its rows: one gemm.
    Tensor ac = a.contiguous();
    Tensor bc = b.contiguous();
    shape = a.sizes();
    shape.back() = n;
    out = Tensor::empty(shape, a.dtype());
    int64_t rows = ac.numel() / k;
    anyFloatTypes(a.dtype(), "matmul", [&](auto tag) {
      using T = decltype(tag);
      gemm<T>(static_cast<const T *>(ac.data()), static_cast<const T *>(bc.data()),
              static_cast<T *>(out.data()), rows, n, k, 1, false);
    });
  } else {
    std::vector<int64_t> ab(a.sizes().begin(), a.sizes().end() - 2),
        bb(b.sizes().begin(), b.sizes().end() - 2);
    size_t r = std::max(ab.size(), bb.size());
    std::vector<int64_t> batch(r, 1);
    for (size_t i = 0; i < r; ++i) {
      int64_t x = i < r - ab.size() ? 1 : ab[i - (r - ab.size())];
      int64_t y = i < r - bb.size() ? 1 : bb[i - (r - bb.size())];
      batch[i] = x == 1 ? y : x;
    }
    std::vector<int64_t> as = batch, bs = batch;
    as.insert(as.end(), {m, k});
    bs.insert(bs.end(), {k, n});
    Tensor ac = a.expand(as).contiguous(), bc = b.expand(bs).contiguous();
    shape = batch;
    shape.insert(shape.end(), {m, n});
    out = Tensor::empty(shape, a.dtype());
    int64_t count = product(batch, 0, batch.size());
    anyFloatTypes(a.dtype(), "matmul", [&](auto tag) {
      using T = decltype(tag);
      gemm<T>(static_cast<const T *>(ac.data()), static_cast<const T *>(bc.data()),
              static_cast<T *>(out.data()), m, n, k, count, false);
    });
  }
  if (a0.dim() == 1 || b0.dim() == 1) {
    std::vector<int64_t> s(shape.begin(), shape.end() - 2);
    if (a0.dim() != 1)
      s.push_back(m);
    if (b0.dim() != 1)
      s.push_back(n);
    out = out.reshape(s);
  }
  return out;
}

Tensor tdx::cu::linear(const Tensor &x, const Tensor &w, const Tensor &bias) {
  int64_t k = x.size(-1), n = w.size(0);
  if (w.size(1) != k)
    throw std::runtime_error("tdx: linear: weight and input features differ");
  Tensor xc = x.contiguous(), wc = w.contiguous();
  std::vector<int64_t> shape = x.sizes();
  shape.back() = n;
  Tensor out = Tensor::empty(shape, x.dtype());
  int64_t rows = k ? xc.numel() / k : 0;
  anyFloatTypes(x.dtype(), "linear", [&](auto tag) {
    using T = decltype(tag);
    gemm<T>(static_cast<const T *>(xc.data()), static_cast<const T *>(wc.data()),
            static_cast<T *>(out.data()), rows, n, k, 1, true);
    if (bias.defined()) {
      Tensor bc = bias.contiguous();
      addBiasKernel<T><<<blocksFor(rows * n), 256>>>(static_cast<T *>(out.data()),
                                                     static_cast<const T *>(bc.data()), rows, n);
      checkLaunch("bias add");
    }
  });
  return out;
}

Tensor tdx::cu::sum(const Tensor &x) { return reduce(RowSum, x, {}, false, "sum"); }
Tensor tdx::cu::sum(const Tensor &x, const std::vector<int64_t> &dims, bool keepdim) {
  return reduce(RowSum, x, dims, keepdim, "sum");
}
Tensor tdx::cu::mean(const Tensor &x) { return reduce(RowMean, x, {}, false, "mean"); }
Tensor tdx::cu::mean(const Tensor &x, const std::vector<int64_t> &dims, bool keepdim) {
  return reduce(RowMean, x, dims, keepdim, "mean");
}
Tensor tdx::cu::amax(const Tensor &x) { return reduce(RowMax, x, {}, false, "amax"); }
Tensor tdx::cu::amax(const Tensor &x, const std::vector<int64_t> &dims, bool keepdim) {
  return reduce(RowMax, x, dims, keepdim, "amax");
}

Tensor tdx::cu::softmax(const Tensor &x, int64_t dim) { return softmaxAlong(x, dim, false); }
Tensor tdx::cu::log_softmax(const Tensor &x, int64_t dim) { return softmaxAlong(x, dim, true); }

Tensor tdx::cu::layer_norm(const Tensor &x, const std::vector<int64_t> &normalizedShape,
                           const Tensor &w, const Tensor &b, double eps) {
  int64_t n = product(normalizedShape, 0, normalizedShape.size());
  Tensor xc = x.contiguous(), y = Tensor::empty(x.sizes(), x.dtype());
  Tensor wc = w.defined() ? w.contiguous() : w, bc = b.defined() ? b.contiguous() : b;
  int64_t rows = n ? xc.numel() / n : 0;
  anyFloatTypes(x.dtype(), "layer_norm", [&](auto tag) {
    using T = decltype(tag);
    layerNormKernel<T><<<rowBlocks(rows), kRowThreads, kRowShared>>>(
        static_cast<const T *>(xc.data()), static_cast<const T *>(wc.data()),
        static_cast<const T *>(bc.data()), static_cast<T *>(y.data()), rows, n, eps);
  });
  checkLaunch("layer_norm");
  return y;
}

Tensor tdx::cu::rms_norm(const Tensor &x, const std::vector<int64_t> &normalizedShape,
                         const Tensor &w, double eps) {
  int64_t n = product(normalizedShape, 0, normalizedShape.size());
  Tensor xc = x.contiguous(), y = Tensor::empty(x.sizes(), x.dtype());
  Tensor wc = w.defined() ? w.contiguous() : w;
  int64_t rows = n ? xc.numel() / n : 0;
  anyFloatTypes(x.dtype(), "rms_norm", [&](auto tag) {
    using T = decltype(tag);
    rmsNormKernel<T><<<rowBlocks(rows), kRowThreads, kRowShared>>>(static_cast<const T *>(xc.data()),
                                               static_cast<const T *>(wc.data()),
                                               static_cast<T *>(y.data()), rows, n, eps);
  });
  checkLaunch("rms_norm");
  return y;
}

Tensor tdx::cu::embedding(const Tensor &weight, const Tensor &ids) {
  if (ids.dtype() != DType::I64)
    throw std::runtime_error("tdx: embedding indices must be int64");
  Tensor wc = weight.contiguous(), ic = ids.contiguous();
  int64_t vocab = weight.size(0), dim = weight.size(1), count = ic.numel();
  std::vector<int64_t> shape = ids.sizes();
  shape.push_back(dim);
  Tensor y = Tensor::empty(shape, weight.dtype());
  int *bad = newFlag();
  anyFloatTypes(weight.dtype(), "embedding", [&](auto tag) {
    using T = decltype(tag);
    embeddingKernel<T><<<rowBlocks(count), kRowThreads>>>(static_cast<const T *>(wc.data()),
                                                  static_cast<const int64_t *>(ic.data()),
                                                  static_cast<T *>(y.data()), count, vocab, dim,
                                                  bad);
  });
  checkLaunch("embedding");
  checkFlag(bad, "tdx: embedding: an index is out of range of the table");
  return y;
}

Tensor tdx::cu::cross_entropy_loss(const Tensor &logits, const Tensor &target,
                                   const Tensor &weight, int64_t reduction, int64_t ignoreIndex,
                                   double smoothing) {
  if (weight.defined())
    throw std::runtime_error("tdx: cross_entropy with class weights is not supported on CUDA");
  if (target.dtype() != DType::I64)
    throw std::runtime_error("tdx: cross_entropy targets must be int64");
  Tensor lc = logits.contiguous(), tc = target.contiguous();
  int64_t classDim = logits.dim() >= 2 ? 1 : 0;
  int64_t classes = logits.size(classDim);
  int64_t inner = product(logits.sizes(), classDim + 1, logits.sizes().size());
  int64_t rows = classes ? lc.numel() / classes : 0;
  Tensor losses = Tensor::empty({rows}, DType::F64);
  Tensor out = Tensor::empty(reduction == 0 ? target.sizes() : std::vector<int64_t>{},
                             logits.dtype());
  int *bad = newFlag();
  anyFloatTypes(logits.dtype(), "cross_entropy", [&](auto tag) {
    using T = decltype(tag);
    crossEntropyKernel<T><<<rowBlocks(rows), kRowThreads, kRowShared>>>(
        static_cast<const T *>(lc.data()), static_cast<const int64_t *>(tc.data()),
        static_cast<double *>(losses.data()), rows, classes, inner, ignoreIndex, smoothing, bad);
    lossReduceKernel<T><<<1, kRowThreads, kRowShared>>>(static_cast<const double *>(losses.data()),
                                  static_cast<T *>(out.data()), rows, reduction);
  });
  checkLaunch("cross_entropy");
  checkFlag(bad, "tdx: cross_entropy: a target is out of range of the classes");
  return out;
}
