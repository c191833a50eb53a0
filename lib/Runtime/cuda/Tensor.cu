//===- Tensor.cu - device tensors, views, copies, elementwise launches ----===//

#include "tdx/Runtime/cuda/Runtime.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <stdexcept>

using namespace tdx::cu;
using tdx::kern::Iter;

namespace {

std::vector<int64_t> denseStrides(const std::vector<int64_t> &shape) {
  std::vector<int64_t> s(shape.size(), 1);
  for (int64_t d = static_cast<int64_t>(shape.size()) - 2; d >= 0; --d)
    s[d] = s[d + 1] * shape[d + 1];
  return s;
}

/// dst[i] = src[i] over `it` (operand 0 = src, 1 = dst), bytes of size T.
template <class T> __global__ void copyKernel(Iter it) {
  int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (i < it.numel)
    it.at<T>(1, i) = it.at<T>(0, i);
}

template <class T> __global__ void fillKernel(T *out, int64_t n, T value) {
  int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (i < n)
    out[i] = value;
}

template <class T> __global__ void arangeKernel(T *out, int64_t n, double start, double step) {
  int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (i < n)
    out[i] = static_cast<T>(start + static_cast<double>(i) * step);
}

/// The Iter of `operands` (all of `shape`'s rank, already broadcast).
Iter iterOver(const std::vector<int64_t> &shape, const std::vector<const Tensor *> &operands) {
  if (shape.size() > static_cast<size_t>(tdx::kern::kMaxRank))
    throw std::runtime_error("tdx: the CUDA backend handles tensors of rank <= 8");
  if (operands.size() > static_cast<size_t>(tdx::kern::kMaxOperands))
    throw std::runtime_error("tdx: a CUDA kernel takes at most 16 operands");
  Iter it;
  it.rank = static_cast<int>(shape.size());
  it.operands = static_cast<int>(operands.size());
  for (size_t d = 0; d < shape.size(); ++d) {
    it.shape[d] = shape[d];
    it.numel *= shape[d];
  }
  for (size_t k = 0; k < operands.size(); ++k) {
    it.data[k] = operands[k]->data();
    for (size_t d = 0; d < shape.size(); ++d)
      it.strides[k][d] = operands[k]->strides()[d];
  }
  return it;
}

} // namespace

void tdx::cu::copyInto(const Tensor &dst, const Tensor &src) {
  Iter it = iterOver(dst.sizes(), {&src, &dst});
  if (it.numel == 0)
    return;
  switch (tdx::rt::dtypeSize(src.dtype())) {
  case 1:
    copyKernel<uint8_t><<<blocksFor(it.numel), 256>>>(it);
    break;
  case 2:
    copyKernel<uint16_t><<<blocksFor(it.numel), 256>>>(it);
    break;
  case 4:
    copyKernel<uint32_t><<<blocksFor(it.numel), 256>>>(it);
    break;
  case 8:
    copyKernel<uint64_t><<<blocksFor(it.numel), 256>>>(it);
    break;
  default:
    throw std::runtime_error(std::string("tdx: copies of ") + tdx::rt::dtypeName(src.dtype()) +
                             " tensors are not supported on CUDA");
  }
  checkLaunch("copy");
}

namespace {

std::vector<int64_t> broadcastShapes(const std::vector<int64_t> &a, const std::vector<int64_t> &b) {
  size_t n = std::max(a.size(), b.size());
  std::vector<int64_t> out(n, 1);
  for (size_t i = 0; i < n; ++i) {
    int64_t x = i < n - a.size() ? 1 : a[i - (n - a.size())];
    int64_t y = i < n - b.size() ? 1 : b[i - (n - b.size())];
    if (x != y && x != 1 && y != 1)
      throw std::runtime_error("tdx: shapes do not broadcast");
    out[i] = x == 1 ? y : x;
  }
  return out;
}

} // namespace

void tdx::cu::checkCuda(cudaError_t e, const std::string &what) {
  if (e != cudaSuccess)
    throw std::runtime_error("tdx: " + what + " failed: " + cudaGetErrorString(e));
}

unsigned tdx::cu::blocksFor(int64_t n) { return static_cast<unsigned>((n + 255) / 256); }

