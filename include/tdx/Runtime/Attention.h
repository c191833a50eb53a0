//===- Attention.h - one query row of fused attention, host and device -*- C++ -*-===//
//
// The CUDA backend's tdx.sdpa: one thread per query row (batch, head, i)
// streams over the keys with an online softmax (running max and sum,
// rescaling the accumulated output), so the scores are never stored. The
// row function is `__host__ __device__`: lib/Runtime/cuda/Attention.cu
// launches it, and the unit test (test/unit/AttentionTest.cpp) runs it on
// the CPU against torch's scaled_dot_product_attention. The CPU backend runs
// torch's own fused kernel (ATen's flash attention for the CPU).
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

} // namespace tdx::kern

#endif // TDX_RUNTIME_ATTENTION_H
