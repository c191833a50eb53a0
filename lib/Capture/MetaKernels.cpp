//===- MetaKernels.cpp - shapes of ops libtorch 1.13 has no meta kernel for -===//
//
// Fake tensors run every op's Meta kernel for its result shapes. libtorch
// 1.13 lacks one for a few backward ops that a training step of a conv net
// dispatches; these give their shapes (the gradients have the shapes of the
// tensors they are gradients of), so the backward records like any other.
//
//===----------------------------------------------------------------------===//

#include <ATen/ATen.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <torch/library.h>

namespace {

at::Tensor metaLike(const at::Tensor &t) {
  return at::empty(t.sizes(), t.options().device(c10::kMeta));
}

/// convolution_backward(grad_output, input, weight, bias_sizes, stride,
/// padding, dilation, transposed, output_padding, groups, output_mask) ->
/// (grad_input, grad_weight, grad_bias), each only where output_mask asks.
void convolutionBackward(const c10::OperatorHandle &, torch::jit::Stack *stack) {
  auto args = torch::jit::last(*stack, 11);
  at::Tensor input = args[1].toTensor(), weight = args[2].toTensor();
  c10::List<bool> mask = args[10].toBoolList();
  at::Tensor gradBias;
  if (mask.get(2)) {
    if (!args[3].isNone()) {
      std::vector<int64_t> sizes;
      for (const c10::IValue &s : args[3].toListRef())
        sizes.push_back(s.isInt() ? s.toInt() : s.toSymInt().expect_int());
      gradBias = at::empty(sizes, weight.options().device(c10::kMeta));
    } else {
      gradBias = at::empty({weight.size(0)}, weight.options().device(c10::kMeta));
    }
  }
  at::Tensor gradInput = mask.get(0) ? metaLike(input) : at::Tensor();
  at::Tensor gradWeight = mask.get(1) ? metaLike(weight) : at::Tensor();
  torch::jit::drop(*stack, 11);
  torch::jit::push(*stack, gradInput, gradWeight, gradBias);
}

/// _adaptive_avg_pool2d_backward(grad_output, self) -> grad of self.
void adaptiveAvgPoolBackward(const c10::OperatorHandle &, torch::jit::Stack *stack) {
  at::Tensor self = (*stack)[stack->size() - 1].toTensor();
  torch::jit::drop(*stack, 2);
  torch::jit::push(*stack, metaLike(self));
}

} // namespace

TORCH_LIBRARY_IMPL(aten, Meta, m) {
  m.impl("convolution_backward", torch::CppFunction::makeFromBoxedFunction<&convolutionBackward>());
  m.impl("_adaptive_avg_pool2d_backward",
         torch::CppFunction::makeFromBoxedFunction<&adaptiveAvgPoolBackward>());
}