void tdx::cu::checkLaunch(const char *what) {
  checkCuda(cudaGetLastError(), std::string("the ") + what + " kernel");
}

int64_t Tensor::numel() const {
  int64_t n = 1;
  for (int64_t s : shape_)
    n *= s;
  return n;
}

bool Tensor::isContiguous() const { return strides_ == denseStrides(shape_) || numel() <= 1; }

Tensor Tensor::empty(const std::vector<int64_t> &shape, DType dtype) {
  Tensor t;
  t.dtype_ = dtype;
  t.shape_ = shape;
  t.strides_ = denseStrides(shape);
  size_t bytes = static_cast<size_t>(std::max<int64_t>(t.numel(), 1) * rt::dtypeSize(dtype));
  // Stream-ordered on the compute stream from the device's pool, which
  // keeps what is freed (no release threshold): a step's tensors, dropped
  // where their last reader stands, are reused by the next ones without a
  // device synchronization or a driver allocation after the first step.
  static const bool pooled = [] {
    int device = 0;
    cudaMemPool_t pool;
    uint64_t keep = UINT64_MAX;
    checkCuda(cudaGetDevice(&device), "cudaGetDevice");
    checkCuda(cudaDeviceGetDefaultMemPool(&pool, device), "cudaDeviceGetDefaultMemPool");
    checkCuda(cudaMemPoolSetAttribute(pool, cudaMemPoolAttrReleaseThreshold, &keep),
              "cudaMemPoolSetAttribute");
    return true;
  }();
  (void)pooled;
  // A tensor the step's plan placed takes its slot of the arena
  // (tdx/Runtime/Arena.h): the compute stream orders its reuse.
  void *p = rt::Arena::get().take(static_cast<int64_t>(bytes));
  if (p) {
    t.storage_ = std::shared_ptr<void>(p, [](void *q) { rt::Arena::get().give(q); });
    t.data_ = p;
    return t;
  }
  checkCuda(cudaMallocAsync(&p, bytes, nullptr),
            "cudaMallocAsync of " + std::to_string(bytes) + " bytes");
  t.storage_ = std::shared_ptr<void>(p, [](void *q) { cudaFreeAsync(q, nullptr); });
  t.data_ = p;
  return t;
}

Tensor Tensor::contiguous() const {
  if (isContiguous())
    return *this;
  Tensor out = empty(shape_, dtype_);
  copyInto(out, *this);
  return out;
}

Tensor Tensor::reshape(const std::vector<int64_t> &shape) const {
  std::vector<int64_t> s = shape;
  int64_t known = 1, infer = -1;
  for (size_t d = 0; d < s.size(); ++d) {
    if (s[d] == -1)
      infer = static_cast<int64_t>(d);
    else
      known *= s[d];
  }
  if (infer >= 0)
    s[infer] = known ? numel() / known : 0;
  Tensor out = contiguous();
  out.shape_ = s;
  out.strides_ = denseStrides(s);
  if (out.numel() != numel())
    throw std::runtime_error("tdx: reshape changes the number of elements");
  return out;
}

Tensor Tensor::transpose(int64_t d0, int64_t d1) const {
  Tensor out = *this;
  d0 = wrap(d0), d1 = wrap(d1);
  std::swap(out.shape_[d0], out.shape_[d1]);
  std::swap(out.strides_[d0], out.strides_[d1]);
  return out;
}

Tensor Tensor::permute(const std::vector<int64_t> &perm) const {
  Tensor out = *this;
  for (size_t d = 0; d < perm.size(); ++d) {
    out.shape_[d] = shape_[wrap(perm[d])];
    out.strides_[d] = strides_[wrap(perm[d])];
  }
  return out;
}

Tensor Tensor::slice(int64_t dim, int64_t start, int64_t end, int64_t step) const {
  dim = wrap(dim);
  int64_t n = shape_[dim];
  start = std::min(n, start < 0 ? std::max<int64_t>(0, start + n) : start);
  end = std::min(n, end < 0 ? std::max<int64_t>(0, end + n) : end);
  Tensor out = *this;
  out.data_ = static_cast<char *>(data_) + start * strides_[dim] * rt::dtypeSize(dtype_);
  out.shape_[dim] = end > start ? (end - start + step - 1) / step : 0;
  out.strides_[dim] *= step;
  return out;
}

