//===- Attention.cu - tdx.sdpa on CUDA: one thread per query row ----------===//
//
// The row function is tdx/Runtime/Attention.h's (online softmax over the
// keys), which the host unit test runs against torch. Float32; the
// backward has no CUDA kernel yet (tdx.sdpa_backward is refused at emission).
//
//===----------------------------------------------------------------------===//

#include "Blas.cuh"

#include "tdx/Runtime/Attention.h"
#include "tdx/Runtime/cuda/Runtime.h"

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

} // namespace

std::tuple<Tensor, Tensor> tdx::cu::sdpa(const Tensor &q0, const Tensor &k0, const Tensor &v0,
                                         const Tensor &mask0, bool causal,
                                         std::optional<double> scale) {
  if (q0.dtype() != DType::F32 || k0.dtype() != DType::F32 || v0.dtype() != DType::F32)
    throw std::runtime_error("tdx: sdpa on CUDA computes float32 only (got " +
                             std::string(tdx::rt::dtypeName(q0.dtype())) + ")");
  if (q0.dim() != 4 || k0.dim() != 4 || v0.dim() != 4)
    throw std::runtime_error("tdx: sdpa takes [batch, heads, seq, dim] tensors");
  Tensor q = q0.contiguous(), k = k0.contiguous(), v = v0.contiguous();
  AttentionShape g;
  g.b = q.size(0), g.h = q.size(1), g.s = q.size(2), g.d = q.size(3);
  g.hkv = k.size(1), g.t = k.size(2), g.e = v.size(3);
  if (g.e > tdx::kern::kMaxAttentionDim)
    throw std::runtime_error("tdx: sdpa on CUDA takes value heads of at most " +
                             std::to_string(tdx::kern::kMaxAttentionDim) + " elements, got " +
                             std::to_string(g.e));
  g.scale = static_cast<float>(scale ? *scale : 1.0 / std::sqrt(static_cast<double>(g.d)));
  g.causal = causal;
  Tensor mask = mask0.defined() ? mask0.contiguous() : mask0;
  tdx::kern::setMaskStrides(g, mask.defined() ? mask.dim() : 0, mask.sizes().data(),
                            mask.strides().data());
  Tensor out = Tensor::empty({g.b, g.h, g.s, g.e}, DType::F32);
  Tensor lse = Tensor::empty({g.b, g.h, g.s}, DType::F32);
  int64_t rows = g.b * g.h * g.s;
  constexpr unsigned kThreads = 128;
  unsigned blocks = static_cast<unsigned>((rows + kThreads - 1) / kThreads);
  auto args = [&](auto *m) {
    using M = std::remove_const_t<std::remove_pointer_t<decltype(m)>>;
    if (rows)
      attentionKernel<M><<<blocks, kThreads>>>(
          g, static_cast<const float *>(q.data()), static_cast<const float *>(k.data()),
          static_cast<const float *>(v.data()), m, static_cast<float *>(out.data()),
          static_cast<float *>(lse.data()), rows);
  };
  if (!mask.defined())
    args(static_cast<const float *>(nullptr));
  else if (mask.dtype() == DType::Bool)
    args(static_cast<const bool *>(mask.data()));
  else if (mask.dtype() == DType::F32)
    args(static_cast<const float *>(mask.data()));
  else
    throw std::runtime_error("tdx: sdpa's mask on CUDA is bool or float32");
  checkLaunch("sdpa");
  return {out, lse};
}
