//===- Crc32c.h - CRC-32C (Castagnoli) of checkpoint files ---------*- C++ -*-===//

#ifndef TDX_STATEFORMAT_CRC32C_H
#define TDX_STATEFORMAT_CRC32C_H

#include <cstddef>
#include <cstdint>

namespace tdx::rt {

/// Extends `crc` (0 to start) by `n` bytes: crc32c(ab) == crc32c(b, crc32c(a)).
/// The polynomial of iSCSI, ext4 and safetensors tools (crc32c("123456789")
/// is 0xe3069283); SSE4.2's instruction where the CPU has it.
uint32_t crc32c(const void *data, size_t n, uint32_t crc = 0);

/// crc32c(ab) from crc32c(a), crc32c(b) and b's length, without the bytes
/// (zlib's crc32_combine for this polynomial).
uint32_t crc32cCombine(uint32_t crcA, uint32_t crcB, uint64_t lengthB);

} // namespace tdx::rt

#endif // TDX_STATEFORMAT_CRC32C_H