Tensor Tensor::expand(const std::vector<int64_t> &sizes) const {
  Tensor out = *this;
  size_t lead = sizes.size() - shape_.size();
  out.shape_ = sizes;
  out.strides_.assign(sizes.size(), 0);
  for (size_t d = 0; d < sizes.size(); ++d) {
    if (d < lead)
      continue;
    int64_t own = shape_[d - lead];
    if (sizes[d] == -1)
      out.shape_[d] = own;
    out.strides_[d] = own == 1 && out.shape_[d] != 1 ? 0 : strides_[d - lead];
  }
  return out;
}

template <> int64_t Tensor::item<int64_t>() const {
  if (numel() != 1)
    throw std::runtime_error("tdx: item() of a tensor of " + std::to_string(numel()) +
                             " elements");
  int64_t v = 0;
  if (dtype_ == DType::I64) {
    checkCuda(cudaMemcpy(&v, data_, 8, cudaMemcpyDeviceToHost), "cudaMemcpy");
  } else if (dtype_ == DType::I32) {
    int32_t w = 0;
    checkCuda(cudaMemcpy(&w, data_, 4, cudaMemcpyDeviceToHost), "cudaMemcpy");
    v = w;
  } else {
    throw std::runtime_error("tdx: item<int64_t>() of a non-integer tensor");
  }
  return v;
}

Tensor tdx::cu::full(const std::vector<int64_t> &shape, double value, DType dtype) {
  Tensor t = Tensor::empty(shape, dtype);
  int64_t n = t.numel();
  if (n == 0)
    return t;
  switch (dtype) {
  case DType::F32:
    fillKernel<float><<<blocksFor(n), 256>>>(static_cast<float *>(t.data()), n,
                                            static_cast<float>(value));
    break;
  case DType::F64:
    fillKernel<double><<<blocksFor(n), 256>>>(static_cast<double *>(t.data()), n, value);
    break;
  case DType::I64:
    fillKernel<int64_t><<<blocksFor(n), 256>>>(static_cast<int64_t *>(t.data()), n,
                                              static_cast<int64_t>(value));
    break;
  case DType::I32:
    fillKernel<int32_t><<<blocksFor(n), 256>>>(static_cast<int32_t *>(t.data()), n,
                                              static_cast<int32_t>(value));
    break;
  case DType::Bool:
    fillKernel<bool><<<blocksFor(n), 256>>>(static_cast<bool *>(t.data()), n, value != 0);
    break;
  case DType::BF16:
    fillKernel<tdx::kern::bf16><<<blocksFor(n), 256>>>(
        static_cast<tdx::kern::bf16 *>(t.data()), n, tdx::kern::narrow<tdx::kern::bf16>(value));
    break;
  case DType::F16:
    fillKernel<tdx::kern::f16><<<blocksFor(n), 256>>>(
        static_cast<tdx::kern::f16 *>(t.data()), n, tdx::kern::narrow<tdx::kern::f16>(value));
    break;
  default:
    throw std::runtime_error(std::string("tdx: the CUDA backend cannot fill ") +
                             rt::dtypeName(dtype) + " tensors yet");
  }
  checkLaunch("fill");
  return t;
}

Tensor tdx::cu::zeros(const std::vector<int64_t> &shape, DType dtype) {
  return full(shape, 0.0, dtype);
}

Tensor tdx::cu::scalar_tensor(double value, DType dtype) { return full({}, value, dtype); }

