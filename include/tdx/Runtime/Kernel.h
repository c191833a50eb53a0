//===- Kernel.h - the math of emitted elementwise kernel bodies --*- C++ -*-===//
//
// The fused elementwise kernels that the tdx backends emit are one body
// each, `__host__ __device__`, written against the functions below:
//
//   template <class V> TDX_HD inline void k0(V a0, V a1, V &y0) {
//     V t0 = a0 + a1;
//     y0 = ::tdx::kern::gelu(t0);
//   }
//
// The CUDA backend launches the body with V = float, one thread per
// element. The CPU backend runs it in a loop: with V = float, and, when
// TDX_KERNEL_VECTORIZED is defined (CPU sources that include ATen), with
// V = at::vec::Vectorized<float> over whole vector lanes. The formulas are
// the ones ATen's CPU kernels use, so results match eager to rounding.
//
// Depends on nothing but <cmath>, the 16-bit float types (CUDA's or c10's)
// and ATen's vec headers when vectorized.
//
//===----------------------------------------------------------------------===//

#ifndef TDX_RUNTIME_KERNEL_H
#define TDX_RUNTIME_KERNEL_H

#include <cmath>
#include <cstdint>

#if defined(__CUDACC__)
#define TDX_HD __host__ __device__
#else
#define TDX_HD
#endif

// The 16-bit float storage types of kernel bodies: CUDA's on the device,
// c10's on the CPU. A body converts them to float for each op and rounds
// its result back (Fusion.cpp), as ATen's kernels compute.
#if defined(__CUDACC__)
#include <cuda_bf16.h>
#include <cuda_fp16.h>
namespace tdx::kern {
using bf16 = __nv_bfloat16;
using f16 = __half;
} // namespace tdx::kern
#elif __has_include(<c10/util/BFloat16.h>)
#include <c10/util/BFloat16.h>
#include <c10/util/Half.h>
namespace tdx::kern {
using bf16 = c10::BFloat16;
using f16 = c10::Half;
} // namespace tdx::kern
#endif

namespace tdx::kern {

// Primitives on one element.
TDX_HD inline float exp(float x) { return ::expf(x); }
TDX_HD inline double exp(double x) { return ::exp(x); }
TDX_HD inline float log(float x) { return ::logf(x); }
TDX_HD inline double log(double x) { return ::log(x); }
TDX_HD inline float sqrt(float x) { return ::sqrtf(x); }
TDX_HD inline double sqrt(double x) { return ::sqrt(x); }
TDX_HD inline float tanh(float x) { return ::tanhf(x); }
TDX_HD inline double tanh(double x) { return ::tanh(x); }
TDX_HD inline float erf(float x) { return ::erff(x); }
TDX_HD inline double erf(double x) { return ::erf(x); }
TDX_HD inline float sin(float x) { return ::sinf(x); }
TDX_HD inline double sin(double x) { return ::sin(x); }
TDX_HD inline float cos(float x) { return ::cosf(x); }
TDX_HD inline double cos(double x) { return ::cos(x); }
TDX_HD inline float pow(float x, float y) { return ::powf(x, y); }
TDX_HD inline double pow(double x, double y) { return ::pow(x, y); }
template <class T> TDX_HD inline T neg(T x) { return -x; }
template <class T> TDX_HD inline T abs(T x) { return x <= T(0) ? T(0) - x : x; }
/// torch.maximum / minimum: NaN wins.
template <class T> TDX_HD inline T maximum(T a, T b) {
  return a != a ? a : (b != b ? b : (a > b ? a : b));
}
template <class T> TDX_HD inline T minimum(T a, T b) {
  return a != a ? a : (b != b ? b : (a < b ? a : b));
}
/// relu keeps NaN, as clamp_min does.
template <class T> TDX_HD inline T relu(T x) { return x < T(0) ? T(0) : x; }

} // namespace tdx::kern

#if defined(TDX_KERNEL_VECTORIZED) && !defined(__CUDACC__)
#include <ATen/cpu/vec/vec.h>

namespace tdx::kern {
// The same primitives on whole vector lanes (ATen's Vectorized, Sleef).
template <class T> using Vec = at::vec::Vectorized<T>;
template <class T> inline Vec<T> exp(Vec<T> x) { return x.exp(); }
template <class T> inline Vec<T> log(Vec<T> x) { return x.log(); }
template <class T> inline Vec<T> sqrt(Vec<T> x) { return x.sqrt(); }
template <class T> inline Vec<T> tanh(Vec<T> x) { return x.tanh(); }
template <class T> inline Vec<T> erf(Vec<T> x) { return x.erf(); }
template <class T> inline Vec<T> sin(Vec<T> x) { return x.sin(); }
template <class T> inline Vec<T> cos(Vec<T> x) { return x.cos(); }
template <class T> inline Vec<T> pow(Vec<T> x, Vec<T> y) { return x.pow(y); }
template <class T> inline Vec<T> neg(Vec<T> x) { return x.neg(); }
template <class T> inline Vec<T> abs(Vec<T> x) { return x.abs(); }
template <class T> inline Vec<T> maximum(Vec<T> a, Vec<T> b) { return at::vec::maximum(a, b); }
template <class T> inline Vec<T> minimum(Vec<T> a, Vec<T> b) { return at::vec::minimum(a, b); }
template <class T> inline Vec<T> relu(Vec<T> x) { return at::vec::clamp_min(x, Vec<T>(T(0))); }
} // namespace tdx::kern
#endif

namespace tdx::kern {

// Arithmetic, by name for the table (ElementwiseOps.def).
template <class V> TDX_HD inline V add(V a, V b) { return a + b; }
template <class V> TDX_HD inline V sub(V a, V b) { return a - b; }
template <class V> TDX_HD inline V mul(V a, V b) { return a * b; }
template <class V> TDX_HD inline V div(V a, V b) { return a / b; }

// Composites, written once for every V.
template <class V> TDX_HD inline V rsqrt(V x) { return V(1) / sqrt(x); }
template <class V> TDX_HD inline V sigmoid(V x) { return V(1) / (V(1) + exp(neg(x))); }
template <class V> TDX_HD inline V silu(V x) { return x / (V(1) + exp(neg(x))); }
/// hardsigmoid: min(max(x + 3, 0), 6) / 6 (ATen's formula).
template <class V> TDX_HD inline V hardsigmoid(V x) {
  return ::tdx::kern::minimum(::tdx::kern::maximum(x + V(3), V(0)), V(6)) / V(6);
}
/// hardswish: x * min(max(x + 3, 0), 6) / 6 (ATen's formula).
template <class V> TDX_HD inline V hardswish(V x) {
  return x * ::tdx::kern::minimum(::tdx::kern::maximum(x + V(3), V(0)), V(6)) / V(6);
}
/// gelu(approximate="none"): x/2 (1 + erf(x / sqrt 2)).
template <class V> TDX_HD inline V gelu(V x) {
  return x * V(0.5) * (V(1) + erf(x * V(0.70710678118654752440)));
}
/// gelu(approximate="tanh"): x/2 (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))).
template <class V> TDX_HD inline V geluTanh(V x) {
  V inner = V(0.79788456080286535588) * (x + V(0.044715) * x * x * x);
  return V(0.5) * x * (V(1) + tanh(inner));
}

} // namespace tdx::kern

#endif // TDX_RUNTIME_KERNEL_H
