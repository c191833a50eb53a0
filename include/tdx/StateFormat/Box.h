//===- Box.h - row-major runs of a box of a tensor ----------------*- C++ -*-===//

#ifndef TDX_STATEFORMAT_BOX_H
#define TDX_STATEFORMAT_BOX_H

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

/// Copies a box between two row-major tensors: calls fn(aElement, bElement,
/// count) for each contiguous run of the box of extent `size` that sits at
/// `offsetA` in a tensor of `shapeA` and at `offsetB` in one of `shapeB`, in
/// the box's row-major order; runs are as long as both tensors allow.
template <class Fn>
void forEachCopyRun(const std::vector<int64_t> &shapeA, const std::vector<int64_t> &offsetA,
                    const std::vector<int64_t> &shapeB, const std::vector<int64_t> &offsetB,
                    const std::vector<int64_t> &size, Fn fn) {
  int64_t rank = static_cast<int64_t>(size.size()), elements = 1;
  for (int64_t s : size)
    elements *= s;
  if (elements == 0)
    return;
  // Dims from `inner` on are whole in both tensors, so a run spans them and
  // dim inner - 1.
  int64_t inner = rank, run = 1;
  while (inner > 0 && size[inner - 1] == shapeA[inner - 1] && size[inner - 1] == shapeB[inner - 1])
    run *= size[--inner];
  if (inner > 0)
    run *= size[--inner];
  std::vector<int64_t> strideA(rank, 1), strideB(rank, 1);
  for (int64_t d = rank - 2; d >= 0; --d) {
    strideA[d] = strideA[d + 1] * shapeA[d + 1];
    strideB[d] = strideB[d + 1] * shapeB[d + 1];
  }
  std::vector<int64_t> index(inner, 0);
  for (int64_t done = 0; done < elements; done += run) {
    int64_t a = 0, b = 0;
    for (int64_t d = 0; d < rank; ++d) {
      int64_t i = d < inner ? index[d] : 0;
      a += (offsetA[d] + i) * strideA[d];
      b += (offsetB[d] + i) * strideB[d];
    }
    fn(a, b, run);
    for (int64_t d = inner - 1; d >= 0; --d) {
      if (++index[d] < size[d])
        break;
      index[d] = 0;
    }
  }
}

/// Calls fn(globalElement, localElement, count) for each contiguous run of
/// the box [offset, offset + size) of a row-major tensor of `shape`, in the
/// box's row-major order (the box's local tensor is dense).
template <class Fn>
void forEachBoxRun(const std::vector<int64_t> &shape, const std::vector<int64_t> &offset,
                   const std::vector<int64_t> &size, Fn fn) {
  forEachCopyRun(shape, offset, size, std::vector<int64_t>(size.size(), 0), size, fn);
}

} // namespace tdx::rt

#endif // TDX_STATEFORMAT_BOX_H