Tensor tdx::cu::arange(double start, double end, double step, DType dtype) {
  int64_t n = static_cast<int64_t>(std::ceil((end - start) / step));
  Tensor t = Tensor::empty({std::max<int64_t>(n, 0)}, dtype);
  if (n <= 0)
    return t;
  switch (dtype) {
  case DType::F32:
    arangeKernel<float><<<blocksFor(n), 256>>>(static_cast<float *>(t.data()), n, start, step);
    break;
  case DType::F64:
    arangeKernel<double><<<blocksFor(n), 256>>>(static_cast<double *>(t.data()), n, start, step);
    break;
  case DType::I64:
    arangeKernel<int64_t><<<blocksFor(n), 256>>>(static_cast<int64_t *>(t.data()), n, start, step);
    break;
  case DType::I32:
    arangeKernel<int32_t><<<blocksFor(n), 256>>>(static_cast<int32_t *>(t.data()), n, start, step);
    break;
  default:
    throw std::runtime_error("tdx: arange of this dtype is not supported on CUDA");
  }
  checkLaunch("arange");
  return t;
}

Tensor tdx::cu::constant(const std::vector<double> &values, const std::vector<int64_t> &shape,
                         DType dtype) {
  Tensor t = Tensor::empty(shape, dtype);
  if (static_cast<int64_t>(values.size()) != t.numel())
    throw std::runtime_error("tdx: constant: value count does not match the shape");
  std::vector<char> host(values.size() * rt::dtypeSize(dtype));
  for (size_t i = 0; i < values.size(); ++i) {
    switch (dtype) {
    case DType::F32: reinterpret_cast<float *>(host.data())[i] = static_cast<float>(values[i]); break;
    case DType::F64: reinterpret_cast<double *>(host.data())[i] = values[i]; break;
    case DType::I64: reinterpret_cast<int64_t *>(host.data())[i] = static_cast<int64_t>(values[i]); break;
    case DType::I32: reinterpret_cast<int32_t *>(host.data())[i] = static_cast<int32_t>(values[i]); break;
    case DType::Bool: reinterpret_cast<bool *>(host.data())[i] = values[i] != 0; break;
    case DType::BF16:
      reinterpret_cast<tdx::kern::bf16 *>(host.data())[i] = tdx::kern::narrow<tdx::kern::bf16>(values[i]);
      break;
    case DType::F16:
      reinterpret_cast<tdx::kern::f16 *>(host.data())[i] = tdx::kern::narrow<tdx::kern::f16>(values[i]);
      break;
    default: throw std::runtime_error("tdx: constants of this dtype are not supported on CUDA");
    }
  }
  if (!host.empty())
    checkCuda(cudaMemcpy(t.data(), host.data(), host.size(), cudaMemcpyHostToDevice), "cudaMemcpy");
  return t;
}

Tensor tdx::cu::concat(const std::vector<Tensor> &xs, int64_t dim) {
  if (xs.empty())
    throw std::runtime_error("tdx: concat of no tensors");
  dim = xs.front().wrap(dim);
  std::vector<int64_t> shape = xs.front().sizes();
  shape[dim] = 0;
  for (const Tensor &x : xs)
    shape[dim] += x.size(dim);
  Tensor out = Tensor::empty(shape, xs.front().dtype());
  int64_t at = 0;
  for (const Tensor &x : xs) {
    copyInto(out.slice(dim, at, at + x.size(dim), 1), x);
    at += x.size(dim);
  }
  return out;
}

std::vector<Tensor> tdx::cu::elementwise(std::vector<int64_t> shape,
                                         const std::vector<Tensor> &inputs,
                                         const std::vector<DType> &outputTypes,
                                         KernelLaunch launch) {
  if (std::count(shape.begin(), shape.end(), -1)) {
    std::vector<int64_t> known;
    for (const Tensor &t : inputs)
      known = broadcastShapes(known, t.sizes());
    for (size_t d = 0; d < shape.size() && known.size() == shape.size(); ++d)
      if (shape[d] == -1)
        shape[d] = known[d];
  }
  std::vector<Tensor> operands;
  for (const Tensor &t : inputs)
    operands.push_back(t.expand(shape));
  std::vector<Tensor> outputs;
  for (DType t : outputTypes)
    outputs.push_back(Tensor::empty(shape, t));
  operands.insert(operands.end(), outputs.begin(), outputs.end());
  std::vector<const Tensor *> ptrs;
  for (const Tensor &t : operands)
    ptrs.push_back(&t);
  Iter it = iterOver(shape, ptrs);
  if (it.numel > 0) {
    launch(it, nullptr);
    checkLaunch("elementwise");
  }
  return outputs;
}
