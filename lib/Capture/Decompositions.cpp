//===- Decompositions.cpp - composite ops whose shape needs data in 1.13 -===//
//
// A few CompositeImplicitAutograd ops of libtorch 1.13 read tensor data to
// compute a shape even when the shape follows from the arguments alone, so
// they cannot run on fake tensors. For fake tensors they are decomposed here,
// above autograd, into ops that can (and that tdx shards); real tensors take
// libtorch's own kernel.
//
//===----------------------------------------------------------------------===//

#include "tdx/Capture/Capture.h"

#include <ATen/ATen.h>
#include <ATen/WrapDimUtils.h>
#include <ATen/ops/repeat_interleave_native.h>
#include <torch/library.h>

namespace {

/// repeat_interleave(x, r, dim): element i along `dim` is x[i / r]. libtorch
/// builds an index tensor from a tensor of repeats (data); with an integer
/// `r` it is unsqueeze, expand and flatten, the same copy.
at::Tensor repeatInterleaveInt(const at::Tensor &self, int64_t repeats,
                               c10::optional<int64_t> dim, c10::optional<int64_t> outputSize) {
  if (!tdx::capture::isFake(self))
    return at::native::repeat_interleave(self, repeats, dim, outputSize);
  TORCH_CHECK(repeats >= 0, "repeat_interleave: repeats must be non-negative, got ", repeats);
  at::Tensor x = dim ? self : self.flatten();
  int64_t d = dim ? c10::maybe_wrap_dim(*dim, x.dim()) : 0;
  std::vector<int64_t> sizes = x.sizes().vec();
  sizes.insert(sizes.begin() + d + 1, repeats);
  at::Tensor out = x.unsqueeze(d + 1).expand(sizes).flatten(d, d + 1);
  TORCH_CHECK(!outputSize || *outputSize == out.size(d), "repeat_interleave: output_size ",
              *outputSize, " does not match the repeated size ", out.size(d));
  return out;
}

} // namespace

TORCH_LIBRARY_IMPL(aten, AutogradCPU, m) {
  m.impl("repeat_interleave.self_int", TORCH_FN(repeatInterleaveInt));
}
TORCH_LIBRARY_IMPL(aten, AutogradCUDA, m) {
  m.impl("repeat_interleave.self_int", TORCH_FN(repeatInterleaveInt));
}
