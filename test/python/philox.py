"""tdx's counter-based generator written again from its definition in
include/tdx/Runtime/Philox.h (Philox4x32-10, Salmon et al. SC'11), so tests
check the runtime's draws against the definition rather than against
themselves."""

import numpy as np
import torch

M32 = np.uint64(0xFFFFFFFF)


def philox_words(seed, stream, blocks):
    """The four output words of Philox4x32-10 for counters {block, stream}
    and key seed, for each block in `blocks` (uint64 array)."""
    seed, stream = seed & (2**64 - 1), stream & (2**64 - 1)
    c0, c1 = blocks & M32, blocks >> np.uint64(32)
    c2 = np.full_like(blocks, stream & 0xFFFFFFFF)
    c3 = np.full_like(blocks, stream >> 32)
    k0, k1 = np.uint64(seed & 0xFFFFFFFF), np.uint64(seed >> 32)
    for r in range(10):
        if r:
            k0, k1 = (k0 + np.uint64(0x9E3779B9)) & M32, (k1 + np.uint64(0xBB67AE85)) & M32
        p0, p1 = np.uint64(0xD2511F53) * c0, np.uint64(0xCD9E8D57) * c2
        c0, c1, c2, c3 = (p1 >> np.uint64(32)) ^ c1 ^ k0, p1 & M32, \
            (p0 >> np.uint64(32)) ^ c3 ^ k1, p0 & M32
    return np.stack([c0, c1, c2, c3])


def uniform01(seed, stream, n):
    """Elements 0..n-1 of uniform(seed, stream) in [0, 1), as float64."""
    i = np.arange(n, dtype=np.uint64)
    words = philox_words(seed, stream, i >> np.uint64(2))
    w = words[(i & np.uint64(3)).astype(np.int64), np.arange(n)]
    return (w >> np.uint64(8)).astype(np.float64) * 2.0**-24


def bernoulli(p, seed, stream, shape, call=None):
    """tdx.bernoulli(p) seed(seed, stream) of `shape` as float32; drawn at
    function call `call` (stream + (call + 1) * 2^32) when given."""
    if call is not None:
        stream += (call + 1) << 32
    n = int(np.prod(shape))
    return torch.from_numpy((uniform01(seed, stream, n) < p).astype(np.float32)).reshape(shape)
