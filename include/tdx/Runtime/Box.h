//===- Box.h - row-major runs of a box of a tensor ----------------*- C++ -*-===//

#ifndef TDX_RUNTIME_BOX_H
#define TDX_RUNTIME_BOX_H

#include <cstdint>
#include <utility>
#include <vector>

namespace tdx::rt {

/// torch.chunk's piece `c` of `n` elements in `k` pieces: [start, end).
inline std::pair<int64_t, int64_t> chunkRange(int64_t n, int64_t k, int64_t c) {
  int64_t size = k ? (n + k - 1) / k : n;
  int64_t start = c * size < n ? c * size : n;
  return {start, start + size < n ? start + size : n};
}

/// Calls fn(globalElement, localElement, count) for each contiguous run of
/// the box [offset, offset + size) of a row-major tensor of `shape`, in the
/// box's row-major order; runs are as long as the box allows.
template <class Fn>
void forEachBoxRun(const std::vector<int64_t> &shape, const std::vector<int64_t> &offset,
                   const std::vector<int64_t> &size, Fn fn) {
  int64_t rank = static_cast<int64_t>(shape.size()), elements = 1;
  for (int64_t s : size)
    elements *= s;
  if (elements == 0)
    return;
  // Dims from `inner` on are whole, so a run spans them and dim inner - 1.
  int64_t inner = rank, run = 1;
  while (inner > 0 && offset[inner - 1] == 0 && size[inner - 1] == shape[inner - 1])
    run *= shape[--inner];
  if (inner > 0)
    run *= size[--inner];
  std::vector<int64_t> stride(rank, 1);
  for (int64_t d = rank - 2; d >= 0; --d)
    stride[d] = stride[d + 1] * shape[d + 1];
  std::vector<int64_t> index(inner, 0);
  for (int64_t local = 0; local < elements; local += run) {
    int64_t global = inner < rank ? offset[inner] * stride[inner] : 0;
    for (int64_t d = 0; d < inner; ++d)
      global += (offset[d] + index[d]) * stride[d];
    fn(global, local, run);
    for (int64_t d = inner - 1; d >= 0; --d) {
      if (++index[d] < size[d])
        break;
      index[d] = 0;
    }
  }
}

} // namespace tdx::rt

#endif // TDX_RUNTIME_BOX_H
