//===- Attention.cu - tdx.sdpa on CUDA: one thread per query row ----------===//
//
// The row functions are tdx/Runtime/Attention.h's (the forward's online
// softmax over the keys; the backward's query rows and key rows), which the
// host unit test runs against torch. Float32.
//
//===----------------------------------------------------------------------===//

#include "Blas.cuh"

#include "tdx/Runtime/Attention.h"
#include "tdx/Runtime/cuda/Runtime.h"

#include <algorithm>
#include <stdexcept>

using namespace tdx::cu;
using tdx::kern::AttentionShape;

namespace {

template <class Mask>
__global__ void attentionKernel(AttentionShape g, const float *q, const float *k, const float *v,
                                const Mask *mask, float *out, float *lse, int64_t rows) {
  int64_t row = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (row < rows)
    tdx::kern::attentionRow(g, q, k, v, mask, out, lse, row);
}

template <class Mask>
__global__ void attentionQueryGradKernel(AttentionShape g, const float *dout, const float *q,
                                         const float *k, const float *v, const float *out,
                                         const float *lse, const Mask *mask, float *dq,
                                         int64_t rows) {
  int64_t row = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (row < rows)
    tdx::kern::attentionBackwardQueryRow(g, dout, q, k, v, out, lse, mask, dq, row);
}

template <class Mask>
__global__ void attentionKeyGradKernel(AttentionShape g, const float *dout, const float *q,
                                       const float *k, const float *v, const float *out,
                                       const float *lse, const Mask *mask, float *dk, float *dv,
                                       int64_t rows) {
  int64_t row = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (row < rows)
    tdx::kern::attentionBackwardKeyRow(g, dout, q, k, v, out, lse, mask, dk, dv, row);
}

constexpr unsigned kThreads = 128;

unsigned blocksFor(int64_t rows) {
  return static_cast<unsigned>((rows + kThreads - 1) / kThreads);
}

/// The shape of one call from its [batch, heads, seq, dim] tensors, after
/// the checks both directions share.
AttentionShape attentionShape(const Tensor &q, const Tensor &k, const Tensor &v,
                              const Tensor &mask, bool causal, std::optional<double> scale) {
  if (q.dtype() != DType::F32 || k.dtype() != DType::F32 || v.dtype() != DType::F32)
    throw std::runtime_error("tdx: sdpa on CUDA computes float32 only (got " +
                             std::string(tdx::rt::dtypeName(q.dtype())) + ")");
  if (q.dim() != 4 || k.dim() != 4 || v.dim() != 4)
    throw std::runtime_error("tdx: sdpa takes [batch, heads, seq, dim] tensors");
  AttentionShape g;
  g.b = q.size(0), g.h = q.size(1), g.s = q.size(2), g.d = q.size(3);
  g.hkv = k.size(1), g.t = k.size(2), g.e = v.size(3);
  if (g.e > tdx::kern::kMaxAttentionDim || g.d > tdx::kern::kMaxAttentionDim)
    throw std::runtime_error("tdx: sdpa on CUDA takes heads of at most " +
                             std::to_string(tdx::kern::kMaxAttentionDim) + " elements, got " +
                             std::to_string(std::max(g.d, g.e)));
  g.scale = static_cast<float>(scale ? *scale : 1.0 / std::sqrt(static_cast<double>(g.d)));
  g.causal = causal;
  tdx::kern::setMaskStrides(g, mask.defined() ? mask.dim() : 0, mask.sizes().data(),
                            mask.strides().data());
  return g;
}

/// Calls `launch` with the mask's typed pointer (float additive, bool keep,
/// or a null float pointer).
template <class Launch>
void withMask(const Tensor &mask, Launch launch) {
  if (!mask.defined())
    launch(static_cast<const float *>(nullptr));
  else if (mask.dtype() == DType::Bool)
    launch(static_cast<const bool *>(mask.data()));
  else if (mask.dtype() == DType::F32)
    launch(static_cast<const float *>(mask.data()));
  else
    throw std::runtime_error("tdx: sdpa's mask on CUDA is bool or float32");
}

const float *f32(const Tensor &t) { return static_cast<const float *>(t.data()); }
float *f32(Tensor &t) { return static_cast<float *>(t.data()); }

} // namespace

std::tuple<Tensor, Tensor> tdx::cu::sdpa(const Tensor &q0, const Tensor &k0, const Tensor &v0,
                                         const Tensor &mask0, bool causal,
                                         std::optional<double> scale) {
  Tensor q = q0.contiguous(), k = k0.contiguous(), v = v0.contiguous();
  Tensor mask = mask0.defined() ? mask0.contiguous() : mask0;
  AttentionShape g = attentionShape(q, k, v, mask, causal, scale);
  Tensor out = Tensor::empty({g.b, g.h, g.s, g.e}, DType::F32);
  Tensor lse = Tensor::empty({g.b, g.h, g.s}, DType::F32);
  int64_t rows = g.b * g.h * g.s;
  withMask(mask, [&](auto *m) {
    using M = std::remove_const_t<std::remove_pointer_t<decltype(m)>>;
    if (rows)
      attentionKernel<M><<<blocksFor(rows), kThreads>>>(g, f32(q), f32(k), f32(v), m, f32(out),
                                                        f32(lse), rows);
  });
  checkLaunch("sdpa");
  return {out, lse};
}

std::tuple<Tensor, Tensor, Tensor>
tdx::cu::sdpa_backward(const Tensor &grad0, const Tensor &q0, const Tensor &k0, const Tensor &v0,
                       const Tensor &out0, const Tensor &lse0, const Tensor &mask0, bool causal,
                       std::optional<double> scale) {
  Tensor grad = grad0.contiguous(), q = q0.contiguous(), k = k0.contiguous(),
         v = v0.contiguous(), out = out0.contiguous(), lse = lse0.contiguous();
  Tensor mask = mask0.defined() ? mask0.contiguous() : mask0;
  AttentionShape g = attentionShape(q, k, v, mask, causal, scale);
  Tensor dq = Tensor::empty({g.b, g.h, g.s, g.d}, DType::F32);
  Tensor dk = Tensor::empty({g.b, g.hkv, g.t, g.d}, DType::F32);
  Tensor dv = Tensor::empty({g.b, g.hkv, g.t, g.e}, DType::F32);
  int64_t queryRows = g.b * g.h * g.s, keyRows = g.b * g.hkv * g.t;
  withMask(mask, [&](auto *m) {
    using M = std::remove_const_t<std::remove_pointer_t<decltype(m)>>;
    if (queryRows)
      attentionQueryGradKernel<M><<<blocksFor(queryRows), kThreads>>>(
          g, f32(grad), f32(q), f32(k), f32(v), f32(out), f32(lse), m, f32(dq), queryRows);
    if (keyRows)
      attentionKeyGradKernel<M><<<blocksFor(keyRows), kThreads>>>(
          g, f32(grad), f32(q), f32(k), f32(v), f32(out), f32(lse), m, f32(dk), f32(dv),
          keyRows);
  });
  checkLaunch("sdpa_backward");
  return {dq, dk, dv};
}
