//===- AttentionTest.cpp - the CUDA backend's attention row, on CPU vs torch ===//
//
// tdx/Runtime/Attention.h is what lib/Runtime/cuda/Attention.cu launches,
// one thread per query row; here the same function runs on the host for
// every row, against at::scaled_dot_product_attention (its output, and the
// log-sum-exp that ATen's CPU flash attention returns beside it), and the
// backward's row functions against torch's autograd of the same attention.

#include "tdx/Runtime/Attention.h"

#include "AtenTestUtil.h"

#include <ATen/ATen.h>

using namespace tdx::kern;
using tdx::test::expectClose;
using tdx::test::randn;

namespace {

AttentionShape shapeOf(const at::Tensor &q, const at::Tensor &k, const at::Tensor &v,
                       const at::Tensor &m, bool causal, double scale) {
  AttentionShape g;
  g.b = q.size(0), g.h = q.size(1), g.s = q.size(2), g.d = q.size(3);
  g.hkv = k.size(1), g.t = k.size(2), g.e = v.size(3);
  g.scale = static_cast<float>(scale);
  g.causal = causal;
  setMaskStrides(g, m.defined() ? m.dim() : 0, m.defined() ? m.sizes().data() : nullptr,
                 m.defined() ? m.strides().data() : nullptr);
  return g;
}

/// (output, lse) of the row function over every row of q.
std::pair<at::Tensor, at::Tensor> rows(const at::Tensor &q, const at::Tensor &k,
                                       const at::Tensor &v, const at::Tensor &mask, bool causal,
                                       double scale) {
  at::Tensor m = mask.defined() ? mask.contiguous() : mask;
  AttentionShape g = shapeOf(q, k, v, m, causal, scale);
  at::Tensor out = at::empty({g.b, g.h, g.s, g.e}), lse = at::empty({g.b, g.h, g.s});
  for (int64_t r = 0; r < g.b * g.h * g.s; ++r) {
    if (!m.defined())
      attentionRow<float>(g, q.data_ptr<float>(), k.data_ptr<float>(), v.data_ptr<float>(),
                          nullptr, out.data_ptr<float>(), lse.data_ptr<float>(), r);
    else if (m.scalar_type() == at::kBool)
      attentionRow(g, q.data_ptr<float>(), k.data_ptr<float>(), v.data_ptr<float>(),
                   m.data_ptr<bool>(), out.data_ptr<float>(), lse.data_ptr<float>(), r);
    else
      attentionRow(g, q.data_ptr<float>(), k.data_ptr<float>(), v.data_ptr<float>(),
                   m.data_ptr<float>(), out.data_ptr<float>(), lse.data_ptr<float>(), r);
  }
  return {out, lse};
}

TEST(Attention, CausalGroupedQueryMatchesTorch) {
  at::Tensor q = randn({2, 4, 7, 16}, 1), k = randn({2, 2, 7, 16}, 2), v = randn({2, 2, 7, 16}, 3);
  auto [out, lse] = rows(q, k, v, at::Tensor(), /*causal=*/true, 0.25);
  auto [want, wantLse] = at::_scaled_dot_product_flash_attention_for_cpu(q, k, v, 0.0, true,
                                                                        std::nullopt, 0.25);
  expectClose(out, want, 1e-5);
  expectClose(lse, wantLse, 1e-5);
}

TEST(Attention, AdditiveAndBooleanMasksMatchTorch) {
  at::Tensor q = randn({1, 2, 5, 8}, 4), k = randn({1, 2, 6, 8}, 5), v = randn({1, 2, 6, 8}, 6);
  at::Tensor additive = randn({5, 6}, 7);
  auto [out, lse] = rows(q, k, v, additive, false, 1.0 / std::sqrt(8.0));
  expectClose(out, at::scaled_dot_product_attention(q, k, v, additive), 1e-5);
  at::Tensor keep = randn({1, 1, 5, 6}, 8) > 0;
  keep.select(3, 0).fill_(true); // no row fully masked
  auto [kept, keptLse] = rows(q, k, v, keep, false, 1.0 / std::sqrt(8.0));
  expectClose(kept, at::scaled_dot_product_attention(q, k, v, keep), 1e-5);
}

/// (dq, dk, dv) of the backward's row functions, from the forward's output
/// and lse (the row function's own).
template <class Mask>
std::tuple<at::Tensor, at::Tensor, at::Tensor>
backwardRows(const at::Tensor &dout, const at::Tensor &q, const at::Tensor &k,
             const at::Tensor &v, const at::Tensor &out, const at::Tensor &lse,
             const at::Tensor &m, bool causal, double scale) {
  AttentionShape g = shapeOf(q, k, v, m, causal, scale);
  const Mask *mask = m.defined() ? static_cast<const Mask *>(m.data_ptr()) : nullptr;
  at::Tensor dq = at::empty_like(q), dk = at::empty_like(k), dv = at::empty_like(v);
  for (int64_t r = 0; r < g.b * g.h * g.s; ++r)
    attentionBackwardQueryRow(g, dout.data_ptr<float>(), q.data_ptr<float>(), k.data_ptr<float>(),
                              v.data_ptr<float>(), out.data_ptr<float>(), lse.data_ptr<float>(),
                              mask, dq.data_ptr<float>(), r);
  for (int64_t r = 0; r < g.b * g.hkv * g.t; ++r)
    attentionBackwardKeyRow(g, dout.data_ptr<float>(), q.data_ptr<float>(), k.data_ptr<float>(),
                            v.data_ptr<float>(), out.data_ptr<float>(), lse.data_ptr<float>(),
                            mask, dk.data_ptr<float>(), dv.data_ptr<float>(), r);
  return {dq, dk, dv};
}

/// The backward rows against torch's autograd of scaled_dot_product_attention
/// (key and value repeated over each group of query heads, as enable_gqa).
template <class Mask>
void expectBackwardMatchesTorch(const at::Tensor &q, const at::Tensor &k, const at::Tensor &v,
                                const at::Tensor &mask, bool causal, double scale) {
  at::Tensor m = mask.defined() ? mask.contiguous() : mask;
  auto [out, lse] = rows(q, k, v, m, causal, scale);
  at::Tensor dout = randn(out.sizes().vec(), 11);
  auto [dq, dk, dv] = backwardRows<Mask>(dout, q, k, v, out, lse, m, causal, scale);
  int64_t group = q.size(1) / k.size(1);
  at::Tensor qg = q.clone().requires_grad_(), kg = k.clone().requires_grad_(),
             vg = v.clone().requires_grad_();
  at::Tensor want = at::scaled_dot_product_attention(
      qg, kg.repeat_interleave(group, 1), vg.repeat_interleave(group, 1),
      m.defined() ? std::optional<at::Tensor>(m) : std::nullopt, 0.0, causal, scale);
  want.backward(dout);
  expectClose(out, want.detach(), 1e-5);
  expectClose(dq, qg.grad(), 1e-4);
  expectClose(dk, kg.grad(), 1e-4);
  expectClose(dv, vg.grad(), 1e-4);
}

TEST(Attention, BackwardRowsMatchTorchsAutograd) {
  at::Tensor q = randn({2, 4, 7, 16}, 1), k = randn({2, 2, 7, 16}, 2), v = randn({2, 2, 7, 8}, 3);
  expectBackwardMatchesTorch<float>(q, k, v, at::Tensor(), /*causal=*/true, 0.25);
  at::Tensor k6 = randn({2, 2, 6, 16}, 4), v6 = randn({2, 2, 6, 8}, 5);
  expectBackwardMatchesTorch<float>(q, k6, v6, randn({7, 6}, 6), false, 0.25);
  at::Tensor keep = randn({1, 1, 7, 6}, 7) > 0;
  keep.select(3, 0).fill_(true); // no row fully masked
  expectBackwardMatchesTorch<bool>(q, k6, v6, keep, false, 1.0 / std::sqrt(16.0));
}

} // namespace
