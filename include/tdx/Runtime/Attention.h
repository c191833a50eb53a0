//===- Attention.h - one query row of fused attention, host and device -*- C++ -*-===//
//
// The CUDA backend's tdx.sdpa: one thread per query row (batch, head, i)
// streams over the keys with an online softmax (running max and sum,
// rescaling the accumulated output), so the scores are never stored. Its
// tdx.sdpa_backward recomputes each probability from the forward's
// log-sum-exp: one thread per query row for the query's gradient, one per
// key row for the key's and value's (summing over the query heads that
// read that key head). The row functions are `__host__ __device__`:
// lib/Runtime/cuda/Attention.cu launches them, and the unit test
// (test/unit/AttentionTest.cpp) runs them on the CPU against torch's
// scaled_dot_product_attention and its autograd. The CPU backend runs
// torch's own fused kernels (ATen's flash attention for the CPU).
//
//===----------------------------------------------------------------------===//

#ifndef TDX_RUNTIME_ATTENTION_H
#define TDX_RUNTIME_ATTENTION_H

#include "tdx/Runtime/Kernel.h"

#include <cmath>
#include <cstdint>

namespace tdx::kern {

/// The widest value head dim a row accumulates in registers.
constexpr int64_t kMaxAttentionDim = 256;

/// Shapes and strides of one attention call, in elements. q [B, H, S, D],
/// k [B, Hkv, T, D], v [B, Hkv, T, E] contiguous; query head h reads kv head
/// h / (H / Hkv). The mask, when given, is additive (float) or a keep-mask
/// (bool), read at strides that broadcast it over [B, H, S, T] (0 for a
/// broadcast dim).
struct AttentionShape {
  int64_t b, h, hkv, s, t, d, e;
  float scale;
  bool causal;
  int64_t maskStride[4];
};

/// Sets g.maskStride for a mask of `rank` (<= 4) dims with these sizes and
/// strides, aligned to [B, H, S, T] from the right: a dim of size 1, or one
/// the mask lacks, is broadcast (stride 0).
inline void setMaskStrides(AttentionShape &g, int64_t rank, const int64_t *sizes,
                           const int64_t *strides) {
  for (int64_t d = 0; d < 4; ++d) {
    int64_t m = d - (4 - rank);
    g.maskStride[d] = m >= 0 && sizes[m] != 1 ? strides[m] : 0;
  }
}

/// Row (b, h, i): out[b, h, i, :] and lse[b, h, i] (the log-sum-exp of the
/// row's scaled, masked scores; -inf for a row every key of which is
/// masked, whose output is then 0). Mask is `const float *` (added) or
/// `const bool *` (false: -inf), or null.
template <class Mask>
TDX_HD inline void attentionRow(const AttentionShape &g, const float *q, const float *k,
                                const float *v, const Mask *mask, float *out, float *lse,
                                int64_t row) {
  int64_t i = row % g.s, bh = row / g.s, h = bh % g.h, b = bh / g.h;
  int64_t kvHead = h / (g.h / g.hkv);
  const float *qi = q + row * g.d;
  const float *kb = k + (b * g.hkv + kvHead) * g.t * g.d;
  const float *vb = v + (b * g.hkv + kvHead) * g.t * g.e;
  float acc[kMaxAttentionDim];
  for (int64_t c = 0; c < g.e; ++c)
    acc[c] = 0.0f;
  float running = -INFINITY, sum = 0.0f;
  int64_t last = g.causal ? (i < g.t - 1 ? i : g.t - 1) : g.t - 1;
  for (int64_t j = 0; j <= last; ++j) {
    float score = 0.0f;
    for (int64_t c = 0; c < g.d; ++c)
      score += qi[c] * kb[j * g.d + c];
    score *= g.scale;
    if (mask) {
      int64_t at = b * g.maskStride[0] + h * g.maskStride[1] + i * g.maskStride[2] +
                   j * g.maskStride[3];
      if constexpr (sizeof(Mask) == 1) {
        if (!mask[at])
          continue;
      } else {
        score += static_cast<float>(mask[at]);
      }
    }
    if (score == -INFINITY)
      continue;
    float top = score > running ? score : running;
    float rescale = expf(running - top), weight = expf(score - top);
    sum = sum * rescale + weight;
    for (int64_t c = 0; c < g.e; ++c)
      acc[c] = acc[c] * rescale + weight * vb[j * g.e + c];
    running = top;
  }
  float *o = out + row * g.e;
  for (int64_t c = 0; c < g.e; ++c)
    o[c] = sum > 0.0f ? acc[c] / sum : 0.0f;
  lse[row] = sum > 0.0f ? running + logf(sum) : -INFINITY;
}

/// softmax probability of key j for query row (b, h, i) as the forward
/// computed it, from the row's log-sum-exp: 0 where masked (or the whole
/// row is).
template <class Mask>
TDX_HD inline float attentionProbability(const AttentionShape &g, const float *qi,
                                         const float *kj, const Mask *mask, int64_t b, int64_t h,
                                         int64_t i, int64_t j, float lse) {
  if ((g.causal && j > i) || lse == -INFINITY)
    return 0.0f;
  float score = 0.0f;
  for (int64_t c = 0; c < g.d; ++c)
    score += qi[c] * kj[c];
  score *= g.scale;
  if (mask) {
    int64_t at =
        b * g.maskStride[0] + h * g.maskStride[1] + i * g.maskStride[2] + j * g.maskStride[3];
    if constexpr (sizeof(Mask) == 1) {
      if (!mask[at])
        return 0.0f;
    } else {
      score += static_cast<float>(mask[at]);
    }
  }
  return score == -INFINITY ? 0.0f : expf(score - lse);
}

/// dot(dout[b, h, i, :], out[b, h, i, :]), the softmax backward's row term.
TDX_HD inline float attentionRowTerm(const AttentionShape &g, const float *dout,
                                     const float *out, int64_t row) {
  float acc = 0.0f;
  for (int64_t c = 0; c < g.e; ++c)
    acc += dout[row * g.e + c] * out[row * g.e + c];
  return acc;
}

/// Query row (b, h, i) of tdx.sdpa_backward: dq[b, h, i, :] = scale *
/// sum_j p_ij (dout_i . v_j - dout_i . out_i) k_j.
template <class Mask>
TDX_HD inline void attentionBackwardQueryRow(const AttentionShape &g, const float *dout,
                                             const float *q, const float *k, const float *v,
                                             const float *out, const float *lse,
                                             const Mask *mask, float *dq, int64_t row) {
  int64_t i = row % g.s, bh = row / g.s, h = bh % g.h, b = bh / g.h;
  int64_t kvHead = h / (g.h / g.hkv);
  const float *qi = q + row * g.d, *doi = dout + row * g.e;
  const float *kb = k + (b * g.hkv + kvHead) * g.t * g.d;
  const float *vb = v + (b * g.hkv + kvHead) * g.t * g.e;
  float rowTerm = attentionRowTerm(g, dout, out, row);
  float *dqi = dq + row * g.d;
  for (int64_t c = 0; c < g.d; ++c)
    dqi[c] = 0.0f;
  for (int64_t j = 0; j < g.t; ++j) {
    float p = attentionProbability(g, qi, kb + j * g.d, mask, b, h, i, j, lse[row]);
    if (p == 0.0f)
      continue;
    float dp = 0.0f;
    for (int64_t c = 0; c < g.e; ++c)
      dp += doi[c] * vb[j * g.e + c];
    float ds = p * (dp - rowTerm) * g.scale;
    for (int64_t c = 0; c < g.d; ++c)
      dqi[c] += ds * kb[j * g.d + c];
  }
}

/// Key row (b, kv head, j) of tdx.sdpa_backward: over the query heads that
/// read this key head and their rows i, dv[j] = sum p_ij dout_i and dk[j] =
/// scale * sum p_ij (dout_i . v_j - dout_i . out_i) q_i.
template <class Mask>
TDX_HD inline void attentionBackwardKeyRow(const AttentionShape &g, const float *dout,
                                           const float *q, const float *k, const float *v,
                                           const float *out, const float *lse,
                                           const Mask *mask, float *dk, float *dv, int64_t row) {
  int64_t j = row % g.t, bkv = row / g.t, kvHead = bkv % g.hkv, b = bkv / g.hkv;
  int64_t group = g.h / g.hkv;
  const float *kj = k + row * g.d, *vj = v + row * g.e;
  float *dkj = dk + row * g.d, *dvj = dv + row * g.e;
  for (int64_t c = 0; c < g.d; ++c)
    dkj[c] = 0.0f;
  for (int64_t c = 0; c < g.e; ++c)
    dvj[c] = 0.0f;
  for (int64_t h = kvHead * group; h < (kvHead + 1) * group; ++h)
    for (int64_t i = 0; i < g.s; ++i) {
      int64_t qrow = (b * g.h + h) * g.s + i;
      const float *qi = q + qrow * g.d, *doi = dout + qrow * g.e;
      float p = attentionProbability(g, qi, kj, mask, b, h, i, j, lse[qrow]);
      if (p == 0.0f)
        continue;
      float dp = 0.0f;
      for (int64_t c = 0; c < g.e; ++c) {
        dp += doi[c] * vj[c];
        dvj[c] += p * doi[c];
      }
      float ds = p * (dp - attentionRowTerm(g, dout, out, qrow)) * g.scale;
      for (int64_t c = 0; c < g.d; ++c)
        dkj[c] += ds * qi[c];
    }
}

} // namespace tdx::kern

#endif // TDX_RUNTIME_ATTENTION_H
