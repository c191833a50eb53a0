//===- Crc32c.cpp - CRC-32C (Castagnoli) of checkpoint files --------------===//

#include "tdx/StateFormat/Crc32c.h"

#include <array>
#include <cstring>

#if defined(__x86_64__)
#include <nmmintrin.h>
#endif

using namespace tdx::rt;

namespace {

/// Tables for slicing by 8 of the reflected polynomial 0x82f63b78.
struct Tables {
  std::array<std::array<uint32_t, 256>, 8> t;
  Tables() {
    for (uint32_t i = 0; i < 256; ++i) {
      uint32_t c = i;
      for (int k = 0; k < 8; ++k)
        c = (c >> 1) ^ (0x82f63b78u & (0u - (c & 1u)));
      t[0][i] = c;
    }
    for (int s = 1; s < 8; ++s)
      for (uint32_t i = 0; i < 256; ++i)
        t[s][i] = (t[s - 1][i] >> 8) ^ t[0][t[s - 1][i] & 0xff];
  }
};

uint32_t software(const unsigned char *p, size_t n, uint32_t c) {
  static const Tables tables;
  const auto &t = tables.t;
  while (n >= 8) {
    uint64_t w;
    std::memcpy(&w, p, 8);
    w ^= c;
    c = t[7][w & 0xff] ^ t[6][(w >> 8) & 0xff] ^ t[5][(w >> 16) & 0xff] ^ t[4][(w >> 24) & 0xff] ^
        t[3][(w >> 32) & 0xff] ^ t[2][(w >> 40) & 0xff] ^ t[1][(w >> 48) & 0xff] ^ t[0][w >> 56];
    p += 8, n -= 8;
  }
  while (n--)
    c = (c >> 8) ^ t[0][(c ^ *p++) & 0xff];
  return c;
}

#if defined(__x86_64__)
__attribute__((target("sse4.2"))) uint32_t hardware(const unsigned char *p, size_t n, uint32_t c) {
  uint64_t c64 = c;
  while (n >= 8) {
    uint64_t w;
    std::memcpy(&w, p, 8);
    c64 = _mm_crc32_u64(c64, w);
    p += 8, n -= 8;
  }
  c = static_cast<uint32_t>(c64);
  while (n--)
    c = _mm_crc32_u8(c, *p++);
  return c;
}
#endif

} // namespace

uint32_t tdx::rt::crc32c(const void *data, size_t n, uint32_t crc) {
  const auto *p = static_cast<const unsigned char *>(data);
  uint32_t c = ~crc;
#if defined(__x86_64__)
  static const bool sse42 = __builtin_cpu_supports("sse4.2");
  c = sse42 ? hardware(p, n, c) : software(p, n, c);
#else
  c = software(p, n, c);
#endif
  return ~c;
}

namespace {
uint32_t gf2Times(const uint32_t *matrix, uint32_t vector) {
  uint32_t sum = 0;
  for (; vector; vector >>= 1, ++matrix)
    if (vector & 1)
      sum ^= *matrix;
  return sum;
}

void gf2Square(uint32_t *square, const uint32_t *matrix) {
  for (int n = 0; n < 32; ++n)
    square[n] = gf2Times(matrix, matrix[n]);
}
} // namespace

uint32_t tdx::rt::crc32cCombine(uint32_t crcA, uint32_t crcB, uint64_t lengthB) {
  if (lengthB == 0)
    return crcA;
  // odd: the operator of one zero bit; squared into 2, 4, 8, ... zero bits,
  // applied for each set bit of the length in bytes.
  uint32_t even[32], odd[32];
  odd[0] = 0x82f63b78u;
  for (int n = 1; n < 32; ++n)
    odd[n] = 1u << (n - 1);
  gf2Square(even, odd);
  gf2Square(odd, even);
  do {
    gf2Square(even, odd);
    if (lengthB & 1)
      crcA = gf2Times(even, crcA);
    lengthB >>= 1;
    if (!lengthB)
      break;
    gf2Square(odd, even);
    if (lengthB & 1)
      crcA = gf2Times(odd, crcA);
    lengthB >>= 1;
  } while (lengthB);
  return crcA ^ crcB;
}
