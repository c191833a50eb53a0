//===- FusedRows.h - the row ops that end a fused CPU kernel ------*- C++ -*-===//
//
// A softmax, log_softmax, layer_norm or rms_norm over the last dim may end
// a fused elementwise kernel (lib/Target/Fusion.cpp): the kernel's members
// write the op's input row into its result, then one of these runs on that
// row in place while it is in cache, so the scale and mask before a
// softmax, or the residual add before a norm, make no tensor of their own.
//
// They run on ATen's vector lanes with the formulas of ATen's CPU kernels
// (softmax: max, exp(x - max), times 1 / sum; layer_norm: RowwiseMoments,
// (x * rstd - mean * rstd) * w + b), so results are eager's. Inline
// templates: the emitted program instantiates them with its own CPU
// capability, as ATen's kernels are. A weight or bias may be null or
// strided (stride in elements; the vector path needs 1).
//
//===----------------------------------------------------------------------===//

#ifndef TDX_RUNTIME_FUSEDROWS_H
#define TDX_RUNTIME_FUSEDROWS_H

#include <ATen/cpu/vec/functional.h>
#include <ATen/cpu/vec/vec.h>
#include <ATen/native/cpu/moments_utils.h>

#include <algorithm>
#include <cmath>
#include <cstdint>

namespace tdx::rt::rows {

/// T, not deduced from the argument (a weight may be passed as nullptr).
template <class T> struct Given { using type = T; };
template <class T> using Of = typename Given<T>::type;

/// softmax (or log_softmax) of the dense row y[0..n), in place.
template <class T> inline void softmax(T *y, int64_t n, bool logSoftmax) {
  using Vec = at::vec::Vectorized<T>;
  T max = at::vec::reduce_all<T>([](Vec &a, Vec &b) { return at::vec::maximum(a, b); }, y, n);
  if (logSoftmax) {
    T sum = at::vec::map_reduce_all<T>([max](Vec x) { return (x - Vec(max)).exp(); },
                                       [](Vec a, Vec b) { return a + b; }, y, n);
    T logSum = std::log(sum);
    at::vec::map([max, logSum](Vec x) { return x - Vec(max) - Vec(logSum); }, y, y, n);
    return;
  }
  at::vec::map([max](Vec x) { return (x - Vec(max)).exp(); }, y, y, n);
  T sum = at::vec::reduce_all<T>([](Vec a, Vec b) { return a + b; }, y, n);
  T inverse = T(1) / sum;
  at::vec::map([inverse](Vec x) { return x * Vec(inverse); }, y, y, n);
}

/// layer_norm of the dense row y[0..n) in place: (y - mean) / sqrt(var +
/// eps) * w + b with the biased variance; w and b may be null.
template <class T>
inline void layerNorm(T *y, const Of<T> *w, int64_t ws, const Of<T> *b, int64_t bs, int64_t n,
                      double eps) {
  using Vec = at::vec::Vectorized<T>;
  auto [mean, var] = at::native::RowwiseMoments(y, n);
  T rstd = T(1) / std::sqrt(std::max(var, T(0)) + static_cast<T>(eps));
  T scale = rstd, shift = -rstd * mean;
  if (w && b && ws == 1 && bs == 1) {
    at::vec::map3([scale, shift](Vec x, Vec g, Vec h) { return (x * Vec(scale) + Vec(shift)) * g + h; },
                  y, y, w, b, n);
    return;
  }
  for (int64_t i = 0; i < n; ++i) {
    T v = y[i] * scale + shift;
    y[i] = (w ? v * w[i * ws] : v) + (b ? b[i * bs] : T(0));
  }
}

/// rms_norm of the dense row y[0..n) in place: y / sqrt(mean(y^2) + eps) *
/// w; w may be null.
template <class T>
inline void rmsNorm(T *y, const Of<T> *w, int64_t ws, int64_t n, double eps) {
  using Vec = at::vec::Vectorized<T>;
  T squares = at::vec::map_reduce_all<T>([](Vec x) { return x * x; },
                                         [](Vec a, Vec b) { return a + b; }, y, n);
  T r = T(1) / std::sqrt(squares / static_cast<T>(n) + static_cast<T>(eps));
  if (w && ws == 1) {
    at::vec::map2([r](Vec x, Vec g) { return x * Vec(r) * g; }, y, y, w, n);
    return;
  }
  for (int64_t i = 0; i < n; ++i)
    y[i] = w ? y[i] * r * w[i * ws] : y[i] * r;
}

} // namespace tdx::rt::rows

#endif // TDX_RUNTIME_FUSEDROWS_H
