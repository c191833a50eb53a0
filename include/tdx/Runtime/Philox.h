//===- Philox.h - the counter-based generator of tdx random init -*- C++ -*-===//
//
// The one definition of tdx's randomness, shared by the CPU runtime and the
// CUDA kernels (every function is __host__ __device__). Element i of a
// random tensor made by an op keyed (seed, stream) is a pure function of
// (seed, stream, i), so any rank computes any slice without the rest and
// the materialized tensor is the same on every mesh and placement.
//
//   key     = { lo32(seed), hi32(seed) }
//   uniform : counter = { lo32(i / 4), hi32(i / 4), lo32(stream), hi32(stream) },
//             word w = output[i % 4],  u = (w >> 8) * 2^-24  in [0, 1)
//   normal  : counter = { lo32(i / 2), hi32(i / 2), lo32(stream), hi32(stream) },
//             words a = output[2 (i % 2)], b = output[2 (i % 2) + 1],
//             u1 = ((a >> 8) + 1) * 2^-24 in (0, 1], u2 = (b >> 8) * 2^-24,
//             z = sqrt(-2 ln u1) cos(2 pi u2)            (Box-Muller)
//   truncated normal on [a, b]: u as for uniform, then the inverse normal CDF
//             of Phi(alpha) + u (Phi(beta) - Phi(alpha)).
//   bernoulli(p): 1 when u (as for uniform) < p, else 0.
//
// A random op inside a function (dropout's mask) draws anew at each call c
// of it (c from 0: one per training step or forward): its stream is
// stream + (c + 1) * 2^32 (InitProgram.h's atCall). Init programs use
// streams below 2^32.
//
// Arithmetic is in double and rounded once to the element type. Build it
// without floating-point contraction (-ffp-contract=off, nvcc --fmad=false)
// so results do not depend on the compiler. CPU and CUDA agree bitwise on
// the generator words and uniforms; normal and truncated normal use libm /
// CUDA math functions, which may differ in the last bit.
//
//===----------------------------------------------------------------------===//

#ifndef TDX_RUNTIME_PHILOX_H
#define TDX_RUNTIME_PHILOX_H

#include <cmath>
#include <cstdint>

#if defined(__CUDACC__)
#define TDX_HOST_DEVICE __host__ __device__
#else
#define TDX_HOST_DEVICE
#endif

namespace tdx::rng {

struct Block {
  uint32_t w[4];
};

/// Philox4x32-10 (Salmon et al., SC'11; the Random123 constants).
TDX_HOST_DEVICE inline Block philox4x32_10(uint32_t c0, uint32_t c1, uint32_t c2,
                                           uint32_t c3, uint32_t k0, uint32_t k1) {
  const uint32_t m0 = 0xD2511F53u, m1 = 0xCD9E8D57u;
  const uint32_t w0 = 0x9E3779B9u, w1 = 0xBB67AE85u;
  for (int round = 0; round < 10; ++round) {
    if (round > 0) {
      k0 += w0;
      k1 += w1;
    }
    uint64_t p0 = static_cast<uint64_t>(m0) * c0;
    uint64_t p1 = static_cast<uint64_t>(m1) * c2;
    uint32_t hi0 = static_cast<uint32_t>(p0 >> 32), lo0 = static_cast<uint32_t>(p0);
    uint32_t hi1 = static_cast<uint32_t>(p1 >> 32), lo1 = static_cast<uint32_t>(p1);
    uint32_t n0 = hi1 ^ c1 ^ k0, n2 = hi0 ^ c3 ^ k1;
    c0 = n0;
    c1 = lo1;
    c2 = n2;
    c3 = lo0;
  }
  return Block{{c0, c1, c2, c3}};
}

TDX_HOST_DEVICE inline Block blockFor(uint64_t seed, uint64_t stream, uint64_t block) {
  return philox4x32_10(static_cast<uint32_t>(block), static_cast<uint32_t>(block >> 32),
                       static_cast<uint32_t>(stream), static_cast<uint32_t>(stream >> 32),
                       static_cast<uint32_t>(seed), static_cast<uint32_t>(seed >> 32));
}

/// The 24-bit uniform of a word, in [0, 1).
TDX_HOST_DEVICE inline double unitOf(uint32_t word) {
  return static_cast<double>(word >> 8) * (1.0 / 16777216.0);
}

/// Element i of uniform(seed, stream) in [0, 1).
TDX_HOST_DEVICE inline double uniform01(uint64_t seed, uint64_t stream, uint64_t i) {
  Block b = blockFor(seed, stream, i >> 2);
  return unitOf(b.w[i & 3]);
}

/// Element i of a standard normal (Box-Muller).
TDX_HOST_DEVICE inline double standardNormal(uint64_t seed, uint64_t stream, uint64_t i) {
  Block b = blockFor(seed, stream, i >> 1);
  uint32_t a = b.w[2 * (i & 1)], c = b.w[2 * (i & 1) + 1];
  double u1 = static_cast<double>((a >> 8) + 1) * (1.0 / 16777216.0);
  double u2 = unitOf(c);
  const double twoPi = 6.283185307179586476925286766559;
  return sqrt(-2.0 * log(u1)) * cos(twoPi * u2);
}

/// The inverse error function: a starting guess (Giles, 2010) refined by
/// Newton steps on erf.
TDX_HOST_DEVICE inline double erfinv(double y) {
  if (y <= -1.0)
    return -INFINITY;
  if (y >= 1.0)
    return INFINITY;
  double w = -log((1.0 - y) * (1.0 + y)), x;
  if (w < 5.0) {
    w -= 2.5;
    x = 2.81022636e-08;
    x = 3.43273939e-07 + x * w;
    x = -3.5233877e-06 + x * w;
    x = -4.39150654e-06 + x * w;
    x = 0.00021858087 + x * w;
    x = -0.00125372503 + x * w;
    x = -0.00417768164 + x * w;
    x = 0.246640727 + x * w;
    x = 1.50140941 + x * w;
  } else {
    w = sqrt(w) - 3.0;
    x = -0.000200214257;
    x = 0.000100950558 + x * w;
    x = 0.00134934322 + x * w;
    x = -0.00367342844 + x * w;
    x = 0.00573950773 + x * w;
    x = -0.0076224613 + x * w;
    x = 0.00943887047 + x * w;
    x = 1.00167406 + x * w;
    x = 2.83297682 + x * w;
  }
  x *= y;
  const double twoOverSqrtPi = 1.1283791670955125738961589031215;
  for (int step = 0; step < 2; ++step)
    x -= (erf(x) - y) / (twoOverSqrtPi * exp(-x * x));
  return x;
}

/// Element i of N(mean, std^2) truncated to [a, b] (absolute bounds).
TDX_HOST_DEVICE inline double truncNormal(uint64_t seed, uint64_t stream, uint64_t i,
                                          double mean, double std, double a, double b) {
  const double invSqrt2 = 0.70710678118654752440084436210485;
  double lo = 0.5 * erfc(-((a - mean) / std) * invSqrt2);
  double hi = 0.5 * erfc(-((b - mean) / std) * invSqrt2);
  double p = lo + uniform01(seed, stream, i) * (hi - lo);
  double x = mean + std * 1.4142135623730950488016887242097 * erfinv(2.0 * p - 1.0);
  return x < a ? a : (x > b ? b : x);
}

} // namespace tdx::rng

#endif // TDX_RUNTIME_PHILOX_H
