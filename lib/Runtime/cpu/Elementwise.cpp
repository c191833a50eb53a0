//===- Elementwise.cpp - the CPU loop around emitted kernel bodies --------===//

#include "tdx/Runtime/Runtime.h"

#include <ATen/Parallel.h>

#include <stdexcept>

std::vector<at::Tensor> tdx::rt::elementwise(std::vector<int64_t> shape,
                                             const std::vector<at::Tensor> &inputs,
                                             const std::vector<at::ScalarType> &outputTypes,
                                             KernelRow row, bool wholeRows) {
  Profile::Scope timed(&Profile::kernels);
  if (std::count(shape.begin(), shape.end(), -1)) {
    std::vector<int64_t> known;
    for (const at::Tensor &t : inputs)
      known = at::infer_size(known, t.sizes());
    if (known.size() != shape.size())
      throw std::runtime_error("tdx: an elementwise kernel's inputs do not broadcast to its shape");
    for (size_t d = 0; d < shape.size(); ++d)
      if (shape[d] == -1)
        shape[d] = known[d];
  }
  std::vector<at::Tensor> operands;
  for (const at::Tensor &t : inputs)
    operands.push_back(t.expand(shape));
  std::vector<at::Tensor> outputs;
  for (at::ScalarType type : outputTypes)
    outputs.push_back(at::empty(shape, at::TensorOptions().dtype(type)));
  operands.insert(operands.end(), outputs.begin(), outputs.end());
  int64_t numel = 1;
  for (int64_t s : shape)
    numel *= s;
  if (numel == 0)
    return outputs;

  // Merge a dim into the one inside it when every operand steps over both as
  // one (size-1 dims merge always), except into a whole row.
  size_t count = operands.size();
  std::vector<int64_t> sizes;                 // innermost first
  std::vector<std::vector<int64_t>> strides(count);
  for (int64_t d = static_cast<int64_t>(shape.size()) - 1; d >= 0; --d) {
    bool last = d == static_cast<int64_t>(shape.size()) - 1;
    if (shape[d] == 1 && !(wholeRows && last))
      continue;
    bool merge = !sizes.empty() && !(wholeRows && sizes.size() == 1);
    for (size_t i = 0; merge && i < count; ++i)
      merge = operands[i].stride(d) == strides[i].back() * sizes.back();
    if (merge) {
      sizes.back() *= shape[d];
      continue;
    }
    sizes.push_back(shape[d]);
    for (size_t i = 0; i < count; ++i)
      strides[i].push_back(operands[i].stride(d));
  }
  if (sizes.empty()) {
    sizes.push_back(1);
    for (size_t i = 0; i < count; ++i)
      strides[i].push_back(0);
  }
  int64_t n = sizes.front(), rows = numel / n;
  size_t dims = sizes.size();
  std::vector<char *> base(count);
  std::vector<int64_t> inner(count), step(count * dims); // step: bytes per index of dim d
  for (size_t i = 0; i < count; ++i) {
    base[i] = static_cast<char *>(operands[i].data_ptr());
    inner[i] = strides[i].front();
    for (size_t d = 0; d < dims; ++d)
      step[i * dims + d] = strides[i][d] * operands[i].element_size();
  }
  int64_t grain = std::max<int64_t>(1, 32768 / n);
  at::parallel_for(0, rows, grain, [&](int64_t begin, int64_t end) {
    // The row's index over the outer dims, carried from row to row (no
    // division per row: rows are as short as 16 elements).
    std::vector<int64_t> index(dims, 0);
    std::vector<char *> ptrs(base);
    int64_t rest = begin;
    for (size_t d = 1; d < dims; ++d) {
      index[d] = rest % sizes[d];
      rest /= sizes[d];
      for (size_t i = 0; i < count; ++i)
        ptrs[i] += index[d] * step[i * dims + d];
    }
    for (int64_t r = begin; r < end; ++r) {
      row(ptrs.data(), inner.data(), n);
      for (size_t d = 1; d < dims; ++d) {
        if (++index[d] < sizes[d]) {
          for (size_t i = 0; i < count; ++i)
            ptrs[i] += step[i * dims + d];
          break;
        }
        index[d] = 0;
        for (size_t i = 0; i < count; ++i)
          ptrs[i] -= (sizes[d] - 1) * step[i * dims + d];
      }
    }
  });
  return outputs;
}
